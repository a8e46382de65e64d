"""The compiled-kernel launcher of the RMSNorm plugin on a real GPU (marker ``gpu``).

The bound launcher calls Triton's C launcher directly; these tests check that it computes what
``kernel[grid]`` computes, and that it falls back to ``kernel[grid]`` where the shortcut would be
wrong (a misaligned tensor, a launch hook set).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import flyreg

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

EPS = 1e-6


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps) * w.double()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("M,N,rows,block,warps", [(1, 4096, 1, 4096, 8), (300, 2880, 1, 4096, 4),
                                                  (4096, 1024, 4, 1024, 8), (64, 16384, 1, 4096, 8)])
def test_bound_launch_equals_the_generic_launch_bitwise(M: int, N: int, rows: int, block: int, warps: int) -> None:
    from flyreg_rmsnorm import triton_kernels as tk

    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    bound = tk.bind_rmsnorm(x, w, EPS, BLOCK_N=block, ROWS=rows, num_warps=warps)
    for _ in range(2):  # fresh inputs of the bound signature, not the ones bound with
        x.normal_()
        y = bound(x, w)
        want = torch.full_like(x, float("nan"))
        tk._rmsnorm_kernel[((M + rows - 1) // rows,)](x, w, want, M, N, EPS, **tk._constexprs(
            M, N, block, rows, False, N, rescue=tk.rescue_mode(x.dtype, block, rows, warps)), num_warps=warps)
        assert torch.equal(y, want)
        assert rel_err(y, reference(x, w)) < 1e-2


def test_a_misaligned_input_of_a_bound_signature_is_launched_correctly() -> None:
    op = flyreg.op("rmsnorm")
    M, N = 8, 4096
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    op(x, w)  # binds the signature (M, N) contiguous, on a 16-byte-aligned x
    flat = torch.randn(M * N + 1, device="cuda", dtype=torch.bfloat16)
    shifted = flat[1:].view(M, N)  # same shape and strides, address 2 bytes past alignment
    assert shifted.data_ptr() % 16 and shifted.stride() == x.stride()
    assert rel_err(op(shifted, w), reference(shifted, w)) < 1e-2
    assert rel_err(op(x, w), reference(x, w)) < 1e-2  # and the aligned calls still take the fast path correctly


def test_fused_misaligned_residual_is_updated_and_normalized() -> None:
    op = flyreg.op("fused_add_rmsnorm")
    M, N = 16, 2048
    w = torch.rand(N, device="cuda", dtype=torch.float16) + 0.5
    op(torch.randn(M, N, device="cuda", dtype=torch.float16), torch.randn(M, N, device="cuda", dtype=torch.float16), w)
    x = torch.randn(M, N, device="cuda", dtype=torch.float16)
    flat = torch.randn(M * N + 3, device="cuda", dtype=torch.float16)
    residual = flat[3:].view(M, N)
    stored = (residual.double() + x.double()).to(torch.float16)
    y = op(x, residual, w)
    assert torch.equal(residual, stored)
    assert rel_err(y, reference(stored, w)) < 2e-3


def test_a_launch_hook_sees_every_launch() -> None:
    from triton import knobs

    from flyreg_rmsnorm import triton_kernels as tk

    x = torch.randn(32, 1024, device="cuda", dtype=torch.float32)
    w = torch.rand(1024, device="cuda", dtype=torch.float32) + 0.5
    bound = tk.bind_rmsnorm(x, w, EPS, BLOCK_N=1024, ROWS=1, num_warps=4)
    seen: list[str] = []
    old = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = lambda metadata: seen.append(metadata.get()["name"])
    try:
        y = bound(x, w)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.launch_enter_hook = old
    assert seen and "rmsnorm" in seen[0]
    assert rel_err(y, reference(x, w)) < 1e-5


def test_aligned_calls_skip_kernel_grid_and_the_others_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyreg_rmsnorm import triton_kernels as tk

    kernel = tk._rmsnorm_kernel
    M, N = 4, 2048
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    bound = tk.bind_rmsnorm(x, w, EPS, BLOCK_N=2048, ROWS=1, num_warps=4)
    generic: list[int] = []
    real_run = kernel.run

    def counted(*args: Any, **kwargs: Any) -> Any:  # JITFunction.run is what kernel[grid](...) calls
        generic.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", counted)
    for _ in range(3):
        x.normal_()
        assert rel_err(bound(x, w), reference(x, w)) < 1e-2
    assert generic == []  # aligned: the compiled kernel's launcher, directly
    shifted = torch.randn(M * N + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, N)
    assert rel_err(bound(shifted, w), reference(shifted, w)) < 1e-2
    assert generic == [1]  # misaligned: Triton's own launch, which picks an unaligned binary
    hook = lambda *args, **kwargs: None  # noqa: E731
    kernel.add_pre_run_hook(hook)
    try:
        assert rel_err(bound(x, w), reference(x, w)) < 1e-2
    finally:
        kernel.pre_run_hooks.remove(hook)
    assert generic == [1, 1]  # a pre-run hook must see the launch


def test_compiled_registers_reads_the_binary_a_launch_runs() -> None:
    from flyreg.triton import compiled_registers, hints
    from flyreg_rmsnorm import triton_kernels as tk

    M, N = 64, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    args = (x, w, torch.empty_like(x), M, N, EPS)
    consts = tk._constexprs(M, N, 4096, 1, False, N, rescue=tk.NO_RESCUE.value)
    free = compiled_registers(tk._rmsnorm_kernel, (M,), args, consts, hints(num_warps=8), x.device)
    capped = compiled_registers(tk._rmsnorm_kernel, (M,), args, consts, {**hints(num_warps=8), "maxnreg": 32},
                                x.device)
    assert free > 0 and 0 < capped <= 32
    cap = tk._occupancy_cap(free, 8)
    options = tk._capped(tk._rmsnorm_kernel, (M,), args, {**consts, "RESCUE": tk.RESCUE_AFTER.value},
                         hints(num_warps=8), x.device)
    assert options["maxnreg"] == cap  # the bound rescue kernel keeps the rescue-free kernel's blocks a SM
