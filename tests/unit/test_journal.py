"""The tuning journal: durable appends, resume lookups by context, concurrent writers, bad files moved aside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import attrs
import pytest

from flyreg import Config, FlyregWarning
from flyreg._search import journal

CTX = journal.Context("op", {"N": 1024, "dtype": "float32"}, {"name": "cpu", "arch": "x86"},
                      {"flyreg": "1", "torch": "2"}, "steady")

WRITER = """
import sys
from flyreg import Config
from flyreg._search import journal
ctx = journal.Context("op", {"N": 1}, {"name": "d", "arch": "a"}, {"t": "1"}, "steady")
worker, count = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
for i in range(count):
    journal.record(ctx, Config({"W": worker, "I": i}), median_ms=float(i) + 1, spread=0.0, reps=1)
    if len(sys.argv) > 3:
        print(i, flush=True)
"""


@pytest.fixture(autouse=True)
def _fresh() -> None:
    journal.close()


def test_measurements_round_trip_and_resume_by_context() -> None:
    journal.record(CTX, Config({"B": 1}), median_ms=2.0, spread=0.01, reps=20)
    journal.record(CTX, Config({"B": 2}), error="RuntimeError: illegal memory access")
    other = journal.Context("op", {"N": 2048, "dtype": "float32"}, CTX.device, CTX.toolchain, "steady")
    journal.record(other, Config({"B": 1}), median_ms=3.0, spread=0.0, reps=20)
    got = journal.measured(CTX)
    assert set(got) == {Config({"B": 1}), Config({"B": 2})}
    assert got[Config({"B": 1})].median_ms == 2.0 and not got[Config({"B": 1})].failed
    assert got[Config({"B": 2})].failed and "illegal memory access" in (got[Config({"B": 2})].error or "")
    for changed in ({"toolchain": {"flyreg": "1", "torch": "3"}}, {"timing": "flushed"},
                    {"device": {"name": "gpu", "arch": "sm_90"}}):
        assert journal.measured(attrs.evolve(CTX, **changed)) == {}  # another context
    assert [m.spec["N"] for m in journal.measurements("op")] == [1024, 1024, 2048]


def test_the_latest_measurement_of_a_config_wins() -> None:
    journal.record(CTX, Config({"B": 1}), error="timeout")
    journal.record(CTX, Config({"B": 1}), median_ms=1.5, spread=0.0, reps=5)
    assert journal.measured(CTX)[Config({"B": 1})].median_ms == 1.5


def test_record_takes_a_time_or_an_error() -> None:
    with pytest.raises(ValueError, match="either median_ms"):
        journal.record(CTX, Config({"B": 1}))
    with pytest.raises(ValueError, match="either median_ms"):
        journal.record(CTX, Config({"B": 1}), median_ms=1.0, error="x")


def test_concurrent_writers_lose_nothing() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), "30"], stdout=subprocess.DEVNULL)
             for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    rows = journal.measurements("op")
    assert sorted((m.config.kwargs["W"], m.config.kwargs["I"]) for m in rows) == [(w, i) for w in range(4)
                                                                                     for i in range(30)]


def test_a_killed_writer_keeps_every_committed_measurement() -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, "0", "100000", "verbose"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    last = -1
    while last < 20:
        last = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    rows = journal.measurements("op")
    assert len(rows) >= last + 1  # every record() that returned is on disk
    assert [m.config.kwargs["I"] for m in rows] == list(range(len(rows)))


def test_a_corrupt_journal_is_moved_aside_and_a_new_one_starts() -> None:
    path = journal.database()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database at all" * 50)
    with pytest.warns(FlyregWarning, match="tuning journal .* moved it aside"):
        journal.record(CTX, Config({"B": 1}), median_ms=1.0, spread=0.0, reps=1)
    (aside,) = path.parent.glob(f"{journal.DB_NAME}.corrupt-*")
    assert aside.read_bytes() == b"not a database at all" * 50
    assert list(journal.measured(CTX)) == [Config({"B": 1})]


def test_a_scratch_cache_database_is_not_taken_for_a_journal() -> None:
    from flyreg._artifacts import cache

    cache.store("op", "k", {"config": {"kwargs": {}, "hints": {}}})
    cache.close()  # the last connection's close folds the WAL into the file
    os.replace(cache.database(), journal.database())
    with pytest.warns(FlyregWarning, match="moved it aside"):
        assert journal.measurements() == []
    assert len(list(journal.database().parent.glob(f"{journal.DB_NAME}.corrupt-*"))) == 1
