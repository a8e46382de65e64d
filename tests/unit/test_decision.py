"""Why a search served its config: the rule, the bands, the timing and the peak, in the report, the
scratch-cache entry and the artifact; and the same measurements giving the same pick in any order.

Measurements are fixed through the tuning journal (a resumed search re-times nothing), as in
``test_search.py``'s tie-band tests.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import flyreg
from flyreg import Config, check_artifacts

from cpu_kernels import double_op, inputs
from on_disk import cache_entries, journal_times, this_device, write_artifact

CHUNKS = (4, 8, 16, 32)


def tuned_with(make: Callable[[], Any], first: Mapping[Config, float], final: Mapping[Config, float] | None = None,
               spread: float = 0.0, **tune: Any) -> flyreg.TuneReport:
    """``make()``'s resumed search with these first- and final-round times journaled (the final round's
    default: the first's); a real search first gives the journal its context."""
    args = inputs()
    primer = make()
    primer.tune(*args, emit=False)
    journal_times(primer.name, first, spread=spread)
    journal_times(primer.name, first if final is None else final, final=True, spread=spread)
    report = make().tune(*args, search_options={"resume": True}, **tune)
    assert report.reused == len(first)  # every time was the journal's
    return report


def chunk_times(times: Mapping[int, float]) -> dict[Config, float]:
    return {Config({"CHUNK": c}): t for c, t in times.items()}


def picks(times: Mapping[int, float], default: int | None, orders: Sequence[Sequence[int]]) -> set[Config]:
    """The winner of the same measurements with the candidates offered in each of ``orders``."""
    out = set()
    for i, order in enumerate(orders):
        dflt = Config({"CHUNK": default}) if default is not None else None

        def make(order: Sequence[int] = order, i: int = i) -> Any:
            return double_op(f"order_{default}_{i}", chunks=order, default=dflt)[0]

        out.add(tuned_with(make, chunk_times({c: times[c] for c in order})).winner)
    return out


@pytest.mark.parametrize("times, default, want", [
    ({4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}, None, 4),  # equal times: the first in knob order
    ({4: 1.004, 8: 1.0, 16: 1.002, 32: 1.5}, None, 4),  # within the tie band (0.5 %) of the fastest
    ({4: 2.0, 8: 1.0, 16: 1.0, 32: 1.003}, 32, 32),  # the default within the tie band stays
    ({4: 2.0, 8: 1.0, 16: 1.0, 32: 1.2}, 32, 8),  # separable from the default: the first of the tied fastest
])
def test_the_same_measurements_in_any_order_pick_the_same_config(times: dict[int, float], default: int | None,
                                                                   want: int) -> None:
    orders = [CHUNKS, CHUNKS[::-1], (16, 4, 32, 8), (8, 32, 4, 16)]
    assert picks(times, default, orders) == {Config({"CHUNK": want})}


def test_every_order_of_three_tied_configs_agrees() -> None:
    orders = list(itertools.permutations((8, 16, 32)))
    assert picks({8: 1.0, 16: 1.0, 32: 1.0}, None, orders) == {Config({"CHUNK": 8})}


def make_with_default(name: str) -> Callable[[], Any]:
    return lambda: double_op(name, chunks=CHUNKS, default=Config({"CHUNK": 32}))[0]


def test_a_default_not_separable_from_the_fastest_is_kept_and_says_why() -> None:
    # medians 1.0 and 1.02 (more than the tie band apart); each band +-5 %: they overlap
    report = tuned_with(make_with_default("overlap"), chunk_times({4: 2.0, 8: 1.0, 16: 1.5, 32: 1.02}), spread=0.1)
    decision = report.decision
    assert report.winner == Config({"CHUNK": 32}) and decision.rule == "default-overlap"
    assert decision.fastest == Config({"CHUNK": 8}) and decision.kept_default
    assert "kept default" in decision.reason and "not separable" in decision.reason and "CHUNK=8" in decision.reason
    assert "2.0% faster" in decision.reason and decision.fastest_band.median == pytest.approx(1.0)
    assert decision.winner.median == pytest.approx(1.02) and decision.default == decision.winner
    assert decision.winner.p20 < 1.0 < decision.winner.p80  # the band reaches the fastest's median


def test_a_separable_winner_states_its_margin_over_the_default() -> None:
    report = tuned_with(make_with_default("separable"), chunk_times({4: 2.0, 8: 1.0, 16: 1.5, 32: 1.5}), spread=0.01)
    decision = report.decision
    assert report.winner == Config({"CHUNK": 8}) and decision.rule == "fastest" and not decision.kept_default
    assert "separable from the default by 50.0%" in decision.reason
    assert decision.default is not None and decision.default.median == pytest.approx(1.5)
    assert decision.winner.p80 < decision.default.p20
    assert (decision.timing.mode, decision.timing.launch, decision.timing.l2) == ("cpu", "eager", "warm")


def test_the_artifact_and_the_cache_entry_record_the_decision(tmp_path: Path) -> None:
    report = tuned_with(make_with_default("stored"), chunk_times({4: 2.0, 8: 1.0, 16: 1.5, 32: 1.02}), spread=0.1,
                        out_dir=tmp_path)
    stored = json.loads(Path(report.artifact).read_text())["provenance"]["decision"]
    (entry,) = cache_entries(report.op).values()
    assert entry["decision"] == stored
    assert stored["rule"] == "default-overlap" and stored["reason"] == report.decision.reason
    assert stored["winner"] == {"median_ms": pytest.approx(1.02), "p20_ms": pytest.approx(1.02 * 0.95),
                                "p80_ms": pytest.approx(1.02 * 1.05)}
    assert stored["default"] == stored["winner"] and stored["fastest"]["median_ms"] == pytest.approx(1.0)
    assert Config.from_json(stored["fastest"]["config"]) == Config({"CHUNK": 8})
    assert stored["timing"] == {"mode": "cpu", "launch": "eager", "l2": "warm", "inputs": "copies"}
    peak = stored["peak"]  # no CPU has a datasheet peak: the copy bandwidth measured when it was tuned
    assert peak["how"].startswith("measured: copy bandwidth") and peak["bandwidth"] > 0 and peak["flops"] is None
    assert check_artifacts([tmp_path], {report.op: "0"}) == []


def test_artifacts_with_and_without_a_decision_are_both_served_and_checked(tmp_path: Path) -> None:
    tuner, _ = double_op("compat", chunks=CHUNKS, default=Config({"CHUNK": 32}))
    spec = {"n": 256}
    old = write_artifact(tmp_path, tuner.name, spec, Config({"CHUNK": 16}))  # written before decisions existed
    assert check_artifacts([tmp_path], {tuner.name: "0"}) == []
    data = json.loads(old.read_text())
    data["provenance"]["decision"] = {"rule": "no such rule", "winner": {}}
    old.write_text(json.dumps(data))
    (problem,) = check_artifacts([tmp_path], {tuner.name: "0"})
    assert problem.severity == "error" and "decision" in problem.message and "rule" in problem.message


def test_what_the_times_ran_on_is_recorded_and_read_back() -> None:
    report = tuned_with(make_with_default("inputs"), chunk_times({4: 2.0, 8: 1.0, 16: 1.5, 32: 1.02}), spread=0.1)
    stored, Decision = report.decision.to_json(), type(report.decision)
    drawn = {**stored, "timing": {**stored["timing"], "inputs": "draws"}}
    assert Decision.from_json(drawn).timing.inputs == "draws" and "over draws" in str(Decision.from_json(drawn).timing)
    older = {**stored, "timing": {k: v for k, v in stored["timing"].items() if k != "inputs"}}
    assert Decision.from_json(older).timing.inputs == "copies"  # written before draws existed: copies of one call
    with pytest.raises(ValueError, match="inputs"):
        Decision.from_json({**stored, "timing": {**stored["timing"], "inputs": "some"}})


def test_an_old_artifact_is_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(tmp_path))
    tuner, _ = double_op("compat_served", chunks=CHUNKS, default=Config({"CHUNK": 32}))
    write_artifact(tmp_path, tuner.name, {"n": 256}, Config({"CHUNK": 16}), device=this_device())
    res = tuner.resolve(*inputs())
    assert res.source == "offline" and res.config == Config({"CHUNK": 16})


def test_a_final_round_left_with_one_config_ranks_nothing() -> None:
    # 8 and the default (32) are the finalists; 8 fails its final round, so the default is re-timed alone (1.7):
    # a round of one ranks nothing, every config keeps its first time (the default 1.5, fastest of those standing),
    # and the winner is not "the only config timed" nor 16 (1.6) beating the default's final time
    report = tuned_with(make_with_default("final_one"), chunk_times({4: 2.0, 8: 1.0, 16: 1.6, 32: 1.5}),
                        final={Config({"CHUNK": 8}): "boom in the final round", Config({"CHUNK": 32}): 1.7})
    assert report.winner == Config({"CHUNK": 32}) and report.decision.rule == "default-fastest"
    assert report.decision.winner.median == pytest.approx(1.5)
    assert Config({"CHUNK": 8}) in dict(report.failed) and len(report.timings) == 3
