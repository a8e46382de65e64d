"""The PTX of an RMSNorm plugin kernel for one config, compiled for a GPU target without a GPU.

    python plugins/flyreg-rmsnorm/bench/kernel_ptx.py --M 4096 --N 8192 --block-n 8192 [--rows 1] [--warps 8] [--stages N]
        [--dtype bfloat16] [--fused] [--no-pdl] [--arch 90] [--all] [--out k.ptx]

Compiles ``_rmsnorm_kernel`` (``--fused``: ``_fused_add_rmsnorm_kernel``) with the constexprs a
launch on dense rows would bind (``_constexprs``) and 16-byte aligned pointers, as the JIT
specializes them, then prints the memory, barrier, shuffle and grid-dependency instructions in
program order: where each load is issued relative to the reduction. ``--all`` prints the whole
PTX; ``--out`` writes it to a file. Needs Triton's NVIDIA backend, not a device. A ``RESCUE_AFTER``
kernel (``triton_kernels.rescue_mode``) compiles here without the ``maxnreg`` cap its bind adds
(``_capped``, which needs the device to read the rescue-free kernel's registers).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget

TYPES = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}
#: PTX instructions that show the kernel's schedule.
SHOWN = re.compile(r"\b(ld\.global|st\.global|griddepcontrol|bar\.sync|shfl\.sync|createpolicy|ret;)")


def compile_config(module: Any, op: str, dtype: str, M: int, N: int, block_n: int, rows: int, warps: int,
                   stages: int | None, arch: int, pdl: bool = True,
                   maxnreg: int | None = None) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``module``'s kernel of ``op`` (a ``flyreg_rmsnorm.triton_kernels``) compiled for compute capability
    ``arch`` the way a launch on dense M x N rows of ``dtype`` binds it (the launch's constexprs, 16-byte
    aligned pointers as the JIT specializes them): the compiled kernel, its constexprs and its options."""
    ptr = TYPES[dtype]
    # Kernels with the overflow rescue take the launch's RESCUE mode; older ones (a --before file) have none.
    rescue = ({"rescue": module.rescue_mode(getattr(torch, dtype), block_n, rows, warps)}
              if hasattr(module, "rescue_mode") else {})
    if op == "fused_add_rmsnorm":
        kernel = module._fused_add_rmsnorm_kernel
        sig = {"X": ptr, "R": ptr, "W": ptr, "Y": ptr, "M": "i32", "stride_x": "i32", "stride_r": "i32", "eps": "fp32"}
        consts = module._constexprs(M, N, block_n, rows, pdl, N, N, **rescue)
    else:
        kernel = module._rmsnorm_kernel
        sig = {"X": ptr, "W": ptr, "Y": ptr, "M": "i32", "stride_x": "i32", "eps": "fp32"}
        consts = module._constexprs(M, N, block_n, rows, pdl, N, **rescue)
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    src = triton.compiler.ASTSource(fn=kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    options = {"num_warps": warps, **({"num_stages": stages} if stages else {}), **({"launch_pdl": True} if pdl else {}),
               **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options), consts, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, required=True, help="rows (sets MASK_ROWS and the index width)")
    ap.add_argument("--N", type=int, required=True)
    ap.add_argument("--block-n", type=int, required=True)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=None)
    ap.add_argument("--dtype", choices=sorted(TYPES), default="bfloat16")
    ap.add_argument("--fused", action="store_true", help="the fused_add_rmsnorm kernel")
    ap.add_argument("--no-pdl", action="store_true", help="compile without programmatic dependent launch")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for the H200")
    ap.add_argument("--all", action="store_true", help="print the whole PTX")
    ap.add_argument("--out", default=None, help="also write the PTX here")
    args = ap.parse_args()
    from flyreg.triton import interpreted
    from flyreg_rmsnorm import triton_kernels as tk

    if interpreted():
        ap.error("TRITON_INTERPRET is set: the kernels are interpreted, not compiled; unset it")
    compiled, consts, options = compile_config(tk, "fused_add_rmsnorm" if args.fused else "rmsnorm", args.dtype, args.M, args.N,
                              args.block_n, args.rows, args.warps, args.stages, args.arch, pdl=not args.no_pdl)
    ptx = compiled.asm["ptx"]
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(ptx)
    print(f"{compiled.name} {args.dtype} M={args.M} N={args.N} {consts} {options}")
    for n, line in enumerate(ptx.splitlines(), 1):
        if args.all or SHOWN.search(line):
            print(f"{n:6d}  {line.strip()}")


if __name__ == "__main__":
    main()
