"""The tuning journal, through tuners' searches: durable appends, resume by context, concurrent writers, bad
files moved aside. The journal is read as its documented SQLite table (``on_disk.journal_rows``)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning

from on_disk import JOURNAL, RUN_FORKS, SCRATCH_CACHE, cache_dir, first_round, journal_rows

RESUME = {"resume": True}

#: A process that starts WORKERS forks, each of which tunes COUNT configs of op ``journaled`` (each config
#: ``{"W": worker, "I": i}``) once the file GO exists, journaling every measurement.
WRITERS = """
import os, sys, time
import torch
import flyreg
from flyreg import Config
workers, count, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
x = torch.zeros(1)


def work(worker):
    configs = [Config({"W": worker, "I": i}) for i in range(count)]
    tuner = flyreg.autotune_builder("journaled", lambda config, spec: (lambda x: x), lambda x: {"n": 1}, configs,
                                    lambda spec: configs[0], warmup=0, rep=1)
    while not os.path.exists(go):
        time.sleep(0.01)
    tuner.tune(x, emit=False, search_options={"effort": "full"})
""" + RUN_FORKS


def toy_op(name: str, configs: list[Config], fails: Callable[[Config], bool] = lambda c: False,
           **options: Any) -> Any:
    """``out = x``; a config that ``fails`` raises when it is built."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        if fails(config):
            raise RuntimeError("illegal memory access")
        return lambda x: x + 0

    return flyreg.autotune_builder(name, build, lambda x: {"N": int(x.shape[0]), "dtype": str(x.dtype)}, configs,
                                   lambda spec: configs[0], build_cache=BuildCache(),
                                   **{"warmup": 0, "rep": 3, **options})


def test_measurements_round_trip_and_resume_by_context(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = [Config({"B": 1}), Config({"B": 2})]
    tuner = toy_op("op", configs, fails=lambda c: c.kwargs["B"] == 2, key_env=["TOY_MODE"])
    with pytest.warns(FlyregWarning, match="illegal memory access"):
        first = tuner.tune(torch.zeros(1024), emit=False, search_options=RESUME)
        tuner.tune(torch.zeros(2048), emit=False, search_options=RESUME)
    rows = first_round(journal_rows("op"))
    got = {m["config"]: m for m in rows if m["spec"] == {"N": 1024, "dtype": "torch.float32"}}
    assert set(got) == set(configs)
    assert got[configs[0]]["median_ms"] == dict(first.timings)[configs[0]].median and got[configs[0]]["error"] is None
    assert got[configs[1]]["median_ms"] is None and "illegal memory access" in got[configs[1]]["error"]
    assert [m["spec"]["N"] for m in rows] == [1024, 1024, 2048, 2048]
    assert all(m["device"]["arch"] and m["toolchain"]["op"] == "0" for m in rows)

    again = tuner.tune(torch.zeros(1024), emit=False, search_options=RESUME)
    assert again.reused == 1 and [c for c, _ in again.failed] == [configs[1]]  # the same context: nothing re-timed
    assert len(journal_rows("op")) == len(rows) + sum(1 for m in journal_rows("op") if "final" in m["timing"])
    monkeypatch.setenv("TOY_MODE", "other")  # another toolchain (a key_env value): another context
    other = tuner.tune(torch.zeros(1024), emit=False, search_options=RESUME)  # the failure warned once already
    assert other.reused == 0
    bumped = toy_op("op", configs, version="2")  # another op version: another context
    assert bumped.tune(torch.zeros(1024), emit=False, search_options=RESUME).reused == 0
    assert {m["toolchain"].get("env:TOY_MODE") for m in first_round(journal_rows("op"))} == {None, "other"}


def test_the_latest_measurement_of_a_config_wins() -> None:
    broken = {"now": True}
    tuner = toy_op("latest", [Config({"B": 1}), Config({"B": 2})], fails=lambda c: c.kwargs["B"] == 1 and broken["now"])
    with pytest.warns(FlyregWarning):
        first = tuner.tune(torch.zeros(8), emit=False, search_options=RESUME)
    assert [c for c, _ in first.failed] == [Config({"B": 1})]
    broken["now"] = False
    tuner.tune(torch.zeros(8), emit=False)  # a search that does not resume measures again, and journals it
    again = tuner.tune(torch.zeros(8), emit=False, search_options=RESUME)
    assert again.failed == () and again.reused == 2 and Config({"B": 1}) in dict(again.timings)
    assert [m["error"] is None for m in first_round(journal_rows("latest")) if m["config"] == Config({"B": 1})] \
        == [False, True]


def start_writers(workers: int, count: int, go: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", WRITERS, str(workers), str(count), str(go)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = start_writers(4, 30, go)
    go.touch()
    assert proc.wait(timeout=120) == 0
    rows = first_round(journal_rows("journaled"))
    assert sorted((m["config"].kwargs["W"], m["config"].kwargs["I"]) for m in rows) == \
        [(w, i) for w in range(4) for i in range(30)]


def test_a_killed_writer_keeps_every_committed_measurement(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = start_writers(1, 20000, go)
    go.touch()
    deadline = time.monotonic() + 120
    seen = 0
    while seen < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            seen = len(first_round(journal_rows("journaled")))
        except sqlite3.OperationalError:  # the journal's tables not created yet
            pass
    os.killpg(proc.pid, signal.SIGKILL)  # the writer and the process that started it
    proc.wait(timeout=30)
    rows = first_round(journal_rows("journaled"))
    assert seen >= 20 and len(rows) >= seen  # every measurement another reader saw committed is on disk
    assert [m["config"].kwargs["I"] for m in rows] == list(range(len(rows)))


def test_a_corrupt_journal_is_moved_aside_and_a_new_one_starts() -> None:
    path = cache_dir() / JOURNAL
    path.write_bytes(b"not a database at all" * 50)
    tuner = toy_op("fresh_journal", [Config({"B": 1})])
    with pytest.warns(FlyregWarning, match="tuning journal .* moved it aside"):
        tuner.tune(torch.zeros(8), emit=False)
    (aside,) = path.parent.glob(f"{JOURNAL}.corrupt-*")
    assert aside.read_bytes() == b"not a database at all" * 50
    assert [m["config"] for m in first_round(journal_rows())] == [Config({"B": 1})]


def test_a_scratch_cache_database_is_not_taken_for_a_journal(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.touch()
    writer = start_writers(1, 1, go)  # another process: it writes a scratch-cache entry (and a journal)
    assert writer.wait(timeout=120) == 0
    with sqlite3.connect(cache_dir() / SCRATCH_CACHE) as source, sqlite3.connect(tmp_path / "copy") as copy:
        source.backup(copy)  # a consistent copy, its WAL folded in
    for leftover in cache_dir().glob(f"{JOURNAL}*"):
        leftover.unlink()
    shutil.move(tmp_path / "copy", cache_dir() / JOURNAL)
    with pytest.warns(FlyregWarning, match="moved it aside"):
        toy_op("journaled_after", [Config({"B": 1})]).tune(torch.zeros(8), emit=False)
    assert len(list(cache_dir().glob(f"{JOURNAL}.corrupt-*"))) == 1
    assert {m["op"] for m in journal_rows()} == {"journaled_after"}
    assert os.path.getsize(cache_dir() / SCRATCH_CACHE) > 0
