"""Every file flyreg opens is handled safely: the scratch cache's database and its ``.lock`` (links, a
read-only directory, a lock another process holds) and the serving record (``FLYREG_RECORD`` naming
a device, a FIFO, a directory, a ``/proc`` file, a link or another program's file).

What flyreg promises is in docs/architecture.md ("Reliability") and docs/serving.md. Runs that read
the environment once, or that would hang, run in fresh processes (with a watchdog alarm); a
read-only directory is a read-only bind mount as root (root ignores file modes), its modes otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock
import pytest

import flyreg
from flyreg import FlyregWarning

from cpu_kernels import double_op, inputs
from fresh_process import FreshProcess, Ran
from on_disk import SCRATCH_CACHE, cache_dir, cache_entries, record_calls

UNIT = Path(__file__).resolve().parent
#: Calls double_op twice under FLYREG_RECORD and runs the exit handlers, as an interpreter's exit does (a fresh
#: process ends with os._exit); the alarm ends a run that would hang at exit.
RECORD_AND_EXIT = """
    import atexit, signal
    signal.alarm(120)
    from cpu_kernels import double_op, inputs
    tuner, _ = double_op("recorded")
    x, out = inputs()
    tuner(x, out)
    tuner(x, out)
    atexit._run_exitfuncs()
    print("exited")
"""


def snapshot(path: Path) -> tuple[Any, ...]:
    """What a path is, unfollowed: its kind, inode, device numbers and (for a regular file) its bytes' hash."""
    info = os.lstat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
    return stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev, digest


def moved_aside(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".corrupt-" in p.name)


def warnings_in(ran: Ran, text: str) -> int:
    return sum(text in line for line in ran.output.splitlines())


def cache_copy(to: Path) -> Path:
    """A cache dir ``to`` holding a copy of this test's cache database alone, as a process that closed it
    leaves it (no ``-wal`` or ``-shm`` beside it)."""
    to.mkdir()
    with contextlib.closing(sqlite3.connect(cache_dir() / SCRATCH_CACHE)) as src, \
            contextlib.closing(sqlite3.connect(to / SCRATCH_CACHE)) as dst:
        src.backup(dst)
    assert sorted(p.name for p in to.iterdir()) == [SCRATCH_CACHE]
    return to


# -- the serving record ---------------------------------------------------------------------------------------


def _make_target(kind: str, tmp_path: Path) -> Path:
    if kind == "proc":
        return Path("/proc/version")
    if kind == "proc_fd":
        return Path("/proc/self/fd/1")  # the run's own output
    path = tmp_path / "record.sqlite3"
    if kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of its own
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
        (path / "inside.txt").write_text("mine")
    elif kind == "link":
        (tmp_path / "elsewhere.txt").write_text("a file the link points to")
        path.symlink_to(tmp_path / "elsewhere.txt")
    elif kind == "text":
        path.write_text("a user's notes, not a record\n" * 100)
    elif kind == "database":
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE mine (x)")
            conn.execute("INSERT INTO mine VALUES (42)")
            conn.commit()
    return path


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "proc", "proc_fd", "link", "text", "database"])
def test_the_record_refuses_what_it_did_not_make(kind: str, tmp_path: Path, fresh_process: FreshProcess) -> None:
    target = _make_target(kind, tmp_path)
    before = snapshot(target) if not kind.startswith("proc") else None
    ran = fresh_process.run(RECORD_AND_EXIT, path=[UNIT], env={"FLYREG_RECORD": str(target)})
    assert ran.code == 0 and "exited" in ran.output, ran.output  # no hang, no error at exit
    assert warnings_in(ran, "FLYREG_RECORD refused") == 1, ran.output
    assert "SQLite format" not in ran.output  # /proc/self/fd/1 is the run's output: nothing written into it
    if before is not None:
        assert snapshot(target) == before  # never renamed, replaced or written
        assert moved_aside(target.parent) == []
        assert not any(p.name.startswith(f"{target.name}-") for p in target.parent.iterdir())  # no -wal, -shm


@pytest.mark.parametrize("kind", ["fifo", "text"])
def test_record_refuses_the_same_with_an_error(kind: str, tmp_path: Path) -> None:
    target = _make_target(kind, tmp_path)
    before = snapshot(target)
    with pytest.raises(ValueError, match="record\\(\\) refuses .*record.sqlite3"):
        with flyreg.record(target):
            pass
    assert snapshot(target) == before


@pytest.mark.parametrize("kind", ["empty", "absent"])
def test_the_record_is_written_into_an_empty_file_or_a_new_path(kind: str, tmp_path: Path,
                                                                 fresh_process: FreshProcess) -> None:
    target = tmp_path / "new" / "record.sqlite3"
    if kind == "empty":
        target.parent.mkdir()
        target.touch()
    ran = fresh_process.run(RECORD_AND_EXIT, path=[UNIT], env={"FLYREG_RECORD": str(target)})
    assert ran.code == 0 and "refused" not in ran.output, ran.output
    assert record_calls(target) == {"recorded": 2}


# -- links in the cache dir -----------------------------------------------------------------------------------


def test_a_cache_database_linked_to_an_empty_file_is_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "empty.bin"
    outside.touch()
    (cache_dir() / SCRATCH_CACHE).symlink_to(outside)
    with pytest.warns(FlyregWarning, match="symbolic link.*moved it aside"):
        double_op("linked")[0](*inputs())
    assert outside.read_bytes() == b""  # nothing written through the link
    (aside,) = moved_aside(cache_dir())
    assert os.readlink(cache_dir() / aside) == str(outside)  # the link itself, renamed
    assert not (cache_dir() / SCRATCH_CACHE).is_symlink() and len(cache_entries("linked")) == 1


def test_a_link_to_another_programs_database_leaves_its_journal_mode(tmp_path: Path) -> None:
    theirs = tmp_path / "app.sqlite3"
    with contextlib.closing(sqlite3.connect(theirs)) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.commit()
    before = snapshot(theirs)
    (cache_dir() / SCRATCH_CACHE).symlink_to(theirs)
    with pytest.warns(FlyregWarning, match="symbolic link"):
        double_op("beside_theirs")[0](*inputs())
    assert snapshot(theirs) == before and not Path(f"{theirs}-wal").exists()
    with contextlib.closing(sqlite3.connect(theirs)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_a_linked_companion_file_is_never_written_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    double_op("first")[0](*inputs())
    cache = cache_copy(tmp_path / "cache")
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(cache))
    outside = tmp_path / "precious.txt"
    outside.write_text("precious")
    (cache / f"{SCRATCH_CACHE}-wal").symlink_to(outside)
    with pytest.warns(FlyregWarning, match="wal is not a regular file but a symbolic link"):
        double_op("second")[0](*inputs(rows=64))
    assert outside.read_text() == "precious"
    assert len(cache_entries("second")) == 1
    aside = moved_aside(cache)
    assert {n.split(".corrupt-")[0] for n in aside} == {SCRATCH_CACHE, f"{SCRATCH_CACHE}-wal"}  # moved together
    assert os.readlink(cache / next(n for n in aside if "-wal" in n)) == str(outside)


def test_a_linked_lock_never_makes_a_call_raise(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not a lock")
    database = cache_dir() / SCRATCH_CACHE
    database.write_bytes(b"\x00garbage" * 100)
    (cache_dir() / f"{SCRATCH_CACHE}.lock").symlink_to(outside)
    x, out = inputs()
    with pytest.warns(FlyregWarning, match="lock is not a regular file but a symbolic link"):
        assert double_op("locked_out")[0](x, out) is out
    assert outside.read_text() == "not a lock"
    assert database.read_bytes() == b"\x00garbage" * 100 and moved_aside(cache_dir()) == []  # left as it is


# -- a read-only cache dir ------------------------------------------------------------------------------------


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` read-only for this and every process: a read-only bind mount of itself as root (who
    ignores file modes), else its files' and its own modes."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [directory, *directory.iterdir()]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    d = str(directory)
    if subprocess.run(["mount", "--bind", d, d], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here to make a read-only directory")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", d], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        assert not os.access(d, os.W_OK)
        yield
    finally:
        subprocess.run(["umount", "-l", d], check=True)


def fresh_dirs(cache: Path, root: Path) -> dict[str, Path]:
    dirs = {"cache": cache, **{name: root / name for name in ("configs", "xdg_config", "xdg_cache")}}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def command(fresh_process: FreshProcess, dirs: dict[str, Path], *argv: str, **kwargs: Any) -> Ran:
    """``flyreg ARGV`` in a fresh process."""
    return fresh_process.run(f"import runpy, sys\nsys.argv = ['flyreg', *{list(argv)!r}]\n"
                             "runpy.run_module('flyreg', run_name='__main__', alter_sys=True)", dirs=dirs, **kwargs)


SERVE_FROM_READ_ONLY = """
    import json
    from cpu_kernels import double_op, inputs
    tuner, _ = double_op("ro_op")
    x, out = inputs()
    known = tuner.resolve(x, out).source
    x2, out2 = inputs(rows=64)
    y = tuner(x2, out2)  # a new key: searched, its store dropped
    print(json.dumps({"known": known, "new": tuner.stats.searches, "right": bool((y == 2 * x2).all())}))
"""


def test_a_read_only_cache_serves_what_it_holds_and_writes_nothing(tmp_path: Path,
                                                                   fresh_process: FreshProcess) -> None:
    double_op("ro_op")[0](*inputs())
    cache = cache_copy(tmp_path / "ro_cache")
    before = {p.name: snapshot(p) for p in cache.iterdir()}
    with read_only(cache):
        ran = fresh_process.run(SERVE_FROM_READ_ONLY, path=[UNIT], dirs=fresh_dirs(cache, tmp_path))
        assert ran.code == 0, ran.output
        assert ran.json()[-1] == {"known": "cache", "new": 1, "right": True}
        cache_warnings = [line for line in ran.output.splitlines() if "scratch cache" in line]
        assert len(cache_warnings) == 1 and "read-only" in cache_warnings[0], ran.output
        listed = command(fresh_process, fresh_dirs(cache, tmp_path), "list")
        assert listed.code == 0 and "Traceback" not in listed.output, listed.output
        shown = command(fresh_process, fresh_dirs(cache, tmp_path), "show", "rmsnorm", "--spec",
                        "M=32,N=1024,backend=cpu,dtype=float32")
        assert shown.code == 0 and "source:  default" in shown.output, shown.output
        report = command(fresh_process, fresh_dirs(cache, tmp_path), "report", "--out", str(tmp_path / "page"))
        assert "Traceback" not in report.output, report.output
        cleared = command(fresh_process, fresh_dirs(cache, tmp_path), "cache", "clear")
        assert cleared.code == 1 and "Traceback" not in cleared.output, cleared.output
        (line,) = cleared.output.strip().splitlines()
        assert line.startswith("flyreg: error: ") and "read-only" in line
    assert {p.name: snapshot(p) for p in cache.iterdir()} == before  # nothing written, nothing lost


def test_tune_into_an_empty_read_only_cache_dir_still_writes_its_artifacts(tmp_path: Path,
                                                                           fresh_process: FreshProcess) -> None:
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    out = tmp_path / "out"
    with read_only(cache):
        tuned = command(fresh_process, fresh_dirs(cache, tmp_path), "tune", "rmsnorm", "--spec",
                        "M=32,N=1024,backend=cpu,dtype=float32", "--device", "cpu", "--out", str(out))
    assert tuned.code == 0 and "Traceback" not in tuned.output, tuned.output
    assert len(list(out.glob("rmsnorm,*.json"))) == 1
    assert list(cache.iterdir()) == []


# -- a lock another process holds -----------------------------------------------------------------------------


BUSY_CALLS = """
    import json
    from cpu_kernels import double_op, inputs
    tuner, _ = double_op("busy_op")
    x, out = inputs()
    known = tuner.resolve(x, out).source
    x2, out2 = inputs(rows=64)
    tuner(x2, out2)  # a new key: its store waits, then is dropped
    print(json.dumps({"known": known}))
"""


def test_a_held_write_lock_skips_the_cache_and_never_moves_it(tmp_path: Path, fresh_process: FreshProcess) -> None:
    double_op("busy_op")[0](*inputs())
    cache = cache_copy(tmp_path / "busy_cache")
    with contextlib.closing(sqlite3.connect(cache / SCRATCH_CACHE, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")  # another process's long write transaction
        ran = fresh_process.run(BUSY_CALLS, path=[UNIT], dirs=fresh_dirs(cache, tmp_path))
        holder.execute("ROLLBACK")
    assert ran.code == 0, ran.output
    assert ran.json()[-1] == {"known": "cache"}  # read while the lock was held: readers take no write lock
    assert warnings_in(ran, "busy") == 1 and "unusable" not in ran.output, ran.output
    assert moved_aside(cache) == [] and (cache / SCRATCH_CACHE).is_file()


def test_a_held_lock_file_never_makes_a_call_raise_or_wait_unbounded() -> None:
    database = cache_dir() / SCRATCH_CACHE
    database.write_bytes(b"\x00garbage" * 100)
    x, out = inputs()
    with filelock.FileLock(f"{database}.lock"):  # another process moving it aside right now
        with pytest.warns(FlyregWarning, match="another process holds flyreg-cache.sqlite3.lock"):
            assert double_op("waits")[0](x, out) is out
    assert database.read_bytes() == b"\x00garbage" * 100


# -- settings at their edges ----------------------------------------------------------------------------------


def test_a_plugin_timeout_past_the_thread_limit_warns_and_calls_still_work(fresh_process: FreshProcess) -> None:
    ran = fresh_process.run("""
        import json, torch, flyreg
        y = flyreg.op("rmsnorm")(torch.ones(4, 64), torch.ones(64))
        print(json.dumps(bool(torch.isfinite(y).all())))
    """, env={"FLYREG_PLUGIN_TIMEOUT": "1e10"})
    assert ran.code == 0 and "OverflowError" not in ran.output, ran.output
    assert ran.json()[-1] is True
    assert warnings_in(ran, "FLYREG_PLUGIN_TIMEOUT='1e10'") == 1
