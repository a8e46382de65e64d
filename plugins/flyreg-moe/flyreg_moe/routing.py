"""Triton routing kernels: the token-expert pairs sorted by expert, each expert's run padded to the row tile.

Pair ``p = m * topk + j`` routes token ``m`` to expert ``topk_ids[m, j]``. The routing writes ``sorted_ids`` (pair
indices grouped by expert, in pair order, each expert's run padded with the sentinel ``P`` to a multiple of
``BLOCK_M``), ``block_expert`` (each row tile's expert) and ``used`` (row tiles from it on have no work). With
``TAILS`` > 0 runs are padded to ``BLOCK_M >> TAILS`` rows and cut into tiles of ``BLOCK_M``, each expert's last holding
what is left, in the tile table [tiles in use, each tile's first slot, each tile's slots]. Three launches: per-chunk
expert counts (and the sentinel fill), one program's offsets and tile experts, and the scatter. A pair whose expert is
outside [0, E) is routed nowhere: no GEMM or reduction counts it. :class:`RoutingPlan` sizes a call signature's routing
from the shapes alone (so are the GEMMs' grids), lays out its int32 workspace and binds its launches."""

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
#: Rows of chunk counts the offsets program reads at once, row tiles it labels at once and it writes the tile table
#: for at once (three [tiles, experts] selections a step, not one), and sentinel slots a count program fills a step.
SCAN_ROWS, LABEL_TILES, TABLE_TILES, FILL_BLOCK = 64, 256, 32, 1024


def chunk_size(E: int) -> int:
    """Pairs a routing program takes: a one-hot tile of at most :data:`ONE_HOT_ELEMS` elements."""
    return max(16, min(1024, ONE_HOT_ELEMS // next_pow2(max(E, 16))))


#: The workspace's parts; ``table`` is what the GEMMs read as USED: the tile table with tails, else ``used``.
RoutingViews = NamedTuple("RoutingViews", [("sorted_ids", torch.Tensor), ("block_expert", torch.Tensor),
                                           ("used", torch.Tensor), ("table", torch.Tensor), ("counts", torch.Tensor)])


@attrs.frozen
class RoutingPlan:
    """P pairs over E experts in row tiles of ``block_m`` rows, whose last tile of an expert may shrink to
    ``block_m >> tails`` (the alignment each expert's run is padded to): ``rows`` slots of sorted pair ids,
    ``tiles`` row tiles (the GEMMs' grid rows), ``chunks`` programs of the count and scatter kernels."""

    P: int
    E: int
    block_m: int
    tails: int
    rows: int
    tiles: int
    chunks: int
    e_p2: int

    @classmethod
    def of(cls, P: int, E: int, block_m: int, tails: int = 0) -> RoutingPlan:
        """The plan of every routing of these sizes: each of the at most min(E, P) non-empty experts pads its run
        by less than the alignment, and with tails takes at most floor(run / block_m) + 1 tiles."""
        align = block_m >> tails
        rows = -(-(P + min(E, P) * (align - 1)) // align) * align
        tiles = P // block_m + min(E, P) if tails else rows // block_m
        return cls(P, E, block_m, tails, rows, tiles, triton.cdiv(P, chunk_size(E)), max(16, next_pow2(E)))

    def workspace(self, device: torch.device) -> RoutingViews:
        """A fresh workspace (one allocation, each part at a multiple of 16 elements), as views."""
        sizes = (self.rows, self.tiles, 1, 1 + 2 * self.tiles if self.tails else 0, self.chunks * self.e_p2)
        starts = [0, *itertools.accumulate(-(-n // 16) * 16 for n in sizes)]
        ws = torch.empty(starts[-1], dtype=torch.int32, device=device)
        sorted_ids, block_expert, used, table, counts = (ws[at:at + n] for at, n in zip(starts, sizes))
        return RoutingViews(sorted_ids, block_expert, used, table if self.tails else used, counts)

    def launcher(self, ids: torch.Tensor, views: RoutingViews,
                 pdl: bool = False) -> Callable[[torch.Tensor, RoutingViews], None]:
        """``route(ids, views)``: the three routing launches, compiled here for ids like ``ids`` (flat), each a
        programmatic dependent of the launch before it where ``pdl``."""
        P, E, rows, chunks = self.P, self.E, self.rows, self.chunks
        fill, device, launch_hints = triton.cdiv(rows, chunks), ids.device, hints(num_warps=4, pdl=pdl)

        def launch_args(ids: torch.Tensor, v: RoutingViews) -> tuple[tuple[Any, ...], ...]:
            return ((ids, v.counts, v.sorted_ids, P, E, rows, fill),
                    (v.counts, v.block_expert, v.used, v.table, chunks, self.tiles, self.block_m >> self.tails,
                     self.block_m), (ids, v.counts, v.sorted_ids, P, E))

        counted, offset, scattered = launch_args(ids, views)
        chunk = {"CHUNK": chunk_size(E), "E_P2": self.e_p2, "PDL": pdl}
        count = compiled_launcher(_count_kernel, (chunks,), counted, chunk | {"FILL": FILL_BLOCK}, launch_hints, device)
        offsets = compiled_launcher(_offsets_kernel, (1,), offset,
                                    {"E_P2": self.e_p2, "SCAN": SCAN_ROWS, "LABEL": LABEL_TILES, "PDL": pdl,
                                     "TILE_TABLE": self.tails > 0, "TABLE_LABEL": TABLE_TILES}, launch_hints, device)
        scatter = compiled_launcher(_scatter_kernel, (chunks,), scattered, chunk, launch_hints, device)

        def route(ids: torch.Tensor, v: RoutingViews) -> None:
            for launch, args in zip((count, offsets, scatter), launch_args(ids, v)):
                launch(*args)

        return route


@triton.jit
def _one_hot(IDS, c, P, E, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    # The chunk's pair indices, their experts (E_P2 for a pair past P or out of range) and one-hot rows.
    pairs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(IDS + pairs, mask=pairs < P, other=E_P2).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E_P2)
    hot = (ids[:, None] == tl.arange(0, E_P2)[None, :]).to(tl.int32)
    return pairs, ids, hot


@triton.jit(do_not_specialize=["P", "E", "rows", "fill_per_program"])
def _count_kernel(IDS, COUNTS, SORTED, P, E, rows, fill_per_program,
                  CHUNK: tl.constexpr, E_P2: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr = False):
    dependent_start(PDL)
    c = tl.program_id(0)
    _, _, hot = _one_hot(IDS, c, P, E, CHUNK, E_P2)
    tl.store(COUNTS + c * E_P2 + tl.arange(0, E_P2), tl.sum(hot, axis=0))
    start = c * fill_per_program
    for i in range(0, fill_per_program, FILL):
        slots = start + i + tl.arange(0, FILL)
        tl.store(SORTED + slots, tl.full([FILL], 0, tl.int32) + P,
                 mask=(slots < rows) & (slots < start + fill_per_program))


@triton.jit(do_not_specialize=["chunks", "tiles", "block_m", "tile_m"])
def _offsets_kernel(COUNTS, BLOCK_EXPERT, ROWS_USED, TABLE, chunks, tiles, block_m, tile_m,
                    E_P2: tl.constexpr, SCAN: tl.constexpr, LABEL: tl.constexpr, TILE_TABLE: tl.constexpr,
                    TABLE_LABEL: tl.constexpr, PDL: tl.constexpr = False):
    dependent_start(PDL)
    e = tl.arange(0, E_P2)
    total = tl.zeros([E_P2], dtype=tl.int32)
    for c0 in range(0, chunks, SCAN):
        r = c0 + tl.arange(0, SCAN)
        cnt = tl.load(COUNTS + r[:, None] * E_P2 + e[None, :], mask=(r < chunks)[:, None], other=0)
        total += tl.sum(cnt, axis=0)
    padded = (total + block_m - 1) // block_m * block_m
    ends = tl.cumsum(padded, axis=0)
    tl.store(ROWS_USED, tl.sum(padded, axis=0))
    # Each chunk's counts become the slot of its first pair of each expert.
    carry = ends - padded
    for c0 in range(0, chunks, SCAN):
        r = c0 + tl.arange(0, SCAN)
        where = COUNTS + r[:, None] * E_P2 + e[None, :]
        mask = (r < chunks)[:, None]
        cnt = tl.load(where, mask=mask, other=0)
        tl.store(where, carry[None, :] + tl.cumsum(cnt, axis=0) - cnt, mask=mask)
        carry += tl.sum(cnt, axis=0)
    if TILE_TABLE:
        # Runs aligned to block_m, cut into tiles of tile_m rows, an expert's last tile holding what is left:
        # TABLE is [tiles in use, each tile's first slot ..., each tile's slots ...].
        n_tiles = (padded + tile_m - 1) // tile_m
        tile_ends = tl.cumsum(n_tiles, axis=0)
        tl.store(TABLE, tl.sum(n_tiles, axis=0))
        shift = ends - padded - (tile_ends - n_tiles) * tile_m  # an expert's first slot less its first tile's
        for t0 in range(0, tiles, TABLE_LABEL):
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
        for t0 in range(0, tiles, LABEL):
            t = t0 + tl.arange(0, LABEL)
            expert = tl.sum((ends[None, :] <= (t * block_m)[:, None]).to(tl.int32), axis=1)
            tl.store(BLOCK_EXPERT + t, tl.minimum(expert, E_P2 - 1), mask=t < tiles)


@triton.jit(do_not_specialize=["P", "E"])
def _scatter_kernel(IDS, COUNTS, SORTED, P, E, CHUNK: tl.constexpr, E_P2: tl.constexpr,
                    PDL: tl.constexpr = False):
    dependent_start(PDL)
    c = tl.program_id(0)
    pairs, ids, hot = _one_hot(IDS, c, P, E, CHUNK, E_P2)
    rank = tl.sum(tl.cumsum(hot, axis=0) * hot, axis=1) - 1  # earlier pairs of the same expert in this chunk
    routed = ids < E_P2
    base = tl.load(COUNTS + c * E_P2 + ids, mask=routed, other=0)
    tl.store(SORTED + base + rank, pairs, mask=routed)
