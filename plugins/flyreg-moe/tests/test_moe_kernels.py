"""Correctness of the fused-MoE kernels (Triton and CPU) against a float32 reference on fresh random inputs.

Without a GPU the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set in
conftest.py) on CPU tensors at tiny shapes; tests marked ``gpu`` run the model shapes on CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

from flyreg.plugin import Config
from flyreg_moe import cpu, space

from moe_cases import TOL, call, reference, rel_err

try:
    from flyreg_moe import triton_moe
except ImportError:  # triton not installed
    triton_moe = None

HAS_CUDA = torch.cuda.is_available()
TRITON_OK = triton_moe is not None and (HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="triton not importable, or no GPU and no interpreter")
DEVICE = "cuda" if HAS_CUDA else "cpu"

#: (M, E, N, K, topk, routing): M = 0, 1, 7 and many; topk = 1; N and K not powers of two; one expert
#: taking every pair; experts with no token.
CASES = [
    (0, 4, 48, 40, 2, "random"),
    (1, 4, 48, 40, 1, "random"),
    (7, 8, 48, 40, 2, "random"),
    (7, 6, 40, 56, 3, "one"),
    (40, 8, 24, 40, 2, "skewed"),
]
#: Small tiles for the interpreter: plain, split GEMM 2 with groups, 32-row tiles.
TILES = [
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "SPLIT_K": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 1},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}-E{}-N{}-K{}-top{}-{}".format(*c))
def test_cpu_backend_matches_reference_for_every_expert_group(case: tuple) -> None:
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, routing=routing)
    ref = reference(*args)
    for config in space.cpu_configs({"M": max(M, 1), "E": E, "N": N, "K": K, "topk": topk}):
        out = cpu.fused_moe_cpu(*args, **config.kwargs)
        assert out.shape == (M, K) and out.dtype == torch.bfloat16
        if M:
            assert rel_err(out, ref) < TOL[torch.bfloat16], config


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}-E{}-N{}-K{}-top{}-{}".format(*c))
def test_triton_kernels_match_reference(case: tuple) -> None:
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, device=DEVICE, routing=routing, seed=1)
    ref = reference(*args)
    tiles = TILES if M == 7 else TILES[:1]  # every tile config once, at one M, to keep the interpreter quick
    for knobs in tiles:
        out = triton_moe.fused_moe_triton(*args, **knobs, num_warps=4)
        assert out.shape == (M, K) and out.dtype == torch.bfloat16
        if M:
            assert rel_err(out, ref) < TOL[torch.bfloat16], knobs


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_unfused_silu_and_float16(dtype: torch.dtype) -> None:
    args = call(9, 4, 40, 48, 2, dtype=dtype, device=DEVICE, seed=2)
    ref = reference(*args)
    for fused in (True, False):
        out = triton_moe.fused_moe_triton(*args, **TILES[1], fused_silu=fused)
        assert out.dtype == dtype and rel_err(out, ref) < TOL[dtype]


@needs_triton
def test_bound_launcher_serves_new_values_of_the_same_signature() -> None:
    first = call(7, 8, 48, 40, 2, device=DEVICE, seed=3)
    run = triton_moe.bind_fused_moe(*first, **TILES[0])
    second = call(7, 8, 48, 40, 2, device=DEVICE, routing="skewed", seed=4)
    assert rel_err(run(*second), reference(*second)) < TOL[torch.bfloat16]


@needs_triton
def test_out_of_range_expert_is_an_error_at_bind() -> None:
    x, w1, w2, tw, ids = call(3, 4, 32, 32, 2, device=DEVICE)
    ids[1, 0] = 4
    with pytest.raises(ValueError, match=r"topk_ids must be expert indices in \[0, 4\)"):
        triton_moe.bind_fused_moe(x, w1, w2, tw, ids, **TILES[0])


def test_knobs_are_checked() -> None:
    if triton_moe is None:
        pytest.skip("triton not importable")
    args = call(3, 4, 32, 32, 2)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        triton_moe.bind_fused_moe(*args, **{**TILES[0], "BLOCK_K": 24})
    with pytest.raises(ValueError, match="SPLIT_K must be an int >= 1"):
        triton_moe.bind_fused_moe(*args, **{**TILES[0], "SPLIT_K": 0})


gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
MODEL = {"Mixtral-8x7B": (8, 4096, 14336, 2), "Qwen3-30B-A3B": (128, 2048, 768, 8),
         "DeepSeek-V2-Lite": (64, 2048, 1408, 6), "gpt-oss-20b": (32, 2880, 2880, 4)}


def _gpu_call(M: int, shape: tuple[int, int, int, int], dtype: torch.dtype = torch.bfloat16) -> tuple:
    from flyreg_moe.ops import make_moe_inputs

    E, K, N, topk = shape
    return make_moe_inputs(M, E, N, K, topk, dtype, "cuda", seed=M)


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [1, 7, 300, 2048])
def test_gpu_default_config_on_model_shapes(model: str, M: int) -> None:
    E, K, N, topk = MODEL[model]
    args = _gpu_call(M, MODEL[model])
    spec = {"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk}
    config = space.triton_default(spec)
    out = triton_moe.fused_moe_triton(*args, **config.kwargs, **config.hints)
    assert rel_err(out, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16]


@gpu
@needs_cuda
@pytest.mark.parametrize("M", [5, 600])
def test_gpu_sample_of_the_space(M: int) -> None:
    E, K, N, topk = MODEL["gpt-oss-20b"]
    args = _gpu_call(M, MODEL["gpt-oss-20b"], torch.float16)
    ref = cpu.fused_moe_reference(*args)
    space_ = space.triton_configs({"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk})
    for config in space_[:: max(1, len(space_) // 12)]:
        out = triton_moe.fused_moe_triton(*args, **config.kwargs, **config.hints)
        assert rel_err(out, ref) < TOL[torch.float16], config


@gpu
@needs_cuda
def test_gpu_unfused_and_graph_capture() -> None:
    args = _gpu_call(33, MODEL["DeepSeek-V2-Lite"])
    ref = cpu.fused_moe_reference(*args)
    config = Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 2}, num_warps=4)
    run = triton_moe.bind_fused_moe(*args, **config.kwargs, **config.hints, fused_silu=False)
    assert rel_err(run(*args), ref) < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
