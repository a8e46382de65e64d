"""Fused MoE against the incumbent: flyreg's whole call against SGLang's Triton fused MoE, per model shape and M.

Per cell (model shape, M), on one GPU, in one process:

* ``incumbent``: SGLang's bf16 fused MoE from its published wheel (:mod:`.incumbent`: its alignment, both
  GEMMs, activation and top-k sum, under its own config lookup: its shipped file for the device where one
  exists, nearest M, else its default rule; the output says which, and names the stand-ins for its CUDA
  extension);
* ``flyreg``: ``flyreg.op("fused_moe")``, serving what lookup gives (the shipped artifact, or the default);
* ``default``: the op's kernels under its no-search default config;
* with ``--menu``, up to 64 rows: the decode path under each tile of :data:`MENU` the spec's space offers, and
  up to 4 rows the pair path under each of its configs at :data:`PAIR_MENU_STAGES` stages; above 16 rows the
  grouped path under each tile of :data:`GROUPED_MENU` the space offers (GROUP_M 1 and the most up to 16, TMA off
  and on, no split, no tails);
* with ``--no-pdl``: the default config launched in plain stream order (``pdl=False``), beside ``default``,
  whose launches are programmatic dependents where the device has them: the two timed in the same run;
* with ``--set NAME=VALUE`` (repeatable): the served config with that knob (``served+NAME=VALUE``), where the op
  takes it on that config (``ONE_DOT`` is refused on the decode and pair paths, so those cells leave it out).

Every implementation is first checked against a float32 reference (``fused_moe_reference``) on fresh
random inputs, then timed: ``--sets`` input sets (x, routing weights and ids drawn apart; one copy of the
weights) are cycled through the calls captured in one CUDA graph, so a call rarely finds the experts it
reads in L2; time per call = replay time / calls, median of ``--reps`` replays; each implementation is timed
in ``--rounds`` rounds, each starting further along the implementations, and the median round is
reported. ``floor`` is the weight-bandwidth floor: the bytes of the distinct experts' weights a call reads
(3 N K elements an expert, averaged over the sets) over the device-to-device copy bandwidth measured in
the same run (bytes read plus written); ``% floor`` = floor / time. ``ratio`` = incumbent time / flyreg time.

    python -m flyreg_moe_bench.vs_incumbent --sglang DIR [--shapes NAME ... | --unseen] [--M 1 2 ...] [--json out.json]
        [--menu]  (also time the decode and grouped menus and the pair path's configs at each cell)  [--no-pdl]
        [--set ONE_DOT=true ...]  [--incumbent-device "NVIDIA H200"]  (the incumbent reads that card's shipped files)

``DIR`` holds the wheel's ``sglang/`` tree: ``pip download --no-deps sglang==0.5.23`` and
``unzip sglang-0.5.23-*.whl 'sglang/kernels/*' 'sglang/srt/layers/moe/*' -d DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

import flyreg

from flyreg.plugin import Config, Device
from flyreg_moe import space, triton_moe
from flyreg_moe.cpu import fused_moe_reference
from flyreg_moe.ops import MODEL_SHAPES

from . import incumbent as inc
from .moe_bench import copy_bandwidth, distinct_experts, rel_err, routed
from .moe_knob_ab import check_knob, exit_on_wrong, knob, with_knob

#: (E, K, N, topk) of real models the plugin never tunes nor names (E >= 16): served by the default, or by the
#: nearest artifact of another shape where lookup finds one; ``--unseen`` times them.
UNSEEN_SHAPES = {
    "Phi-3.5-MoE": (16, 4096, 6400, 2),
    "Qwen1.5-MoE-A2.7B": (60, 2048, 1408, 4),
    "OLMoE-1B-7B": (64, 2048, 1024, 8),
}
SHAPES = {**MODEL_SHAPES, **UNSEEN_SHAPES}
#: Device time one graph replay holds at least.
REPLAY_MS = 2.0
#: Decode-path tiles timed with --menu: (BLOCK_N, BLOCK_N_DOWN, BLOCK_K, num_warps, num_stages).
#: Those outside the spec's space are skipped.
MENU = (*((bn, bnd, bk, 4, 4) for bn in (16, 32, 64) for bnd in (32, 64, 128) for bk in (128, 256)),
        (32, 64, 128, 4, 3), (32, 64, 128, 4, 5), (32, 64, 256, 4, 3))
PAIR_MENU_STAGES = 3  #: The stages of the pair-path configs --menu times (all of the space's others).
#: Grouped-path tiles timed with --menu: (BLOCK_M, BLOCK_N, BLOCK_N_DOWN, BLOCK_K, num_warps, num_stages). The
#: tilings of SGLang's shipped H200 configs at Mixtral M = 64, 128, 256 and Qwen3 M = 512 (its BLOCK_SIZE_N is GEMM
#: 1's gate and up columns counted apart, and GEMM 2's), the default's largest tile, and two 16-row tiles: the
#: default's smallest (its tile at M = 32, gpt-oss-20b's H200 artifact there), and its former one (Qwen3's there).
GROUPED_MENU = ((32, 64, 128, 128, 4, 3), (64, 64, 128, 128, 8, 4), (64, 64, 128, 64, 4, 3), (128, 128, 256, 64, 8, 4),
                (16, 128, None, 128, 4, 3), (16, 64, None, 128, 4, 5))
GROUPED_MENU_ROWS = 16  #: Rows above which --menu times the grouped tiles.


def graph_ms(calls: list[Callable[[], Any]], reps: int) -> float:
    """Median ms per call of ``calls`` (run in order) captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del graph
    return statistics.median(times) / len(calls)


def tiling(cfg: Config) -> tuple[Any, ...]:
    """A config's (BLOCK_M, BLOCK_N, BLOCK_N_DOWN, BLOCK_K, num_warps, num_stages), as :data:`GROUPED_MENU` names it."""
    k, h = cfg.kwargs, cfg.hints
    return k["BLOCK_M"], k["BLOCK_N"], k.get("BLOCK_N_DOWN"), k["BLOCK_K"], h["num_warps"], h["num_stages"]


def grouped_menu(spec: dict[str, Any]) -> dict[str, Config]:
    """The configs of :data:`GROUPED_MENU` that the spec's space offers, by name: GROUP_M 1 and the most it offers
    up to 16, TMA off and on, no split and no tails."""
    offered, out = set(space.triton_configs(spec)), {}
    for bm, bn, bnd, bk, warps, stages in GROUPED_MENU:
        tile = [c for c in offered if tiling(c) == (bm, bn, bnd, bk, warps, stages) and space.grouped(c.kwargs)
                and c.kwargs["SPLIT_K"] == 1 and not c.kwargs.get("TAILS")]
        groups = {c.kwargs["GROUP_M"] for c in tile}
        picked = {1, max((g for g in groups if g <= 16), default=1)}
        for cfg in tile:
            if cfg.kwargs["GROUP_M"] in picked:
                tma = "tma" if cfg.kwargs.get("TMA") else "ptr"
                out[f"menu grouped {bm}/{bn}/{bnd}/{bk}/{warps}w/{stages}s/g{cfg.kwargs['GROUP_M']}/{tma}"] = cfg
    return out


def knob_variants(config: Config, knobs: Sequence[tuple[str, Any]]) -> dict[str, Config]:
    """``config`` with each knob of ``knobs`` set, keyed ``served+NAME=VALUE``; a knob the op refuses on this config
    (``ONE_DOT`` on the decode path, ``TAILS=1`` on 16-row tiles), or one the config already has, is left out."""
    out: dict[str, Config] = {}
    for name, value in knobs:
        cfg = with_knob(config, name, value)
        try:
            triton_moe.check_knobs(**cfg.kwargs)
        except ValueError:
            continue
        if cfg == config:
            continue
        out[f"served+{name}={json.dumps(value)}"] = cfg
    return out


def bench_cell(mods: dict[str, Any], name: str, M: int, sets: int, reps: int, rounds: int, bw: float,
               menu: bool, no_pdl: bool = False, knobs: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    E, K, N, topk = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(M)
    w1 = (torch.randn((E, 2 * N, K), generator=gen, device="cuda") * K ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn((E, K, N), generator=gen, device="cuda") * N ** -0.5).to(torch.bfloat16)
    inputs = [routed(M, E, K, topk, gen) for _ in range(sets)]
    spec = {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
    x0, tw0, ids0 = inputs[0]
    incumbent = inc.Incumbent(mods, x0, w1, w2, ids0)
    served = flyreg.resolve_spec("fused_moe", spec, "cuda")
    configs: dict[str, Config] = {"default": space.triton_default(spec, Device.of("cuda"))}
    if menu and M <= space.DECODE_ROWS:
        bm, offered = space.decode_block_m(M), space.decode_configs(spec)
        for bn, bnd, bk, warps, stages in MENU:
            cfg = Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1,
                          "BLOCK_N_DOWN": bnd, "DECODE": True}, num_warps=warps, num_stages=stages)
            if cfg in offered:
                configs[f"menu {bn}/{bnd}/{bk}/{warps}w/{stages}s"] = cfg
        for cfg in space.pair_configs(spec):
            if cfg.hints["num_stages"] == PAIR_MENU_STAGES:
                k = cfg.kwargs
                configs[f"menu pair {k['BLOCK_N']}/{k['BLOCK_N_DOWN']}/{k['BLOCK_K']}/{cfg.hints['num_warps']}w"] = cfg
    if menu and M > GROUPED_MENU_ROWS:
        configs.update(grouped_menu(spec))
    configs.update(knob_variants(served.config, knobs))
    op = flyreg.op("fused_moe")
    runs: dict[str, Callable[..., torch.Tensor]] = {"flyreg": op}
    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:  # binding compiles: the menus' in parallel
        runs.update(zip(configs, pool.map(lambda cfg: triton_moe.bind_fused_moe(x0, w1, w2, tw0, ids0, **cfg.kwargs,
                                                                                **cfg.hints), configs.values())))
    if no_pdl:
        cfg = configs["default"]
        runs["default_no_pdl"] = triton_moe.bind_fused_moe(x0, w1, w2, tw0, ids0, **cfg.kwargs, **cfg.hints,
                                                           pdl=False)
    aligned = [None if incumbent.in_graph_align else incumbent.aligned(ids) for _, _, ids in inputs]
    row: dict[str, Any] = {"model": name, "E": E, "K": K, "N": N, "topk": topk, "M": M,
                           "incumbent_config": incumbent.config, "incumbent_config_source": incumbent.config_source,
                           "incumbent_notes": incumbent.notes, "flyreg_config": str(served.config),
                           "flyreg_source": served.source, "default_config": str(configs["default"])}
    # Correctness on fresh inputs (not among the timed sets).
    x, tw, ids = routed(M, E, K, topk, gen)
    ref = fused_moe_reference(x, w1, w2, tw, ids)
    row["incumbent_rel_err"] = rel_err(incumbent(x, w1, w2, tw, ids, None if incumbent.in_graph_align
                                                 else incumbent.aligned(ids)), ref)
    for key, run in runs.items():
        row[f"{key}_rel_err"] = rel_err(run(x, w1, w2, tw, ids), ref)
    exit_on_wrong(f"{name} M={M}", {k: row[f"{k}_rel_err"] for k in runs if k.startswith("served+")})
    # Each call of a replay takes the next input set.
    fns: dict[str, Callable[[int], Any]] = {
        "incumbent": lambda s: incumbent(inputs[s][0], w1, w2, inputs[s][1], inputs[s][2], aligned[s])}
    for key, run in runs.items():
        fns[key] = lambda s, run=run: run(inputs[s][0], w1, w2, inputs[s][1], inputs[s][2])
    expert_bytes = 3 * N * K * w1.element_size()
    distinct = distinct_experts(ids for _, _, ids in inputs)
    row["floor_ms"] = distinct * expert_bytes / bw * 1e3
    calls = sets * max(1, math.ceil(REPLAY_MS / row["floor_ms"] / sets))
    keys = list(fns)
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        shift = r * len(keys) // rounds
        for k in keys[shift:] + keys[:shift]:
            times[k].append(graph_ms([lambda s=i % sets, f=fns[k]: f(s) for i in range(calls)], reps))
    for k in keys:
        row[f"{k}_ms"], row[f"{k}_round_ms"] = statistics.median(times[k]), times[k]
        row[f"{k}_floor_pct"] = 100 * row["floor_ms"] / row[f"{k}_ms"]
    for k in keys[1:]:
        row[f"ratio_{k}"] = row["incumbent_ms"] / row[f"{k}_ms"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang", required=True, help="folder holding the sglang wheel's sglang/ tree")
    p.add_argument("--shapes", nargs="*", default=None, choices=list(SHAPES),
                   help="model shapes to time (default: the tuned ones, or with --unseen the unseen ones)")
    p.add_argument("--unseen", action="store_true", help="time UNSEEN_SHAPES, shapes the plugin never names")
    p.add_argument("--M", nargs="*", type=int, default=list(space.M_BUCKETS))
    p.add_argument("--sets", type=int, default=8, help="input sets the calls of a replay cycle through")
    p.add_argument("--reps", type=int, default=5, help="replays a timing takes the median of")
    p.add_argument("--rounds", type=int, default=3, help="timings of each implementation a cell takes the median of")
    p.add_argument("--menu", action="store_true",
                   help="also time the decode path's menu of tiles, the pair path's configs at 3 stages and the "
                        "grouped menu's tiles")
    p.add_argument("--no-pdl", action="store_true", help="also time the default launched without PDL")
    p.add_argument("--set", dest="knobs", type=knob, action="append", default=[], metavar="NAME=VALUE",
                   help="NAME=VALUE: also time the served config with this knob (repeatable), e.g. ONE_DOT=true")
    p.add_argument("--incumbent-device", default=None, metavar="NAME",
                   help="the incumbent looks up its shipped configs for this card, as torch names it (e.g. "
                        "'NVIDIA H200'), not the one it runs on")
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args()
    for name, value in a.knobs:
        check_knob(name, value)
    mods = inc.load(a.sglang, a.incumbent_device)
    bw = copy_bandwidth(repeats=20)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "copy_bandwidth_GBps": bw / 1e9,
            "incumbent_configs_for": a.incumbent_device or torch.cuda.get_device_name()}
    print(f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, copy bandwidth {bw / 1e9:.0f} GB/s, "
          f"incumbent configs for {meta['incumbent_configs_for']}", flush=True)
    print("model | M | incumbent us | flyreg us | default us | ratio flyreg | ratio default | floor us | "
          "% floor flyreg | % floor default | incumbent config | errors (inc/flyreg/default)", flush=True)
    rows = []
    for name in a.shapes or list(UNSEEN_SHAPES if a.unseen else MODEL_SHAPES):
        for M in a.M:
            r = bench_cell(mods, name, M, a.sets, a.reps, a.rounds, bw, a.menu, a.no_pdl, a.knobs)
            torch.cuda.empty_cache()
            rows.append(r)
            print(f"{name} | {M} | {r['incumbent_ms'] * 1e3:.1f} | {r['flyreg_ms'] * 1e3:.1f} | "
                  f"{r['default_ms'] * 1e3:.1f} | {r['ratio_flyreg']:.2f}x | {r['ratio_default']:.2f}x | "
                  f"{r['floor_ms'] * 1e3:.1f} | {r['flyreg_floor_pct']:.0f} | {r['default_floor_pct']:.0f} | "
                  f"{r['incumbent_config_source']} | {r['incumbent_rel_err']:.1e}/{r['flyreg_rel_err']:.1e}/"
                  f"{r['default_rel_err']:.1e}", flush=True)
            menu = {k: v for k, v in r.items() if k.startswith("menu ") and k.endswith("_ms")
                    and not k.endswith("_round_ms")}
            if menu:
                best = min(menu, key=menu.get)
                print(f"  menu best {best.removesuffix('_ms')}: {menu[best] * 1e3:.1f} us "
                      f"({100 * r['floor_ms'] / menu[best]:.0f} % floor); " + ", ".join(
                          f"{k.removeprefix('menu ').removesuffix('_ms')}={v * 1e3:.1f}" for k, v in menu.items()),
                      flush=True)
            for k in [k for k in r if k.startswith("served+") and k.endswith("_ms") and not k.endswith("_round_ms")]:
                print(f"  {k.removesuffix('_ms')}: {r[k] * 1e3:.1f} us, {r['ratio_' + k.removesuffix('_ms')]:.2f}x "
                      f"the incumbent, time over flyreg's served call {r[k] / r['flyreg_ms']:.3f}", flush=True)
            if a.no_pdl:
                print(f"  default without PDL: {r['default_no_pdl_ms'] * 1e3:.1f} us; time without / with "
                      f"{r['default_no_pdl_ms'] / r['default_ms']:.3f}x", flush=True)
            if a.json:
                with open(a.json, "w", encoding="utf-8") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
