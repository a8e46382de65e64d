"""The search: candidates, pruning, in-place kernels, failures, the correctness gate, the tie band."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning, TuneError

from cpu_kernels import FAST, chunked_accumulate, chunked_double, double_op, inputs, launches_per_search
from on_disk import cache_entries, journal_times

#: The final round re-times the candidates within this share of the fastest, at most FINALISTS of them,
#: and the default (docs/autotune_guide.md, "The final round").
FINAL_BAND, FINALISTS = 0.03, 6

# -- candidates ---------------------------------------------------------------------------------


def benchmarked(report: flyreg.TuneReport) -> list[Config]:
    return [c for c, _ in report.timings]


def only_report(tuner: Any, before: set[str]) -> flyreg.TuneReport:
    (new,) = set(tuner.reports) - before
    return tuner.reports[new]


def test_prune_runs_per_call_on_the_spec() -> None:
    pruned_for: list[dict[str, Any]] = []

    def prune(configs: list[Config], spec: dict[str, Any]) -> list[Config]:
        pruned_for.append(spec)
        return [c for c in configs if c.kwargs["CHUNK"] <= spec["n"] // 4]

    chunks = (1, 8, 32, 128)
    tuner, rec = double_op("pruned", chunks=chunks, prune_configs_by=prune)
    for rows in (16, 64, 512):
        before = set(tuner.reports)
        rec.launches.clear()
        x, out = inputs(rows=rows)
        tuner(x, out)
        want = [Config({"CHUNK": c}) for c in chunks if c <= rows // 4]
        assert benchmarked(only_report(tuner, before)) == want
        assert {c for c, _ in rec.launches} == {c.kwargs["CHUNK"] for c in want}
        assert torch.equal(out, x * 2)
    assert [s["n"] for s in pruned_for] == [16, 64, 512]


def test_configs_may_be_a_callable_of_the_spec() -> None:
    asked: list[dict[str, Any]] = []

    def configs(spec: dict[str, Any]) -> list[Config]:
        asked.append(dict(spec))
        return [Config({"CHUNK": c}) for c in (spec["n"] // 8, spec["n"] // 2)]

    def build(config: Config, spec: dict[str, Any]) -> Any:
        return lambda x, out: chunked_double(x, out, int(config.kwargs["CHUNK"]))  # type: ignore[arg-type]

    tuner = flyreg.autotune_builder("cfg_fn", build, lambda x, out: {"n": int(x.shape[0])}, configs,
                                    build_cache=BuildCache(), **FAST)
    for rows in (32, 128):
        before = set(tuner.reports)
        tuner(*inputs(rows=rows))
        assert benchmarked(only_report(tuner, before)) == [Config({"CHUNK": rows // 8}), Config({"CHUNK": rows // 2})]
    assert {"n": 32} in asked and {"n": 128} in asked


def test_default_is_always_a_candidate() -> None:
    tuner, _ = double_op("with_default", chunks=(4, 8), default=Config({"CHUNK": 64}))
    x, out = inputs()
    report = tuner.tune(x, out, emit=False)
    assert benchmarked(report)[0] == Config({"CHUNK": 64})
    assert report.default_ms is not None and report.speedup == pytest.approx(report.default_ms / report.winner_ms)
    assert report.tried == 3


def test_non_config_candidates_are_an_error() -> None:
    tuner = flyreg.autotune_builder("not_cfg", lambda c, s: print, lambda x, out: {}, [{"CHUNK": 1}],
                                    build_cache=BuildCache(), **FAST)
    with pytest.raises(TypeError, match="Config"):
        tuner(*inputs())


# -- kernels that write their inputs ------------------------------------------------------------


def _accumulate_op(name: str, chunks: tuple[int, ...] = (1, 16, 128), buggy: int | None = None,
                   **options: Any) -> tuple[Any, list[torch.Tensor]]:
    """``acc += x * k``: launches record ``acc`` as they find it. ``buggy`` (a CHUNK) stops after one chunk."""
    at_start: list[torch.Tensor] = []

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        rows = chunk if config.kwargs.get("BUGGY") else None

        def launch(acc: torch.Tensor, x: torch.Tensor, k: float) -> torch.Tensor:
            at_start.append(acc.clone())
            return chunked_accumulate(acc, x, k, chunk, rows)

        return launch

    configs = [Config({"CHUNK": c, "BUGGY": False}) for c in chunks]
    if buggy is not None:
        configs.append(Config({"CHUNK": buggy, "BUGGY": True}))
    tuner = flyreg.autotune_builder(name, build, lambda acc, x, k: {"n": int(acc.shape[0]), "k": k}, configs,
                                    build_cache=BuildCache(), **{**FAST, **options})
    return tuner, at_start


def test_restore_value_gives_one_clean_run() -> None:
    acc0, x = torch.randn(256, 8), torch.randn(256, 8)
    acc = acc0.clone()
    tuner, at_start = _accumulate_op("acc_restore", restore_value=["acc"])
    y = tuner(acc, x, 0.5)
    assert y is acc and torch.equal(acc, acc0 + x * 0.5)
    assert len(at_start) == launches_per_search(tuner) + 1
    assert all(torch.equal(a, acc0) for a in at_start)  # every launch, the real one too, saw the clean input
    tuner(acc, x, 0.5)  # a memory hit is a plain call: it accumulates once more
    assert torch.equal(acc, acc0 + x * 0.5 + x * 0.5)


def test_without_restore_value_the_search_corrupts_the_input() -> None:
    acc0, x = torch.randn(256, 8), torch.randn(256, 8)
    acc = acc0.clone()
    tuner, _ = _accumulate_op("acc_no_restore")
    tuner(acc, x, 0.5)
    assert not torch.equal(acc, acc0 + x * 0.5)  # why restore_value exists


def _zeroing_op(name: str, default: Config | None = None, **options: Any) -> tuple[Any, list[torch.Tensor]]:
    """``out += x * k`` (it needs ``out`` zeroed); launches record ``out`` as they find it."""
    at_start: list[torch.Tensor] = []

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]

        def launch(out: torch.Tensor, x: torch.Tensor, k: float) -> torch.Tensor:
            at_start.append(out.clone())
            return chunked_accumulate(out, x, k, chunk)

        return launch

    tuner = flyreg.autotune_builder(name, build, lambda out, x, k: {"n": int(out.shape[0])},
                                    [Config({"CHUNK": c}) for c in (1, 16, 128)],
                                    (lambda spec: default) if default is not None else None,
                                    reset_to_zero=["out"], build_cache=BuildCache(), **{**FAST, **options})
    return tuner, at_start


def test_reset_to_zero_before_every_rep_and_every_real_call() -> None:
    x = torch.randn(256, 8)
    out = torch.full_like(x, 7.0)
    tuner, at_start = _zeroing_op("zeroed")
    assert torch.equal(tuner(out, x, 3.0), x * 3.0)
    assert len(at_start) == launches_per_search(tuner) + 1
    assert all(not a.any() for a in at_start)
    for garbage in (5.0, -1.0):  # memory hits zero too
        out.fill_(garbage)
        assert torch.equal(tuner(out, x, 3.0), x * 3.0)
    assert tuner.stats.searches == 1
    fresh, fresh_at_start = _zeroing_op("zeroed")  # a persistent disk-cache hit in a fresh tuner
    out.fill_(9.0)
    assert fresh.resolve(out, x, 3.0).source == "cache"
    assert torch.equal(fresh(out, x, 3.0), x * 3.0)
    assert fresh.stats.searches == 0 and len(fresh_at_start) == 1 and not fresh_at_start[0].any()


def test_reset_to_zero_on_a_default_hit_and_by_keyword() -> None:
    x = torch.randn(64, 8)
    out = torch.full_like(x, 7.0)
    tuner, at_start = _zeroing_op("zeroed_default", default=Config({"CHUNK": 16}))
    assert torch.equal(tuner(out, x, 2.0), x * 2.0)
    out.fill_(1.0)
    assert torch.equal(tuner(out=out, x=x, k=2.0), x * 2.0)
    assert tuner.stats.searches == 0 and len(at_start) == 2 and not any(a.any() for a in at_start)


def test_restore_and_reset_must_name_tensor_arguments() -> None:
    x = torch.randn(16, 8)
    with pytest.raises(ValueError, match="nope"):  # now at construction, not at the first call
        _accumulate_op("bad_restore", restore_value=["nope"])
    tuner, _ = _accumulate_op("bad_restore2", restore_value=["k"])
    with pytest.raises(TypeError, match="'k'.*not a tensor"):
        tuner(x.clone(), x, 1.0)


def test_pre_hook_runs_before_each_rep_and_survives_the_disk_cache() -> None:
    hooked: list[int] = []

    def zero_out(args: dict[str, Any]) -> None:
        hooked.append(1)
        args["out"].zero_()

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        return lambda out, x, k: chunked_accumulate(out, x, k, chunk)

    def make() -> Any:
        return flyreg.autotune_builder(
            "hooked", build, lambda out, x, k: {"n": int(out.shape[0])},
            [Config({"CHUNK": c}, pre_hook=zero_out) for c in (4, 64)],
            reference=lambda a, kw: a[1] * a[2], build_cache=BuildCache(), **FAST)

    x = torch.randn(64, 8)
    out = torch.full_like(x, 5.0)
    tuner = make()
    assert torch.equal(tuner(out, x, 2.0), x * 2.0)
    assert tuner.stats.benchmarks == 2  # neither config was rejected: the hook zeroed before the check
    assert len(hooked) == 2 + launches_per_search(tuner) + 1  # a check each, the timed launches, the call
    hooked.clear()
    out.fill_(5.0)
    fresh = make()
    assert fresh.resolve(out, x, 2.0).source == "cache"
    assert fresh.resolve(out, x, 2.0).config.pre_hook is zero_out
    assert torch.equal(fresh(out, x, 2.0), x * 2.0) and hooked == [1]


# -- failures and the correctness gate ----------------------------------------------------------


def _flaky_op(name: str, bad_build: set[int], bad_launch: set[int], chunks: tuple[int, ...] = (2, 3, 5, 8)) -> Any:
    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        if chunk in bad_build:
            raise ValueError(f"cannot build CHUNK={chunk}")

        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            if chunk in bad_launch:
                raise RuntimeError(f"out of resources at CHUNK={chunk}")
            return chunked_double(x, out, chunk)

        return launch

    return flyreg.autotune_builder(name, build, lambda x, out: {"n": int(x.shape[0])},
                                   [Config({"CHUNK": c}) for c in chunks], build_cache=BuildCache(), **FAST)


def test_failing_configs_are_skipped_with_a_warning() -> None:
    tuner = _flaky_op("flaky", bad_build={3}, bad_launch={5})
    x, out = inputs(rows=64)
    with pytest.warns(FlyregWarning) as record:
        assert torch.equal(tuner(x, out), x * 2)
    messages = [str(w.message) for w in record]
    assert any("Config(CHUNK=3)" in m and "ValueError: cannot build CHUNK=3" in m for m in messages)
    assert any("Config(CHUNK=5)" in m and "RuntimeError: out of resources at CHUNK=5" in m for m in messages)
    (report,) = tuner.reports.values()
    assert {c.kwargs["CHUNK"] for c, _ in report.failed} == {3, 5}
    assert {c.kwargs["CHUNK"] for c in benchmarked(report)} == {2, 8}
    assert report.winner.kwargs["CHUNK"] in (2, 8)


def test_all_configs_failing_is_a_tune_error() -> None:
    tuner = _flaky_op("doomed", bad_build={2, 3}, bad_launch={5, 8})
    x, out = inputs(rows=64)
    with pytest.warns(FlyregWarning), pytest.raises(TuneError) as info:
        tuner(x, out)
    text = str(info.value)
    assert "doomed" in text and str({"n": 64}) in text
    for chunk in (2, 3):
        assert f"Config(CHUNK={chunk}): ValueError: cannot build CHUNK={chunk}" in text
    for chunk in (5, 8):
        assert f"Config(CHUNK={chunk}): RuntimeError: out of resources at CHUNK={chunk}" in text
    assert cache_entries("doomed") == {}
    with pytest.raises(TuneError):  # a new tuner finds nothing stored: it searches (its failures warned once already)
        _flaky_op("doomed", bad_build={2, 3}, bad_launch={5, 8}).resolve(x, out)


def test_wrong_fastest_config_is_rejected() -> None:
    acc0, x = torch.randn(512, 8), torch.randn(512, 8)
    # The buggy config runs one loop iteration against at least 128 (a wide margin even on a loaded machine):
    # without the gate it wins.
    ungated, _ = _accumulate_op("gate_off", chunks=(1, 32), buggy=32, restore_value=["acc"])
    big_acc, big_x = torch.randn(4096, 8), torch.randn(4096, 8)
    ungated_report = ungated.tune(big_acc, big_x, 1.5, emit=False)
    assert ungated_report.winner.kwargs["BUGGY"] is True, ungated_report.timings

    def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        acc, x_, k = args
        acc += x_ * k  # in place, returning its own input: the gate must copy it
        return acc

    tuner, _ = _accumulate_op("gated", chunks=(1, 32), buggy=32, restore_value=["acc"], reference=reference)
    acc = acc0.clone()
    with pytest.warns(FlyregWarning, match="BUGGY=True.*wrong result"):
        tuner(acc, x, 1.5)
    assert torch.equal(acc, acc0 + x * 1.5)
    (report,) = tuner.reports.values()
    assert [c.kwargs["BUGGY"] for c, _ in report.rejected] == [True]
    assert "elements off" in report.rejected[0][1]
    assert report.winner.kwargs["BUGGY"] is False
    assert all(c.kwargs["BUGGY"] is False for c in benchmarked(report))
    assert tuner.resolve(acc, x, 1.5).config.kwargs["BUGGY"] is False
    (entry,) = cache_entries("gated").values()
    assert entry["config"]["kwargs"]["BUGGY"] is False
    fresh, _ = _accumulate_op("gated", chunks=(1, 32), buggy=32, restore_value=["acc"], reference=reference)
    served = fresh.resolve(acc, x, 1.5)
    assert served.source == "cache" and served.config.kwargs["BUGGY"] is False


def _delta_op(name: str, reference: Any, **options: Any) -> Any:
    """``acc += x * k`` in place, returning the increment ``x * k`` (right for every config);
    the config with BUGGY=True writes only its first CHUNK rows of ``acc`` (and is fastest)."""
    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        rows = chunk if config.kwargs["BUGGY"] else None

        def launch(acc: torch.Tensor, x: torch.Tensor, k: float) -> torch.Tensor:
            chunked_accumulate(acc, x, k, chunk, rows)
            return x * k

        return launch

    configs = [Config({"CHUNK": 1, "BUGGY": False}), Config({"CHUNK": 64, "BUGGY": True})]
    return flyreg.autotune_builder(name, build, lambda acc, x, k: {"n": int(acc.shape[0])}, configs,
                                   restore_value=["acc"], reference=reference, build_cache=BuildCache(),
                                   **{**FAST, **options})


def test_gate_checks_what_an_in_place_reference_writes() -> None:
    acc0, x = torch.randn(256, 8), torch.randn(256, 8)
    seen: list[torch.Tensor] = []

    def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        acc, x_, k = args
        seen.append(acc)
        acc += x_ * k  # what a correct call does to acc, on the copy the gate hands it
        return x_ * k

    tuner = _delta_op("gate_in_place", reference)
    acc = acc0.clone()
    with pytest.warns(FlyregWarning, match=r"BUGGY=True.*wrong result \(in-place argument 'acc'"):
        assert torch.equal(tuner(acc, x, 0.5), x * 0.5)
    assert seen[0] is not acc  # the reference never saw the real tensor
    assert torch.equal(acc, acc0 + x * 0.5)  # one clean run of the (correct) winner
    (report,) = tuner.reports.values()
    assert [c.kwargs["BUGGY"] for c, _ in report.rejected] == [True]
    assert report.winner.kwargs["BUGGY"] is False


def test_gate_with_a_pure_reference_does_not_judge_in_place_tensors() -> None:
    acc0, x = torch.randn(256, 8), torch.randn(256, 8)
    tuner = _delta_op("gate_pure", lambda args, kwargs: args[1] * args[2])
    report = tuner.tune(acc0.clone(), x, 0.5, emit=False)
    assert report.rejected == ()  # correct configs are never rejected for updating acc
    assert len(report.timings) == 2


# -- the tie band and the final round ------------------------------------------------------------
# A search that resumes ranks each config by its latest journaled time (first round, and final round for the
# finalists), timing none of them: the journal, written as its documented table, fixes every timing.


def tuned_with(make: Callable[[], Any], args: tuple[Any, ...], first: Mapping[Config, float | str],
               final: Mapping[Config, float | str] | None = None, spread: float = 0.0) -> tuple[Any, flyreg.TuneReport]:
    """A new tuner from ``make`` and its resumed search of ``args`` with the ``first``-round and ``final``-round
    timings (default: the first round's) journaled; one real search first gives the journal its context."""
    primer = make()
    primer.tune(*args, emit=False)
    journal_times(primer.name, first, spread=spread)
    journal_times(primer.name, first if final is None else final, final=True, spread=spread)
    tuner = make()
    return tuner, tuner.tune(*args, emit=False, search_options={"resume": True})


def chunk_times(times: Mapping[int, float | str]) -> dict[Config, float | str]:
    return {Config({"CHUNK": c}): t for c, t in times.items()}


@pytest.mark.parametrize("default_ms, wins", [(1.003, "default"), (1.0049, "default"), (1.008, "fastest")])
def test_default_wins_within_the_band(default_ms: float, wins: str) -> None:
    tuner, report = tuned_with(lambda: double_op("tie_default", chunks=(4, 8, 16), default=Config({"CHUNK": 8}))[0],
                               inputs(), chunk_times({4: 1.5, 8: default_ms, 16: 1.0}))
    assert report.winner == (Config({"CHUNK": 8}) if wins == "default" else Config({"CHUNK": 16}))
    assert report.default_ms == pytest.approx(default_ms)
    assert report.reused == 3 and tuner.stats.benchmarks == 0  # every timing was the journal's


def test_the_first_in_knob_order_wins_within_the_band() -> None:
    def make() -> Any:
        return double_op("tie_order", chunks=(4, 8, 16, 32))[0]

    assert tuned_with(make, inputs(), chunk_times({4: 2.0, 8: 1.003, 16: 1.0, 32: 1.004}))[1].winner == \
        Config({"CHUNK": 8})
    assert tuned_with(make, inputs(), chunk_times({4: 2.0, 8: 1.01, 16: 1.0, 32: 1.004}))[1].winner == \
        Config({"CHUNK": 16})


def test_repeated_tunings_agree() -> None:
    winners = set()
    for seed in range(12):
        rng = random.Random(seed)
        # 8 and 16 cost the same up to 0.2% noise; each run the noise falls differently.
        noisy = {c: t * (1 + rng.uniform(-0.002, 0.002)) for c, t in {4: 3.0, 8: 1.0, 16: 1.0}.items()}
        _, report = tuned_with(lambda: double_op("tie_repeat", chunks=(4, 8, 16))[0], inputs(), chunk_times(noisy))
        winners.add(report.winner)
    assert winners == {Config({"CHUNK": 8})}


def test_final_round_ranks_by_the_longer_timing() -> None:
    """The first round's short timing says 16; the final round's longer one says 8 is faster."""
    _, report = tuned_with(lambda: double_op("final_round", chunks=(4, 8, 16, 32), default=Config({"CHUNK": 32}))[0],
                           inputs(), chunk_times({4: 2.0, 8: 1.02, 16: 1.0, 32: 1.5}),
                           chunk_times({4: 0.1, 8: 0.97, 16: 0.99, 32: 1.45}))
    assert report.winner == Config({"CHUNK": 8}) and report.winner_ms == pytest.approx(0.97)
    assert report.default_ms == pytest.approx(1.45)  # the default is a finalist: its time is comparable
    # 4 is not a finalist: it keeps its first time (its final one would have won)
    assert {c.kwargs["CHUNK"]: r.median for c, r in report.timings} == pytest.approx({4: 2.0, 8: 0.97, 16: 0.99,
                                                                                      32: 1.45})


def test_only_the_final_round_ranks() -> None:
    """A close candidate left out of the final round keeps its short time, and cannot win by it."""
    chunks = tuple(range(1, FINALISTS + 3))  # every one within the band: the slowest two are left out
    first = {c: 1.0 + 0.001 * i for i, c in enumerate(chunks)}
    final = {c: 1.05 + 0.01 * i if i < FINALISTS else 0.5 for i, c in enumerate(chunks)}
    _, report = tuned_with(lambda: double_op("final_only", chunks=chunks)[0], inputs(), chunk_times(first),
                           chunk_times(final))
    assert report.winner == Config({"CHUNK": 1}) and report.winner_ms == pytest.approx(1.05)
    medians = {c.kwargs["CHUNK"]: r.median for c, r in report.timings}
    assert medians == pytest.approx({c: final[c] if i < FINALISTS else first[c] for i, c in enumerate(chunks)})


def test_a_finalist_failing_its_final_run_is_dropped_and_reported() -> None:
    flaky = {"on": False}

    def make() -> Any:
        tuner, rec = double_op("final_fails", chunks=(4, 8, 16))
        build = tuner.build

        def failing_build(config: Config, spec: dict[str, Any]) -> Any:
            launch = build(config, spec)

            def maybe_fail(x: torch.Tensor, out: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
                if flaky["on"] and config.kwargs["CHUNK"] == 4:
                    raise RuntimeError("flaky")
                return launch(x, out)

            return maybe_fail

        tuner.build = failing_build
        return tuner

    primer = make()
    primer.tune(*inputs(), emit=False)
    journal_times("final_fails", chunk_times({4: 1.0, 8: 1.01, 16: 2.0}))  # no final round journaled: it runs
    flaky["on"] = True
    tuner = make()
    with pytest.warns(FlyregWarning, match="flaky"):
        report = tuner.tune(*inputs(), emit=False, search_options={"resume": True})
    assert report.winner == Config({"CHUNK": 8})
    assert [c for c, _ in report.failed] == [Config({"CHUNK": 4})]
    assert Config({"CHUNK": 4}) not in dict(report.timings)
    assert report.reused == 3 and tuner.stats.benchmarks == 0 and tuner.stats.retimed == 1


def finalists_of(first: Mapping[int, float], default: int | None = None, broken: int | None = None) -> set[int]:
    """The CHUNKs a search re-timed in its final round, when its first round timed ``first`` (CHUNK -> ms).

    Each config's journaled final time is 100 + its CHUNK: a finalist's median in the report is that."""
    chunks = tuple(first)
    final = {c: 100.0 + c for c in chunks}

    def make() -> Any:
        tuner, _ = double_op("finalists", chunks=chunks, default=Config({"CHUNK": default}) if default else None)
        if broken is not None:
            build = tuner.build

            def build_or_fail(config: Config, spec: dict[str, Any]) -> Any:
                if config.kwargs["CHUNK"] == broken:
                    raise RuntimeError("no such kernel")
                return build(config, spec)

            tuner.build = build_or_fail
        return tuner

    _, report = tuned_with(make, inputs(), chunk_times(first), chunk_times(final))
    return {c.kwargs["CHUNK"] for c, r in report.timings if r.median == 100.0 + c.kwargs["CHUNK"]}


def test_finalists() -> None:
    close = {i: 1.0 + 0.001 * i for i in range(1, 11)}  # all within the band, slowest last
    assert finalists_of(close) == set(range(1, FINALISTS + 1))
    assert finalists_of(close, default=10) == {*range(1, FINALISTS + 1), 10}
    assert finalists_of(close, default=1) == set(range(1, FINALISTS + 1))
    far = {1: 1.0, 2: 1.0 + 2 * FINAL_BAND, 3: 0.999}
    assert finalists_of(far) == {3, 1}
    assert finalists_of(far, default=2) == {3, 1, 2}
    assert finalists_of({1: 1.0}, default=1) == set()  # nothing to tell apart
    assert finalists_of({1: 1.0, 2: 2.0}, default=1) == set()  # one close config, the default
    with pytest.warns(FlyregWarning, match="no such kernel"):
        assert finalists_of(far, default=99, broken=99) == {3, 1}  # an untimed default


def winner_of(times: Mapping[str, tuple[float, float]], default: str | None, tie_band: float) -> tuple[str, float]:
    """The winner (its KEY) and its time among configs ``KEY`` -> (median ms, spread), candidates in this order."""
    configs = [Config({"KEY": k}) for k in times]

    def make() -> Any:
        return flyreg.autotune_builder("ranked", lambda c, s: (lambda x: x), lambda x: {"n": 1}, configs,
                                       (lambda spec: Config({"KEY": default})) if default else None,
                                       tie_band=tie_band, build_cache=BuildCache(), **FAST)

    make().tune(torch.zeros(1), emit=False)
    for key, (median, spread) in times.items():
        for final in (False, True):
            journal_times("ranked", {Config({"KEY": key}): median}, final=final, spread=spread)
    report = make().tune(torch.zeros(1), emit=False, search_options={"resume": True})
    return str(report.winner.kwargs["KEY"]), report.winner_ms


def test_the_winner_is_the_fastest_or_within_the_band_the_default_then_the_earliest() -> None:
    exact = {"a": (1.0, 0.0), "b": (0.5, 0.0), "c": (0.505, 0.0)}
    assert winner_of(exact, None, 0.02)[0] == "b"
    assert winner_of(exact, "c", 0.02)[0] == "c"
    assert winner_of(exact, "c", 0.0)[0] == "b"
    assert winner_of({"a": (0.509, 0.0), "b": (0.5, 0.0)}, None, 0.02) == ("a", pytest.approx(0.509))


def test_the_default_stays_when_the_measurement_cannot_tell_it_from_the_fastest() -> None:
    # A journaled spread s puts p20 and p80 at median * (1 -+ s / 2).
    jittery_fast = (4.0, 0.26)  # p80 4.52
    jittery_default = (4.6, 0.28 / 4.6)  # 15 % slower, but p20 4.46: the two overlap
    assert winner_of({"a": jittery_fast, "d": jittery_default}, "d", 0.02) == ("d", pytest.approx(4.6))
    clearly_slower = (5.0, 0.24 / 5.0)  # p20 4.88 is above the fastest's p80
    assert winner_of({"a": jittery_fast, "d": clearly_slower}, "d", 0.02) == ("a", pytest.approx(4.0))
    assert winner_of({"a": jittery_fast, "d": jittery_default}, None, 0.02) == ("a", pytest.approx(4.0))


def test_a_cpu_search_runs_each_candidate_warmup_plus_rep_times_only() -> None:
    """No launch warms the device on the CPU: a search's launches are its timed runs and nothing else."""
    tuner, rec = double_op("counted", chunks=(1, 16, 256))
    tuner.tune(*inputs(), emit=False)
    assert len(rec.launches) == launches_per_search(tuner)


def test_tune_error_on_zero_candidates() -> None:
    tuner, _ = double_op("none_left", prune_configs_by=lambda cs, spec: [])
    with pytest.raises(TuneError, match="none_left.*no candidate"):
        tuner(*inputs())


def test_search_writes_a_complete_cache_entry() -> None:
    tuner, _ = double_op("entry_op", default=None)
    x, out = inputs()
    report = tuner.tune(x, out, emit=False)
    (entry,) = cache_entries("entry_op").values()
    assert Config.from_json(entry["config"]) == report.winner
    assert entry["spec"] == {"n": 256} and entry["time_ms"] == report.winner_ms
    assert double_op("entry_op", default=None)[0].resolve(x, out).source == "cache"


def test_every_config_failing_the_gate_serves_the_default_and_tune_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data the reference disagrees with for every config (say, an overflow only the reference survives):
    a serving call falls back to the default with one warning; tune() raises it as that spec's failure."""
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner, _ = double_op("gate_all", default=Config({"CHUNK": 16}), reference=lambda args, kwargs: args[0] * 3)
    x, out = inputs(rows=64)
    with pytest.warns(FlyregWarning, match="every config of spec .* failed the correctness gate") as record:
        y = tuner(x, out)
    assert torch.equal(y, x * 2)  # what the default computes
    assert [str(w.message) for w in record if "gate_all" in str(w.message)] == [
        str(w.message) for w in record if "correctness gate on this call's data" in str(w.message)]  # one warning
    assert len(record) == 1
    assert tuner.resolve(x, out).origin == "default"
    assert cache_entries("gate_all") == {}  # a data-dependent fallback is stored nowhere
    fresh, _ = double_op("gate_all2", default=Config({"CHUNK": 16}), reference=lambda args, kwargs: args[0] * 3)
    with pytest.raises(TuneError, match="every config failed") as info:
        fresh.tune(x, out, emit=False)
    assert len(info.value.rejected) == 3 and not info.value.failed


def test_every_config_failing_the_gate_without_a_default_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, _ = double_op("gate_nodefault", default=None, reference=lambda args, kwargs: args[0] * 3)
    x, out = inputs(rows=64)
    with pytest.raises(TuneError, match="every config failed"):
        tuner(x, out)
