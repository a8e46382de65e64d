"""A Triton kernel compiled once and launched through its C launcher, skipping ``kernel[grid]``'s per-call work.

``kernel[grid](...)`` binds the arguments, computes their specialization and looks the binary up
on every call (about 10 us of host time on the H200's host). A bound launch knows all of that
for its call signature already, so it calls the compiled kernel's launcher directly. It falls
back to ``kernel[grid]`` where the shortcut would be wrong: Triton's interpreter, a launch hook
set (profilers read launch metadata), or a tensor whose address is not 16-byte aligned while the
binary was specialized for aligned ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

#: Pointer alignment Triton specializes tensor arguments on.
ALIGN = 16


def compiled_launcher(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: Mapping[str, Any],
                      hints: Mapping[str, Any], device: torch.device) -> Callable[..., None]:
    """``launch(*runtime_args)`` of ``kernel`` with these ``constexprs`` and compiler ``hints``.

    ``args`` are example runtime arguments (in the kernel's parameter order, without the
    constexprs); every later call must pass arguments of the same types, integer values and
    tensor dtypes. The binary is compiled (or loaded from Triton's cache) here, so compile
    errors such as running out of shared memory are raised here, not at the first launch.
    """
    generic = kernel[grid]
    if not isinstance(kernel, JITFunction):  # Triton's interpreter: no binary to call
        def interpreted(*a: Any) -> None:
            generic(*a, **constexprs, **hints)

        return interpreted
    names = kernel.arg_names[len(args):]
    missing = [n for n in names if n not in constexprs]
    if missing:
        raise TypeError(f"{kernel.__name__ if hasattr(kernel, '__name__') else kernel}: constexprs {missing} not given")
    const_vals = tuple(constexprs[n] for n in names)
    with torch.cuda.device(device):
        compiled = kernel.warmup(*args, grid=grid, **constexprs, **hints)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled  # an async-compile future
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata  # .run loads the binary
    g0, g1, g2 = (*grid, 1, 1)[:3]
    aligned = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.data_ptr() % ALIGN == 0)
    stream_of = driver.active.get_current_stream
    dev = device.index if device.index is not None else torch.cuda.current_device()
    runtime = knobs.runtime

    def launch(*a: Any) -> None:
        ptrs = 0
        for i in aligned:
            ptrs |= a[i].data_ptr()
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        # Triton >= 3.5 keeps each hook as a HookChain, empty unless something added to it.
        if (ptrs % ALIGN or (enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True))):
            generic(*a, **constexprs, **hints)
            return
        run(g0, g1, g2, stream_of(dev), function, packed, None, None, None, *a, *const_vals)

    return launch
