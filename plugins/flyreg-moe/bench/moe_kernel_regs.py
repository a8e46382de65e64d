"""Registers, spills and shared memory of the fused-MoE GEMM kernels, against a variant's, without a GPU.

Each distinct GEMM binary (GEMM 1 and GEMM 2) of the shipped Triton artifacts (``--served``) or of one
spec's pruned space (``--spec E,K,N,topk,M``) is compiled twice for compute capability ``--arch``: with
the weight tiles by pointer loads and no tail tiles (GEMM 2 as wide as the config makes it), and
with ``--variant``'s knobs (``TMA``, ``TAILS=2``, ``BLOCK_N_DOWN=256``, ``ONE_DOT``, ``MASK_PAD`` or a mix
such as ``TMA,TAILS=2``), as a launch on aligned bf16 tensors binds it;
the ``ptxas -v`` Triton itself uses then gives the registers and spill bytes (the counts a device reports
for the same Triton). Also counted in the PTX: wgmma, cp.async and TMA copy instructions, and 2-byte global loads
(scalar: not vectorized).

    python plugins/flyreg-moe/bench/moe_kernel_regs.py --served [--variant TMA] --json regs.json
    python plugins/flyreg-moe/bench/moe_kernel_regs.py --spec 32,2880,2880,4,2048 --variant TMA,TAILS=2 --json regs.json
    python plugins/flyreg-moe/bench/moe_kernel_regs.py --tile 128,128,64,8,4,2880,2880 --variant TMA --json regs.json
    python plugins/flyreg-moe/bench/moe_kernel_regs.py --routing --json regs.json
    python plugins/flyreg-moe/bench/moe_kernel_regs.py --decode --json regs.json
    python plugins/flyreg-moe/bench/moe_kernel_regs.py --pair 128,2048,768,8 [--stages 4] --json regs.json

``--decode`` compiles the decode path's two kernels for each decode config of the shipped artifacts, and of the
default at their specs, as
programmatic dependents (Hopper), and also counts their atomics and grid-dependency instructions. ``--pair
E,K,N,topk`` does the same for the pair path's two kernels under each pair config that spec's space offers (those of
``--stages`` stages only, where given).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget

import flyreg_moe
from flyreg_moe import gemm_kernels as gk
from flyreg_moe import space

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): what makes a GEMM binary (GROUP_M, SPLIT_K are runtime).
Tile = tuple[int, int, int, int, int]
#: (tile, K, N, whether GEMM 2 is split, GEMM 2's width where it is not BLOCK_N): one GEMM binary of each kind.
Binary = tuple[Tile, int, int, bool, "int | None"]
COUNTED = {"wgmma": r"wgmma\.mma_async", "cp_async": r"cp\.async\.c[ag]", "tma": r"cp\.async\.bulk\.tensor",
           "atomic": r"\batom\.", "griddep": r"griddepcontrol\.",
           "scalar_b16_loads": r"ld\.global(?:\.[a-z0-9:]+)*\.[bu]16\s"}  # 2-byte loads: not vectorized


def compile_gemm(which: str, tile: Tile, K: int, N: int, partial: bool, arch: int, tma: bool = False,
                 tails: int = 0, bn_down: int | None = None, one_dot: bool = False, mask_pad: bool = False) -> Any:
    """GEMM 1 (``gate_up``, SiLU fused) or GEMM 2 (``down``, ``bn_down`` columns wide where given) for this tile,
    shape and knobs, compiled for ``arch``."""
    bm, bn, bk, warps, stages = tile
    if which == "down" and bn_down:
        bn = bn_down
    w = f"tensordesc<bf16[{bn},{bk}]>" if tma else "*bf16"
    if which == "gate_up":
        fn = gk._gate_up_kernel
        if tma and one_dot:
            w = f"tensordesc<bf16[2,{bn},{bk}]>"  # w1 as [E * 2, N, K]
        types = ["*bf16", w, "*bf16", "*i32", "*i32", "*i32"] + ["i32"] * 7  # X W1 H SORTED BLOCK_EXPERT USED, ints
        consts = {"EVEN_K": K % bk == 0, "EVEN_N": N % bn == 0, "ONE_DOT": one_dot}
    else:
        fn = gk._down_kernel
        types = ["*bf16", w, "*fp32" if partial else "*bf16", "*i32", "*i32", "*i32", "*fp32"] + ["i32"] * 7
        consts = {"PARTIAL": partial, "EVEN_K": N % bk == 0, "EVEN_N": K % bn == 0}
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **consts, "UPCAST": False, "TMA": tma, "TAILS": tails,
              "PDL": arch >= 90, "MASK_PAD": mask_pad}  # launched as programmatic dependents from Hopper on
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}  # a kernel from before a knob lacks it
    return compile_kernel(fn, types, consts, arch, warps, stages)


def compile_kernel(fn: Any, types: list[str], consts: dict[str, Any], arch: int, warps: int = 4,
                   stages: int | None = None) -> Any:
    """``fn`` compiled for ``arch`` with these runtime argument ``types`` (in order) and ``consts``; pointers and
    the strides a launch passes divisible by 16 (``x_stride``, ``N``, ``K``) are specialized so, as the JIT does."""
    sig = dict(zip(fn.arg_names, types))
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
             if ty.startswith("*") or name in ("x_stride", "N", "K")}
    src = triton.compiler.ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts,
                                    attrs=attrs)
    options = {"num_warps": warps, **({"num_stages": stages} if stages is not None else {})}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def described(build: Callable[[], Any], arch: int) -> dict[str, Any]:
    """:func:`describe` of the kernel ``build()`` compiles; a failed compile is a result too, its error the entry."""
    try:
        return describe(build(), arch)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def variant(text: str) -> dict[str, Any]:
    """``TMA``, ``TAILS=2``, ``BLOCK_N_DOWN=256``, ``ONE_DOT``, ``MASK_PAD`` or a comma-separated mix: the knobs of
    the compared binaries."""
    out: dict[str, Any] = {}
    flags = {"TMA": "tma", "ONE_DOT": "one_dot", "MASK_PAD": "mask_pad"}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name in flags and not value:
            out[flags[name]] = True
        elif name == "TAILS" and value in ("1", "2"):
            out["tails"] = int(value)
        elif name == "BLOCK_N_DOWN" and value.isdigit() and int(value) >= 16 and not int(value) & (int(value) - 1):
            out["bn_down"] = int(value)
        else:
            raise argparse.ArgumentTypeError("--variant takes TMA, ONE_DOT, MASK_PAD, TAILS=1 or 2 and "
                                             f"BLOCK_N_DOWN=<a power of two >= 16>, comma-separated; got {part!r}")
    return out


def ptxas_counts(ptx: str, arch: int) -> tuple[int | None, int | None]:
    """(registers, spill-store bytes) that the ptxas Triton itself uses for ``arch`` reports for ``ptx``."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        Path(path).write_text(ptx, encoding="utf-8")
        err = subprocess.run([str(ptxas), f"-arch=sm_{arch}a", "-v", path, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    return (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)


def describe(kernel: Any, arch: int) -> dict[str, Any]:
    """Registers, spills, shared memory and instruction counts of ``kernel``; also its widest wgmma's N and how many
    distinct source-size operands its 16-byte cp.async copies take (one a stage where every row loads alike; more
    where rows are masked apart, as ``MASK_PAD`` masks padding slots)."""
    ptx = kernel.asm["ptx"]
    regs, spill = ptxas_counts(ptx, arch)
    widths = [int(n) for n in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n(\d+)k\d+", ptx)]
    sizes = set(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], 0x10, (%r\d+);", ptx))
    return {"regs": regs, "spill_bytes": spill, "smem": kernel.metadata.shared,
            **{name: len(re.findall(pat, ptx)) for name, pat in COUNTED.items()},
            "wgmma_widest_n": max(widths, default=0), "copy_sizes": len(sizes)}


def routing_counts(arch: int) -> list[dict[str, Any]]:
    """The routing kernel for 16, 64, 128 and 512 experts (two chunks of pairs a program): one launch without the tile
    table (128-row runs), and reading the count launch's counts with it (64-row runs); and the count kernel."""
    from flyreg_moe import routing

    rows = []
    for e_p2 in (16, 64, 128, 512):
        row: dict[str, Any] = {"kernel": "route", "E_P2": e_p2}
        span = 2 * routing.chunk_size(e_p2)
        common = {"SPAN": span, "E_P2": e_p2, "HIST": min(routing.HIST_BLOCK, span), "PDL": arch >= 90}
        for name, table in (("base", False), ("variant", True)):
            consts = {**common, "CHUNK": routing.chunk_size(e_p2), "STEPS": 2, "COUNTED": table,
                      "PROGRAMS_P2": routing.MAX_PROGRAMS, "PAD": routing.pad_step(e_p2, 64 if table else 128),
                      "LABEL": routing.LABEL_TILES, "TILE_TABLE": table, "TABLE_LABEL": routing.TABLE_TILES}
            # IDS COUNTS SORTED BLOCK_EXPERT ROWS_USED TABLE, then ints
            row[name] = describe(compile_kernel(routing._route_kernel, ["*i32"] * 6 + ["i32"] * 5, consts, arch,
                                                routing.WARPS), arch)
        row["count"] = describe(compile_kernel(routing._count_kernel, ["*i32"] * 2 + ["i32"] * 2, common, arch,
                                               routing.WARPS), arch)
        rows.append(row)
        print(f"route E_P2={e_p2}: one launch {row['base']['regs']} regs {row['base']['spill_bytes']} B spilled, "
              f"counted with the tile table {row['variant']['regs']} regs {row['variant']['spill_bytes']} B spilled, "
              f"count {row['count']['regs']} regs {row['count']['spill_bytes']} B spilled", flush=True)
    return rows


def decode_counts(arch: int) -> list[dict[str, Any]]:
    """Both decode kernels of each distinct decode config (and K, N, E, topk) of the shipped artifacts, and of the
    default at each shipped artifact's spec."""
    from flyreg_moe import decode

    seen = set()
    for path in sorted((Path(flyreg_moe.__file__).parent / "configs").glob("*.json")):
        a = json.loads(path.read_text(encoding="utf-8"))
        if a["spec"].get("backend") != "triton":
            continue
        spec, default = a["spec"], space.triton_default(a["spec"])
        for kw, hints in ((a["config"]["kwargs"], a["config"]["hints"]), (default.kwargs, default.hints)):
            if kw.get("DECODE"):
                seen.add((kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_N_DOWN"], kw["BLOCK_K"], hints["num_warps"],
                          hints["num_stages"], spec["K"], spec["N"], spec["E"], spec["topk"]))
    rows = []
    for bm, bn, bnd, bk, warps, stages, K, N, E, topk in sorted(seen):
        # M = BLOCK_M: a decode tile holds every token of its bucket
        up, down = decode.constexprs(bm, K, N, E, topk, bm, bn, bk, bnd, upcast=False, pdl=arch >= 90)
        kernels = {  # kernel: (pointer and int argument types, constexprs)
            "decode_gate_up": (["*bf16"] * 3 + ["*i32", "*fp32", "*i32", "*i32"] + ["i32"] * 8, up),
            "decode_down": (["*bf16", "*bf16", "*fp32", "*bf16", "*i32", "*i32", "*i32"] + ["i32"] * 5, down)}
        for which, (types, consts) in kernels.items():
            fn = getattr(decode, f"_{which}_kernel")
            row: dict[str, Any] = {"kernel": which, "config": [bm, bn, bnd, bk, warps, stages], "K": K, "N": N,
                                   "E": E, "topk": topk}
            row["binary"] = described(lambda: compile_kernel(fn, types, consts, arch, warps, stages), arch)
            rows.append(row)
            print(f"{which} {row['config']} K={K} N={N} E={E} topk={topk}: {row['binary']}", flush=True)
    return rows


def pair_counts(arch: int, E: int, K: int, N: int, topk: int, stages: int | None = None) -> list[dict[str, Any]]:
    """Both pair-path kernels of each pair config the space offers for (E, K, N, topk), of ``stages`` stages
    only where given (the summing kernel once per distinct compile)."""
    from flyreg_moe import pair_mlp

    types = {"pair_mlp": ["*bf16"] * 3 + ["*fp32", "*i32", "*fp32"] + ["i32"] * 5,  # X W1 W2 Y IDS TW, ints
             "pair_sum": ["*fp32", "*bf16", "i32", "i32"]}  # Y OUT parts K
    seen, rows = set(), []
    for cfg in space.pair_configs({"E": E, "K": K, "N": N, "topk": topk, "M": 1}):
        kw, warps, depth = cfg.kwargs, cfg.hints["num_warps"], cfg.hints["num_stages"]
        if stages is not None and depth != stages:
            continue
        consts = pair_mlp.constexprs(K, N, topk, kw["BLOCK_N"], kw["BLOCK_K"], kw["BLOCK_N_DOWN"], depth, arch >= 90)
        for which, c, w, st in (("pair_mlp", consts[0], warps, depth), ("pair_sum", consts[1], 4, None)):
            key = (which, tuple(sorted(c.items())), w, st)
            if key in seen:
                continue
            seen.add(key)
            row: dict[str, Any] = {"kernel": which, "config": [kw["BLOCK_N"], kw["BLOCK_K"], kw["BLOCK_N_DOWN"], w, st],
                                   "K": K, "N": N, "E": E, "topk": topk}
            row["binary"] = described(lambda: compile_kernel(getattr(pair_mlp, f"_{which}_kernel"), types[which], c,
                                                             arch, w, st), arch)
            rows.append(row)
            print(f"{which} {row['config']} K={K} N={N}: {row['binary']}", flush=True)
    return rows


def served_binaries() -> Iterable[Binary]:
    """Each distinct :data:`Binary` the shipped Triton artifacts compile."""
    seen = set()
    for path in sorted((Path(flyreg_moe.__file__).parent / "configs").glob("*.json")):
        a = json.loads(path.read_text(encoding="utf-8"))
        spec, kw, hints = a["spec"], a["config"]["kwargs"], a["config"]["hints"]
        if spec["backend"] == "triton" and space.grouped(kw):
            tile = (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], hints.get("num_warps", 4), hints.get("num_stages", 3))
            seen.add((tile, spec["K"], spec["N"], kw["SPLIT_K"] > 1, kw.get("BLOCK_N_DOWN")))
    return sorted(seen, key=repr)


def space_binaries(E: int, K: int, N: int, topk: int, M: int) -> Iterable[Binary]:
    configs = space.triton_configs({"E": E, "K": K, "N": N, "topk": topk, "M": M})
    return sorted({((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.hints["num_warps"],
                     c.hints["num_stages"]), K, N, c.kwargs["SPLIT_K"] > 1, c.kwargs.get("BLOCK_N_DOWN"))
                   for c in configs if space.grouped(c.kwargs)}, key=repr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--served", action="store_true", help="the binaries of the shipped artifacts")
    what.add_argument("--spec", help="E,K,N,topk,M: the binaries of this spec's pruned space")
    what.add_argument("--tile", help="BLOCK_M,BLOCK_N,BLOCK_K,num_warps,num_stages,K,N: one binary a GEMM")
    what.add_argument("--routing", action="store_true",
                      help="the routing kernels (one launch; counted, with the tile table)")
    what.add_argument("--decode", action="store_true", help="the decode kernels of the shipped decode configs")
    what.add_argument("--pair", help="E,K,N,topk: the pair-path kernels of each pair config this spec's space offers")
    p.add_argument("--stages", type=int, default=None, help="with --pair, only the configs of this many stages")
    p.add_argument("--variant", type=variant, default={"tma": True},
                   help="knobs compared with pointer loads, no tails and GEMM 2 as wide as GEMM 1: TMA "
                        "(the default), TAILS=1 or 2, BLOCK_N_DOWN=256, or a mix")
    p.add_argument("--arch", type=int, default=90, help="compute capability, 90 for the H200")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    if a.routing or a.decode or a.pair:
        rows = (routing_counts(a.arch) if a.routing else decode_counts(a.arch) if a.decode
                else pair_counts(a.arch, *map(int, a.pair.split(",")), stages=a.stages))
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"meta": {"triton": triton.__version__, "arch": a.arch}, "rows": rows}, f, indent=1)
        return
    if a.tile:
        *tile, K, N = map(int, a.tile.split(","))
        binaries: Iterable[Binary] = [(tuple(tile), K, N, False, None)]  # type: ignore[list-item]
    else:
        binaries = served_binaries() if a.served else space_binaries(*map(int, a.spec.split(",")))
    rows = []
    for tile, K, N, split, bn_down in binaries:
        if tile[0] >> a.variant.get("tails", 0) < space.BLOCK_MS[0]:
            continue  # no tail tile fits a BLOCK_M this small
        for which in ("gate_up", "down"):
            row: dict[str, Any] = {"kernel": which, "tile": tile, "K": K, "N": N, "split": split, "bn_down": bn_down}
            for name, knobs in (("base", {"bn_down": bn_down}), ("variant", {"bn_down": bn_down, **a.variant})):
                row[name] = described(lambda: compile_gemm(which, tile, K, N, split and which == "down", a.arch,
                                                           **knobs), a.arch)
            rows.append(row)
            base, var = row["base"], row["variant"]
            print(f"{which} {tile} K={K} N={N} split={split} down={bn_down or tile[1]}: base {base.get('regs')} regs "
                  f"{base.get('spill_bytes')} B spilled, variant {var.get('regs')} regs {var.get('spill_bytes')} B spilled, smem "
                  f"{base.get('smem')} -> {var.get('smem')}" + (f" ({var['error']})" if "error" in var else ""),
                  flush=True)
    ok = [r for r in rows if "error" not in r["base"] and "error" not in r["variant"]]
    summary = {"kernels": len(rows), "failed": len(rows) - len(ok),
               "spilling_base": sum(1 for r in ok if r["base"]["spill_bytes"]),
               "spilling_variant": sum(1 for r in ok if r["variant"]["spill_bytes"]),
               "fewer_regs_variant": sum(1 for r in ok if r["variant"]["regs"] < r["base"]["regs"]),
               "more_regs_variant": sum(1 for r in ok if r["variant"]["regs"] > r["base"]["regs"])}
    print(summary)
    meta = {"triton": triton.__version__, "arch": a.arch, "what": "served" if a.served else a.spec or a.tile,
            "variant": a.variant}
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
