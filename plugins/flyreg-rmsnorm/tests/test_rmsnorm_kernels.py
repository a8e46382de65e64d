"""Correctness of the RMSNorm kernels (Triton and CPU) against a float64 reference.

Without a GPU the Triton kernels run under ``TRITON_INTERPRET=1`` (set in conftest.py) on
CPU tensors, with tiny shapes; with a GPU they run on CUDA. Tests marked ``gpu`` run only
with CUDA, on realistic shapes and every config of the space.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flyreg import Config
from flyreg_rmsnorm import cpu, space

try:
    from flyreg_rmsnorm import triton_kernels
    from flyreg.triton import pdl_supported
except ImportError:  # triton not installed
    triton_kernels = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
TRITON_OK = triton_kernels is not None and (INTERPRET or HAS_CUDA)
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="triton not importable, or no GPU and no interpreter")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class Backend:
    """One implementation of both ops, with its config space."""

    name: str
    device: str
    rmsnorm: Callable[..., torch.Tensor]
    fused: Callable[..., torch.Tensor]
    configs: Callable[[dict[str, Any]], list[Config]]
    default: Callable[[dict[str, Any]], Config]

    def call(self, fn: Callable[..., torch.Tensor], config: Config, *args: Any) -> torch.Tensor:
        return fn(*args, **config.kwargs, **config.hints)


def _cpu_backend() -> Backend:
    return Backend("cpu", "cpu", cpu.rmsnorm_cpu, cpu.fused_add_rmsnorm_cpu, space.cpu_configs, space.cpu_default)


def _triton_backend() -> Backend:
    assert triton_kernels is not None
    return Backend(
        "triton",
        "cpu" if INTERPRET else "cuda",
        triton_kernels.rmsnorm_triton,
        triton_kernels.fused_add_rmsnorm_triton,
        space.triton_configs,
        space.triton_default,
    )


@pytest.fixture(params=[pytest.param("cpu"), pytest.param("triton", marks=needs_triton)])
def backend(request: pytest.FixtureRequest) -> Backend:
    return _cpu_backend() if request.param == "cpu" else _triton_backend()


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every floating torch.empty and torch.empty_like come back filled with NaN, so unwritten outputs show."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = real_empty(*args, **kwargs)
        return t.fill_(math.nan) if t.is_floating_point() else t

    def empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = real_empty_like(*args, **kwargs)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)


# ---- helpers ---------------------------------------------------------------------------


def randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def spec_of(x: torch.Tensor) -> dict[str, Any]:
    M = x.numel() // x.shape[-1]
    return {"N": x.shape[-1], "dtype": str(x.dtype).removeprefix("torch."), "M": space.row_bucket(M)}


def ref_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.detach().cpu().double()
    return x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + eps) * weight.detach().cpu().double()


def expected_residual(x: torch.Tensor, residual: torch.Tensor, backend: Backend) -> torch.Tensor:
    """``residual + x`` rounded once to residual's dtype, as both backends store it.

    Triton's interpreter (not the GPU) casts float32 to bfloat16 by truncation; that is
    emulated here so the in-place update can still be checked bit for bit.
    """
    x, residual = x.cpu(), residual.cpu()
    if backend.name == "triton" and INTERPRET and residual.dtype == torch.bfloat16:
        s = residual.float() + x.float()
        return (s.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    return (residual.double() + x.double()).to(residual.dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64 = out.detach().cpu().double()
    assert torch.isfinite(out64).all(), "output has NaN/inf (an element not written?)"
    denom = ref.norm().item()
    return (out64 - ref).norm().item() / (denom if denom else 1.0)


def check_rmsnorm(backend: Backend, config: Config, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> None:
    x_before = x.clone()
    y = backend.call(backend.rmsnorm, config, x, w, eps)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device and y.is_contiguous()
    assert torch.equal(x, x_before), "x was modified"
    assert rel_err(y, ref_rmsnorm(x, w, eps)) <= TOL[x.dtype], config


def check_fused(
    backend: Backend, config: Config, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> None:
    x_before = x.clone()
    want_r = expected_residual(x, r, backend)
    ptr = r.data_ptr()
    y = backend.call(backend.fused, config, x, r, w, eps)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device and y.is_contiguous()
    assert torch.equal(x, x_before), "x was modified"
    assert r.data_ptr() == ptr
    assert torch.equal(r.cpu(), want_r), f"residual not updated as reference ({config})"
    assert rel_err(y, ref_rmsnorm(want_r, w, eps)) <= TOL[x.dtype], config


# ---- correctness with the default config -----------------------------------------------

SHAPES = [(1, 1), (3, 7), (4, 100), (2, 2880), (37, 64), (300, 16), (2, 3, 48)]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm_default(backend: Backend, poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    seed = 1000 * len(shape) + sum(shape) + 7 * list(DTYPES.values()).index(dtype)
    x = randn(shape, dtype, seed, backend.device)
    w = randn(shape[-1:], dtype, seed + 1, backend.device)
    check_rmsnorm(backend, backend.default(spec_of(x)), x, w)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_add_default(backend: Backend, poison: None, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    seed = 5000 + 1000 * len(shape) + sum(shape) + 7 * list(DTYPES.values()).index(dtype)
    x = randn(shape, dtype, seed, backend.device)
    r = randn(shape, dtype, seed + 1, backend.device)
    w = randn(shape[-1:], dtype, seed + 2, backend.device)
    check_fused(backend, backend.default(spec_of(x)), x, r, w)


def test_eps_is_applied(backend: Backend) -> None:
    x = randn((5, 40), torch.float32, 11, backend.device) * 1e-2
    w = randn((40,), torch.float32, 12, backend.device)
    r = randn((5, 40), torch.float32, 13, backend.device) * 1e-2
    cfg = backend.default(spec_of(x))
    check_rmsnorm(backend, cfg, x, w, eps=1e-3)
    check_fused(backend, cfg, x, r, w, eps=1e-3)
    check_rmsnorm(backend, cfg, x, w, eps=0)  # an int eps is accepted


@pytest.mark.parametrize(("x_dtype", "w_dtype"), [("bfloat16", "float32"), ("float32", "bfloat16"), ("float16", "bfloat16")])
def test_weight_dtype_differs(backend: Backend, poison: None, x_dtype: str, w_dtype: str) -> None:
    x = randn((6, 96), DTYPES[x_dtype], 21, backend.device)
    r = randn((6, 96), DTYPES[x_dtype], 22, backend.device)
    w = randn((96,), DTYPES[w_dtype], 23, backend.device)
    cfg = backend.default(spec_of(x))
    check_rmsnorm(backend, cfg, x, w)
    check_fused(backend, cfg, x, r, w)


def test_strided_rows(backend: Backend, poison: None) -> None:
    """Row-strided slices of wider tensors, 2-D and 3-D, are read and updated in place."""
    N = 50
    big_x = randn((9, 80), torch.float16, 31, backend.device)
    big_r = randn((9, 80), torch.float16, 32, backend.device)
    w = randn((N,), torch.float16, 33, backend.device)
    x, r = big_x[:, 5 : 5 + N], big_r[:, 7 : 7 + N]
    outside = big_r.clone()
    cfg = backend.default(spec_of(x))
    check_rmsnorm(backend, cfg, x, w)
    check_fused(backend, cfg, x, r, w)
    outside[:, 7 : 7 + N] = big_r[:, 7 : 7 + N]
    assert torch.equal(big_r, outside), "fused_add wrote outside the residual slice"

    big3 = randn((2, 3, 64), torch.float32, 34, backend.device)
    r3 = randn((2, 3, 64), torch.float32, 35, backend.device)[:, :, :N]
    check_rmsnorm(backend, cfg, big3[:, :, 10 : 10 + N], w.float())
    check_fused(backend, cfg, big3[:, :, :N], r3, w.float())
    # Leading dims of size 1 and a broadcast (stride-0) x are fine to read.
    check_rmsnorm(backend, cfg, big3[:1, 1:2, :N], w.float())
    check_rmsnorm(backend, cfg, randn((N,), torch.float32, 36, backend.device).expand(4, N), w.float())


def test_1d_input(backend: Backend) -> None:
    x = randn((33,), torch.float32, 41, backend.device)
    r = randn((33,), torch.float32, 42, backend.device)
    w = randn((33,), torch.float32, 43, backend.device)
    cfg = backend.default(spec_of(x))
    check_rmsnorm(backend, cfg, x, w)
    check_fused(backend, cfg, x, r, w)


def test_residual_aliases_x(backend: Backend) -> None:
    """``fused_add(x, x)`` doubles x in place, like ``x += x``."""
    x = randn((3, 24), torch.float32, 51, backend.device)
    w = randn((24,), torch.float32, 52, backend.device)
    want = x * 2
    y = backend.call(backend.fused, backend.default(spec_of(x)), x, x, w, 1e-6)
    assert torch.equal(x, want)
    assert rel_err(y, ref_rmsnorm(want, w, 1e-6)) <= TOL[torch.float32]


def test_empty_rows_no_launch(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.name == "triton":  # any launch would now fail
        monkeypatch.setattr(triton_kernels, "_rmsnorm_kernel", None)
        monkeypatch.setattr(triton_kernels, "_fused_add_rmsnorm_kernel", None)
    for shape in [(0, 16), (2, 0, 16)]:
        x = torch.empty(shape, device=backend.device)
        r = torch.empty(shape, device=backend.device)
        w = randn((16,), torch.float32, 61, backend.device)
        cfg = backend.default(spec_of(x))
        for y in (backend.call(backend.rmsnorm, cfg, x, w, 1e-6), backend.call(backend.fused, cfg, x, r, w, 1e-6)):
            assert y.shape == shape and y.dtype == x.dtype


# ---- every config of the spaces --------------------------------------------------------

# (spec, rows actually used): tiny rows for the interpreter, not multiples of ROWS.
TRITON_SPECS = [
    ({"N": 100, "dtype": "float16", "M": 32}, 37),
    ({"N": 5000, "dtype": "bfloat16", "M": 1}, 1),
    ({"N": 2880, "dtype": "float32", "M": 4096}, 3),
]
CPU_SPECS = [({"N": 100, "dtype": "float32", "M": 4096}, 301), ({"N": 2880, "dtype": "bfloat16", "M": 256}, 70)]


def _run_every_config(backend: Backend, spec: dict[str, Any], M: int) -> None:
    dtype = DTYPES[spec["dtype"]]
    N = spec["N"]
    configs = backend.configs(spec)
    assert configs
    for i, config in enumerate(configs):
        x = randn((M, N), dtype, 100 + i, backend.device)
        r = randn((M, N), dtype, 200 + i, backend.device)
        w = randn((N,), torch.float32, 300 + i, backend.device)
        check_rmsnorm(backend, config, x, w)
        check_fused(backend, config, x, r, w)


@needs_triton
@pytest.mark.parametrize(("spec", "M"), TRITON_SPECS, ids=lambda v: str(v) if isinstance(v, int) else f"N{v['N']}")
def test_every_triton_config(poison: None, spec: dict[str, Any], M: int) -> None:
    _run_every_config(_triton_backend(), spec, M)


@pytest.mark.parametrize(("spec", "M"), CPU_SPECS, ids=lambda v: str(v) if isinstance(v, int) else f"N{v['N']}")
def test_every_cpu_config(poison: None, spec: dict[str, Any], M: int) -> None:
    _run_every_config(_cpu_backend(), spec, M)


# ---- bad inputs ------------------------------------------------------------------------


def _bad_calls() -> list[Any]:
    x = torch.randn(4, 8)
    w = torch.randn(8)
    r = torch.randn(4, 8)
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
        # (id, rmsnorm args (x, w, eps), fused overrides, exception, argument named)
        ("x-list", ([[1.0]], w, 1e-6), {}, TypeError, "x"),
        ("w-list", (x, [1.0] * 8, 1e-6), {}, TypeError, "weight"),
        ("x-int", (x.long(), w, 1e-6), {}, TypeError, "x"),
        ("x-float64", (x.double(), w, 1e-6), {}, TypeError, "x"),
        ("w-int", (x, w.int(), 1e-6), {}, TypeError, "weight"),
        ("w-device", (x, w.to("meta"), 1e-6), {}, ValueError, "weight"),
        ("w-2d", (x, w[None], 1e-6), {}, ValueError, "weight"),
        ("w-length", (x, torch.randn(9), 1e-6), {}, ValueError, "weight"),
        ("w-strided", (x, torch.randn(16)[::2], 1e-6), {}, ValueError, "weight"),
        ("x-0d", (torch.tensor(1.0), torch.randn(1), 1e-6), {}, ValueError, "x"),
        ("x-N0", (torch.randn(4, 0), torch.randn(0), 1e-6), {}, ValueError, "x"),
        ("eps-str", (x, w, "1e-6"), {}, TypeError, "eps"),
        ("eps-bool", (x, w, True), {}, TypeError, "eps"),
        ("eps-none", (x, w, None), {}, TypeError, "eps"),
        ("eps-neg", (x, w, -1e-6), {}, ValueError, "eps"),
        ("eps-nan", (x, w, math.nan), {}, ValueError, "eps"),
        ("eps-inf", (x, w, math.inf), {}, ValueError, "eps"),
        ("x-col-stride", (torch.randn(8, 4).t(), w, 1e-6), {}, ValueError, "x"),
        ("x-not-collapsible", (torch.randn(3, 4, 8)[:, :2], w, 1e-6), {}, ValueError, "x"),
        ("x-transposed-rows", (torch.randn(3, 4, 8).transpose(0, 1), w, 1e-6), {}, ValueError, "x"),
        ("r-list", (x, w, 1e-6), {"residual": [[0.0]]}, TypeError, "residual"),
        ("r-int", (x, w, 1e-6), {"residual": r.long()}, TypeError, "residual"),
        ("r-dtype", (x, w, 1e-6), {"residual": r.half()}, TypeError, "residual"),
        ("r-shape", (x, w, 1e-6), {"residual": torch.randn(2, 2, 8)}, ValueError, "residual"),
        ("r-device", (x, w, 1e-6), {"residual": r.to("meta")}, ValueError, "residual"),
        ("r-col-stride", (x, w, 1e-6), {"residual": torch.randn(8, 4).t()}, ValueError, "residual"),
        ("r-broadcast", (x, w, 1e-6), {"residual": torch.randn(8).expand(4, 8)}, ValueError, "residual"),
        ("r-not-collapsible", (torch.randn(3, 2, 8), w, 1e-6), {"residual": torch.randn(3, 4, 8)[:, :2]}, ValueError, "residual"),
    ]
    return [pytest.param(*c[1:], id=c[0]) for c in cases]


@pytest.mark.parametrize(("args", "fused_over", "exc", "name"), _bad_calls())
def test_bad_inputs(backend: Backend, args: tuple[Any, ...], fused_over: dict[str, Any], exc: type[Exception], name: str) -> None:
    def to_dev(v: Any) -> Any:  # same sizes and strides on the backend's device (values unused)
        if not isinstance(v, torch.Tensor) or v.device.type != "cpu" or backend.device == "cpu":
            return v
        return torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=backend.device)

    x, w, eps = (to_dev(a) for a in args)
    config = backend.default({"N": 8, "dtype": "float32", "M": 4})
    if not fused_over:
        with pytest.raises(exc, match=rf"^{name}\b"):
            backend.call(backend.rmsnorm, config, x, w, eps)
    r_default = torch.randn(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    r = to_dev(fused_over.get("residual", r_default))
    with pytest.raises(exc, match=rf"^{name}\b"):
        backend.call(backend.fused, config, x, r, w, eps)


@needs_triton
@pytest.mark.parametrize("knobs", [{"BLOCK_N": 48, "ROWS": 1}, {"BLOCK_N": 64, "ROWS": 3}, {"BLOCK_N": 0, "ROWS": 1}])
def test_bad_triton_knobs(knobs: dict[str, int]) -> None:
    x = torch.randn(2, 64, device=_triton_backend().device)
    w = torch.randn(64, device=x.device)
    with pytest.raises(ValueError, match="BLOCK_N|ROWS"):
        triton_kernels.rmsnorm_triton(x, w, 1e-6, **knobs)


@pytest.mark.parametrize("row_block", [0, -4, 2.0, True])
def test_bad_cpu_knob(row_block: Any) -> None:
    with pytest.raises(ValueError, match="ROW_BLOCK"):
        cpu.rmsnorm_cpu(torch.randn(2, 8), torch.randn(8), 1e-6, ROW_BLOCK=row_block)


# ---- spaces and defaults ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("M", "bucket"),
    [(0, 1), (1, 1), (2, 32), (32, 32), (33, 256), (256, 256), (257, 4096), (4096, 4096), (4097, 32768), (10**9, 32768)],
)
def test_row_bucket(M: int, bucket: int) -> None:
    assert space.row_bucket(M) == bucket


@given(st.integers(min_value=0, max_value=10**7))
def test_row_bucket_is_smallest_cover(M: int) -> None:
    b = space.row_bucket(M)
    assert b in space.ROW_BUCKETS
    assert b >= M or b == 32768
    assert all(c < M for c in space.ROW_BUCKETS if c < b)


SPACE_SPECS = [
    {"N": n, "dtype": d, "M": m}
    for n in (1, 7, 100, 512, 1024, 2880, 4096, 5120, 7168, 8192, 16384, 20000, 32768, 100_000)
    for d in DTYPES
    for m in space.ROW_BUCKETS
]


def _pow2(v: object) -> bool:
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


@pytest.mark.parametrize("spec", SPACE_SPECS, ids=lambda s: f"N{s['N']}-{s['dtype']}-M{s['M']}")
def test_triton_space(spec: dict[str, Any]) -> None:
    configs = space.triton_configs(spec)
    N, M = spec["N"], spec["M"]
    P = 1 << (N - 1).bit_length()
    assert configs and len(set(configs)) == len(configs)
    for c in configs:
        k, h = c.kwargs, c.hints
        assert set(k) == {"BLOCK_N", "ROWS"} and _pow2(k["BLOCK_N"]) and _pow2(k["ROWS"])
        assert k["BLOCK_N"] <= P, "BLOCK_N wider than the row"
        assert k["ROWS"] <= M, "more rows per program than the bucket has"
        assert h["num_warps"] in (1, 2, 4, 8, 16, 32)
        if k["BLOCK_N"] < P:  # chunked
            assert N > 2048 and k["ROWS"] == 1
        else:
            assert "num_stages" not in h  # no loop to pipeline
    if 1024 <= N <= 32768 and M >= 32:
        assert 15 <= len(configs) <= 40, len(configs)
    if M == 1:
        assert {c.kwargs["ROWS"] for c in configs} == {1}
    default = space.triton_default(spec)
    assert default.kwargs in [c.kwargs for c in configs]
    assert default in configs


@pytest.mark.parametrize(("N", "M", "warps"), [(1024, 256, 2), (4096, 4096, 8), (8192, 4096, 8), (16384, 4096, 16)])
def test_triton_default_matches_measured_warps(N: int, M: int, warps: int) -> None:
    """The one-row kernel's best num_warps as measured on the H200."""
    d = space.triton_default({"N": N, "dtype": "bfloat16", "M": M})
    assert d.kwargs == {"BLOCK_N": N, "ROWS": 1} and d.hints["num_warps"] == warps


def test_triton_default_tiles_small_rows() -> None:
    assert space.triton_default({"N": 128, "dtype": "bfloat16", "M": 32768}).kwargs["ROWS"] > 1
    assert space.triton_default({"N": 1024, "dtype": "bfloat16", "M": 4096}).kwargs["ROWS"] == 2
    assert space.triton_default({"N": 128, "dtype": "bfloat16", "M": 32}).kwargs["ROWS"] == 1
    assert space.triton_default({"N": 32768, "dtype": "bfloat16", "M": 4096}).kwargs["BLOCK_N"] == 32768
    chunked = space.triton_default({"N": 65536, "dtype": "bfloat16", "M": 4096})
    assert chunked.kwargs["BLOCK_N"] < 65536


@pytest.mark.parametrize("spec", SPACE_SPECS, ids=lambda s: f"N{s['N']}-{s['dtype']}-M{s['M']}")
def test_cpu_space(spec: dict[str, Any]) -> None:
    configs = space.cpu_configs(spec)
    assert configs and len(set(configs)) == len(configs)
    blocks = [c.kwargs["ROW_BLOCK"] for c in configs]
    assert all(isinstance(b, int) and 1 <= b <= spec["M"] for b in blocks)
    assert all(c.hints == {} and set(c.kwargs) == {"ROW_BLOCK"} for c in configs)
    assert space.cpu_default(spec) in configs


@pytest.mark.parametrize("bad", [{"N": 0, "dtype": "float16", "M": 1}, {"N": 8, "dtype": "int8", "M": 1}, {"dtype": "float16"}])
def test_bad_spec(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="spec"):
        space.triton_configs(bad)
    with pytest.raises(ValueError, match="spec"):
        space.cpu_default(bad)


# ---- GPU: realistic shapes, every config -----------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("N", [1024, 2880, 8192])
@pytest.mark.parametrize("M", [1, 4096])
def test_gpu_every_config(M: int, N: int, dtype: torch.dtype, poison: None) -> None:
    backend = _triton_backend()
    configs = space.triton_configs({"N": N, "dtype": str(dtype).removeprefix("torch."), "M": space.row_bucket(M)})
    x = randn((M, N), dtype, N + M, "cuda")
    w = randn((N,), dtype, N + M + 1, "cuda")
    r0 = randn((M, N), dtype, N + M + 2, "cuda")
    for config in configs:
        check_rmsnorm(backend, config, x, w)
        check_fused(backend, config, x, r0.clone(), w)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("N", [16384, 20000, 32768, 65536, 100_000])
def test_gpu_wide_rows_default(N: int, dtype: torch.dtype, poison: None) -> None:
    backend = _triton_backend()
    config = space.triton_default({"N": N, "dtype": str(dtype).removeprefix("torch."), "M": 32})
    x = randn((3, N), dtype, N, "cuda")
    w = randn((N,), dtype, N + 1, "cuda")
    check_rmsnorm(backend, config, x, w)
    check_fused(backend, config, x, randn((3, N), dtype, N + 2, "cuda"), w)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("N", [1024, 5120, 16384])
def test_gpu_overflowing_rows_every_config(N: int, dtype: torch.dtype, poison: None) -> None:
    """Every config of the space, whole rows and chunks, on rows that overflow float32 among rows that do not."""
    M, huge = 37, [0, 5, 6, 20, 33, 35]
    x = overflowing_rows(M, N, huge, dtype, seed=N).to("cuda")
    configs = space.triton_configs({"N": N, "dtype": str(dtype).removeprefix("torch."), "M": space.row_bucket(M)})
    check_overflowing_rows(_triton_backend(), configs, x, dtype, huge)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_gpu_int64_row_offsets(dtype: torch.dtype) -> None:
    """Rows 2**31 elements apart: row offsets overflow int32 (bfloat16: the second row's sum of squares overflows
    too, rescued after the stores on one warp and in the sum on two)."""
    backend = _triton_backend()
    N, stride = 64, 2**31
    buf_x = torch.empty(stride + N, dtype=dtype, device="cuda")
    buf_r = torch.empty(stride + N, dtype=dtype, device="cuda")
    x = buf_x.as_strided((2, N), (stride, 1))
    r = buf_r.as_strided((2, N), (stride, 1))
    values = randn((2, N), torch.float32, 71)
    if dtype == torch.bfloat16:
        values[1] *= 1e20
    x.copy_(values.to(dtype))
    r.copy_(randn((2, N), dtype, 72))
    w = randn((N,), dtype, 73, "cuda")
    for warps in (1, 2) if dtype == torch.bfloat16 else (1,):
        config = Config({"BLOCK_N": 64, "ROWS": 2}, num_warps=warps)
        check_rmsnorm(backend, config, x, w)
        check_fused(backend, config, x, r, w)
        r.copy_(randn((2, N), dtype, 72))


@needs_triton
@pytest.mark.parametrize(("M", "N", "BLOCK_N", "ROWS", "strides", "last"), [
    (2, 64, 64, 1, (2**31 - 64,), 2**31 - 1),  # the last row ends exactly at INT32_MAX
    (2, 64, 64, 1, (2**31 - 63,), 2**31),
    (3, 100, 64, 4, (100,), 3 * 100 + 127),
    (3, 64, 64, 4, ((2**31 - 64) // 3 + 1,), 3 * ((2**31 - 64) // 3 + 1) + 63),  # only the masked 4th row passes
    (2, 33, 64, 1, (2**31 - 63,), 2**31 - 63 + 63),  # only the masked columns 33..63 pass
    (65537, 32768, 4096, 1, (32768,), 65536 * 32768 + 32767),
    (32768, 12288, 2048, 1, (12288,), 32767 * 12288 + 2047 + 10240),
    (32768, 12288, 2048, 1, (12288, 65538), 32767 * 65538 + 12287),  # the widest row stride decides
])
def test_int64_indexing_exactly_where_an_offset_passes_int32(M: int, N: int, BLOCK_N: int, ROWS: int,
                                                               strides: tuple[int, ...], last: int) -> None:
    assert triton_kernels is not None
    assert triton_kernels.needs_int64(M, N, BLOCK_N, ROWS, *strides) is (last > 2**31 - 1)
    assert triton_kernels._constexprs(M, N, BLOCK_N, ROWS, False, *strides, rescue=0)["OFF64"] is (last > 2**31 - 1)


@needs_triton
@pytest.mark.parametrize("dtype,block_n,rows,warps,mode", [
    (torch.float16, 128, 16, 8, "NO_RESCUE"),  # a float16 sum of squares cannot overflow
    (torch.bfloat16, 128, 1, 8, "RESCUE_AFTER"),  # one row: the tile-wide test is the row's own
    (torch.float32, 128, 4, 1, "RESCUE_AFTER"),  # one warp: the test stays inside it
    (torch.bfloat16, 128, 4, 1, "RESCUE_AFTER"),  # however few columns the warp's rows have
    (torch.bfloat16, 128, 2, 2, "RESCUE_IN_SUM"),  # a warp spans 256 bf16 columns: the rows spread over warps
    (torch.bfloat16, 1024, 2, 4, "RESCUE_AFTER"),  # 4 warps of 256 columns each along a row
    (torch.float32, 512, 2, 4, "RESCUE_AFTER"),
    (torch.float32, 512, 2, 8, "RESCUE_IN_SUM"),
    (torch.bfloat16, 512, 2, None, "RESCUE_IN_SUM"),  # Triton's default of 4 warps: 1024 columns wide
    (torch.bfloat16, 1024, 2, None, "RESCUE_AFTER"),
])
def test_rescue_mode_sums_scaled_squares_only_where_rows_spread_over_warps(dtype: torch.dtype, block_n: int, rows: int,
                                                                          warps: int | None, mode: str) -> None:
    assert triton_kernels is not None
    assert triton_kernels.rescue_mode(dtype, block_n, rows, warps) == getattr(triton_kernels, mode).value


@needs_triton
@pytest.mark.parametrize("regs,warps,cap", [
    (30, 4, 32),  # 16 blocks of 4 warps (the 64-warp limit) at up to 32 registers
    (40, 8, 40),  # 6 blocks of 8 warps: 48 registers would leave 5
    (20, 1, 64),  # 32 blocks (the block limit) of one warp at up to 64 registers
    (128, 8, 128),  # 2 blocks: 129 (136 allocated) would leave 1
    (200, 4, 255),  # 2 blocks of 4 warps at any count a thread may take
])
def test_occupancy_cap_keeps_the_blocks_a_sm(regs: int, warps: int, cap: int) -> None:
    assert triton_kernels is not None
    assert triton_kernels._occupancy_cap(regs, warps) == cap
    assert triton_kernels._blocks_per_sm(cap, warps) == triton_kernels._blocks_per_sm(regs, warps)
    assert cap == 255 or triton_kernels._blocks_per_sm(cap + 1, warps) < triton_kernels._blocks_per_sm(regs, warps)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's answer")
def test_compiled_registers_under_the_interpreter_says_there_is_no_binary() -> None:
    from flyreg.triton import compiled_registers, hints

    assert triton_kernels is not None
    x = torch.randn(2, 64)
    consts = triton_kernels._constexprs(2, 64, 64, 1, False, 64, rescue=0)
    with pytest.raises(RuntimeError, match="interpreter"):
        compiled_registers(triton_kernels._rmsnorm_kernel, (2,), (x, x[0], x, 2, 64, 1e-6), consts, hints(), x.device)


@needs_triton
def test_dense_rows_index_by_the_constexpr_width() -> None:
    assert triton_kernels is not None
    assert triton_kernels._constexprs(8, 64, 64, 1, False, 64, rescue=0)["X_DENSE"] is True
    consts = triton_kernels._constexprs(8, 64, 64, 1, False, 64, 96, rescue=0)
    assert (consts["X_DENSE"], consts["R_DENSE"]) == (True, False)
    assert triton_kernels._constexprs(8, 64, 64, 1, False, 96, rescue=0)["X_DENSE"] is False


@needs_triton
@pytest.mark.parametrize("config", [Config({"BLOCK_N": 64, "ROWS": 4}, num_warps=2),
                                    Config({"BLOCK_N": 32, "ROWS": 1}, num_warps=1, num_stages=1)])
def test_int64_and_int32_indexing_agree(monkeypatch: pytest.MonkeyPatch, config: Config, poison: None) -> None:
    """Both index widths, on strided rows with a masked-off last tile: the int64 path is taken by
    lowering the int32 limit (a real > 2**31-element case runs in the gpu-marked test)."""
    assert triton_kernels is not None
    backend = _triton_backend()
    big_x = randn((7, 90), torch.float32, 31, backend.device)
    big_r = randn((7, 80), torch.float32, 32, backend.device)
    x, w = big_x[:, :50], randn((50,), torch.float32, 33, backend.device)
    results = {}
    for limit in (2**31 - 1, 100):
        monkeypatch.setattr(triton_kernels, "INT32_MAX", limit)
        assert triton_kernels.needs_int64(7, 50, config.kwargs["BLOCK_N"], config.kwargs["ROWS"], 90) is (limit == 100)
        r = big_r.clone()[:, :50]  # strided too: the residual's runtime row stride
        check_rmsnorm(backend, config, x, w)
        check_fused(backend, config, x, r, w)
        results[limit] = (backend.call(backend.rmsnorm, config, x, w, 1e-6), r)
    assert torch.equal(results[100][0], results[2**31 - 1][0])
    assert torch.equal(results[100][1], results[2**31 - 1][1])


@needs_triton
@pytest.mark.parametrize(("interpreted", "capability", "want"), [
    (False, (9, 0), True), (False, (10, 0), True), (False, (8, 0), False), (True, (9, 0), False)])
def test_dependent_launch_only_compiled_on_hopper_and_later(monkeypatch: pytest.MonkeyPatch, interpreted: bool,
                                                             capability: tuple[int, int], want: bool) -> None:
    import flyreg.triton as ft

    monkeypatch.setattr(ft, "interpreted", lambda: interpreted)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert ft.pdl_supported(torch.device("cuda")) is want
    assert not ft.pdl_supported(torch.device("cpu"))


@needs_triton
def test_pdl_true_where_unsupported_is_a_value_error() -> None:
    assert triton_kernels is not None
    device = _triton_backend().device
    x, w = randn((2, 64), torch.float32, 91, device), randn((64,), torch.float32, 92, device)
    if not pdl_supported(x.device):  # always so in the interpreter
        with pytest.raises(ValueError, match="pdl=True needs"):
            triton_kernels.bind_rmsnorm(x, w, BLOCK_N=64, ROWS=1, pdl=True)
        with pytest.raises(ValueError, match="pdl=True needs"):
            triton_kernels.bind_fused_add_rmsnorm(x, x.clone(), w, BLOCK_N=64, ROWS=1, pdl=True)
    y = triton_kernels.bind_rmsnorm(x, w, BLOCK_N=64, ROWS=1, pdl=False)(x, w)
    assert rel_err(y, ref_rmsnorm(x, w, 1e-6)) <= TOL[torch.float32]


@gpu
@needs_cuda
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize(("M", "N", "config"), [
    (4096, 1024, Config({"BLOCK_N": 1024, "ROWS": 2}, num_warps=4)),
    (2048, 7168, Config({"BLOCK_N": 2048, "ROWS": 1}, num_warps=8, num_stages=1)),
])
def test_gpu_dependent_launches_read_what_the_kernel_before_wrote(pdl: bool, M: int, N: int, config: Config) -> None:
    """A chain in one CUDA graph, each kernel reading the one before's output (residual and y):
    with dependent launches every kernel still sees all of the previous one's writes."""
    assert triton_kernels is not None
    if pdl and not pdl_supported(torch.device("cuda")):
        pytest.skip("no programmatic dependent launch on this GPU")
    tk, kw = triton_kernels, {**config.kwargs, **config.hints, "pdl": pdl}
    x, r = randn((M, N), torch.bfloat16, 81, "cuda"), randn((M, N), torch.bfloat16, 82, "cuda")
    w = (torch.rand(N, device="cuda") + 0.5).to(torch.bfloat16)
    norm = tk.bind_rmsnorm(x, w, **kw)
    fused = tk.bind_fused_add_rmsnorm(x, r, w, **kw)
    steps = 6

    def chain() -> torch.Tensor:
        y = x
        for _ in range(steps):
            y = norm(fused(y, r, w), w)  # r += y; y = rmsnorm(rmsnorm(r))
        return y

    r0 = r.clone()
    chain()  # compile and warm
    if pdl:  # the binaries were compiled to launch as dependents, not only given the constexpr
        binaries = [k for cache in getattr(tk._rmsnorm_kernel, "device_caches", {}).values() for k in cache[0].values()]
        assert any(getattr(k.metadata, "launch_pdl", False) for k in binaries)
    r.copy_(r0)
    want_r, want_y = r0.cpu().double(), x.cpu()
    for _ in range(steps):  # the same chain in float64, rounding where the kernels store
        want_r = (want_r + want_y.double()).to(torch.bfloat16).double()
        want_y = ref_rmsnorm(ref_rmsnorm(want_r, w, 1e-6).to(torch.bfloat16), w, 1e-6).to(torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    r.copy_(r0)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(r, want_r) <= TOL[torch.bfloat16]
    assert rel_err(out, want_y.double()) <= 2 * TOL[torch.bfloat16]


# ---- rows whose float32 sum of squares overflows -----------------------------------------


def overflowing_rows(M: int, N: int, huge: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Fresh random rows; the ``huge`` rows cycle through squares that overflow float32 on their own
    (x ~ 1e20), values near the top of the range (x ~ 3e37), and finite squares whose sum overflows;
    the row after each is tiny (x ~ 1e-20), and the last row holds a NaN."""
    x = randn((M, N), torch.float32, seed=seed)
    for k, i in enumerate(huge):
        x[i] *= (1e20, 3e37, 1.5 * math.sqrt(F32_MAX / N))[k % 3]
        if k % 3 == 2:  # only the sum overflows
            assert torch.isfinite(x[i].square()).all() and x[i].double().square().sum() > F32_MAX
        if i + 1 < M - 1 and i + 1 not in huge:
            x[i + 1] *= 1e-20
    x[M - 1, N // 2] = math.nan
    return x.to(dtype)


def assert_rows_match(out: torch.Tensor, ref: torch.Tensor, rows: list[int], tol: float, what: object) -> None:
    """Each of ``rows`` on its own (a tiny row must not hide in a huge row's error); NaN rows stay NaN."""
    out = out.detach().cpu().double()
    for i in rows:
        if torch.isnan(ref[i]).any():
            assert torch.isnan(out[i]).any(), (what, i)
        else:
            assert rel_err(out[i], ref[i]) < tol, (what, i)


def check_overflowing_rows(backend: Backend, configs: list[Config], x: torch.Tensor, dtype: torch.dtype,
                           huge: list[int]) -> None:
    """Both ops under every config on ``x`` (from :func:`overflowing_rows`): the ``huge`` rows, the other rows
    (tiny, plain and NaN) each on its own, and the residual update."""
    M, N = x.shape
    w = randn((N,), torch.float32, seed=N).to(dtype).to(x.device)
    residual = torch.empty_strided(tuple(x.shape), x.stride(), dtype=dtype, device=x.device)  # x's row stride
    residual.copy_(randn(tuple(x.shape), torch.float32, seed=N + 1).to(dtype))
    ref = ref_rmsnorm(x, w, 1e-6)
    want_r = expected_residual(x, residual, backend)
    fused_ref = ref_rmsnorm(want_r, w, 1e-6)
    assert ref[:-1].abs().amax(-1).min() > 0 and torch.isfinite(ref[:-1]).all()
    rows = huge + [i for i in range(M) if i not in huge]
    ok = ~torch.isnan(want_r.cpu().double())
    for config in configs:
        assert_rows_match(backend.call(backend.rmsnorm, config, x, w, 1e-6), ref, rows, TOL[dtype], config)
        r = residual.clone()
        fused = backend.call(backend.fused, config, x, r, w, 1e-6)
        assert torch.equal(r.cpu()[ok], want_r.cpu()[ok]), config  # the residual added once, not again
        assert_rows_match(fused, fused_ref, rows, TOL[dtype], config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_n", [64, 16])  # one pass over 48 columns, and chunks
@pytest.mark.parametrize("N,row_stride", [(48, 48), (300, 312)])  # dense rows; strided ones, a column tail
def test_overflowing_sum_of_squares_matches_the_float64_reference(backend: Backend, dtype: torch.dtype, block_n: int,
                                                                  N: int, row_stride: int) -> None:
    if backend.name == "cpu" and block_n != 64:
        pytest.skip("the CPU path has no BLOCK_N")
    M, huge = 9, [0, 2, 4]  # 9 rows: the last tile of 2 or 4 rows is masked
    values = overflowing_rows(M, N, huge, dtype, seed=11)
    x = torch.zeros(M, row_stride, dtype=dtype)[:, :N].copy_(values).to(backend.device)
    if backend.name == "triton":  # one-row and several-row tiles, a tile with no overflowing row among them;
        # (2, 2) spreads its rows over warps (RESCUE_IN_SUM), the others test after the stores (RESCUE_AFTER)
        configs = [Config({"BLOCK_N": block_n, "ROWS": rows}, num_warps=w) for rows, w in ((1, 1), (2, 2), (4, 1))]
        assert triton_kernels is not None
        modes = {triton_kernels.rescue_mode(dtype, block_n, c.kwargs["ROWS"], c.hints["num_warps"]) for c in configs}
        assert modes == {triton_kernels.RESCUE_AFTER.value, triton_kernels.RESCUE_IN_SUM.value}
    else:
        configs = backend.configs(spec_of(x))[:3] or [backend.default(spec_of(x))]
    check_overflowing_rows(backend, configs, x, dtype, huge)
