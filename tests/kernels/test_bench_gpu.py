"""do_bench on a real GPU: event timing, L2 flush, CUDA-graph mode (marker ``gpu``)."""

from __future__ import annotations

import pytest
import torch

from flyreg import do_bench

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_event_timing_scales_with_work() -> None:
    small = torch.randn(1 << 24, device="cuda")
    big = torch.randn(1 << 26, device="cuda")
    out_s, out_b = torch.empty_like(small), torch.empty_like(big)
    t_small = do_bench(lambda: out_s.copy_(small), 3, 20, device="cuda").median
    t_big = do_bench(lambda: out_b.copy_(big), 3, 20, device="cuda").median
    assert 2.5 < t_big / t_small < 6.0  # 4x the bytes, both well past launch overhead


def test_setup_runs_outside_the_timed_region() -> None:
    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    big = torch.randn(1 << 27, device="cuda")
    plain = do_bench(lambda: y.copy_(x), 3, 20, device="cuda").median
    with_setup = do_bench(lambda: y.copy_(x), 3, 20, device="cuda", setup=lambda: big.mul_(1.0)).median
    assert with_setup < plain * 1.5  # the 8x larger setup kernel is not counted


@pytest.mark.parametrize("with_setup", [False, True])
def test_cuda_graph_mode_times_replays(with_setup: bool) -> None:
    x = torch.randn(4096, device="cuda")
    acc = torch.zeros_like(x)
    setup = (lambda: acc.zero_()) if with_setup else None
    launches = do_bench(lambda: acc.add_(x), 5, 50, device="cuda", setup=setup, flush_l2=False).median
    graphed = do_bench(lambda: acc.add_(x), 5, 50, device="cuda", setup=setup, cuda_graph=True)
    assert 0 < graphed.median <= launches  # replays skip the host launch gap
    assert graphed.reps == 50
