"""Steady-state timing on a real GPU, seen through a search (marker ``gpu``): the input copies a search
times on keep the call's layout and rotate past the L2, time follows the bytes read from HBM, prepared
sets run once a replay, candidates share one replay length, and a search falls back to flushed timing."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from flyreg import Config, autotune_builder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: Most input sets a search rotates through, and fewest where the op draws its inputs by seed (docs/autotune_guide.md).
MAX_SETS, DRAWS = 64, 4

Call = tuple[tuple[Any, ...], dict[str, Any]]


def tuned_calls(name: str, *args: Any, launch: Callable[..., torch.Tensor] | None = None,
                **options: Any) -> list[Call]:
    """The arguments of every launch a steady-state search of an op made: two configs of the same
    ``launch`` (default: a copy of the first argument), tuned on ``args``."""
    seen: list[Call] = []

    def build(config: Config, spec: dict) -> Callable[..., torch.Tensor]:
        def recorded(*call_args: Any, **call_kwargs: Any) -> torch.Tensor:
            seen.append((call_args, call_kwargs))
            return launch(*call_args) if launch is not None else call_args[0].clone()
        return recorded

    tuner = autotune_builder(name, build, lambda *a, **k: {"n": 1}, [Config({"K": 1}), Config({"K": 2})],
                             **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuner.tune(*args, emit=False)
    assert not fell_back(caught)  # flushed timing would time no copies
    return seen


def fell_back(caught: list[warnings.WarningMessage]) -> bool:
    return any("cannot be timed in a CUDA graph" in str(w.message) for w in caught)


def input_sets(seen: list[Call]) -> list[tuple[Any, ...]]:
    """The distinct argument sets the launches got, told apart by the first tensor's address."""
    sets: dict[int, tuple[Any, ...]] = {}
    for args, _ in seen:
        sets.setdefault(args[0].data_ptr(), args)
    return list(sets.values())


def copies(seen: list[Call], own: torch.Tensor) -> list[tuple[Any, ...]]:
    """The argument sets other than the call's own (whose first argument is ``own``)."""
    found = [s for s in input_sets(seen) if s[0].data_ptr() != own.data_ptr()]
    assert found, "the search timed no copy of the inputs"
    return found


def rotate_bytes() -> int:
    """Twice the L2 the device reports, rounded up to a power of two."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return 1 << (2 * l2 - 1).bit_length()


def test_copies_are_new_memory_with_equal_values_and_the_calls_own_set_is_one_of_them() -> None:
    x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, device="cuda")
    seen = tuned_calls("steady_copies_probe", x, w, 1e-6)
    assert any(args[0] is x and args[1] is w for args, _ in seen)
    for cx, cw, eps in copies(seen, x):
        assert eps == 1e-6
        assert torch.equal(cx, x) and torch.equal(cw, w)
        assert cx.data_ptr() != x.data_ptr() and cw.data_ptr() != w.data_ptr()
        cx.add_(1.0)
        assert not torch.equal(cx, x)  # writing a copy leaves the call's tensor alone


def test_a_strided_slice_keeps_its_offset_and_strides() -> None:
    base = torch.randn(6, 32, device="cuda")
    x = base[1:5, 8:24]  # offset 40, row stride 32
    for (c,) in copies(tuned_calls("steady_slice_probe", x), x):
        assert c.shape == x.shape and c.stride() == x.stride() and c.storage_offset() == x.storage_offset()
        assert torch.equal(c, x)


def test_views_of_one_storage_stay_views_of_one_copy() -> None:
    buf = torch.randn(4, 8, device="cuda")
    x, r = buf[:, :4], buf[:, 4:]
    for cx, cr, cbuf in copies(tuned_calls("steady_views_probe", x, r, buf), x):
        assert cx.untyped_storage().data_ptr() == cr.untyped_storage().data_ptr() == cbuf.untyped_storage().data_ptr()
        assert cbuf.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
        cbuf.zero_()
        assert not cx.any() and not cr.any()  # an in-place kernel writing one sees it through the other
    assert buf.abs().sum() > 0


def test_the_same_tensor_twice_is_one_copy() -> None:
    x = torch.randn(5, device="cuda")
    for a, (b, d) in copies(tuned_calls("steady_twice_probe", x, [x, {"again": x}]), x):
        assert a is b is d["again"]


def test_an_expanded_tensor_is_copied_as_its_storage() -> None:
    w = torch.randn(16, device="cuda").expand(4, 16)  # stride 0: one row of storage
    for (c,) in copies(tuned_calls("steady_expanded_probe", w), w):
        assert c.stride() == (0, 1) and torch.equal(c, w)


def test_the_sets_rotate_past_the_l2() -> None:
    mb = 1 << 20
    x = torch.randn(8 * mb // 4, device="cuda")
    assert len(input_sets(tuned_calls("steady_rotate_probe", x))) == min(MAX_SETS, rotate_bytes() // (8 * mb))
    small = torch.randn(128, device="cuda")  # 512 bytes: as many sets as allowed
    assert len(input_sets(tuned_calls("steady_rotate_small_probe", small))) == MAX_SETS
    big = torch.randn(rotate_bytes() // 4, device="cuda")  # past the L2 on its own: no copy
    assert len(input_sets(tuned_calls("steady_rotate_big_probe", big))) == 1


def test_a_slice_rotates_by_its_own_bytes_and_its_storage_copies_fit_the_budget() -> None:
    mb = 1 << 20
    base = torch.randn(900 * mb // 4, device="cuda")  # 900 MiB: one copy fits the 1 GiB copy budget, two do not
    x = base[: 4 * mb // 4]  # a 4 MiB view: 32 sets would rotate it past the L2
    sets = input_sets(tuned_calls("steady_slice_budget_probe", x))
    assert len(sets) == 2
    (c,) = [s[0] for s in sets if s[0].data_ptr() != x.data_ptr()]
    assert c.untyped_storage().nbytes() == base.untyped_storage().nbytes() and torch.equal(c, x)
    huge = torch.randn(1536 * mb // 4, device="cuda")  # over the budget on its own: never copied
    assert len(input_sets(tuned_calls("steady_over_budget_probe", huge[: 4 * mb // 4]))) == 1


def test_time_follows_the_bytes_past_the_l2() -> None:
    def clone_ms(n: int, name: str) -> float:
        x = torch.randn(n, device="cuda")
        tuner = autotune_builder(name, lambda config, spec: (lambda x: x.clone()), lambda x: {"n": x.numel()},
                                 [Config({"K": 1}), Config({"K": 2})])
        return tuner.tune(x, emit=False).winner_ms

    t_small = clone_ms(1 << 24, "steady_bytes_small_probe")  # 64 MB
    t_big = clone_ms(1 << 26, "steady_bytes_big_probe")  # 256 MB
    assert 3.0 < t_big / t_small < 5.5  # 4x the bytes, both from HBM


def test_prepared_sets_run_once_a_replay_on_prepared_inputs() -> None:
    acc = torch.zeros(1 << 16, device="cuda")

    def bump(acc: torch.Tensor) -> torch.Tensor:
        out = acc.clone()
        acc.add_(1.0)
        return out

    seen = tuned_calls("steady_prepared_probe", acc, launch=bump, arg_names=["acc"], reset_to_zero=["acc"])
    assert len(input_sets(seen)) == MAX_SETS  # each set runs once a replay: as many as allowed
    sets = copies(seen, acc)
    for (c,) in sets:
        assert torch.all(c == 1.0)  # zeroed before the last replay, then run exactly once in it
    assert not acc.any()  # the call's own tensor is zeroed again after the search


def test_search_falls_back_to_flushed_timing_when_capture_fails() -> None:
    x = torch.randn(1 << 20, device="cuda")

    def build(config: Config, spec: dict):
        def launch(x: torch.Tensor) -> torch.Tensor:
            y = x * config.kwargs["K"]
            torch.cuda.synchronize()  # not allowed while a graph is captured
            return y
        return launch

    tuner = autotune_builder("steady_fallback_probe", build, lambda x: {"n": x.numel()},
                             [Config({"K": 1.0}), Config({"K": 2.0})])
    before = torch.cuda.current_stream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = tuner.tune(x, emit=False)
    assert torch.cuda.current_stream() == before  # the failed capture did not leave its stream current
    assert fell_back(caught)
    assert len(report.timings) == 2 and not report.failed
    assert torch.randn(4, device="cuda").isfinite().all()  # the failed capture left torch's RNG usable


def test_every_candidate_of_a_round_is_replayed_at_one_length() -> None:
    x = torch.randn(1 << 16, device="cuda")
    calls: Counter[int] = Counter()

    def build(config: Config, spec: dict) -> Any:
        def launch(x: torch.Tensor) -> torch.Tensor:
            calls[config.kwargs["K"]] += 1
            for _ in range(config.kwargs["K"]):  # eager calls of very different lengths
                x = x * 1.0
            return x
        return launch

    tuner = autotune_builder("shared_replay_probe", build, lambda x: {"n": x.numel()},
                             [Config({"K": k}) for k in (1, 8, 64)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = tuner.tune(x, emit=False)
    assert not fell_back(caught)
    assert report.winner == Config({"K": 1}) and len(report.timings) == 3
    # Far apart, so no final round: the two candidates after the first (which also warms the GPU and
    # sizes the replay) are checked once and captured at the first's length, though 8 times apart.
    assert calls[8] == calls[64] > 1
    assert calls[1] > calls[8]


def test_an_op_drawn_by_seed_is_timed_over_its_draws() -> None:
    # make_inputs takes a seed: the sets a search rotates through hold draws 0 to DRAWS - 1, not copies of one.
    seen: list[torch.Tensor] = []

    def build(config: Config, spec: dict) -> Callable[..., torch.Tensor]:
        def recorded(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            seen.append(ids)
            return x.clone()
        return recorded

    def make(spec: dict, device: str, seed: int = 0) -> Call:
        g = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(spec["n"], 64, device=device, generator=g),
                torch.randint(0, 1 << 20, (spec["n"],), device=device, generator=g)), {}

    tuner = autotune_builder("steady_draws_probe", build, lambda x, ids: {"n": int(x.shape[0])},
                             [Config({"K": 1}), Config({"K": 2})])
    tuner.make_inputs, tuner.seeded_inputs = make, True
    report = tuner.tune(*make({"n": 256}, "cuda")[0], emit=False)
    timed = {tuple(t.tolist()) for t in seen}
    drawn = [tuple(make({"n": 256}, "cuda", seed)[0][1].tolist()) for seed in range(DRAWS)]
    assert len(set(drawn)) == DRAWS and set(drawn) <= timed
    assert report.decision.timing.inputs == "draws"
    # Draws unlike the call (another row count) leave every set a copy of it: the record says copies.
    unlike = autotune_builder("steady_draws_unlike_probe", build, lambda x, ids: {"n": int(x.shape[0])},
                              [Config({"K": 1}), Config({"K": 2})])
    unlike.make_inputs, unlike.seeded_inputs = (lambda spec, device, seed=0: make({"n": 255}, device, seed)), True
    assert unlike.tune(*make({"n": 256}, "cuda")[0], emit=False).decision.timing.inputs == "copies"
