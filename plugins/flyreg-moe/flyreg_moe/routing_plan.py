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
    ``block_m >> tails`` (the alignment each expert's run is padded to)."""

    P: int
    E: int
    block_m: int
    tails: int = 0

    @property
    def align(self) -> int:
        return self.block_m >> self.tails

    @property
    def rows(self) -> int:
        return routing.padded_rows(self.P, self.E, self.align)

    @property
    def tiles(self) -> int:
        return routing.table_tiles(self.P, self.E, self.block_m) if self.tails else self.rows // self.block_m

    @property
    def e_p2(self) -> int:
        return max(16, routing.next_pow2(self.E))

    @property
    def chunks(self) -> int:
        return triton.cdiv(self.P, routing.chunk_size(self.E))

    def workspace(self, device: torch.device) -> RoutingViews:
        rows, tiles = self.rows, self.tiles
        at_used = _aligned(rows) + _aligned(tiles)
        at_table = at_used + 16
        at_counts = at_table + (_aligned(1 + 2 * tiles) if self.tails else 0)
        ws = torch.empty(at_counts + self.chunks * self.e_p2, dtype=torch.int32, device=device)
        used = ws[at_used:at_used + 1]
        table = ws[at_table:at_table + 1 + 2 * tiles] if self.tails else used
        return RoutingViews(ws[:rows], ws[_aligned(rows):_aligned(rows) + tiles], used, table, ws[at_counts:])

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
