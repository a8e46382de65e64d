"""What a resumed search trusts of the tuning journal: rows that do not validate are skipped with one warning and
never rank; a config read from the journal passes the correctness gate again before it is served; ``--force``
(``retry_failed``) tries journaled failures again; a candidate that calls ``sys.exit()`` fails alone."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning

from on_disk import JOURNAL, cache_dir, first_round, journal_rows, journal_times

RESUME = {"resume": True, "effort": "full"}
FORCE = {**RESUME, "retry_failed": True}  # what `flyreg tune --force` asks of each search
FAST, SLOW = Config({"B": 1}), Config({"B": 2})


def op(name: str, configs: list[Config], behaviour: dict[Config, str], builds: list[Config] | None = None) -> Any:
    """``out = 2 x``; each config as ``behaviour`` says at the time: "ok", "slow" (sleeps 3 ms a call),
    "wrong" (returns 3 x), "fail" (its build raises), "exit build" or "exit launch" (calls sys.exit(0))."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        if builds is not None:
            builds.append(config)
        how = behaviour.get(config, "ok")
        if how == "fail":
            raise RuntimeError("illegal memory access")
        if how == "exit build":
            sys.exit(0)

        def launch(x: torch.Tensor) -> torch.Tensor:
            how = behaviour.get(config, "ok")  # read at each call: a config may regress after it was tuned
            if how == "exit launch":
                sys.exit(0)
            if how == "slow":
                time.sleep(0.003)
            return x * (3 if how == "wrong" else 2)

        return launch

    return flyreg.autotune_builder(name, build, lambda x: {"n": int(x.shape[0])}, configs, lambda spec: configs[-1],
                                   build_cache=BuildCache(), reference=lambda args, kwargs: args[0].double() * 2,
                                   warmup=0, rep=3)


def insert(op_name: str, config_text: str, median: object = None, error: object = None) -> None:
    """A row another program wrote, in the context of ``op_name``'s latest first-round measurement."""
    with sqlite3.connect(cache_dir() / JOURNAL) as conn:
        context = conn.execute("SELECT spec, device, toolchain, timing FROM measurements WHERE op = ? AND "
                               "timing NOT LIKE '% final %' ORDER BY id DESC LIMIT 1", (op_name,)).fetchone()
        conn.execute("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, reps, "
                     "error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (op_name, context[0], config_text, context[1], context[2], context[3], median,
                      0.0 if error is None else None, 3 if error is None else None, error, time.time()))
    conn.close()


def text(config: Config) -> str:
    return json.dumps(config.to_json(), sort_keys=True, separators=(",", ":"))


def test_rows_that_do_not_validate_are_skipped_with_one_warning_and_never_rank() -> None:
    tuner = op("hostile_rows", [FAST, SLOW], {SLOW: "slow"})
    x = torch.ones(64)
    assert tuner.tune(x, emit=False, search_options=RESUME).winner == FAST
    other = Config({"B": 3})
    insert("hostile_rows", text(SLOW), median=-1.0)  # would rank first
    insert("hostile_rows", text(SLOW), median="fast")  # text in the median column
    insert("hostile_rows", '{"kwargs":{"B":' + "[" * 100_000 + "]" * 100_000 + "}}", median=0.001)  # deeply nested
    insert("hostile_rows", '{"kwargs":{"B":{"C":1}},"hints":{}}', median=0.001)  # not flat
    insert("hostile_rows", text(other), error="x" * 40_000)  # an error text far over the bound
    insert("hostile_rows", text(other), median=None, error=None)  # neither a time nor a failure
    for options in (RESUME, FORCE):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = tuner.tune(x, emit=False, search_options=options)
        assert report.winner == FAST and report.failed == () and report.rejected == ()
        assert dict(report.timings)[SLOW].median > 0  # SLOW's own valid row, not the hostile ones
        skipped = [w for w in caught if "do not validate" in str(w.message)]
        assert len(skipped) == (1 if options is RESUME else 0), [str(w.message) for w in caught]  # once a journal
    assert "6 here" in str(skipped[0].message) if skipped else True


def test_a_journaled_config_that_regressed_is_checked_again_and_never_served() -> None:
    behaviour: dict[Config, str] = {SLOW: "slow"}
    tuner = op("regressed", [FAST, SLOW], behaviour)
    x = torch.ones(64)
    assert tuner.tune(x, emit=False, search_options=RESUME).winner == FAST
    behaviour[FAST] = "wrong"  # it passed once; now it computes the wrong answer
    with pytest.warns(FlyregWarning, match="rejected"):
        forced = tuner.tune(x, emit=False, search_options=FORCE)
    resumed = tuner.tune(x, emit=False, search_options=RESUME)  # the journal now says it is wrong (warned once)
    for report in (forced, resumed):
        assert report.winner == SLOW
        assert [c for c, _ in report.rejected] == [FAST] and FAST not in dict(report.timings)
    rows = [m for m in first_round(journal_rows("regressed")) if m["config"] == FAST]
    assert rows[0]["error"] is None and str(rows[-1]["error"]).startswith("rejected: ")  # the latest row says so


def test_force_retries_journaled_failures_and_reuses_only_timings() -> None:
    behaviour: dict[Config, str] = {FAST: "fail", SLOW: "slow"}
    builds: list[Config] = []
    tuner = op("retried", [FAST, SLOW], behaviour, builds)
    x = torch.ones(64)
    with pytest.warns(FlyregWarning, match="illegal memory access"):
        assert tuner.tune(x, emit=False, search_options=RESUME).winner == SLOW
    del behaviour[FAST]  # fixed since
    builds.clear()
    again = tuner.tune(x, emit=False, search_options=RESUME)  # a resume reuses the failure
    assert again.winner == SLOW and [c for c, _ in again.failed] == [FAST] and FAST not in builds
    forced = tuner.tune(x, emit=False, search_options=FORCE)
    assert forced.winner == FAST and forced.failed == ()
    assert forced.reused >= 1  # SLOW's timing was read, not taken again
    journal_times("retried", {SLOW: 0.0001})  # a journaled timing that would now win is checked again, not re-timed
    assert tuner.tune(x, emit=False, search_options=FORCE).winner == SLOW


def test_a_candidate_that_calls_sys_exit_fails_alone() -> None:
    exits_build, exits_launch = Config({"B": 3}), Config({"B": 4})
    tuner = op("exiting", [exits_build, FAST, exits_launch, SLOW],
               {exits_build: "exit build", exits_launch: "exit launch", SLOW: "slow"})
    with pytest.warns(FlyregWarning, match=r"sys\.exit\(0\)"):
        report = tuner.tune(torch.ones(64), emit=False, search_options=RESUME)
    assert report.winner == FAST
    reasons = dict(report.failed)
    assert set(reasons) == {exits_build, exits_launch}
    assert all("called sys.exit(0)" in why for why in reasons.values())
