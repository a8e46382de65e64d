"""Config spaces and no-search defaults of the fused MoE, for a spec ``{"E", "N", "K", "topk", "M": m_bucket(rows),
"dtype", "backend"}``. Triton knobs: ``BLOCK_M`` (rows of a tile, also the routing's alignment), ``BLOCK_N`` (output
columns of a tile, in GEMM 1 as many gate and as many up), ``BLOCK_K`` (reduction depth a step), ``GROUP_M`` (row
tiles a group of programs walks per column tile), ``SPLIT_K`` (ways GEMM 2's reduction over N is split), the hints
``num_warps`` and ``num_stages``, and, absent meaning off: ``TMA=True`` (weight tiles read through tensor
descriptors, where :func:`tma_fits`), ``TAILS`` (1 or 2: each expert's run padded to ``BLOCK_M >> TAILS`` rows, its
last tile that high, where :func:`tails_fit`), ``BLOCK_N_DOWN`` (GEMM 2's columns, twice GEMM 1's BLOCK_N where
:func:`wide_down_fits`), ``DECODE=True`` (:mod:`.decode`, up to :data:`DECODE_ROWS` rows) and ``PAIR_MLP=True``
(:mod:`.pair_mlp`, up to :data:`PAIR_ROWS` rows: BLOCK_N of N a program, BLOCK_K deep, BLOCK_N_DOWN output columns a
step). CPU knob:
``EXPERT_GROUP`` (:mod:`.cpu`)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from flyreg.plugin import Config, Device

#: Row-count buckets: an unseen M is served from the smallest bucket at least M (the largest above it).
M_BUCKETS = tuple(1 << i for i in range(14))  # 1, 2, 4, ..., 8192

#: The values each knob and hint takes in the spaces.
BLOCK_MS, BLOCK_NS, BLOCK_KS = (16, 32, 64, 128), (32, 64, 128, 256), (64, 128, 256)
GROUP_MS, SPLIT_KS, WARPS, STAGES = (1, 4, 8, 16, 32), (1, 2, 4, 8), (4, 8), (2, 3, 4, 5)
#: Halvings of BLOCK_M an expert's last row tile may take (0: none), and GEMM 2's widths offered beside GEMM 1's half as
#: wide (none below 128: SGLang's Mixtral and Qwen3 H200 files pair 64-wide tiles only at 32 rows or fewer).
TAILS, WIDE_DOWNS = (0, 1, 2), (128, 256)

SMEM_BYTES = 227 * 1024 - 8 * 1024  #: Shared memory a program may use on the H200: 227 KiB a block, less epilogue room.
MAX_ACC_PER_THREAD = 128  #: Most float32 accumulator elements a thread holds in GEMM 1 (gate and up): more would spill.
SPLIT_ROWS = 64  #: Rows per expert up to which GEMM 2 may split its reduction (few row tiles, too few programs).
SMS = 132  #: Multiprocessors of the H200: the default splits GEMM 2 until its programs fill them once.
#: The default's tiles, the first whose rows an expert gets bound r: (rows, BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
#: num_stages, most GROUP_M, most TAILS). From a menu timed on every shipped workload on the H200 (``moe_menu.py``
#: and ``moe_knob_ab.py`` under the tag ``lab-archive-2026-12``; docs/decisions.md); above 8 rows grouped (weights
#: read once from L2: ungrouped tiles read 1.15x slower at Mixtral M = 64). The first, 64 columns in 5 stages, from
#: ``vs_incumbent --menu`` at M = 32 and 64 on an H100: level with 128 in 3 or up to 2.4 % faster on seven shapes.
DEFAULT_TILES = ((8, 16, 64, 128, 4, 5, 1, 0), (16, 16, 128, 128, 4, 3, 16, 0), (32, 32, 128, 128, 4, 2, 4, 1),
                 (64, 64, 128, 64, 4, 4, 16, 2), (1 << 62, 128, 128, 64, 8, 4, 8, 2))
#: Datasheet bandwidth (bytes/s) from which the default takes :data:`HIGH_BANDWIDTH_TILES` and
#: :data:`PAIR_HIGH_BANDWIDTH_ROWS`: between the H100's 3.35 TB/s and the H200's 4.8, the two cards measured. A product
#: in flyreg's table of datasheet peaks goes by its bandwidth there (the H200 NVL untimed); one outside it by the
#: H100's rule.
HIGH_BANDWIDTH = 4.5e12
#: The default's tiles on such a device: the first 128 columns in 3 stages. On an H200 (``vs_incumbent --menu`` at M =
#: 32 and 64, docs/decisions.md) it read 1 to 5 % faster than 64 in 5 stages on OLMoE and Qwen1.5-MoE, about 2 %
#: slower on Phi-3.5-MoE; the H200's own tunes at M = 32 took 128 columns on Qwen3 and DeepSeek, 64 on gpt-oss and
#: Mixtral.
HIGH_BANDWIDTH_TILES = ((8, 16, 128, 128, 4, 3, 1, 0), *DEFAULT_TILES[1:])
DECODE_ROWS = 64  #: Rows (tokens) up to which the decode path is offered: its tile holds every token, BLOCK_M <= 64.
#: Rows up to which the default takes the decode path where :func:`pair_default` gives none: it beat the grouped path
#: at M = 1 to 16 on every shape of ``vs_incumbent --menu``; at M = 32 the grouped path's first default tile read
#: level to 2.6 % faster on an H100 (seven shapes, two runs), and the H200's tuned 16-row tiles 6 to 13 % faster
#: (docs/decisions.md).
DECODE_DEFAULT_ROWS = 16
DECODE_NS = DECODE_N_DOWNS = (16, 32, 64, 128)  #: Columns a decode GEMM 1 (gate, up each) and GEMM 2 program takes.
#: Rows (tokens) up to which the pair path is offered: it reads an expert's weights once per pair, and multiplies
#: without tensor cores.
PAIR_ROWS = 4
#: The pair path's (BLOCK_N, BLOCK_K, num_warps): float32 products of gate and up kept per element, at most 32 a
#: thread each (ptxas may hold one at 80 or 128 registers and spill a word or two: ``moe_kernel_regs.py --pair``).
#: 128 of N a program at 8 and 16 warps: the menu's best at Mixtral and Phi-3.5-MoE M = 1, 2 and gpt-oss-20b M = 1.
PAIR_TILES = ((16, 128, 4), (16, 256, 4), (16, 256, 8), (16, 512, 8), (32, 64, 4), (32, 128, 4), (32, 128, 8),
              (32, 256, 8), (64, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8), (128, 128, 16))
PAIR_DOWNS, PAIR_STAGES = (64, 128, 256), (2, 3, 4)  #: The pair path's output columns a step, and pipeline stages.
#: Most w2 elements (BLOCK_N_DOWN x BLOCK_N) a pair program's thread holds a step: more would spill.
PAIR_W2_PER_THREAD = 64
#: The default's pair tile (BLOCK_N, BLOCK_K, num_warps, BLOCK_N_DOWN) and, by rows, the most N it takes the pair path
#: at and its stages. On an H100 (``vs_incumbent --menu``, docs/decisions.md) the pair path beat the decode path at
#: M = 1 on every shape with N <= 2880 (1.04x to 1.35x) and at M = 2 on those with N <= 1408; at N = 6400 and 14336
#: (two experts a token) it was level or behind, and at M = 2, N = 2880 level. The bounds lie between those points,
#: untimed between them. This tile was within 1.06x of the pair path's best at the cells it takes.
PAIR_DEFAULT_TILE = (64, 128, 8, 128)
PAIR_DEFAULT_ROWS = {1: (4096, 4), 2: (2048, 3)}
#: On a device of :data:`HIGH_BANDWIDTH` or more, also four rows up to N = 2048, in 3 stages, under their own tile: on
#: an H200 the pair path's best there (64 of N, 64 deep, 4 warps, 128 outputs a step) read 1.08x the decode default at
#: OLMoE and Qwen1.5-MoE M = 4, and the H200's tunes took the pair path at Qwen3 and DeepSeek M = 4 (the H100's at
#: DeepSeek only; Phi-3.5-MoE, N = 6400, stayed on the decode path).
PAIR_HIGH_BANDWIDTH_ROWS, PAIR_HIGH_BANDWIDTH_TILE = {4: (2048, 3)}, (64, 64, 4, 128)
CPU_GROUPS = (1, 2, 4, 8, 16, 32, 64, 128)  #: EXPERT_GROUP values offered on the CPU (those up to E, and E itself).


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def m_bucket(M: int) -> int:
    """The smallest bucket of :data:`M_BUCKETS` at least M; the largest for more rows."""
    return next((b for b in M_BUCKETS if M <= b), M_BUCKETS[-1])


def shape(spec: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """``(M, E, N, K, topk)`` of a spec whose axes the registry has checked (M = 0 counts as 1)."""
    return max(1, int(spec["M"])), int(spec["E"]), int(spec["N"]), int(spec["K"]), int(spec["topk"])


def rows_per_expert(spec: Mapping[str, Any]) -> int:
    """Rows an expert gets when the M * topk pairs spread evenly over the experts (at least 1)."""
    M, E, _, _, topk = shape(spec)
    return max(1, -(-M * topk // E))


def tma_fits(E: int, N: int, K: int, itemsize: int = 2) -> bool:
    """Whether TMA can read the weights of these shapes: 16-byte row strides (w1's K, w2's N) and row
    indices of w1 as [E * 2N, K] and of w2 as [E * K, N] that fit an int32."""
    return (K * itemsize) % 16 == 0 and (N * itemsize) % 16 == 0 and E * 2 * N < 2 ** 31 and E * K < 2 ** 31


def tails_fit(r: int, bm: int, tails: int) -> bool:
    """Whether an expert's last row tile may take ``bm >> tails`` rows: at ``r`` rows an expert it fills a
    ``bm``-row tile on average, and the tail keeps at least the smallest BLOCK_M."""
    return tails == 0 or (r >= bm and bm >> tails >= BLOCK_MS[0])


def wide_down_fits(bm: int, bn: int, bk: int, warps: int, stages: int, K: int) -> bool:
    """Whether GEMM 2 may be ``2 * bn`` wide beside GEMM 1's ``bn`` (gate and up ``bn`` each, so the same accumulator
    and pipeline bytes; SGLang's one BLOCK_SIZE_N counts them apart, so its GEMM 2 tiles are that wide): it is one of
    :data:`WIDE_DOWNS`, K spans it, registers and smem fit."""
    down = 2 * bn
    return (down in WIDE_DOWNS and K >= down and bm * down <= MAX_ACC_PER_THREAD * 32 * warps
            and _smem(bm, bk, down, stages) <= SMEM_BYTES)


def _smem(bm: int, bk: int, cols: int, stages: int) -> int:
    """Shared-memory bytes of a GEMM's pipeline: a ``bm`` x ``bk`` input and a ``bk`` x ``cols`` weight tile a stage."""
    return stages * (bm * bk + bk * cols) * 2


def _groups(spec: Mapping[str, Any]) -> list[int]:
    """GROUP_M values offered: 1, and those below the row tiles of the smallest BLOCK_M (an estimate)."""
    M, E, _, _, topk = shape(spec)
    tiles_m = min(E, M * topk) * -(-rows_per_expert(spec) // BLOCK_MS[0])
    return [g for g in GROUP_MS if g == 1 or g < tiles_m]


def _config(bm: int, bn: int, bk: int, group: int, split: int, tma: bool, tails: int, down: int | None,
            warps: int, stages: int) -> Config:
    """A grouped-path config, its optional knobs present only where on."""
    optional = {"TMA": tma, "TAILS": tails, "BLOCK_N_DOWN": down}
    return Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split,
                   **{k: v for k, v in optional.items() if v}}, num_warps=warps, num_stages=stages)


def grouped(kwargs: Mapping[str, Any]) -> bool:
    """Whether a config's knobs take the grouped path (neither ``DECODE`` nor ``PAIR_MLP`` on)."""
    return not kwargs.get("DECODE") and not kwargs.get("PAIR_MLP")


def decode_block_m(M: int) -> int:
    """The decode path's token tile at M rows: every token in one tile (at least 16 rows, for tl.dot)."""
    return max(BLOCK_MS[0], next_pow2(M))


def decode_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Decode-path configs (none above :data:`DECODE_ROWS` rows): all tokens in a tile, pipelines in shared memory."""
    M = shape(spec)[0]
    if M > DECODE_ROWS:
        return []
    bm = decode_block_m(M)
    # Triton's decode GEMM 1 took its pipeline and three float32 accumulator-sized tiles (262144 bytes for 64 x 128
    # x 128 in 2 stages, on the H100), GEMM 2 one. 8 warps only where each holds 16 accumulator rows.
    return [Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1, "BLOCK_N_DOWN": bnd,
                    "DECODE": True}, num_warps=warps, num_stages=stages)
            for bn, bnd, bk, warps, stages in itertools.product(DECODE_NS, DECODE_N_DOWNS, BLOCK_KS, WARPS, STAGES)
            if max(_smem(bm, bk, 2 * bn, stages) + 3 * bm * bn * 4, _smem(bm, bk, bnd, stages) + bm * bnd * 4)
            <= SMEM_BYTES and (warps != 8 or bm * max(bn, bnd) >= 4096)]


def pair_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Pair-path configs (none above :data:`PAIR_ROWS` rows)."""
    if shape(spec)[0] > PAIR_ROWS:
        return []
    return [_pair_config(bn, bk, warps, bnd, stages)
            for (bn, bk, warps), bnd, stages in itertools.product(PAIR_TILES, PAIR_DOWNS, PAIR_STAGES)
            if bn * bnd <= PAIR_W2_PER_THREAD * 32 * warps]


def _pair_config(bn: int, bk: int, warps: int, bnd: int, stages: int) -> Config:
    """A pair-path config (BLOCK_M and the grouped path's knobs at their fixed values, unused by the path)."""
    return Config({"BLOCK_M": BLOCK_MS[0], "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1,
                   "BLOCK_N_DOWN": bnd, "PAIR_MLP": True}, num_warps=warps, num_stages=stages)


def high_bandwidth(device: Device | None) -> bool:
    """Whether the default takes a high-bandwidth device's tiles: a datasheet bandwidth of :data:`HIGH_BANDWIDTH` or
    more (None, or a device flyreg knows no bandwidth of, takes the others)."""
    return device is not None and device.bandwidth is not None and device.bandwidth >= HIGH_BANDWIDTH


def pair_default(spec: Mapping[str, Any], device: Device | None = None) -> Config | None:
    """The pair-path default where :data:`PAIR_DEFAULT_ROWS` (and on a :func:`high_bandwidth` device
    :data:`PAIR_HIGH_BANDWIDTH_ROWS`, under its own tile) gives the spec's rows the path (N at most its bound), else
    None."""
    M, _, N, _, _ = shape(spec)
    if high_bandwidth(device) and M in PAIR_HIGH_BANDWIDTH_ROWS:
        (most_n, stages), tile = PAIR_HIGH_BANDWIDTH_ROWS[M], PAIR_HIGH_BANDWIDTH_TILE
    elif M in PAIR_DEFAULT_ROWS:
        (most_n, stages), tile = PAIR_DEFAULT_ROWS[M], PAIR_DEFAULT_TILE
    else:
        return None
    if N > most_n:
        return None
    bn, bk, warps, bnd = tile
    return _pair_config(bn, bk, warps, bnd, stages)


def decode_default(spec: Mapping[str, Any]) -> Config:
    """Decode-path default (GEMM 1 / GEMM 2 columns / depth / most stages, 4 warps): 32/64/128/5; above 16 rows
    64/32/128/4, the menu's best there."""
    tile, stages = ((64, 32, 128), 4) if shape(spec)[0] > 16 else ((32, 64, 128), 5)
    return max((c for c in decode_configs(spec) if c.hints["num_warps"] == 4 and c.hints["num_stages"] <= stages
                and (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_N_DOWN"], c.kwargs["BLOCK_K"]) == tile),
               key=lambda c: c.hints["num_stages"])


def triton_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate configs for ``spec`` within shared memory and registers, row tiles up to twice the rows an expert
    gets on average (so one tile holds an expert above its average: its weights read once), :func:`decode_configs`
    and :func:`pair_configs`."""
    (_, E, N, K, _), r = shape(spec), rows_per_expert(spec)
    max_bm, groups, out = max(BLOCK_MS[0], 2 * next_pow2(r)), _groups(spec), []
    tmas = (False, True) if tma_fits(E, N, K) else (False,)
    for bm, bn, bk, warps, stages in itertools.product(BLOCK_MS, BLOCK_NS, BLOCK_KS, WARPS, STAGES):
        if (bm > max_bm or _smem(bm, bk, 2 * bn, stages) > SMEM_BYTES or 2 * bm * bn > MAX_ACC_PER_THREAD * 32 * warps
                or (warps == 8 and bm * bn < 4096)):  # 8 warps only with 16 or more accumulator rows a warp
            continue
        splits = [s for s in SPLIT_KS if s == 1 or (r <= SPLIT_ROWS and -(-N // bk) >= 2 * s)]
        tails = [t for t in TAILS if tails_fit(r, bm, t)]
        downs = (None, 2 * bn) if wide_down_fits(bm, bn, bk, warps, stages, K) else (None,)
        out += [_config(bm, bn, bk, g, s, tma, tail, down, warps, stages)
                for g, s, tma, tail, down in itertools.product(groups, splits, tmas, tails, downs)]
    return out + decode_configs(spec) + pair_configs(spec)


def triton_default(spec: Mapping[str, Any], device: Device | None = None) -> Config:
    """Heuristic config for ``device`` (in :func:`triton_configs`; evidence: docs/decisions.md): up to
    :data:`DECODE_DEFAULT_ROWS` rows :func:`pair_default` where it gives one, else :func:`decode_default`; above, the
    tile of :data:`DEFAULT_TILES` (:data:`HIGH_BANDWIDTH_TILES` on a :func:`high_bandwidth` device) for the rows an
    expert gets (r), GEMM 2 split by :func:`default_split`, above 16 rows TMA where :func:`tma_fits` and tails where
    :func:`tails_fit`, and the 128-row tile's GEMM 2 256 wide where :func:`wide_down_fits` (at 24 to 128 rows an
    expert within 2 % of the menu's best)."""
    M, E, N, K, topk = shape(spec)
    if M <= DECODE_DEFAULT_ROWS:
        return pair_default(spec, device) or decode_default(spec)
    r = rows_per_expert(spec)
    tiles = HIGH_BANDWIDTH_TILES if high_bandwidth(device) else DEFAULT_TILES
    _, bm, bn, bk, warps, stages, group, tails = next(t for t in tiles if r <= t[0])
    bm = min(bm, max(BLOCK_MS[0], next_pow2(r)))
    group = max(g for g in _groups(spec) if g <= group)
    tma = r > 16 and tma_fits(E, N, K)
    tails = max(t for t in TAILS if t <= tails and tails_fit(r, bm, t))
    down = 2 * bn if bm == 128 and wide_down_fits(bm, bn, bk, warps, stages, K) else None
    return _config(bm, bn, bk, group, default_split(spec, bm, bn, bk, down), tma, tails, down, warps, stages)


def default_split(spec: Mapping[str, Any], bm: int, bn: int, bk: int, bn_down: int | None = None) -> int:
    """Ways the default splits GEMM 2 of ``spec`` under a ``bm`` x ``bn`` (or ``bn_down``) x ``bk`` tile: 1 above
    :data:`SPLIT_ROWS` rows an expert, else doubled until its programs fill the SMs (each way 4 or more steps)."""
    M, E, N, K, topk = shape(spec)
    r, split = rows_per_expert(spec), 1
    if r <= SPLIT_ROWS:
        programs = min(E, M * topk) * -(-r // bm) * -(-K // (bn_down or bn))  # GEMM 2's row tiles x column tiles
        while split < SPLIT_KS[-1] and programs * split < SMS and -(-N // bk) >= 4 * 2 * split:
            split *= 2
    return split


def cpu_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate CPU configs: EXPERT_GROUP from 1 to E."""
    E = shape(spec)[1]
    return [Config({"EXPERT_GROUP": g}) for g in sorted({g for g in CPU_GROUPS if g < E} | {E})]


def cpu_default(spec: Mapping[str, Any]) -> Config:
    """Heuristic CPU config: every expert in one step up to 8 rows an expert (dispatch dominates), else one a step."""
    return Config({"EXPERT_GROUP": shape(spec)[1] if rows_per_expert(spec) <= 8 else 1})
