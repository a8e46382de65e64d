"""SGLang's Triton fused MoE (bf16), loaded from its published wheel's files, as one callable op.

Nothing of SGLang is copied here: :func:`load` imports the wheel's own modules from a folder that holds
the wheel's ``sglang/`` tree (``unzip sglang-0.5.23-*.whl 'sglang/kernels/*' 'sglang/srt/layers/moe/*'
-d DIR``), after putting stand-ins in ``sys.modules`` for the imports those modules make that have nothing
to do with a bf16 call (quantization kernels, server settings, the CUDA extension ``sgl_kernel``).
Only the package ``__init__`` files are skipped (they import the whole server).

:class:`Incumbent` runs what SGLang runs for a bf16 call on CUDA (``fused_experts_impl``, no quantization,
no expert parallelism): its alignment (``moe_align_block_size``), GEMM 1 (``invoke_fused_moe_kernel``), the
activation, GEMM 2 with the routing weight, and the top-k sum (``moe_combine_topk``'s choice). Where SGLang
would call its CUDA extension, which the wheel does not hold, the stand-in is named in :attr:`Incumbent.notes`:

* alignment: the wheel's single-launch Triton kernel (``moe_align_small_numel``) where the pairs number at
  most its ``SMALL_NUMEL_LIMIT`` (64; SGLang itself takes it there above 63 experts, and its CUDA
  single-block kernel, also one launch, at fewer); above that, the CUDA kernel's result is computed before timing
  (in torch, outside the graph), so those cells leave the incumbent's alignment out, which favours it;
* activation: the wheel's Triton ``act_and_mul_triton`` for SGLang's CUDA ``silu_and_mul``;
* top-k sum: ``torch.add`` for top-2, the wheel's ``moe_sum_reduce_triton`` otherwise (SGLang's own
  choice up to 32 tokens; its CUDA ``moe_sum_reduce`` above).

The config is SGLang's own lookup (``try_get_optimal_moe_config``): its shipped file for the device (or the card
:func:`load` is told to look up) and shape where one exists (nearest M), else its default rule;
:attr:`Incumbent.config_source` says which.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import torch

#: The wheel's modules this loads (their package __init__ files are not run).
KERNELS = "sglang.kernels.ops.moe.fused_moe_triton_kernels"
ALIGN = "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size"
CONFIG = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"


class _Setting:
    """A stand-in server setting: off."""

    def get(self) -> bool:
        return False


class _Settings:
    def __getattr__(self, name: str) -> _Setting:
        return _Setting()


def _unavailable(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is not part of a bf16 call (a stand-in from the incumbent benchmark)")

    return call


def _align_stand_in(topk_ids: torch.Tensor, buckets: int, block_size: int, sorted_ids: torch.Tensor,
                    expert_ids: torch.Tensor, post_pad: torch.Tensor, cumsum: torch.Tensor, *_: Any) -> None:
    """What SGLang's CUDA alignment writes (its "+1 offset" buckets: expert e in bucket e + 1): up to
    ``SMALL_NUMEL_LIMIT`` pairs by the wheel's single-launch Triton kernel (its buffer contract is the CUDA
    kernel's), else in torch, eagerly: pairs in bucket order, each bucket padded to ``block_size`` with the
    pair count, each block's expert."""
    from sglang.kernels.ops.moe.moe_align_small_numel import SMALL_NUMEL_LIMIT, moe_align_small_numel

    if topk_ids.numel() <= SMALL_NUMEL_LIMIT:
        moe_align_small_numel(topk_ids, buckets, block_size, sorted_ids, expert_ids, post_pad)
        return
    bucket = topk_ids.view(-1).long() + 1
    numel = bucket.numel()
    counts = torch.bincount(bucket, minlength=buckets)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(bucket, stable=True)
    first_in_order = torch.cumsum(counts, 0) - counts
    b = bucket[order]
    slots = (ends - padded)[b] + torch.arange(numel, device=b.device) - first_in_order[b]
    sorted_ids.fill_(numel)
    sorted_ids[slots] = order.to(torch.int32)
    blocks = torch.arange(expert_ids.numel(), device=b.device) * block_size
    expert_ids.copy_((torch.searchsorted(ends, blocks, right=True) - 1).to(torch.int32))
    post_pad[0] = ends[-1]


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load(root: str | Path, device_name: str | None = None) -> dict[str, types.ModuleType]:
    """The wheel's kernel, alignment and config modules, imported from ``root`` (which holds ``sglang/``); with
    ``device_name`` (``"NVIDIA H200"``), its config lookup reads that card's shipped files instead of this one's."""
    root = Path(root).resolve()
    if not (root / "sglang" / "kernels" / "ops" / "moe" / "fused_moe_triton_kernels.py").is_file():
        raise FileNotFoundError(f"--sglang {root}: no sglang/kernels/ops/moe/fused_moe_triton_kernels.py there; "
                                "unzip the sglang wheel's sglang/kernels and sglang/srt/layers/moe into it")
    # Packages whose __init__ would import the server: bare modules with the wheel's folders as their path.
    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.srt", "sglang.srt.layers",
                "sglang.srt.layers.moe", "sglang.srt.layers.moe.moe_runner"):
        _stub(pkg, __path__=[str(root.joinpath(*pkg.split(".")))])
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    _stub("sglang.kernels.ops.moe", __path__=[str(root / "sglang/kernels/ops/moe")],
          moe_align_block_size=_align_stand_in)
    _stub("sglang.srt.layers.moe.moe_runner.triton_utils",
          __path__=[str(root / "sglang/srt/layers/moe/moe_runner/triton_utils")], get_config=lambda: None)
    _stub("sglang.kernels.jit", __path__=[])
    _stub("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: sm90)
    _stub("sglang.kernels.ops.quantization", __path__=[])
    _stub("sglang.kernels.ops.quantization.fp8_kernel", per_token_group_quant_fp8=_unavailable("fp8 quant"),
          scaled_fp8_quant=_unavailable("fp8 quant"), sglang_per_token_group_quant_fp8=_unavailable("fp8 quant"))
    _stub("sglang.kernels.ops.quantization.int8_kernel", per_token_group_quant_int8=_unavailable("int8 quant"),
          per_token_quant_int8=_unavailable("int8 quant"),
          sglang_per_token_group_quant_int8=_unavailable("int8 quant"))
    _stub("sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False)
    _stub("sglang.srt.environ", envs=_Settings())
    _stub("sglang.srt.layers.moe.utils", get_moe_padding_size=lambda *a: 0)
    exec_ctx = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    _stub("sglang.srt.runtime_context", get_exec=lambda: exec_ctx)
    _stub("sglang.srt.utils", cpu_has_amx_support=lambda: False, is_cpu=lambda: False, is_cuda=lambda: True,
          is_hip=lambda: False, is_musa=lambda: False, is_xpu=lambda: False, is_sm90_supported=lambda: sm90,
          get_device_name=lambda device_id=0: device_name or torch.cuda.get_device_name(device_id))
    return {name: importlib.import_module(name) for name in (KERNELS, ALIGN, CONFIG)}


class Incumbent:
    """SGLang's fused MoE for calls shaped like ``(x, w1, w2, topk_weights, topk_ids)``, bf16 or fp16."""

    def __init__(self, mods: dict[str, types.ModuleType], x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                 topk_ids: torch.Tensor) -> None:
        self.k, self.align, cfg = mods[KERNELS], mods[ALIGN], mods[CONFIG]
        M, topk, E = x.shape[0], topk_ids.shape[1], w1.shape[0]
        self.E = E
        found = cfg.get_moe_configs(E, w2.shape[2], None, 0, 0, False, False)
        # The card whose files the lookup read (load's device_name where given), so a row says whose config it timed.
        self.config_source = f"shipped for {cfg.get_device_name()}" if found else "default rule"
        config, (down, _) = cfg.try_get_optimal_moe_config(w1.shape, w2.shape, topk, None, M,
                                                           return_down_config=True)
        self.config = dict(config)
        self.config.pop("USE_TMA", None)  # up-projection TMA: not in any file for these shapes
        self.down_tma = bool(down and down.pop("USE_TMA", False) and self.k.support_tensor_descriptor())
        self.down = down
        if self.down_tma:
            self.config_source += " (+ TMA down config)"
        self.in_graph_align = topk_ids.numel() <= self.align.SMALL_NUMEL_LIMIT
        self.notes = ("alignment: " + ("wheel's Triton small-numel kernel, in the graph" if self.in_graph_align
                                       else "CUDA kernel's result computed before timing (left out)")
                      + "; activation: act_and_mul_triton; sum: "
                      + ("torch.add" if topk == 2 else "moe_sum_reduce_triton"))

    def aligned(self, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The alignment's three outputs for these ids (for the cells that time it outside the graph)."""
        return self.align.moe_align_block_size(topk_ids, self.config["BLOCK_SIZE_M"], self.E)

    def __call__(self, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, aligned: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        import triton.language as tl

        k, config = self.k, self.config
        M, topk, E, two_n = x.shape[0], topk_ids.shape[1], w1.shape[0], w1.shape[1]
        if aligned is None:
            aligned = self.align.moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)
        sorted_ids, expert_ids, post_pad = aligned
        compute = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16
        pad = min(M * topk, E + 1) * (config["BLOCK_SIZE_M"] - 1) if self.down_tma else 0
        cache1 = torch.empty((M * topk + pad, two_n), device=x.device, dtype=x.dtype)
        common = dict(compute_type=compute, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False, block_shape=None, filter_expert=True)
        k.invoke_fused_moe_kernel(x, w1, None, cache1, None, None, None, topk_weights, topk_ids, sorted_ids,
                                  expert_ids, post_pad, False, topk, config, c_sorted=self.down_tma, **common)
        cache2 = torch.empty((M * topk + pad, two_n // 2), device=x.device, dtype=x.dtype)
        k.act_and_mul_triton(cache1, cache2, config, topk_ids, expert_ids, self.down_tma, "silu")
        cache3 = torch.empty((M, topk, w2.shape[1]), device=x.device, dtype=x.dtype)
        k.invoke_fused_moe_kernel(cache2, w2, None, cache3, None, None, None, topk_weights, topk_ids, sorted_ids,
                                  expert_ids, post_pad, True, 1, self.down or config, a_use_tma=self.down_tma,
                                  b_use_tma=self.down_tma, router_topk=topk, **common)
        out = torch.empty_like(x)
        if topk == 2:
            torch.add(cache3[:, 0], cache3[:, 1], out=out)
        else:
            k.moe_sum_reduce_triton(cache3, out, 1.0)
        return out
