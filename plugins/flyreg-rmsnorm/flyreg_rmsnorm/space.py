"""Config spaces and no-search defaults for the RMSNorm kernels.

A spec is ``{"N": int, "dtype": "bfloat16" | "float16" | "float32", "M": row_bucket(rows)}``. Triton knobs:
``BLOCK_N`` and ``ROWS`` (see :mod:`.triton_kernels`), hints ``num_warps`` and, for chunked rows only,
``num_stages``. CPU knob: ``ROW_BLOCK`` (see :mod:`.cpu`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyreg.plugin import Config

ROW_BUCKETS = (1, 32, 256, 4096, 32768)
_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

#: Largest next_pow2(N) kept whole in registers (32 fp32 per thread at 32 warps).
MAX_WHOLE_ROW = 32768
#: Largest ROWS x BLOCK_N tile when ROWS > 1.
MAX_TILE = 16384
#: Largest row count per program.
MAX_ROWS = 64
#: Chunk widths offered for rows of at least 4096 columns.
CHUNKS = (1024, 2048, 4096, 8192)
#: Chunk width and warps the default uses above DEFAULT_WHOLE_ROW (best measured at N=65536).
DEFAULT_CHUNK = 8192
DEFAULT_CHUNK_WARPS = 16
#: Cap on BLOCK_N * element bytes * num_stages, so pipelined chunks (x and residual) fit in shared memory.
MAX_STAGE_BYTES = 64 * 1024
#: Default whole-row limit: wider rows are chunked by the default.
DEFAULT_WHOLE_ROW = 32768
#: Row buckets up to this one get twice the warps by default for rows up to 2048 columns (on the
#: H200, 1 x 1024 bf16: 1.29 us with 4 or 8 warps against 1.39 us with 2).
DECODE_ROWS = 32
#: Programs the default keeps in flight before it groups rows (about 2 per H200 SM).
MIN_PROGRAMS = 264


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def row_bucket(M: int) -> int:
    """The smallest bucket of (1, 32, 256, 4096, 32768) that is >= M; 32768 above 4096."""
    return next((bucket for bucket in ROW_BUCKETS if M <= bucket), ROW_BUCKETS[-1])


def _spec(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(N, element bytes, M bucket)`` of a spec, validated."""
    N, dtype, M = spec.get("N"), spec.get("dtype"), spec.get("M", ROW_BUCKETS[-1])
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"spec['N'] must be a positive int, got {N!r}")
    if dtype not in _ELEM_BYTES:
        raise ValueError(f"spec['dtype'] must be one of {sorted(_ELEM_BYTES)}, got {dtype!r}")
    if isinstance(M, bool) or not isinstance(M, int) or M < 0:
        raise ValueError(f"spec['M'] must be a non-negative int (a row bucket), got {M!r}")
    return N, _ELEM_BYTES[dtype], max(M, 1)


def warps_for(tile: int) -> int:
    """num_warps for a ROWS x BLOCK_N tile of ``tile`` elements (16-32 elements per thread).

    Matches the H200 measurements of a one-row kernel: 2 warps at 1024 columns, 8 at
    4096 and 8192, 16 at 16384 and 32768.
    """
    if tile <= 8192:
        return max(1, min(8, tile // 512))
    return 16 if tile <= 32768 else 32


def _warp_choices(tile: int) -> list[int]:
    """The default warps for ``tile`` and its neighbours, keeping >= 1 element per thread."""
    w = warps_for(tile)
    return [c for c in (w // 2, w, w * 2) if 1 <= c <= 32 and (c * 32 <= tile or c == 1)]


def _chunk_warp_choices(chunk: int) -> list[int]:
    """Warps for a chunk: the default's for its size, half, double and four times (inductor's
    looped RMSNorm on the H200 takes 2048-column chunks with 16 warps), >= 2 elements per thread."""
    w = warps_for(chunk)
    return [c for c in (w // 2, w, w * 2, w * 4) if 1 <= c <= 32 and c * 64 <= chunk]


def _rows_choices(P: int, M: int) -> list[int]:
    """Rows a program may take: powers of two up to M and MAX_ROWS, the tile within MAX_TILE."""
    return [r for r in (1 << i for i in range(MAX_ROWS.bit_length())) if r == 1 or r <= M and r * P <= MAX_TILE]


def triton_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate Triton configs for ``spec``: whole-row tiles and, for N > 2048, chunked rows."""
    N, elem, M = _spec(spec)
    P = _next_pow2(N)
    out: list[Config] = []
    if P <= MAX_WHOLE_ROW:
        for rows in _rows_choices(P, M):
            for w in _warp_choices(rows * P):
                out.append(Config({"BLOCK_N": P, "ROWS": rows}, num_warps=w))
    for chunk in CHUNKS:
        if P < 4096 or chunk >= P or (chunk < 4096 and chunk * 32 < P):
            continue  # >= 2 chunks a row; chunks under 4096 only while <= 32 of them cover it
        for w in _chunk_warp_choices(chunk):
            for stages in (1, 3):
                if stages == 1 or chunk * elem * stages <= MAX_STAGE_BYTES:
                    out.append(Config({"BLOCK_N": chunk, "ROWS": 1}, num_warps=w, num_stages=stages))
    return out


def triton_default(spec: Mapping[str, Any]) -> Config:
    """Heuristic Triton config (a member of :func:`triton_configs`).

    Whole row in registers up to N = 32768, else 8192-column chunks with 16 warps and
    ``num_stages=1`` (stages made no measurable difference). Rows per program: 1 unless
    N <= 1024 and there are more than ``MIN_PROGRAMS`` rows; then enough rows for a
    ~2048-element tile, but never fewer than ``MIN_PROGRAMS`` programs. num_warps from
    :func:`warps_for` of the tile size, doubled for decode-sized calls (at most ``DECODE_ROWS``
    rows, at most 2048 columns).
    """
    N, _, M = _spec(spec)
    P = _next_pow2(N)
    if P > DEFAULT_WHOLE_ROW:
        return Config({"BLOCK_N": DEFAULT_CHUNK, "ROWS": 1}, num_warps=DEFAULT_CHUNK_WARPS, num_stages=1)
    rows = 1
    if P <= 1024 and M > MIN_PROGRAMS:
        rows = min(2048 // P, _floor_pow2(M // MIN_PROGRAMS), MAX_ROWS, _floor_pow2(MAX_TILE // P))
    warps = warps_for(rows * P)
    if M <= DECODE_ROWS and P <= 2048 and warps * 64 <= rows * P:
        warps *= 2  # a latency-bound call: fewer elements per thread finish sooner
    return Config({"BLOCK_N": P, "ROWS": rows}, num_warps=warps)


#: Bytes of float32 work buffer the CPU space spans (ROW_BLOCK x N x 4).
_CPU_MIN_BYTES = 16 * 1024
_CPU_MAX_BYTES = 16 * 1024 * 1024
#: Default CPU work buffer. Per-block dispatch overhead dominates below a few MiB (measured
#: on a 2-core x86 machine: 4096x1024 rows took 2.4 ms at 1024 rows a block, 4.3 ms at 128).
_CPU_DEFAULT_BYTES = 4 * 1024 * 1024


def cpu_configs(spec: Mapping[str, Any]) -> list[Config]:
    """Candidate CPU configs: powers of four for ROW_BLOCK, from one row to a 16 MiB buffer."""
    N, _, M = _spec(spec)
    out = []
    rb = 1
    while rb <= M and (rb == 1 or rb * N * 4 <= _CPU_MAX_BYTES):
        if rb == 1 or rb * N * 4 >= _CPU_MIN_BYTES or rb * 4 > M:
            out.append(Config({"ROW_BLOCK": rb}))
        rb *= 4
    return sorted({*out, cpu_default(spec)}, key=lambda c: c.kwargs["ROW_BLOCK"])  # the default always among them


def cpu_default(spec: Mapping[str, Any]) -> Config:
    """Heuristic CPU config: the largest power of two ROW_BLOCK whose buffer fits 4 MiB, at most M."""
    N, _, M = _spec(spec)
    rb = _floor_pow2(max(1, _CPU_DEFAULT_BYTES // (N * 4)))
    return Config({"ROW_BLOCK": min(rb, _floor_pow2(M))})
