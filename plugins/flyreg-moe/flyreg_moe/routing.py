"""The Triton routing: the token-expert pairs sorted by expert, each expert's run padded to the row tile.

Pair ``p = m * topk + j`` routes token ``m`` to expert ``topk_ids[m, j]``. The routing writes ``sorted_ids`` (pair
indices grouped by expert, in pair order, each expert's run padded with the sentinel ``P`` to a multiple of
``BLOCK_M``; slots past the used rows are left as they were, since no kernel reads them), ``block_expert`` (each row
tile's expert) and ``used`` (row tiles from it on have no work). With ``TAILS`` > 0 runs are padded to
``BLOCK_M >> TAILS`` rows and cut into tiles of ``BLOCK_M``, each expert's last holding what is left, in the tile
table [tiles in use, each tile's first slot, each tile's slots]. Up to :data:`ONE_LAUNCH_PAIRS` pairs one launch:
every program counts all the pairs by expert itself (a histogram of the ids, which stay in L2), so it knows every
run's start without waiting for another program, then places its own span of pairs, pads its share of the runs and
labels its share of the tiles; above, a first launch counts each program's span and the second reads those counts.
A pair whose expert is outside [0, E) is routed nowhere: no GEMM or reduction counts it. :class:`RoutingPlan` sizes a
call signature's routing from the shapes alone (so are the GEMMs' grids), lays out its int32 workspace and binds its
launches."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import torch
import triton
import triton.language as tl

from flyreg.triton import compiled_launcher, dependent_start, hints

from .space import next_pow2

ONE_HOT_ELEMS = 16384  #: Elements of a chunk's one-hot tile (CHUNK pairs x next_pow2(E) experts).
MAX_PROGRAMS = 64  #: Routing programs at most (a power of two).
#: Pairs up to which the routing is one launch, each program counting every id; above, a first launch counts each
#: program's span and the routing reads those counts. On an H100 one launch won at 8192 pairs and read 1.5 % slower
#: at 65536; sizes between were not measured.
ONE_LAUNCH_PAIRS = 8192
HIST_BLOCK = 4096  #: Ids a routing program counts a step, at most.
PAD_ELEMS = 4096  #: Elements of the [experts, slots] tile a routing program fills padding with a step, at most.
WARPS = 8  #: Warps of a routing program: at 4, a 1024-pair chunk's one-hot tile spilled with the tile table.
#: Row tiles a program labels at once, and those it writes the tile table for at once, the tiles spread over the
#: programs (on an H100 256 a step, all in one program at Qwen3's M = 64 to 512, read 2 to 2.5 % slower on whole calls).
LABEL_TILES, TABLE_TILES = 32, 32


def pad_step(e_p2: int, align: int) -> int:
    """Padding slots of each expert's run a routing program fills a step: [e_p2, step] at most
    :data:`PAD_ELEMS` elements (a power of two, at most the alignment's)."""
    return max(1, min(next_pow2(align), PAD_ELEMS // e_p2))


def chunk_size(E: int) -> int:
    """Pairs a routing program places a step at most: a one-hot tile of at most :data:`ONE_HOT_ELEMS` elements."""
    return max(16, min(1024, ONE_HOT_ELEMS // next_pow2(max(E, 16))))


#: The workspace's parts; ``table`` is what the GEMMs read as USED: the tile table with tails, else ``used``.
RoutingViews = NamedTuple("RoutingViews", [("sorted_ids", torch.Tensor), ("block_expert", torch.Tensor),
                                           ("used", torch.Tensor), ("table", torch.Tensor), ("counts", torch.Tensor)])


@attrs.frozen
class RoutingPlan:
    """P pairs over E experts in row tiles of ``block_m`` rows, whose last tile of an expert may shrink to
    ``block_m >> tails`` (the alignment each expert's run is padded to): ``rows`` slots of sorted pair ids,
    ``tiles`` row tiles (the GEMMs' grid rows), ``programs`` routing programs, each placing ``steps`` chunks of
    ``chunk`` pairs, their counts by expert first counted in a launch of their own where ``counted``."""

    P: int
    E: int
    block_m: int
    tails: int
    rows: int
    tiles: int
    programs: int
    steps: int
    chunk: int
    e_p2: int
    counted: bool

    @classmethod
    def of(cls, P: int, E: int, block_m: int, tails: int = 0) -> RoutingPlan:
        """The plan of every routing of these sizes: each of the at most min(E, P) non-empty experts pads its run
        by less than the alignment, and with tails takes at most floor(run / block_m) + 1 tiles. Chunks are as small
        as fill :data:`MAX_PROGRAMS` programs (from 16 pairs to :func:`chunk_size`): a smaller one-hot tile a step."""
        align = block_m >> tails
        rows = -(-(P + min(E, P) * (align - 1)) // align) * align
        tiles = P // block_m + min(E, P) if tails else rows // block_m
        chunk = max(16, min(chunk_size(E), next_pow2(triton.cdiv(P, MAX_PROGRAMS))))
        chunks = triton.cdiv(P, chunk)
        steps = triton.cdiv(chunks, MAX_PROGRAMS)
        return cls(P, E, block_m, tails, rows, tiles, triton.cdiv(chunks, steps), steps, chunk, max(16, next_pow2(E)),
                   P > ONE_LAUNCH_PAIRS)

    def workspace(self, device: torch.device) -> RoutingViews:
        """A fresh workspace (one allocation, each part at a multiple of 16 elements), as views."""
        sizes = (self.rows, self.tiles, 1, 1 + 2 * self.tiles if self.tails else 0,
                 self.programs * self.e_p2 if self.counted else 0)
        starts = [0, *itertools.accumulate(-(-n // 16) * 16 for n in sizes)]
        ws = torch.empty(starts[-1], dtype=torch.int32, device=device)
        sorted_ids, block_expert, used, table, counts = (ws[at:at + n] for at, n in zip(starts, sizes))
        return RoutingViews(sorted_ids, block_expert, used, table if self.tails else used, counts)

    def launcher(self, ids: torch.Tensor, views: RoutingViews,
                 pdl: bool = False) -> Callable[[torch.Tensor, RoutingViews], None]:
        """``route(ids, views)``: the routing's launches (one, or two where ``counted``), compiled here for ids like
        ``ids`` (flat), each a programmatic dependent of the launch before it where ``pdl``."""
        align, span = self.block_m >> self.tails, self.steps * self.chunk
        hist = min(HIST_BLOCK, max(16, next_pow2(span if self.counted else self.P)))
        consts = {"SPAN": span, "E_P2": self.e_p2, "HIST": hist, "PDL": pdl}
        launch_hints, device = hints(num_warps=WARPS, pdl=pdl), ids.device

        def launch_args(ids: torch.Tensor, v: RoutingViews) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            return ((ids, v.counts, self.P, self.E),
                    (ids, v.counts, v.sorted_ids, v.block_expert, v.used, v.table, self.P, self.E, self.tiles, align,
                     self.block_m))

        count_args, route_args = launch_args(ids, views)
        count = compiled_launcher(_count_kernel, (self.programs,), count_args, consts, launch_hints,
                                  device) if self.counted else None
        place = compiled_launcher(
            _route_kernel, (self.programs,), route_args,
            {**consts, "CHUNK": self.chunk, "STEPS": self.steps, "COUNTED": self.counted,
             "PROGRAMS_P2": MAX_PROGRAMS, "PAD": pad_step(self.e_p2, align), "LABEL": LABEL_TILES,
             "TILE_TABLE": self.tails > 0, "TABLE_LABEL": TABLE_TILES}, launch_hints, device)

        def route(ids: torch.Tensor, v: RoutingViews) -> None:
            count_args, route_args = launch_args(ids, v)
            if count is not None:
                count(*count_args)
            place(*route_args)

        return route


@triton.jit
def _one_hot(IDS, c, P, E, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    # The chunk's pair indices, their experts (E_P2 for a pair past P or out of range) and one-hot rows.
    pairs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(IDS + pairs, mask=pairs < P, other=E_P2).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E_P2)
    hot = (ids[:, None] == tl.arange(0, E_P2)[None, :]).to(tl.int32)
    return pairs, ids, hot


@triton.jit
def _histogram(ids, ok, E_P2: tl.constexpr):
    # The ids counted by expert where ok: the others are counted as expert 0, then taken off (tl.histogram takes a
    # mask only from Triton 3.4).
    first = tl.arange(0, E_P2) == 0
    return tl.histogram(tl.where(ok, ids, 0), E_P2) - tl.where(first, tl.sum((~ok).to(tl.int32), axis=0), 0)


@triton.jit
def _histograms(IDS, lo, hi, split, E, E_P2: tl.constexpr, HIST: tl.constexpr):
    # Pairs [lo, hi) counted by expert, and those of them before split (a pair out of range counts nowhere).
    counts = tl.zeros([E_P2], dtype=tl.int32)
    before = tl.zeros([E_P2], dtype=tl.int32)
    for p0 in range(lo, hi, HIST):
        p = p0 + tl.arange(0, HIST)
        ids = tl.load(IDS + p, mask=p < hi, other=-1).to(tl.int32)
        ok = (ids >= 0) & (ids < E)
        counts += _histogram(ids, ok, E_P2)
        before += _histogram(ids, ok & (p < split), E_P2)
    return counts, before


@triton.jit(do_not_specialize=["P", "E"])
def _count_kernel(IDS, COUNTS, P, E, SPAN: tl.constexpr, E_P2: tl.constexpr, HIST: tl.constexpr,
                  PDL: tl.constexpr = False):
    dependent_start(PDL)
    g = tl.program_id(0)
    counts, _ = _histograms(IDS, g * SPAN, tl.minimum(g * SPAN + SPAN, P), g * SPAN, E, E_P2, HIST)
    tl.store(COUNTS + g * E_P2 + tl.arange(0, E_P2), counts)


@triton.jit(do_not_specialize=["P", "E", "tiles", "align", "tile_m"])
def _route_kernel(IDS, COUNTS, SORTED, BLOCK_EXPERT, ROWS_USED, TABLE, P, E, tiles, align, tile_m,
                  SPAN: tl.constexpr, CHUNK: tl.constexpr, STEPS: tl.constexpr, E_P2: tl.constexpr,
                  HIST: tl.constexpr, COUNTED: tl.constexpr, PROGRAMS_P2: tl.constexpr, PAD: tl.constexpr,
                  LABEL: tl.constexpr, TILE_TABLE: tl.constexpr, TABLE_LABEL: tl.constexpr, PDL: tl.constexpr = False):
    dependent_start(PDL)
    g, programs = tl.program_id(0), tl.num_programs(0)
    e = tl.arange(0, E_P2)
    # Each expert's pairs in all, and before this program's span: from each program's counts, or counted here.
    if COUNTED:
        r = tl.arange(0, PROGRAMS_P2)
        counts = tl.load(COUNTS + r[:, None] * E_P2 + e[None, :], mask=(r < programs)[:, None], other=0)
        total = tl.sum(counts, axis=0)
        before = tl.sum(tl.where((r < g)[:, None], counts, 0), axis=0)
    else:
        total, before = _histograms(IDS, 0, P, g * SPAN, E, E_P2, HIST)
    padded = (total + align - 1) // align * align
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    # Its pairs to their slots: their run's start, their expert's pairs before them, in pair order.
    base = starts + before
    for s in range(STEPS):
        pairs, ids, hot = _one_hot(IDS, g * STEPS + s, P, E, CHUNK, E_P2)
        slot = tl.sum(hot * (tl.cumsum(hot, axis=0) + base[None, :]), axis=1) - 1
        tl.store(SORTED + slot, pairs, mask=ids < E_P2)
        base += tl.sum(hot, axis=0)
    # The sentinel P in the padding of its share of the runs (experts e = g mod programs), PAD slots a step.
    for j0 in range(0, align, PAD):
        pad = (starts + total + j0)[:, None] + tl.arange(0, PAD)[None, :]
        tl.store(SORTED + pad, tl.full([E_P2, PAD], 0, tl.int32) + P,
                 mask=(e % programs == g)[:, None] & (pad < ends[:, None]))
    if g == 0:
        tl.store(ROWS_USED, tl.sum(padded, axis=0))
    if TILE_TABLE:
        # Runs aligned to align, cut into tiles of tile_m rows, an expert's last tile holding what is left:
        # TABLE is [tiles in use, each tile's first slot ..., each tile's slots ...].
        n_tiles = (padded + tile_m - 1) // tile_m
        tile_ends = tl.cumsum(n_tiles, axis=0)
        if g == 0:
            tl.store(TABLE, tl.sum(n_tiles, axis=0))
        shift = starts - (tile_ends - n_tiles) * tile_m  # an expert's first slot less its first tile's
        for t0 in range(g * TABLE_LABEL, tiles, programs * TABLE_LABEL):
            t = t0 + tl.arange(0, TABLE_LABEL)
            expert = tl.sum((tile_ends[None, :] <= t[:, None]).to(tl.int32), axis=1)
            mine = expert[:, None] == e[None, :]
            first = tl.sum(tl.where(mine, shift[None, :], 0), axis=1) + t * tile_m
            end = tl.sum(tl.where(mine, ends[None, :], 0), axis=1)
            ok = t < tiles
            tl.store(BLOCK_EXPERT + t, tl.minimum(expert, E_P2 - 1), mask=ok)
            tl.store(TABLE + 1 + t, first, mask=ok)
            tl.store(TABLE + 1 + tiles + t, tl.minimum(end - first, tile_m), mask=ok)
    else:
        # A tile's expert: how many experts' runs end at or before its first row (tiles past the used rows
        # get E_P2 or less; the GEMMs never read them).
        for t0 in range(g * LABEL, tiles, programs * LABEL):
            t = t0 + tl.arange(0, LABEL)
            expert = tl.sum((ends[None, :] <= (t * tile_m)[:, None]).to(tl.int32), axis=1)
            tl.store(BLOCK_EXPERT + t, tl.minimum(expert, E_P2 - 1), mask=t < tiles)
