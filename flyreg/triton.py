"""Triton plumbing for kernel plugins: a precompiled fast launch, dependent launches, interpreter detection.

Imported only by plugins that use it (``import flyreg`` never imports Triton); an op declared with
``flyreg.plugin.triton_op`` launches through :func:`compiled_launcher` without naming this module. What it offers:

* :func:`compiled_launcher`: a ``@triton.jit`` kernel, its grid, constexprs and compiler hints,
  compiled once for one call signature and launched through the compiled kernel's C launcher,
  skipping ``kernel[grid](...)``'s per-call argument binding and cache lookup (about 10 us of
  host time per call on the H200's host). It falls back to ``kernel[grid]`` where the shortcut
  would be wrong: Triton's interpreter, a Triton older than :data:`MIN_TRITON`, a launch hook or
  a pre-run hook set (profilers read launch metadata), or a tensor whose address is not 16-byte
  aligned where the binary was compiled for an aligned one.
* :func:`compiled_registers`: the registers a thread of that binary takes (to size a ``maxnreg``).
* :func:`pdl_supported` / :func:`resolve_pdl` and the jit helper :func:`dependent_start`:
  programmatic dependent launch on Hopper and later.
* :func:`interpreted`: whether Triton runs kernels in its interpreter.

Example (a kernel ``_double(X, Y, n, BLOCK: tl.constexpr)`` launched on ``x``)::

    launch = compiled_launcher(_double, (triton.cdiv(n, 1024),), (x, y, n), {"BLOCK": 1024},
                               hints(num_warps=4), x.device)
    launch(x, y, n)
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
import triton
import triton.language as tl

try:  # grid dependency control: Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton launches without it
    gdc_launch_dependents = gdc_wait = None

__all__ = ["ALIGN", "MIN_TRITON", "compiled_launcher", "compiled_registers", "dependent_start", "hints", "interpreted",
           "pdl_supported", "resolve_pdl"]

#: Pointer alignment Triton specializes tensor arguments on.
ALIGN = 16
#: Oldest Triton whose ``CompiledKernel.run`` takes (grid, stream, function, metadata, hooks, every
#: argument constexprs included) and keeps launch hooks as ``knobs.runtime`` HookChains: 3.6 was run
#: on the H200; 3.9's source has the same interface.
MIN_TRITON = (3, 6)
#: Held while a compiled kernel's binary is loaded and its launch handles read.
_LOAD_LOCK = threading.Lock()


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


FAST = _version(triton.__version__) >= MIN_TRITON
if FAST:
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET``, as Triton reads it)."""
    tk = getattr(triton, "knobs", None)
    if tk is not None and hasattr(tk, "runtime"):
        return bool(tk.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can launch as programmatic dependents: a CUDA device of compute
    capability 9.0 or later, a compiled (not interpreted) Triton that has ``launch_pdl``."""
    if device.type != "cuda" or gdc_wait is None or interpreted():
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - no NVIDIA backend
        return False
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return "launch_pdl" in fields and torch.cuda.get_device_capability(device)[0] >= 9


def resolve_pdl(device: torch.device, pdl: bool | None) -> bool:
    """A ``pdl=`` argument resolved: None is :func:`pdl_supported`; True must be supported (else ValueError)."""
    if pdl is None:
        return pdl_supported(device)
    if pdl and not pdl_supported(device):
        raise ValueError(f"pdl=True needs a CUDA device of compute capability 9.0 or later and a compiled Triton "
                         f"with launch_pdl; got device {device}")
    return bool(pdl)


@triton.jit
def dependent_start(PDL: tl.constexpr):
    # A programmatic dependent waits for the kernel before it (its writes visible), then lets the
    # next launch start as soon as every program of this one has started.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def hints(num_warps: int | None = None, num_stages: int | None = None, pdl: bool = False) -> dict[str, int | bool]:
    """The compiler hints of a launch: those set, plus ``launch_pdl`` for a dependent launch."""
    out: dict[str, int | bool] = {"launch_pdl": True} if pdl else {}
    if num_warps is not None:
        out["num_warps"] = num_warps
    if num_stages is not None:
        out["num_stages"] = num_stages
    return out


def _compile(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
             hints: Mapping[str, Any], device: torch.device) -> Any:
    """``kernel``'s CompiledKernel for these arguments, compiled or loaded from Triton's cache (not yet loaded)."""
    with torch.cuda.device(device):
        compiled = kernel.warmup(*args, grid=grid, **constexprs, **hints)
        return compiled.result() if hasattr(compiled, "result") else compiled  # an async-compile future


def compiled_registers(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
                       hints: Mapping[str, Any], device: torch.device) -> int:
    """The registers a thread of ``kernel``'s binary takes, compiled as :func:`compiled_launcher` compiles it
    (same arguments). Raises RuntimeError under Triton's interpreter, which compiles nothing."""
    if interpreted():
        raise RuntimeError("compiled_registers: Triton runs kernels in its interpreter here, so there is no binary")
    compiled = _compile(kernel, grid, args, constexprs, hints, device)
    with torch.cuda.device(device), _LOAD_LOCK:  # loading the binary sets n_regs (the lock: compiled_launcher)
        compiled._init_handles()
        return int(compiled.n_regs)


def compiled_launcher(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
                      hints: Mapping[str, Any], device: torch.device) -> Callable[..., None]:
    """``launch(*runtime_args)`` of ``kernel`` with these ``constexprs`` and compiler ``hints``.

    ``args`` are example runtime arguments (in the kernel's parameter order, without the
    constexprs); every later call must pass arguments of the same types, integer values and
    tensor dtypes. The binary is compiled (or loaded from Triton's cache) here, specialized like
    ``args`` (alignment included), so compile errors such as running out of shared memory are
    raised here, not at the first launch. Like ``kernel[grid]``, a launch expects the tensors'
    device to be the current CUDA device.
    """
    generic = kernel[grid]

    def slow(*a: Any) -> None:
        generic(*a, **constexprs, **hints)

    if not FAST or not isinstance(kernel, JITFunction):  # Triton's interpreter, or an unchecked Triton
        return slow
    names = kernel.arg_names[len(args):]
    # A constexpr a launch leaves out takes the kernel's own default.
    defaults = {p.name: p.default for p in kernel.params if p.default is not inspect.Parameter.empty}
    missing = [n for n in names if n not in constexprs and n not in defaults]
    if missing:
        raise TypeError(f"{kernel}: constexprs {missing} not given")
    const_vals = tuple(constexprs[n] if n in constexprs else defaults[n] for n in names)
    compiled = _compile(kernel, grid, args, constexprs, hints, device)
    with torch.cuda.device(device):
        # .run loads the binary, but Triton sets it before the load ends: another thread binding the same
        # binary could read .function as None (seen on the H200 when configs share one binary).
        with _LOAD_LOCK:
            run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    g0, g1, g2 = (*grid, 1, 1)[:3]
    stream_of = driver.active.get_current_stream
    dev = device.index if device.index is not None else torch.cuda.current_device()
    runtime = knobs.runtime
    pre_run = kernel.pre_run_hooks
    # Tensors the binary assumes 16-byte aligned (as they were here); a later misaligned one goes the slow way.
    tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.data_ptr() % ALIGN == 0)

    def launch(*a: Any) -> None:
        ptrs = 0
        for i in tensors:
            ptrs |= a[i].data_ptr()
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        # Launch hooks are HookChains, empty unless something added to one.
        if (ptrs % ALIGN or pre_run or (enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True))):
            slow(*a)
            return
        run(g0, g1, g2, stream_of(dev), function, packed, None, None, None, *a, *const_vals)

    return launch
