"""The routing of one call signature: its sizes, its int32 workspace, and its three launches.

:class:`RoutingPlan` sizes everything from the shapes alone (so a CUDA graph can hold the call) and
:meth:`RoutingPlan.launcher` binds the kernels of :mod:`.routing` once. The workspace holds, in order:
the sorted pair ids (``rows``), each row tile's expert (``tiles``), the rows in use, the tile table
(with tail tiles only) and the per-chunk expert counts.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
import triton

from flyreg.triton import compiled_launcher, hints

from . import routing


def _aligned(n: int) -> int:
    return -(-n // 16) * 16


@attrs.frozen
class RoutingViews:
    """The workspace's parts: ``used`` is the rows in use, ``table`` what the GEMMs read as USED (the tile
    table with tail tiles, else ``used``)."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    used: torch.Tensor
    table: torch.Tensor
    counts: torch.Tensor


@attrs.frozen
class RoutingPlan:
    """P pairs over E experts in row tiles of ``block_m`` rows, whose last tile of an expert may shrink to
    ``block_m >> tails`` (the alignment each expert's run is padded to); :meth:`of` sizes it once."""

    P: int
    E: int
    block_m: int
    tails: int
    align: int
    rows: int  # slots of the sorted pair ids
    tiles: int  # row tiles (the GEMMs' grid rows)
    e_p2: int
    chunks: int
    at_used: int  # workspace offsets: the rows in use, the tile table, the chunk counts; then its length
    at_table: int
    at_counts: int
    length: int

    @classmethod
    def of(cls, P: int, E: int, block_m: int, tails: int = 0) -> RoutingPlan:
        align = block_m >> tails
        rows = routing.padded_rows(P, E, align)
        tiles = routing.table_tiles(P, E, block_m) if tails else rows // block_m
        e_p2, chunks = max(16, routing.next_pow2(E)), triton.cdiv(P, routing.chunk_size(E))
        at_used = _aligned(rows) + _aligned(tiles)
        at_counts = at_used + 16 + (_aligned(1 + 2 * tiles) if tails else 0)
        return cls(P, E, block_m, tails, align, rows, tiles, e_p2, chunks, at_used, at_used + 16, at_counts,
                   at_counts + chunks * e_p2)

    def workspace(self, device: torch.device) -> RoutingViews:
        """A fresh workspace (one allocation), as views."""
        ws = torch.empty(self.length, dtype=torch.int32, device=device)
        at_expert = _aligned(self.rows)
        used = ws[self.at_used:self.at_used + 1]
        table = ws[self.at_table:self.at_table + 1 + 2 * self.tiles] if self.tails else used
        return RoutingViews(ws[:self.rows], ws[at_expert:at_expert + self.tiles], used, table, ws[self.at_counts:])

    def launcher(self, ids: torch.Tensor, views: RoutingViews) -> Callable[[torch.Tensor, RoutingViews], None]:
        """``route(ids, views)``: the three routing launches, compiled here for ids like ``ids`` (flat)."""
        P, E, rows, tiles, e_p2, chunks = self.P, self.E, self.rows, self.tiles, self.e_p2, self.chunks
        chunk, fill, device, plain = routing.chunk_size(E), triton.cdiv(rows, chunks), ids.device, hints(num_warps=4)
        v = views
        count = compiled_launcher(routing._count_kernel, (chunks,), (ids, v.counts, v.sorted_ids, P, E, rows, fill),
                                  {"CHUNK": chunk, "E_P2": e_p2, "FILL": routing.FILL_BLOCK}, plain, device)
        offsets = compiled_launcher(
            routing._offsets_kernel, (1,), (v.counts, v.block_expert, v.used, v.table, chunks, tiles, self.align,
                                            self.block_m),
            {"E_P2": e_p2, "SCAN": routing.SCAN_ROWS, "LABEL": routing.LABEL_TILES, "TILE_TABLE": self.tails > 0,
             "TABLE_LABEL": routing.TABLE_TILES},
            plain, device)
        scatter = compiled_launcher(routing._scatter_kernel, (chunks,), (ids, v.counts, v.sorted_ids, P, E),
                                    {"CHUNK": chunk, "E_P2": e_p2}, plain, device)
        align, block_m = self.align, self.block_m

        def route(ids: torch.Tensor, v: RoutingViews) -> None:
            count(ids, v.counts, v.sorted_ids, P, E, rows, fill)
            offsets(v.counts, v.block_expert, v.used, v.table, chunks, tiles, align, block_m)
            scatter(ids, v.counts, v.sorted_ids, P, E)

        return route
