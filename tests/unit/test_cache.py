"""The scratch disk cache: one SQLite database per cache dir, safe across processes, forgiving of bad files;
and the atomic artifact writes that killed writers cannot leave half-done.

Entries are written by searches and read back as the documented table (``on_disk.cache_entries``) or
through a fresh tuner's resolution; ``flyreg cache`` clears them.
"""

from __future__ import annotations

import json
import os
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

from cpu_kernels import double_op, inputs
from on_disk import JOURNAL, RUN_FORKS, SCRATCH_CACHE, cache_dir, cache_entries, rewrite_cache_entries

#: A process that starts WORKERS forks, each of which searches COUNT keys of op ``shared_op`` (spec
#: ``{"w": worker, "i": i}``), storing each winner in the scratch cache.
WRITERS = """
import sys
import torch
import flyreg
from flyreg import Config
workers, count = int(sys.argv[1]), int(sys.argv[2])


def work(worker):
    for i in range(count):
        op = flyreg.autotune_builder("shared_op", lambda config, spec: (lambda x: x),
                                     lambda x, w=worker, i=i: {"w": w, "i": i}, [Config({"CHUNK": i})],
                                     warmup=0, rep=1)
        op(torch.zeros(1))
""" + RUN_FORKS

#: A process that writes the artifact of a config holding a 900 kB knob into DIR, again and again until killed.
ARTIFACT_WRITER = """
import sys
import torch
import flyreg
from flyreg import Config
out_dir = sys.argv[1]
blob = Config({"BLOB": "x" * 900_000})
op = flyreg.autotune_builder("blob_op", lambda config, spec: (lambda x: x), lambda x: {"n": 1}, [blob],
                             warmup=0, rep=1)
x = torch.zeros(1)
print("ready", flush=True)
while True:
    op.tune(x, out_dir=out_dir)
"""


def database() -> Path:
    return cache_dir() / SCRATCH_CACHE


def fresh_source(name: str, x: torch.Tensor, out: torch.Tensor, **options: Any) -> str:
    """Where a new tuner of op ``name`` finds the config of this call."""
    tuner, _ = double_op(name, **options)
    return tuner.resolve(x, out).source


def winners(op: str) -> list[Config]:
    return [Config.from_json(e["config"]) for e in cache_entries(op).values()]


def test_one_database_under_the_cache_dir(isolated_dirs: dict[str, Path], flyreg_cli: Callable[..., Any]) -> None:
    x, out = inputs()
    a, _ = double_op("op_a")
    b, _ = double_op("op_b", chunks=(2, 4))
    won = {"op_a": a.tune(x, out, emit=False).winner, "op_b": b.tune(x, out, emit=False).winner}
    assert database() == isolated_dirs["cache"] / SCRATCH_CACHE and database().is_file()
    assert flyreg_cli("cache", "path").out.strip() == str(database())
    assert {op: winners(op) for op in won} == {op: [w] for op, w in won.items()}
    entry = next(iter(cache_entries("op_a").values()))
    assert entry["spec"] == {"n": 256} and entry["time_ms"] > 0 and entry["device"]["arch"]
    assert fresh_source("op_a", x, out) == "cache" and fresh_source("op_b", x, out, chunks=(2, 4)) == "cache"
    assert fresh_source("op_c", x, out) == "search"


def test_a_new_search_replaces_the_entry_of_its_key() -> None:
    x, out = inputs()
    double_op("replaced", chunks=(1,))[0].tune(x, out, emit=False)
    double_op("replaced", chunks=(256,))[0].tune(x, out, emit=False)
    assert winners("replaced") == [Config({"CHUNK": 256})]


def test_cache_dir_is_read_on_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, out = inputs()
    double_op("moving")[0].tune(x, out, emit=False)
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "other"))
    assert cache_entries("moving") == {} and fresh_source("moving", x, out) == "search"
    assert (tmp_path / "other" / SCRATCH_CACHE).is_file() and len(cache_entries("moving")) == 1


def test_a_new_tuner_sees_the_cache_dir_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, out = inputs()
    first, _ = double_op("dirs")
    first(x, out)
    assert first.stats.searches == 1
    home = os.environ["FLYREG_CACHE_DIR"]
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "elsewhere"))
    second, _ = double_op("dirs")
    assert second.resolve(x, out).source == "search"
    assert (tmp_path / "elsewhere" / SCRATCH_CACHE).is_file()
    monkeypatch.setenv("FLYREG_CACHE_DIR", home)
    third, _ = double_op("dirs")
    assert third.resolve(x, out).source == "cache"
    assert third.stats.searches == 0


def test_clear_removes_entries(flyreg_cli: Callable[..., Any]) -> None:
    double_op("op_a")[0](*inputs())
    b, _ = double_op("op_b")
    b(*inputs(rows=64))
    b(*inputs(rows=128))
    assert flyreg_cli("cache", "clear", "op_a").out.strip() == f"removed 1 cache entry from {database()}"
    assert cache_entries("op_a") == {} and len(cache_entries("op_b")) == 2
    assert flyreg_cli("cache", "clear").out.strip() == f"removed 2 cache entries from {database()}"
    assert flyreg_cli("cache", "clear").out.strip() == f"removed 0 cache entries from {database()}"


def test_clear_of_nothing_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          flyreg_cli: Callable[..., Any]) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "absent"))
    for argv in (("cache", "clear", "rmsnorm"), ("cache", "clear")):
        run = flyreg_cli(*argv)
        assert run.code == 0 and run.out.startswith("removed 0 cache entries")
    spec = {"M": 32, "N": 1024, "backend": "cpu", "dtype": "float32"}
    assert flyreg.resolve_spec("rmsnorm", spec).source == "default"  # a lookup reads, and creates nothing
    assert not (tmp_path / "absent").exists()


def test_clear_leaves_other_files_alone(flyreg_cli: Callable[..., Any]) -> None:
    double_op("op_a")[0](*inputs())
    notes = cache_dir() / "notes.json"
    notes.write_text('{"mine": true}')
    assert flyreg_cli("cache", "clear").out.startswith("removed 1 cache entry")
    assert notes.read_text() == '{"mine": true}'


@pytest.mark.parametrize("op, spec_value", [("a/b", "k"), ("a" * 300, "k"), ("op", "v" * 100_000), ("ø/../x", "\x00")])
def test_names_and_keys_of_any_length_are_stored(op: str, spec_value: str) -> None:
    def make() -> Any:
        return flyreg.autotune_builder(op, lambda config, spec: (lambda x: x), lambda x: {"s": spec_value},
                                       [Config({"CHUNK": 7})], build_cache=BuildCache(), warmup=0, rep=1)

    make()(torch.zeros(1))
    ((stored_op, _),) = cache_entries(op)
    assert stored_op == op and winners(op) == [Config({"CHUNK": 7})]
    assert make().resolve(torch.zeros(1)).source == "cache"
    assert [p.name for p in cache_dir().iterdir() if not p.name.startswith((SCRATCH_CACHE, JOURNAL))] == []


@pytest.mark.parametrize("content", [b"{not json", b"\x00garbage" * 100, b"SQLite format 3\x00" + b"\xff" * 200])
def test_a_corrupt_database_is_moved_aside_and_rebuilt(content: bytes) -> None:
    database().write_bytes(content)
    x, out = inputs()
    with pytest.warns(FlyregWarning, match="moved it aside"):
        assert fresh_source("after_corrupt", x, out) == "search"  # reading never raises
    aside = list(cache_dir().glob(f"{SCRATCH_CACHE}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content  # never lost
    assert len(cache_entries("after_corrupt")) == 1 and fresh_source("after_corrupt", x, out) == "cache"


def test_a_foreign_database_is_moved_aside() -> None:
    with sqlite3.connect(database()) as conn:
        conn.execute("CREATE TABLE mine (x)")
        conn.execute("INSERT INTO mine VALUES (42)")
    conn.close()
    with pytest.warns(FlyregWarning, match="moved it aside"):
        double_op("after_foreign")[0](*inputs())
    (aside,) = cache_dir().glob(f"{SCRATCH_CACHE}.corrupt-*")
    with sqlite3.connect(aside) as conn:
        assert conn.execute("SELECT x FROM mine").fetchall() == [(42,)]
    conn.close()


def test_a_fifo_never_blocks_a_call() -> None:
    os.mkfifo(database())
    x, out = inputs()
    tuner, _ = double_op("fifo_op")
    show = [sys.executable, "-m", "flyreg", "show", "rmsnorm", "--spec", "M=32,N=1024,backend=cpu,dtype=float32"]
    done = subprocess.run(show, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "source:  default" in done.stdout and "not a regular file" in done.stderr
    (aside,) = cache_dir().glob(f"{SCRATCH_CACHE}.corrupt-*")  # moved aside, not read
    assert aside.is_fifo()
    assert tuner(x, out) is out and tuner.stats.searches == 1
    assert len(cache_entries("fifo_op")) == 1


def test_a_symlink_to_dev_zero_is_moved_aside() -> None:
    os.symlink("/dev/zero", database())
    x, out = inputs()
    with pytest.warns(FlyregWarning, match="not a regular file"):
        assert fresh_source("zero_op", x, out) == "search"
    assert fresh_source("zero_op", x, out) == "cache"
    (aside,) = cache_dir().glob(f"{SCRATCH_CACHE}.corrupt-*")
    assert aside.is_symlink() and os.readlink(aside) == "/dev/zero"


def test_tuner_survives_a_corrupt_database() -> None:
    x, out = inputs()
    database().write_bytes(b"\x00garbage")
    tuner, _ = double_op("corrupt_op")
    with pytest.warns(FlyregWarning, match="moved it aside"):
        y = tuner(x, out)
    assert y is out and tuner.stats.searches == 1
    assert len(cache_entries("corrupt_op")) == 1


@pytest.mark.parametrize("bad, warns", [("{not json", True), ("[1]", False)])
def test_a_corrupt_entry_is_ignored(bad: str, warns: bool) -> None:
    x, out = inputs()
    double_op("entry_op")[0](x, out)
    rewrite_cache_entries("entry_op", lambda old: bad)
    if warns:
        with pytest.warns(FlyregWarning, match="corrupt entry"):
            assert fresh_source("entry_op", x, out) == "search"
    else:
        assert fresh_source("entry_op", x, out) == "search"  # not an object: not an entry


def test_a_problem_warns_once_however_often_it_is_met() -> None:
    x, out = inputs()
    double_op("once_op")[0](x, out)
    rewrite_cache_entries("once_op", lambda old: "{not json")
    with pytest.warns(FlyregWarning) as record:
        for _ in range(3):
            double_op("once_op")[0].resolve(x, out)  # each a search: the entry is rewritten each time...
            rewrite_cache_entries("once_op", lambda old: "{not json")  # ...and corrupted again
    assert len([w for w in record if "corrupt entry" in str(w.message)]) == 1


def test_bad_cached_config_is_ignored_with_a_warning() -> None:
    x, out = inputs()
    double_op("badentry")[0](x, out)

    def unknown_knob(old: str) -> str:
        entry = json.loads(old)
        entry["config"] = {"kwargs": {"NOT_A_KNOB": 1}, "hints": {}}
        return json.dumps(entry)

    rewrite_cache_entries("badentry", unknown_knob)
    with pytest.warns(FlyregWarning, match="NOT_A_KNOB"):
        assert fresh_source("badentry", x, out) == "search"


def test_concurrent_processes_lose_no_entries() -> None:
    workers, per_worker = 4, 25
    proc = subprocess.Popen([sys.executable, "-c", WRITERS, str(workers), str(per_worker)], stdout=subprocess.DEVNULL)
    seen = 0
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            count = len(cache_entries("shared_op"))
        except sqlite3.OperationalError:  # the table not created yet
            count = 0
        assert count >= seen  # an entry once written is never lost
        seen = count
        time.sleep(0.01)
    assert proc.wait(timeout=60) == 0
    entries = cache_entries("shared_op").values()
    assert sorted((e["spec"]["w"], e["spec"]["i"]) for e in entries) == \
        [(w, i) for w in range(workers) for i in range(per_worker)]
    assert all(e["config"]["kwargs"]["CHUNK"] == e["spec"]["i"] for e in entries)


def _kill_writer_mid_write(target_dir: Path) -> None:
    """Kill a process that writes artifacts in a loop while one of its temp files exists, so the file stays behind."""
    before = set(target_dir.glob(".blob_op,*.tmp"))
    proc = subprocess.Popen([sys.executable, "-c", ARTIFACT_WRITER, str(target_dir)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if set(target_dir.glob(".blob_op,*.tmp")) - before:
                proc.send_signal(signal.SIGSTOP)  # stopped, it can neither finish the write nor remove the file
                if set(target_dir.glob(".blob_op,*.tmp")) - before:
                    return
                proc.send_signal(signal.SIGCONT)  # it renamed the file between the two looks: catch the next one
            time.sleep(0.001)
        raise AssertionError("the writer left no temp file to kill it on within 60 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def emit_in_a_new_process(out_dir: Path) -> None:
    """A new process's first artifact write into ``out_dir``."""
    code = ("import torch, flyreg; from flyreg import Config\n"
            "op = flyreg.autotune_builder('fresh_writer', lambda c, s: (lambda x: x), lambda x: {'n': 1}, "
            "[Config({'K': 1})], warmup=0, rep=1)\n"
            f"op.tune(torch.zeros(1), out_dir={str(out_dir)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_temp_files_of_killed_writers_are_removed_by_the_next_write(tmp_path: Path) -> None:
    for _ in range(5):
        _kill_writer_mid_write(tmp_path)
    assert list(tmp_path.glob(".blob_op,*.tmp"))  # the kills left temp files behind
    emit_in_a_new_process(tmp_path)  # its first write into the directory sweeps it
    assert list(tmp_path.glob(".*.tmp")) == []
    assert all(p.read_text().startswith("{") for p in tmp_path.glob("*.json"))


def test_a_live_writers_temp_file_is_kept(tmp_path: Path) -> None:
    live = tmp_path / f".artifact.json.{os.getppid()}.abc123.tmp"  # a live process (our parent)
    live.write_text("partial")
    other = tmp_path / f".other.json.{2**22 + 7}.abc123.tmp"  # above the kernel's pid limit: its writer is gone
    other.write_text("partial")
    tuner = flyreg.autotune_builder("sweeper", lambda c, s: (lambda x: x), lambda x: {"n": 1}, [Config({"K": 1})],
                                    build_cache=BuildCache(), warmup=0, rep=1)
    tuner.tune(torch.zeros(1), out_dir=tmp_path)  # this process's first write into the directory
    assert live.exists() and not other.exists()  # no process has that pid
    old = time.time() - 2 * 3600
    os.utime(live, (old, old))
    emit_in_a_new_process(tmp_path)
    assert not live.exists()  # old enough to be abandoned whatever its pid


def test_cache_clear_removes_abandoned_temp_files(flyreg_cli: Callable[..., Any]) -> None:
    _kill_writer_mid_write(cache_dir())
    assert list(cache_dir().glob(".blob_op,*.tmp"))
    assert flyreg_cli("cache", "clear").code == 0
    assert list(cache_dir().glob(".blob_op,*.tmp")) == []


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "dir", "big"])
def test_an_artifact_that_is_not_a_small_regular_file_is_never_read(tmp_path: Path, kind: str) -> None:
    tuner = flyreg.autotune_builder("readable", lambda c, s: (lambda x: x), lambda x: {"n": 1}, [Config({"K": 1})],
                                    build_cache=BuildCache(), warmup=0, rep=1)
    good = Path(str(tuner.tune(torch.zeros(1), out_dir=tmp_path).artifact))
    path = tmp_path / good.name.replace("readable,", "other,")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "dir":
        path.mkdir()
    else:
        text = good.read_text()
        path.write_text(text[:-2] + " " * (1 << 20) + text[-2:])  # valid JSON, over the 1 MiB cap
    problems = flyreg.check_artifacts([tmp_path])
    assert [(p.path, p.severity) for p in problems] == [(path, "error")]
    assert good.read_text().startswith("{")  # the well-formed neighbour is read and passes
