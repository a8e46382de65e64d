"""The scratch disk cache: one SQLite database per cache dir, safe across processes, forgiving of bad files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyreg import FlyregWarning
from flyreg._artifacts import cache
from flyreg._core import fileio

from cpu_kernels import double_op, inputs

WRITER = """
import sys
from flyreg._artifacts import cache
worker = int(sys.argv[1])
for i in range(int(sys.argv[2])):
    cache.store("shared_op", f"w{worker}-{i}", {"config": {"kwargs": {"CHUNK": i}, "hints": {}}, "worker": worker})
"""

# Writes artifacts (through the atomic JSON writer) until killed.
JSON_WRITER = """
import sys
from pathlib import Path
from flyreg._core.fileio import write_json_atomic
target = Path(sys.argv[1])
payload = {"blob": "x" * 2_000_000}
print("ready", flush=True)
while True:
    write_json_atomic(target, payload)
"""


def entry(i: int) -> dict[str, object]:
    return {"config": {"kwargs": {"CHUNK": i}, "hints": {}}, "time_ms": float(i)}


@pytest.fixture(autouse=True)
def _fresh_connections() -> None:
    cache.close()


def test_one_database_under_the_cache_dir(isolated_dirs: dict[str, Path]) -> None:
    cache.store("op_a", "k", entry(1))
    cache.store("op_b", "k", entry(2))
    assert cache.database() == isolated_dirs["cache"] / cache.DB_NAME and cache.database().is_file()
    assert cache.load("op_a") == {"k": entry(1)} and cache.load("op_b") == {"k": entry(2)}
    assert cache.get("op_a", "k") == entry(1) and cache.get("op_a", "other") is None
    assert cache.counts() == {"op_a": 1, "op_b": 1}


def test_store_replaces_an_entry() -> None:
    cache.store("op", "k", entry(1))
    cache.store("op", "k", entry(2))
    assert cache.load("op") == {"k": entry(2)}


def test_cache_dir_is_read_on_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.store("op", "k", entry(1))
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "other"))
    assert cache.load("op") == {} and cache.get("op", "k") is None
    cache.store("op", "k2", entry(2))
    assert (tmp_path / "other" / cache.DB_NAME).is_file()


def test_a_new_tuner_sees_the_cache_dir_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, out = inputs()
    first, _ = double_op("dirs")
    first(x, out)
    assert first.stats.searches == 1
    home = os.environ["FLYREG_CACHE_DIR"]
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "elsewhere"))
    second, _ = double_op("dirs")
    assert second.resolve(x, out).source == "search"
    assert (tmp_path / "elsewhere" / cache.DB_NAME).is_file()
    monkeypatch.setenv("FLYREG_CACHE_DIR", home)
    third, _ = double_op("dirs")
    assert third.resolve(x, out).source == "cache"
    assert third.stats.searches == 0


def test_clear_removes_entries() -> None:
    cache.store("op_a", "k", entry(1))
    cache.store("op_b", "k", entry(2))
    cache.store("op_b", "k2", entry(3))
    assert cache.clear("op_a") == 1
    assert cache.load("op_a") == {} and cache.load("op_b") == {"k": entry(2), "k2": entry(3)}
    assert cache.clear() == 2
    assert cache.clear() == 0


def test_clear_of_nothing_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "absent"))
    assert cache.clear("rmsnorm") == 0 and cache.clear() == 0
    assert cache.load("rmsnorm") == {} and cache.get("rmsnorm", "k") is None
    assert not (tmp_path / "absent").exists()


def test_clear_leaves_other_files_alone() -> None:
    cache.store("op_a", "k", entry(1))
    notes = cache.cache_dir() / "notes.json"
    notes.write_text('{"mine": true}')
    assert cache.clear() == 1
    assert notes.read_text() == '{"mine": true}'


@pytest.mark.parametrize("op, key", [("a/b", "k"), ("a" * 300, "k"), ("op", "v" * 100_000), ("ø/../x", "\x00")])
def test_names_and_keys_of_any_length_are_stored(op: str, key: str) -> None:
    cache.store(op, key, entry(7))
    cache.close()
    assert cache.get(op, key) == entry(7) and cache.load(op) == {key: entry(7)}
    assert [p.name for p in cache.cache_dir().iterdir() if not p.name.startswith(cache.DB_NAME)] == []


@pytest.mark.parametrize("content", [b"{not json", b"\x00garbage" * 100, b"SQLite format 3\x00" + b"\xff" * 200])
def test_a_corrupt_database_is_moved_aside_and_rebuilt(content: bytes) -> None:
    path = cache.database()
    path.write_bytes(content)
    with pytest.warns(FlyregWarning, match="moved it aside"):
        assert cache.load("op") == {}  # reading never raises
    cache.store("op", "k", entry(1))
    aside = list(path.parent.glob(f"{cache.DB_NAME}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content  # never lost
    assert cache.load("op") == {"k": entry(1)}


def test_a_foreign_database_is_moved_aside() -> None:
    path = cache.database()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine (x)")
        conn.execute("INSERT INTO mine VALUES (42)")
    conn.close()
    with pytest.warns(FlyregWarning, match="moved it aside"):
        cache.store("op", "k", entry(1))
    (aside,) = path.parent.glob(f"{cache.DB_NAME}.corrupt-*")
    with sqlite3.connect(aside) as conn:
        assert conn.execute("SELECT x FROM mine").fetchall() == [(42,)]
    conn.close()


def test_a_fifo_never_blocks_a_call() -> None:
    os.mkfifo(cache.database())
    x, out = inputs()
    tuner, _ = double_op("fifo_op")
    code = (f"import os; os.environ['FLYREG_CACHE_DIR'] = {str(cache.cache_dir())!r}\n"
            "from flyreg._artifacts import cache; print(cache.load('op'), cache.get('op', 'k'), cache.clear())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["{}", "None", "0"] and "not a regular file" in done.stderr
    (aside,) = cache.cache_dir().glob(f"{cache.DB_NAME}.corrupt-*")  # moved aside, not read
    assert aside.is_fifo()
    assert tuner(x, out) is out and tuner.stats.searches == 1
    assert len(cache.load("fifo_op")) == 1


def test_a_symlink_to_dev_zero_is_moved_aside() -> None:
    os.symlink("/dev/zero", cache.database())
    with pytest.warns(FlyregWarning, match="not a regular file"):
        assert cache.load("op") == {} and cache.get("op", "k") is None
    cache.store("op", "k", entry(1))
    assert cache.get("op", "k") == entry(1)
    (aside,) = cache.cache_dir().glob(f"{cache.DB_NAME}.corrupt-*")
    assert aside.is_symlink() and os.readlink(aside) == "/dev/zero"


def test_tuner_survives_a_corrupt_database() -> None:
    x, out = inputs()
    cache.database().write_bytes(b"\x00garbage")
    tuner, _ = double_op("corrupt_op")
    with pytest.warns(FlyregWarning, match="moved it aside"):
        y = tuner(x, out)
    assert y is out and tuner.stats.searches == 1
    assert len(cache.load("corrupt_op")) == 1


def test_a_corrupt_entry_is_ignored_with_a_warning() -> None:
    cache.store("op", "good", entry(1))
    with sqlite3.connect(cache.database()) as conn:
        conn.execute("INSERT INTO entries VALUES ('op', 'bad', '{not json', 0)")
        conn.execute("INSERT INTO entries VALUES ('op', 'list', '[1]', 0)")
    conn.close()
    with pytest.warns(FlyregWarning, match="corrupt entry"):
        assert cache.load("op") == {"good": entry(1)}
    assert cache.get("op", "list") is None


def test_bad_cached_config_is_ignored_with_a_warning() -> None:
    x, out = inputs()
    tuner, _ = double_op("badentry")
    tuner(x, out)
    ((key, stored),) = cache.load("badentry").items()
    stored["config"] = {"kwargs": {"NOT_A_KNOB": 1}, "hints": {}}
    cache.store("badentry", key, stored)
    fresh, _ = double_op("badentry")
    with pytest.warns(FlyregWarning, match="NOT_A_KNOB"):
        assert fresh.resolve(x, out).source == "search"


def test_concurrent_processes_lose_no_entries() -> None:
    workers, per_worker = 4, 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(per_worker)], env=os.environ.copy())
             for w in range(workers)]
    seen = 0
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        count = len(cache.load("shared_op"))
        assert count >= seen  # an entry once written is never lost
        seen = count
    assert [p.wait(timeout=60) for p in procs] == [0] * workers
    entries = cache.load("shared_op")
    assert sorted(entries) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(per_worker))
    assert all(e["worker"] == int(k[1]) for k, e in entries.items())


def test_warn_once_per_key() -> None:
    with pytest.warns(FlyregWarning) as record:
        for _ in range(3):
            fileio.warn_once("flyreg: the same problem")
        fileio.warn_once("flyreg: keyed", key="k")
        fileio.warn_once("flyreg: keyed again", key="k")
    assert [str(w.message) for w in record] == ["flyreg: the same problem", "flyreg: keyed"]


def _kill_writer_mid_write(target: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", JSON_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not list(target.parent.glob(f".{target.name}.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_temp_files_of_killed_writers_are_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "artifact.json"
    for _ in range(5):
        _kill_writer_mid_write(target)
    assert list(tmp_path.glob(".artifact.json.*.tmp"))  # the kills left temp files behind
    fileio._swept.clear()  # as in a new process: its first write into the directory sweeps it
    fileio.write_json_atomic(target, {"ok": 1})
    assert list(tmp_path.glob(".artifact.json.*.tmp")) == []
    assert target.read_text().startswith("{")


def test_a_live_writers_temp_file_is_kept(tmp_path: Path) -> None:
    live = tmp_path / f".artifact.json.{os.getppid()}.abc123.tmp"  # a live process (our parent)
    live.write_text("partial")
    other = tmp_path / f".other.json.{2**22 + 7}.abc123.tmp"  # above the kernel's pid limit: its writer is gone
    other.write_text("partial")
    fileio.write_json_atomic(tmp_path / "artifact.json", {"ok": 1})
    assert live.exists() and not other.exists()  # no process has that pid
    old = time.time() - fileio.STALE_TEMP_SECONDS - 10
    os.utime(live, (old, old))
    fileio._swept.clear()
    fileio.write_json_atomic(tmp_path / "artifact.json", {"ok": 2})
    assert not live.exists()  # old enough to be abandoned whatever its pid


def test_cache_clear_removes_abandoned_temp_files(tmp_path: Path) -> None:
    _kill_writer_mid_write(cache.cache_dir() / "leftover.json")
    assert list(cache.cache_dir().glob(".leftover.json.*.tmp"))
    cache.clear()
    assert list(cache.cache_dir().glob(".leftover.json.*.tmp")) == []


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "dir", "big"])
def test_read_bounded_refuses_what_is_not_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 101)
    with pytest.raises((fileio.UnreadableFile, IsADirectoryError)):
        fileio.read_bounded(path, 100)
    (tmp_path / "ok").write_bytes(b"x" * 100)
    assert fileio.read_bounded(tmp_path / "ok", 100) == b"x" * 100
