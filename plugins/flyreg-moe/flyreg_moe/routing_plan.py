"""The routing of one call signature: its sizes, its int32 workspace, and the three launches of :mod:`.routing`.

:meth:`RoutingPlan.of` sizes everything from the shapes alone, so a CUDA graph can hold the call. The workspace
holds, in order: the sorted pair ids, each row tile's expert, the rows in use, the tile table (with tail tiles
only) and the per-chunk expert counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
        rows = routing.padded_rows(P, E, block_m >> tails)
        tiles = routing.table_tiles(P, E, block_m) if tails else rows // block_m
        return cls(P, E, block_m, tails, rows, tiles, triton.cdiv(P, routing.chunk_size(E)),
                   max(16, routing.next_pow2(E)))

    def workspace(self, device: torch.device) -> RoutingViews:
        """A fresh workspace (one allocation), as views."""
        at_expert, table = _aligned(self.rows), 1 + 2 * self.tiles if self.tails else 0
        at_used = at_expert + _aligned(self.tiles)
        at_counts = at_used + 16 + _aligned(table)
        ws = torch.empty(at_counts + self.chunks * self.e_p2, dtype=torch.int32, device=device)
        used = ws[at_used:at_used + 1]
        return RoutingViews(ws[:self.rows], ws[at_expert:at_expert + self.tiles], used,
                            ws[at_used + 16:at_used + 16 + table] if self.tails else used, ws[at_counts:])

    def launcher(self, ids: torch.Tensor, views: RoutingViews) -> Callable[[torch.Tensor, RoutingViews], None]:
        """``route(ids, views)``: the three routing launches, compiled here for ids like ``ids`` (flat)."""
        P, E, rows, chunks = self.P, self.E, self.rows, self.chunks
        fill, device, plain = triton.cdiv(rows, chunks), ids.device, hints(num_warps=4)

        def launch_args(ids: torch.Tensor, v: RoutingViews) -> tuple[tuple[Any, ...], ...]:
            return ((ids, v.counts, v.sorted_ids, P, E, rows, fill),
                    (v.counts, v.block_expert, v.used, v.table, chunks, self.tiles, self.block_m >> self.tails,
                     self.block_m), (ids, v.counts, v.sorted_ids, P, E))

        counted, offset, scattered = launch_args(ids, views)
        chunk = {"CHUNK": routing.chunk_size(E), "E_P2": self.e_p2}
        count = compiled_launcher(routing._count_kernel, (chunks,), counted, {**chunk, "FILL": routing.FILL_BLOCK},
                                  plain, device)
        offsets = compiled_launcher(
            routing._offsets_kernel, (1,), offset, {"E_P2": self.e_p2, "SCAN": routing.SCAN_ROWS,
                                                    "LABEL": routing.LABEL_TILES, "TILE_TABLE": self.tails > 0,
                                                    "TABLE_LABEL": routing.TABLE_TILES}, plain, device)
        scatter = compiled_launcher(routing._scatter_kernel, (chunks,), scattered, chunk, plain, device)

        def route(ids: torch.Tensor, v: RoutingViews) -> None:
            counted, offset, scattered = launch_args(ids, v)
            count(*counted)
            offsets(*offset)
            scatter(*scattered)

        return route
