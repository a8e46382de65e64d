"""A Triton kernel compiled once and launched through its C launcher, skipping ``kernel[grid]``'s per-call work.

``kernel[grid](...)`` binds the arguments, computes their specialization and looks the binary up
on every call (about 10 us of host time on the H200's host). A bound launch knows all of that
for its call signature already, so it calls the compiled kernel's launcher directly. It falls
back to ``kernel[grid]`` where the shortcut would be wrong: Triton's interpreter, a Triton older
than the launcher interface this was checked against (3.6), a launch hook or a pre-run hook set
(profilers read launch metadata), or a tensor whose address is not 16-byte aligned where the
binary was compiled for an aligned one. Like ``kernel[grid]``, it expects the tensors' device to
be the current CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import triton

#: Pointer alignment Triton specializes tensor arguments on.
ALIGN = 16
#: Oldest Triton whose ``CompiledKernel.run`` takes (grid, stream, function, metadata, hooks, every
#: argument constexprs included) and keeps launch hooks as ``knobs.runtime`` HookChains: 3.6 was run
#: on the H200; 3.9's source has the same interface.
MIN_TRITON = (3, 6)


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


def compiled_launcher(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
                      hints: Mapping[str, Any], device: torch.device) -> Callable[..., None]:
    """``launch(*runtime_args)`` of ``kernel`` with these ``constexprs`` and compiler ``hints``.

    ``args`` are example runtime arguments (in the kernel's parameter order, without the
    constexprs); every later call must pass arguments of the same types, integer values and
    tensor dtypes. The binary is compiled (or loaded from Triton's cache) here, specialized like
    ``args`` (alignment included), so compile errors such as running out of shared memory are
    raised here, not at the first launch.
    """
    generic = kernel[grid]

    def slow(*a: Any) -> None:
        generic(*a, **constexprs, **hints)

    if not FAST or not isinstance(kernel, JITFunction):  # Triton's interpreter, or an unchecked Triton
        return slow
    names = kernel.arg_names[len(args):]
    missing = [n for n in names if n not in constexprs]
    if missing:
        raise TypeError(f"{kernel}: constexprs {missing} not given")
    const_vals = tuple(constexprs[n] for n in names)
    with torch.cuda.device(device):
        compiled = kernel.warmup(*args, grid=grid, **constexprs, **hints)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled  # an async-compile future
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata  # .run loads the binary
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
