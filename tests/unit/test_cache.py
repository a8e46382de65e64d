"""The scratch disk cache: one JSON file per op, atomic, safe across processes, forgiving of bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyreg import FlyregWarning

from flyreg._core import fileio as _fileio

from flyreg._artifacts import cache

from cpu_kernels import double_op, inputs

WRITER = """
import sys
from flyreg._artifacts import cache
worker = int(sys.argv[1])
for i in range(int(sys.argv[2])):
    cache.store("shared_op", f"w{worker}-{i}", {"config": {"kwargs": {"CHUNK": i}, "hints": {}}, "worker": worker})
"""


def entry(i: int) -> dict[str, object]:
    return {"config": {"kwargs": {"CHUNK": i}, "hints": {}}, "time_ms": float(i)}


def test_one_file_per_op_under_the_cache_dir(isolated_dirs: dict[str, Path]) -> None:
    for i in range(3):
        cache.store("op_a", f"k{i}", entry(i))
    cache.store("op_b", "k", entry(9))
    assert cache.cache_dir() == isolated_dirs["cache"]
    assert sorted(p.name for p in isolated_dirs["cache"].glob("*.json")) == ["op_a.json", "op_b.json"]
    assert cache.load("op_a") == {f"k{i}": entry(i) for i in range(3)}
    assert cache.load("op_b") == {"k": entry(9)}
    assert cache.load("op_c") == {}
    data = json.loads(cache.cache_file("op_a").read_text())
    assert data["op"] == "op_a" and data["schema"] == cache.SCHEMA


def test_op_names_become_safe_file_names() -> None:
    path = cache.store("../evil op/x", "k", entry(1))
    assert path.parent == cache.cache_dir()
    assert cache.load("../evil op/x") == {"k": entry(1)}


def test_cache_dir_is_read_on_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.store("op", "k", entry(1))
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "other"))
    assert cache.load("op") == {}
    cache.store("op", "k2", entry(2))
    assert (tmp_path / "other" / "op.json").is_file()


def test_a_new_tuner_sees_the_cache_dir_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, out = inputs()
    first, _ = double_op("dirs")
    first(x, out)
    assert first.stats.searches == 1
    home = os.environ["FLYREG_CACHE_DIR"]
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "elsewhere"))
    second, _ = double_op("dirs")
    assert second.resolve(x, out).source == "search"
    assert (tmp_path / "elsewhere" / "dirs.json").is_file()
    monkeypatch.setenv("FLYREG_CACHE_DIR", home)
    third, _ = double_op("dirs")
    assert third.resolve(x, out).source == "cache"
    assert third.stats.searches == 0


def test_clear_removes_files() -> None:
    cache.store("op_a", "k", entry(1))
    cache.store("op_b", "k", entry(2))
    assert cache.clear("op_a") == [cache.cache_file("op_a")]
    assert cache.load("op_a") == {} and cache.load("op_b") == {"k": entry(2)}
    assert cache.clear() == [cache.cache_file("op_b")]
    assert cache.clear() == []


def test_write_is_atomic(monkeypatch: pytest.MonkeyPatch) -> None:
    cache.store("op", "k", entry(1))
    path = cache.cache_file("op")
    before = path.read_bytes()

    def broken_dump(data: object, f: object, **kw: object) -> None:
        f.write('{"schema": 1, "entr')  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(_fileio.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        cache.store("op", "k2", entry(2))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_written_files_follow_the_umask() -> None:
    path = cache.store("op", "k", entry(1))
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"schema": 99, "entries": {}}', '{"schema": 1}',
                                  '{"schema": 1, "entries": []}'])
def test_corrupt_file_warns_and_is_ignored(text: str) -> None:
    path = cache.cache_file("op")
    path.write_text(text)
    with pytest.warns(FlyregWarning, match="corrupt"):
        assert cache.load("op") == {}


def test_corrupt_file_is_moved_aside_on_the_next_write() -> None:
    path = cache.cache_file("op")
    path.write_text("{not json")
    with pytest.warns(FlyregWarning, match="corrupt"):
        cache.store("op", "k", entry(1))
    aside = list(path.parent.glob("op.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{not json"
    assert cache.load("op") == {"k": entry(1)}


def test_tuner_survives_a_corrupt_cache_file() -> None:
    x, out = inputs()
    cache.cache_file("corrupt_op").write_text("\x00garbage")
    tuner, _ = double_op("corrupt_op")
    with pytest.warns(FlyregWarning, match="corrupt"):
        y = tuner(x, out)
    assert y is out and tuner.stats.searches == 1
    assert len(cache.load("corrupt_op")) == 1
    assert len(list(cache.cache_dir().glob("corrupt_op.json.corrupt-*"))) == 1


def test_non_dict_entries_are_dropped() -> None:
    cache.cache_file("op").write_text(json.dumps({"schema": 1, "entries": {"a": 1, "b": entry(2)}}))
    assert cache.load("op") == {"b": entry(2)}


def test_bad_cached_config_is_ignored_with_a_warning() -> None:
    x, out = inputs()
    tuner, _ = double_op("badentry")
    tuner(x, out)
    data = json.loads(cache.cache_file("badentry").read_text())
    (key,) = data["entries"]
    data["entries"][key]["config"] = {"kwargs": {"NOT_A_KNOB": 1}, "hints": {}}
    cache.cache_file("badentry").write_text(json.dumps(data))
    fresh, _ = double_op("badentry")
    with pytest.warns(FlyregWarning, match="NOT_A_KNOB"):
        assert fresh.resolve(x, out).source == "search"


def test_concurrent_processes_lose_no_entries() -> None:
    workers, per_worker = 4, 20
    path = cache.cache_file("shared_op")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(per_worker)], env=os.environ.copy())
             for w in range(workers)]
    reads, seen = 0, 0
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        data = json.loads(text)  # never a half-written file
        assert data["schema"] == cache.SCHEMA
        count = len(data["entries"])
        assert count >= seen  # an entry once written is never lost
        seen = count
        reads += 1
    assert [p.wait(timeout=60) for p in procs] == [0] * workers
    entries = cache.load("shared_op")
    assert sorted(entries) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(per_worker))
    assert all(e["worker"] == int(k[1]) for k, e in entries.items())
    assert reads > 0


def test_warn_once_per_key() -> None:
    with pytest.warns(FlyregWarning) as record:
        for _ in range(3):
            _fileio.warn_once("flyreg: the same problem")
        _fileio.warn_once("flyreg: keyed", key="k")
        _fileio.warn_once("flyreg: keyed again", key="k")
    assert [str(w.message) for w in record] == ["flyreg: the same problem", "flyreg: keyed"]


def test_clear_of_nothing_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "absent"))
    assert cache.clear("rmsnorm") == [] and cache.clear() == []
    assert not (tmp_path / "absent").exists()


def test_clear_deletes_only_flyreg_cache_files() -> None:
    cache.store("op_a", "k", entry(1))
    directory = cache.cache_dir()
    notes = directory / "notes.json"
    notes.write_text('{"mine": true}')
    not_json = directory / "broken.json"
    not_json.write_text("{not json")
    other_schema = directory / "other.json"
    other_schema.write_text('{"schema": 2, "entries": {}}')
    assert cache.clear() == [cache.cache_file("op_a")]
    assert sorted(p.name for p in directory.glob("*.json")) == ["broken.json", "notes.json", "other.json"]
    assert notes.read_text() == '{"mine": true}'
    assert cache.clear("notes") == [] and notes.exists()  # an op's name does not make a user file a cache file


def test_clear_of_a_missing_file_makes_no_lock() -> None:
    assert cache.clear("never_stored") == [] and cache.clear() == []
    assert list(cache.cache_dir().iterdir()) == []


def test_store_after_clear_starts_a_fresh_file() -> None:
    cache.store("op_a", "k", entry(1))
    assert cache.clear("op_a") == [cache.cache_file("op_a")]
    assert cache.load("op_a") == {}
    cache.store("op_a", "k2", entry(2))
    assert set(cache.load("op_a")) == {"k2"}


@pytest.mark.parametrize("a, b", [("a/b", "a_b"), ("a b", "a_b"), ("a/b", "a b"), (".x", "x"), ("x", "_x")])
def test_distinct_ops_never_share_a_file(a: str, b: str) -> None:
    assert cache.cache_file(a) != cache.cache_file(b)
    cache.store(a, "k", entry(1))
    cache.store(b, "k", entry(2))
    assert cache.load(a) == {"k": entry(1)} and cache.load(b) == {"k": entry(2)}
    assert all(p.parent == cache.cache_dir() and not p.name.startswith(".")
               for p in (cache.cache_file(a), cache.cache_file(b)))


def test_plain_op_names_keep_their_file_name() -> None:
    assert cache.cache_file("fused_add_rmsnorm").name == "fused_add_rmsnorm.json"


def test_a_file_holding_another_op_is_ignored_and_moved_aside() -> None:
    path = cache.cache_file("op_a")
    path.write_text(json.dumps({"schema": 1, "op": "op_b", "entries": {"k": entry(1)}}))
    with pytest.warns(FlyregWarning, match="op 'op_b', not 'op_a'") as record:
        assert cache.load("op_a") == {}
        assert cache.load("op_a") == {}
    assert len(record) == 1
    cache.store("op_a", "k2", entry(2))
    assert cache.load("op_a") == {"k2": entry(2)}
    assert len(list(path.parent.glob("op_a.json.corrupt-*"))) == 1
