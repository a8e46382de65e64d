"""Draws of a call's inputs: an op whose ``make_inputs`` takes a ``seed`` has its searches timed over
several draws (each input set another draw's values), not over copies of one call. The sets are made
only by a search on a GPU (``tests/kernels/test_steady_gpu.py``), so these tests drive them directly, and the
record of an isolated search, whose worker reports whether its sets held draws."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch

from flyreg import Config
from flyreg._core.results import BenchResult, TunerStats
from flyreg._core.search_terms import SearchSettings
from flyreg._search import journal
from flyreg._search.candidates import Measured
from flyreg._search.isolated_evaluator import IsolatedEvaluator
from flyreg._search.journal import Machine
from flyreg._search.steady import DRAWS, InputSet, copy_inputs, fill_from_draw, plan_sets, set_count
from flyreg._search.timers import _filled
from flyreg._search.worker import Outcome

MiB = 1 << 20


def test_without_draws_the_sets_are_as_the_budget_and_rotation_say() -> None:
    sizes, budget = [1 * MiB, 300 * MiB], 1024 * MiB
    assert plan_sets(sizes, 301 * MiB, False, budget) == (set_count(301 * MiB, False, budget, 301 * MiB), budget)
    assert plan_sets(sizes, 301 * MiB, True, budget, in_place_bytes=[2048 * MiB]) == (1, budget)


def test_draws_share_the_large_storages_so_that_several_draws_fit() -> None:
    # Weights of 805 and 403 MiB, activations and a routing of 1 MiB: copies of the whole call do not fit
    # twice in the budget, so without draws a search times one set; with draws, the weights are shared
    # and the small tensors of 4 draws rotate.
    sizes, budget = [805 * MiB, 403 * MiB, 1 * MiB], 1024 * MiB
    assert plan_sets(sizes, sum(sizes), False, budget) == (1, budget)
    n, share = plan_sets(sizes, sum(sizes), False, budget, drawn=True)
    assert (n, share) == (DRAWS, budget // DRAWS)
    assert plan_sets([200 * MiB, 200 * MiB], 400 * MiB, False, budget, drawn=True)[0] == 3  # as many as fit
    # an in-place storage the draws would share: one set, so each call runs alone between preparations
    assert plan_sets(sizes, sum(sizes), True, budget, in_place_bytes=[403 * MiB], drawn=True)[0] == 1


def _call(seed: int, n: int = 6) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(64, 8, generator=g)
    return (torch.randn(n, 8, generator=g), weights), {"ids": torch.randint(0, 64, (n,), generator=g)}


def test_a_set_takes_the_draws_values_in_its_copies_and_keeps_what_it_shares() -> None:
    (x, w), kw = _call(0)
    own = InputSet((x, w), kw, {})
    s = copy_inputs((x, w), kw, budget=x.untyped_storage().nbytes())  # the weights are shared, not copied
    assert s.args[1] is w and s.args[0] is not x
    drawn = _call(5)
    assert fill_from_draw(s, own, drawn)
    assert torch.equal(s.args[0], drawn[0][0]) and torch.equal(s.kwargs["ids"], drawn[1]["ids"])
    assert torch.equal(s.args[1], _call(0)[0][1])  # the shared weights keep the call's values
    assert not torch.equal(x, drawn[0][0]) and torch.equal(x, _call(0)[0][0])  # the call itself is untouched


@pytest.mark.parametrize("other", ["rows", "count", "dtype", "keyword", "positional"])
def test_a_draw_unlike_the_call_leaves_the_set_a_copy(other: str) -> None:
    (x, w), kw = _call(0)
    own, s = InputSet((x, w), kw, {}), copy_inputs((x, w), kw)
    (x1, w1), kw1 = _call(1)
    drawn = {"rows": _call(1, n=7), "count": ((x1,), {}), "dtype": ((x1.double(), w1), kw1),
             "keyword": ((x1, w1), {"idx": kw1["ids"]}),  # the same tensors, another name: no pairing by order
             "positional": ((x1, w1, kw1["ids"]), {})}[other]
    assert not fill_from_draw(s, own, drawn)
    assert all(torch.equal(a, b) for a, b in zip(s.args, (x, w))) and torch.equal(s.kwargs["ids"], kw["ids"])


def test_a_draw_that_fails_leaves_its_set_a_copy_and_ends_the_draws() -> None:
    (x, w), kw = _call(0)
    own, s = InputSet((x, w), kw, {}), copy_inputs((x, w), kw)

    def failing(seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        raise RuntimeError("make_inputs could not draw")

    assert not _filled(s, own, failing, 1)
    assert torch.equal(s.args[0], x) and torch.equal(s.kwargs["ids"], kw["ids"])
    assert _filled(s, own, _call, 3) and torch.equal(s.args[0], _call(3)[0][0])


class _Worker:
    """A benchmarking worker's stand-in: each measure returns one timing and whether its sets held draws."""

    def __init__(self, drawn: list[bool | None]) -> None:
        self.drawn, self.replaced = drawn, 0
        self.limits = SimpleNamespace(slowest=1.0)  # it has finished a config: no calibration first

    def measure(self, config: Any, **options: Any) -> Outcome:
        drawn = self.drawn.pop(0)  # or the text of a failure
        if isinstance(drawn, str):
            return Outcome(config, None, drawn)
        return Outcome(config, Measured(BenchResult.of([1.0]), drawn=drawn), None)


# A steady timing whose worker does not say (None) counts as one over copies.
@pytest.mark.parametrize(("drawn", "inputs"), [([True, True], "draws"), ([True, False], "copies"),
                                               ([None, True], "copies")])
def test_an_isolated_search_records_draws_only_where_its_worker_timed_over_them(drawn: list, inputs: str) -> None:
    # The worker's timer knows whether a set held a draw; the record (made in the calling process) follows it.
    machine = Machine({"name": "probe"}, {"inputs": "draws"})  # the op draws by seed
    search = IsolatedEvaluator(SearchSettings.of("probe"), {"n": 1}, "cuda", TunerStats(), machine, _Worker(drawn))
    for config in (Config({"K": 1}), Config({"K": 2})):
        search._time(config, 1)
    assert search.inputs == inputs


@pytest.mark.parametrize(("first", "keys", "again", "reused", "inputs"), [
    ([True, True], {"draws"}, [], 2, "draws"),
    ([True, False], {"draws", "copies"}, [], 2, "copies"),  # K=2's time, over copies, ranks: the record says so
    ([False, False], {"copies"}, [], 2, "copies"),  # the draws never fit: each time is reused all the same
    ([False, "boom"], {"draws", "copies"}, [], 2, "copies"),  # a failure, under the machine's own key, stays one
    ([None, None], {"copies"}, [], 2, "copies"),  # a worker that does not say files its times as copies
], ids=["draws", "one-copy", "never-draws", "failure", "unsaid"])
def test_a_resumed_search_knows_which_journaled_times_ran_over_draws(first: list, keys: set, again: list,
                                                                      reused: int, inputs: str) -> None:
    machine, configs = Machine({"name": "probe"}, {"inputs": "draws"}), [Config({"K": 1}), Config({"K": 2})]
    settings = attrs.evolve(SearchSettings.of("probe"), resume=True)
    IsolatedEvaluator(settings, {"n": 1}, "cuda", TunerStats(), machine, _Worker(list(first)))(configs)
    assert {m.toolchain["inputs"] for m in journal.measurements("probe")} == keys
    worker = _Worker(list(again))
    search = IsolatedEvaluator(settings, {"n": 1}, "cuda", TunerStats(), machine, worker)
    search(configs)
    assert worker.drawn == [] and search.inputs == inputs  # nothing timed again; the record as the ranked times
    assert search.reused + len(search.failed) == reused and len(search.failed) == first.count("boom")


def test_a_resumed_search_reads_each_configs_latest_row_and_its_own_times_records_draws(
        monkeypatch: pytest.MonkeyPatch) -> None:
    machine, settings = Machine({"name": "probe"}, {"inputs": "draws"}), attrs.evolve(SearchSettings.of("probe"),
                                                                                      resume=True)
    one, two, four = Config({"K": 1}), Config({"K": 2}), Config({"K": 4})
    IsolatedEvaluator(settings, {"n": 1}, "cuda", TunerStats(), machine, _Worker([False, False]))([one, four])
    ctx = machine.context("probe", {"n": 1}, "steady")
    monkeypatch.setattr(journal.time, "time", lambda: 1.0)  # a clock stepped back: the row written last still wins
    journal.record(ctx, one, error="failed later")  # under the draws' key, after one's time over copies
    search = IsolatedEvaluator(settings, {"n": 1}, "cuda", TunerStats(), machine, _Worker([True]))
    search([one, two])  # four's time over copies is in the journal but not among these
    assert search.failed == [(one, "failed later")] and search.reused == 0 and search.inputs == "draws"


def test_the_report_shows_a_search_whole_whether_its_times_ran_over_draws_or_copies() -> None:
    from flyreg._report.data import collect

    machine, configs = Machine({"name": "probe"}, {"inputs": "draws"}), [Config({"K": 1}), Config({"K": 2})]
    IsolatedEvaluator(SearchSettings.of("probe"), {"n": 1}, "cuda", TunerStats(), machine,
                      _Worker([True, False]))(configs)  # K=2's time journaled under copies
    (spec,) = collect(["probe"])[0].specs
    assert set(spec.bands) == set(configs) and spec.superseded == 0
