"""Steady-state timing's GPU-free parts: input copies that keep the call's layout and aliasing,
and how many copies and calls a replay uses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flyreg._core.device_facts import rotate_bytes
from flyreg._search import steady
from flyreg._search.engine import InPlace


def test_copies_are_new_memory_with_equal_values() -> None:
    x, w = torch.randn(8, 16), torch.randn(16)
    s = steady.copy_inputs((x, w, 1e-6), {"out": torch.zeros(8, 16)})
    cx, cw, eps = s.args
    assert eps == 1e-6
    assert torch.equal(cx, x) and torch.equal(cw, w) and torch.equal(s.kwargs["out"], torch.zeros(8, 16))
    assert cx.data_ptr() != x.data_ptr() and cw.data_ptr() != w.data_ptr()
    cx.add_(1.0)
    assert not torch.equal(cx, x)  # writing a copy leaves the call's tensor alone
    assert s[x] is cx and s[w] is cw


def test_a_strided_slice_keeps_its_offset_and_strides() -> None:
    base = torch.randn(6, 32)
    x = base[1:5, 8:24]  # offset 40, row stride 32
    (c,) = steady.copy_inputs((x,), {}).args
    assert c.shape == x.shape and c.stride() == x.stride() and c.storage_offset() == x.storage_offset()
    assert torch.equal(c, x)


def test_views_of_one_storage_stay_views_of_one_copy() -> None:
    buf = torch.randn(4, 8)
    x, r = buf[:, :4], buf[:, 4:]
    s = steady.copy_inputs((x, r, buf), {})
    cx, cr, cbuf = s.args
    assert cx.untyped_storage().data_ptr() == cr.untyped_storage().data_ptr() == cbuf.untyped_storage().data_ptr()
    cbuf.zero_()
    assert not cx.any() and not cr.any()  # an in-place kernel writing one sees it through the other
    assert buf.abs().sum() > 0


def test_the_same_tensor_twice_is_one_copy() -> None:
    x = torch.randn(5)
    s = steady.copy_inputs((x, [x, {"again": x}]), {})
    a, (b, d) = s.args
    assert a is b is d["again"]


def test_an_expanded_tensor_is_copied_as_its_storage() -> None:
    w = torch.randn(16).expand(4, 16)  # stride 0: one row of storage
    (c,) = steady.copy_inputs((w,), {}).args
    assert c.stride() == (0, 1) and torch.equal(c, w)


def test_a_storage_over_the_budget_is_shared() -> None:
    big, small = torch.randn(1024), torch.randn(8)
    s = steady.copy_inputs((big, small), {}, budget=1024)
    assert s.args[0] is big
    assert s.args[1] is not small and s[small] is s.args[1]
    assert s[big] is big


def test_copy_budget_leaves_a_serving_gpu_its_memory() -> None:
    gib = 1 << 30
    assert steady.copy_budget(100 * gib) == steady.COPY_BUDGET
    assert steady.copy_budget(2 * gib) == gib // 2  # a quarter of what is free
    assert steady.copy_budget(0) == 0 and steady.copy_budget(-5) == 0
    assert steady.set_count(8 << 20, prepared=False, budget=steady.copy_budget(0)) == 1  # no room: no copies


def test_storages_counts_each_storage_once() -> None:
    buf = torch.randn(4, 8)
    w = torch.randn(8, dtype=torch.float64)
    assert sorted(steady.storages((buf[:2], buf[2:], w), {"k": [buf]}).values()) == [64, 128]


@settings(max_examples=200, deadline=None)
@given(set_bytes=st.integers(0, 1 << 34), prepared=st.booleans(), budget=st.integers(0, 1 << 32))
def test_set_count_bounds(set_bytes: int, prepared: bool, budget: int) -> None:
    rotate = 128 << 20
    n = steady.set_count(set_bytes, prepared, budget, rotate=rotate)
    assert 1 <= n <= steady.MAX_SETS
    assert (n - 1) * set_bytes <= budget  # the copies fit the budget (the call's own set is free)
    want = steady.MAX_SETS if prepared or not set_bytes else -(-rotate // set_bytes)
    if set_bytes and n < min(want, steady.MAX_SETS):
        assert n == 1 + budget // set_bytes  # short of what it wants only for want of budget


def test_set_count_rotates_by_bytes_viewed_and_fits_the_copies_in_the_budget() -> None:
    mb = 1 << 20
    # a 4 MiB slice of a 900 MiB storage: rotated as 4 MiB a set, but only one copy fits 1 GiB
    assert steady.set_count(4 * mb, prepared=False, copy_bytes=900 * mb) == 2
    assert steady.set_count(4 * mb, prepared=False, copy_bytes=4 * mb, rotate=128 * mb) == 32


def test_viewed_bytes_counts_elements_not_storages() -> None:
    base = torch.randn(1000, 64)
    x = base[:10]
    assert steady.viewed_bytes((x, x, [base[10:20]]), {"w": torch.randn(8, dtype=torch.float64)}) == \
        10 * 64 * 4 * 2 + 8 * 8


def test_set_count_rotates_past_the_l2() -> None:
    mb = 1 << 20
    rotate = rotate_bytes()  # of the current device; assumed off CUDA
    assert steady.set_count(8 * mb, prepared=False) == rotate // (8 * mb)
    assert steady.set_count(rotate, prepared=False) == 1
    assert steady.set_count(8 * mb, prepared=False, rotate=256 * mb) == 32
    assert steady.set_count(512, prepared=False) == steady.MAX_SETS
    assert steady.set_count(8 * mb, prepared=True) == steady.MAX_SETS  # each set runs once a replay
    assert steady.set_count(600 * mb, prepared=True) == 2
    assert steady.set_count(0, prepared=True) == 1


@pytest.mark.parametrize(("sets", "call_ms", "prepared", "want"), [
    (4, 0.0001, False, steady.MAX_CALLS),  # short calls: as many as allowed, a multiple of the sets
    (3, 0.0001, False, 258),
    (4, 0.001, False, 252),  # 0.25 ms of calls, rounded up to whole rounds
    (4, 0.05, False, 8),
    (16, 0.05, False, 16),  # never fewer than one call per set
    (1, 2.0, False, 1),
    (7, 0.001, True, 7),  # prepared: each set exactly once
])
def test_calls_per_replay(sets: int, call_ms: float, prepared: bool, want: int) -> None:
    n = steady.calls_per_replay(sets, call_ms, prepared)
    assert n == want and n % sets == 0


@pytest.mark.parametrize(("sets", "call_ms", "prepared", "want"), [
    (4, 0.0001, False, 8 * steady.MAX_CALLS),  # the cap scales too
    (4, 0.001, False, 2000),  # 2 ms of calls
    (4, 0.05, False, 40),
    (7, 0.001, True, 7),  # prepared: still each set once (the reps scale instead)
])
def test_calls_per_replay_scaled(sets: int, call_ms: float, prepared: bool, want: int) -> None:
    assert steady.calls_per_replay(sets, call_ms, prepared, scale=8) == want


def test_in_place_prepare_restores_zeroes_and_hooks_one_set() -> None:
    r, acc, x = torch.randn(4), torch.randn(4), torch.randn(4)
    snapshot = {"r": r.clone()}
    acc_before = acc.clone()
    s = steady.copy_inputs((x, r, acc), {})
    seen = []
    in_place = InPlace({"r": r}, snapshot, [acc])
    s.args[1].add_(5.0)
    in_place.prepare(s, lambda args, kwargs: seen.append(args[0]))
    assert torch.equal(s.args[1], snapshot["r"]) and not s.args[2].any()
    assert seen == [s.args[0]]
    assert torch.equal(acc, acc_before)  # the call's own tensors are untouched


def _tuner(**kw: object) -> object:
    from flyreg import Config, autotune_builder

    return autotune_builder("steady_opts_probe", lambda config, spec: (lambda x: x), lambda x: {"n": 1},
                            [Config({"K": 1})], **kw)


def test_timing_is_checked_and_cuda_graph_is_a_deprecated_alias() -> None:
    assert _tuner().timing == "steady"
    assert _tuner(timing="flushed").timing == "flushed"
    with pytest.raises(ValueError, match="timing must be one of"):
        _tuner(timing="fast")
    with pytest.warns(DeprecationWarning, match="cuda_graph= is deprecated"):
        assert _tuner(cuda_graph=True).timing == "graph"
