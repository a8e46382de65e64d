"""Config spaces and no-search defaults of the fused MoE.

A spec is ``{"E", "N", "K", "topk", "M": m_bucket(rows), "dtype", "backend"}``. Triton knobs:
``BLOCK_M`` (rows of a tile, also the routing's alignment), ``BLOCK_N`` (output columns of a tile in
both GEMMs, GEMM 2's unless ``BLOCK_N_DOWN`` is set; GEMM 1 computes that many gate and as many up
columns), ``BLOCK_K`` (reduction depth a
step), ``GROUP_M`` (row tiles a group of programs walks per column tile) and ``SPLIT_K`` (ways
GEMM 2's reduction over N is split, float32 partials summed by the top-k reduction), with the hints
``num_warps`` and ``num_stages``. ``TMA=True`` has both GEMMs read their weight tiles through tensor
descriptors (the tensor memory accelerator) instead of pointer loads; a config without the knob uses
pointer loads (as every config did before it), and it is offered where :func:`tma_fits` the shapes (on a
GPU before Hopper, which has no TMA, a TMA config runs the pointer loads: ``triton_moe.tma_hardware``).
``TAILS`` (1 or 2) pads each expert's run to ``BLOCK_M >> TAILS`` rows instead of BLOCK_M and lets its
last row tile multiply only the half or quarter of BLOCK_M it needs; offered where an expert gets at
least BLOCK_M rows on average, absent means none. ``BLOCK_N_DOWN`` (256) gives GEMM 2 tiles twice as wide
as GEMM 1's 128 columns (:func:`wide_down_fits`); absent means BLOCK_N.
``DECODE=True`` is the decode path (:mod:`.decode`: two launches, tokens as a tile's rows, no routing, the
top-k sum folded into GEMM 2), offered up to :data:`DECODE_ROWS` rows (:func:`decode_configs`); absent means
the grouped path.
CPU knob: ``EXPERT_GROUP`` (see :mod:`.cpu`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from flyreg.plugin import Config

#: Row-count buckets: an unseen M is served from the smallest bucket at least M (the largest above it).
M_BUCKETS = tuple(1 << i for i in range(14))  # 1, 2, 4, ..., 8192

BLOCK_MS = (16, 32, 64, 128)
BLOCK_NS = (32, 64, 128, 256)
BLOCK_KS = (64, 128, 256)
GROUP_MS = (1, 4, 8, 16, 32)
SPLIT_KS = (1, 2, 4, 8)
WARPS = (4, 8)
STAGES = (2, 3, 4, 5)
#: Halvings of BLOCK_M an expert's last row tile may take (0: none).
TAILS = (0, 1, 2)

#: Shared memory a program may use on the H200 (227 KiB a block), less room for the epilogue.
SMEM_BYTES = 227 * 1024 - 8 * 1024
#: Most float32 accumulator elements a thread holds in GEMM 1 (gate and up): more spill registers.
MAX_ACC_PER_THREAD = 128
#: Rows per expert up to which GEMM 2 may split its reduction (few row tiles, too few programs).
SPLIT_ROWS = 64
#: Multiprocessors of the H200: the default splits GEMM 2 until its programs fill them once.
SMS = 132
#: Rows (tokens) up to which the decode path is offered: its tile holds every token, BLOCK_M <= 64.
DECODE_ROWS = 64
#: Rows up to which the default takes the decode path: none yet. Timed eagerly on an H100 (2026-12-06,
#: bench/check_ids_cost.py's unchecked column) it read about 40 to 73 % of the weight-bandwidth floor at M = 1 and
#: 16 (Qwen3 M = 16: 520 us, where the grouped path's served config read 201 us on the H200); no graph-timed
#: run on one card has shown it winning, so only a search that measures it takes it.
DECODE_DEFAULT_ROWS = 0
#: Output columns a decode GEMM 1 (gate and up each) and GEMM 2 program may take.
DECODE_NS = (16, 32, 64, 128)
DECODE_N_DOWNS = (16, 32, 64, 128)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def m_bucket(M: int) -> int:
    """The smallest bucket of :data:`M_BUCKETS` at least M; the largest for more rows."""
    for b in M_BUCKETS:
        if M <= b:
            return b
    return M_BUCKETS[-1]


def _int(spec: Mapping[str, Any], name: str, least: int) -> int:
    v = spec.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ValueError(f"fused_moe spec[{name!r}] must be an int >= {least}, got {v!r}")
    return v


def shape(spec: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """``(M, E, N, K, topk)`` of a spec, validated."""
    return (max(1, _int(spec, "M", 0)), _int(spec, "E", 1), _int(spec, "N", 1), _int(spec, "K", 1),
            _int(spec, "topk", 1))


def rows_per_expert(spec: Mapping[str, Any]) -> int:
    """Rows an expert gets when the M * topk pairs spread evenly over the experts (at least 1)."""
    M, E, _, _, topk = shape(spec)
    return max(1, -(-M * topk // E))


def tma_fits(E: int, N: int, K: int, itemsize: int = 2) -> bool:
    """Whether TMA can read the weights of these shapes: 16-byte row strides (w1's K, w2's N) and row
    indices of w1 as [E * 2N, K] and of w2 as [E * K, N] that fit an int32."""
    return (K * itemsize) % 16 == 0 and (N * itemsize) % 16 == 0 and E * 2 * N < 2 ** 31 and E * K < 2 ** 31


def tails_fit(r: int, bm: int, tails: int) -> bool:
    """Whether an expert's last row tile may take ``bm >> tails`` rows at ``r`` rows an expert: the
    expert fills a ``bm``-row tile on average and the tail keeps at least the smallest BLOCK_M."""
    return tails == 0 or (r >= bm and bm >> tails >= BLOCK_MS[0])


#: GEMM 2's output columns a tile may take beside GEMM 1's BLOCK_N = 128.
WIDE_DOWN = 256


def wide_down_fits(bm: int, bn: int, bk: int, warps: int, stages: int, K: int) -> bool:
    """Whether GEMM 2 may take :data:`WIDE_DOWN` output columns under a GEMM 1 tile of ``bn`` = 128 columns: K
    spans such a tile, and its accumulator and pipeline fit the registers and shared memory."""
    return (bn == 128 and K >= WIDE_DOWN and bm * WIDE_DOWN <= MAX_ACC_PER_THREAD * 32 * warps
            and stages * (bm * bk + bk * WIDE_DOWN) * 2 <= SMEM_BYTES)


def _smem(bm: int, bn: int, bk: int, stages: int) -> int:
    """Shared memory of GEMM 1's pipeline (x tile and the gate and up tiles, 2 bytes an element)."""
    return stages * (bm * bk + 2 * bk * bn) * 2


def _tile_ok(bm: int, bn: int, bk: int, warps: int, stages: int, max_bm: int) -> bool:
    if bm > max_bm or _smem(bm, bn, bk, stages) > SMEM_BYTES:
        return False
    if 2 * bm * bn > MAX_ACC_PER_THREAD * 32 * warps:
        return False
    return warps == 4 or bm * bn >= 4096  # 8 warps only with 16 or more accumulator rows a warp


def _groups(spec: Mapping[str, Any]) -> list[int]:
    """GROUP_M values offered: 1, and those below the row tiles of the smallest BLOCK_M (an estimate)."""
    M, E, _, _, topk = shape(spec)
    tiles_m = min(E, M * topk) * -(-rows_per_expert(spec) // BLOCK_MS[0])
    return [g for g in GROUP_MS if g == 1 or g < tiles_m]


def decode_block_m(M: int) -> int:
    """The decode path's token tile at M rows: every token in one tile (at least 16 rows, for tl.dot)."""
    return max(BLOCK_MS[0], _next_pow2(M))


def decode_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Decode-path configs for ``spec`` (none above :data:`DECODE_ROWS` rows): every token in one tile,
    GEMM 1 and GEMM 2 column tiles and depths whose pipelines fit shared memory."""
    M = shape(spec)[0]
    if M > DECODE_ROWS:
        return []
    bm = decode_block_m(M)
    out = []
    for bn, bnd, bk, warps, stages in itertools.product(DECODE_NS, DECODE_N_DOWNS, BLOCK_KS, WARPS, STAGES):
        # Triton's decode GEMM 1 took its pipeline plus three float32 tiles of its accumulator's size (262144 bytes
        # for 64 x 128 x 128 in 2 stages, on the H100); GEMM 2 is counted alike with one.
        if max(_smem(bm, bn, bk, stages) + 3 * bm * bn * 4,
               stages * (bm * bk + bk * bnd) * 2 + bm * bnd * 4) > SMEM_BYTES:
            continue
        if warps == 8 and bm * max(bn, bnd) < 4096:  # 8 warps only where each holds 16 accumulator rows
            continue
        out.append(Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1,
                           "BLOCK_N_DOWN": bnd, "DECODE": True}, num_warps=warps, num_stages=stages))
    return out


def decode_default(spec: Mapping[str, Any]) -> Config:
    """The decode path's no-search config (a member of :func:`decode_configs`)."""
    M = shape(spec)[0]
    return Config({"BLOCK_M": decode_block_m(M), "BLOCK_N": 32, "BLOCK_K": 256, "GROUP_M": 1, "SPLIT_K": 1,
                   "BLOCK_N_DOWN": 16, "DECODE": True}, num_warps=4, num_stages=4)


def triton_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate configs for ``spec``, pruned by shared memory, registers and the rows per expert, and
    the decode path's (:func:`decode_configs`)."""
    M, E, N, K, topk = shape(spec)
    r = rows_per_expert(spec)
    max_bm = max(BLOCK_MS[0], _next_pow2(r))
    groups = _groups(spec)
    tmas = (False, True) if tma_fits(E, N, K) else (False,)
    out = []
    for bm, bn, bk, warps, stages in itertools.product(BLOCK_MS, BLOCK_NS, BLOCK_KS, WARPS, STAGES):
        if not _tile_ok(bm, bn, bk, warps, stages, max_bm):
            continue
        k_tiles = -(-N // bk)
        splits = [s for s in SPLIT_KS if s == 1 or (r <= SPLIT_ROWS and k_tiles >= 2 * s)]
        tails = [t for t in TAILS if tails_fit(r, bm, t)]
        downs = (None, WIDE_DOWN) if wide_down_fits(bm, bn, bk, warps, stages, K) else (None,)
        for g, s, tma, tail, down in itertools.product(groups, splits, tmas, tails, downs):
            knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "SPLIT_K": s,
                     **({"TMA": True} if tma else {}), **({"TAILS": tail} if tail else {}),
                     **({"BLOCK_N_DOWN": down} if down else {})}
            out.append(Config(knobs, num_warps=warps, num_stages=stages))
    return out + decode_configs(spec)


def triton_default(spec: Mapping[str, Any]) -> Config:
    """Heuristic config (a member of :func:`triton_configs`), from the rows an expert gets (r) and K.

    Chosen from a fixed menu of tiles timed on every shipped workload on the H200
    (``moe_menu.py`` and ``moe_knob_ab.py`` under the tag ``lab-archive-2026-12``; docs/decisions.md):

    * r <= 16 (decode): 16 x 128 tiles, 128 deep, 4 warps, 3 stages, GEMM 2 split as
      :func:`default_split` says; above 8 rows, groups of up to 16 (the tuned configs of every
      r = 12 to 16 workload group their row tiles; at Mixtral M = 64 ungrouped tiles read 1.15x slower);
    * r <= 32: 32 x 128 tiles, 128 deep, 4 warps, 2 stages, groups of up to 4, half tails;
    * r <= 64: 64 x 128 tiles, 64 deep, 4 warps, 4 stages, groups of up to 16, quarter tails;
    * else: 128 x 128 tiles, 64 deep, 8 warps, 4 stages, groups of up to 8, quarter tails, GEMM 2 tiles
      256 wide where :func:`wide_down_fits` (``moe_knob_ab.py --set BLOCK_N_DOWN=256`` on all four shapes at
      M >= 2048: 0.90 to 0.95 of the time of the same config with 128-wide GEMM 2 tiles).

    Above 16 rows an expert the weights are read by TMA where :func:`tma_fits`, and tails are taken where
    :func:`tails_fit`. On the menu at 24 to 128 rows an expert these are within 2 % of the
    menu's best in 9 of 9 cells; the tiles they replaced (32 x 128 x 64 without tails, 64 x 256 below
    N = 2048) read up to 1.17x slower. (``moe_knob_ab.py`` at M >= 1024 on Mixtral and gpt-oss:
    TMA 1 to 10 % faster, quarter tails 1 to 19 % up to M = 4096.)

    Up to :data:`DECODE_DEFAULT_ROWS` rows (none yet): the decode path (:func:`decode_default`).
    """
    M, E, N, K, topk = shape(spec)
    if M <= DECODE_DEFAULT_ROWS:
        return decode_default(spec)
    r = rows_per_expert(spec)
    if r <= 8:
        bm, bn, bk, warps, stages, group, tails = 16, 128, 128, 4, 3, 1, 0
    elif r <= 16:  # some experts get more than one row tile: grouped, they read their weights once from L2
        bm, bn, bk, warps, stages, group, tails = 16, 128, 128, 4, 3, 16, 0
    elif r <= 32:
        bm, bn, bk, warps, stages, group, tails = 32, 128, 128, 4, 2, 4, 1
    elif r <= 64:
        bm, bn, bk, warps, stages, group, tails = 64, 128, 64, 4, 4, 16, 2
    else:
        bm, bn, bk, warps, stages, group, tails = 128, 128, 64, 8, 4, 8, 2
    bm = min(bm, max(BLOCK_MS[0], _next_pow2(r)))
    group = max(g for g in _groups(spec) if g <= group)
    tma = r > 16 and tma_fits(E, N, K)
    tails = max(t for t in TAILS if t <= tails and tails_fit(r, bm, t))
    down = WIDE_DOWN if bm == 128 and wide_down_fits(bm, bn, bk, warps, stages, K) else None
    split = default_split(spec, bm, bn, bk, down)
    knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split,
             **({"TMA": True} if tma else {}), **({"TAILS": tails} if tails else {}),
             **({"BLOCK_N_DOWN": down} if down else {})}
    return Config(knobs, num_warps=warps, num_stages=stages)


def default_split(spec: Mapping[str, Any], bm: int, bn: int, bk: int, bn_down: int | None = None) -> int:
    """Ways the default splits GEMM 2 of ``spec`` under a ``bm`` x ``bn`` x ``bk`` tile (GEMM 2 ``bn_down`` wide
    where given): while an expert gets
    at most :data:`SPLIT_ROWS` rows, doubled until GEMM 2's programs fill the SMs once (each way keeping
    at least 4 reduction steps); else 1."""
    M, E, N, K, topk = shape(spec)
    r = rows_per_expert(spec)
    split = 1
    if r <= SPLIT_ROWS:
        programs = min(E, M * topk) * -(-r // bm) * -(-K // (bn_down or bn))  # GEMM 2's row tiles x column tiles
        k_tiles = -(-N // bk)
        while split < SPLIT_KS[-1] and programs * split < SMS and k_tiles >= 4 * 2 * split:
            split *= 2
    return split


#: EXPERT_GROUP values offered on the CPU (those up to E, and E itself).
CPU_GROUPS = (1, 2, 4, 8, 16, 32, 64, 128)


def cpu_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate CPU configs: EXPERT_GROUP from 1 to E."""
    _, E, _, _, _ = shape(spec)
    groups = sorted({g for g in CPU_GROUPS if g < E} | {E})
    return [Config({"EXPERT_GROUP": g}) for g in groups]


def cpu_default(spec: Mapping[str, Any]) -> Config:
    """Heuristic CPU config: every expert in one step while experts get few rows (dispatch
    dominates), one expert a step once they get many (padding would dominate)."""
    _, E, _, _, _ = shape(spec)
    return Config({"EXPERT_GROUP": E if rows_per_expert(spec) <= 8 else 1})
