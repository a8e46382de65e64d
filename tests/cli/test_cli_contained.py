"""What a ``flyreg tune`` keeps contained: a plugin that ends the process while loading, a candidate that calls
``sys.exit(0)``, starts processes or floods its output, and a journaled config that has since regressed.
Each ends as a named failure of that op or config; the tune goes on, writes its artifacts and
summary, exits non-zero where something did not finish, and leaves no process running."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from cli_harness import Flyreg, fake_distribution, table_rows
from test_cli_isolate import _running, journal_errors
from toy_ops import NAME as TOY, toy_site

#: An op whose configs sleep K ms a call (K=1 the fastest right one) unless ESCAPE_REGRESS names K (then it
#: returns 3 x), and whose MODE "exit_build" / "exit_launch" calls sys.exit(0) building / launching, "spawn"
#: starts a process three ways (subprocess, fork, a setsid double fork: pids noted in ESCAPE_LOG) and
#: returns, "loud" prints 5 MB, writes 5 MB to descriptor 1, then a line "LOUD-END", and raises, "loud_build" writes
#: 5 MB to descriptor 2 building, then "BUILD-END", and raises, "chatty" (K=4, right) prints "CHATTY" and warns
#: "chatty-warning" each call.
ESCAPING = '''
import os
import subprocess
import sys
import time
import warnings

import torch

from flyreg.plugin import Config, OpRecord, hookimpl

LOG = os.environ["ESCAPE_LOG"]


def _note(pid):
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(f"{pid}\\n")


def _spawn():
    _note(subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL).pid)
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    _note(pid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a daemon: a new session, its parent gone at once
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(600)
            os._exit(0)
        os.write(write, f"{grandchild}\\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    _note(int(os.read(read, 64)))


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    mode, k = config.kwargs["MODE"], config.kwargs["K"]
    if mode == "exit_build":
        sys.exit(0)
    if mode == "loud_build":
        os.write(2, b"b" * 5_000_000 + b"\\nBUILD-END\\n")
        raise RuntimeError("loud build")

    def launch(x):
        if mode == "exit_launch":
            sys.exit(0)
        if mode == "spawn":
            if not os.path.exists(LOG):
                _spawn()
        if mode == "loud":
            print("x" * 5_000_000)
            os.write(1, b"y" * 5_000_000 + b"\\nLOUD-END\\n")
            raise RuntimeError("loud and wrong")
        if mode == "chatty":
            print("CHATTY")
            os.write(2, b"CHATTY\\n")
            warnings.warn("chatty-warning")
        time.sleep(k / 1e3)
        return x * (3 if str(k) == os.environ.get("ESCAPE_REGRESS") else 2)

    return launch


@hookimpl
def configs(spec):
    bad = [Config({"MODE": m, "K": 9}) for m in ("exit_build", "exit_launch", "spawn", "loud", "loud_build")]
    return [Config({"MODE": "ok", "K": 3}), *bad, Config({"MODE": "chatty", "K": 4}), Config({"MODE": "ok", "K": 1}),
            Config({"MODE": "ok", "K": 2})]


@hookimpl
def default(spec):
    return Config({"MODE": "ok", "K": 3})


@hookimpl
def make_inputs(spec, device):
    return (torch.ones(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0].double() * 2


@hookimpl
def describe():
    return OpRecord(description="escapes its search every way it can", version="1", structural=["MODE", "K"])
'''

#: The required hooks of a plugin that does nothing (indented as ENDING's modules are).
REQUIRED = '''
        import os
        import sys
        from flyreg.plugin import Config, hookimpl

        @hookimpl
        def specialize(args, kwargs):
            return {}

        @hookimpl
        def build(config, spec):
            return lambda: None

        @hookimpl
        def configs(spec):
            return [Config({})]

        @hookimpl
        def default(spec):
            return Config({})
'''
#: Plugins that end the process while loading: at import, from describe(), by a signal to themselves.
ENDING = {
    "ending_ops/__init__.py": "",
    "ending_ops/at_import.py": "import os\nos._exit(0)\n",
    "ending_ops/killed.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "ending_ops/at_describe.py": REQUIRED + '''
        @hookimpl
        def describe():
            os._exit(0)
    ''',
    "ending_ops/in_workloads.py": REQUIRED + '''
        @hookimpl
        def workloads(device):
            sys.exit(0)

        @hookimpl
        def make_inputs(spec, device):
            return (), {}
    ''',
}
LOADING = "[flyreg.ops]\nends_at_import = ending_ops.at_import\nends_killed = ending_ops.killed\n" \
          "ends_in_describe = ending_ops.at_describe\n"


@pytest.fixture
def escaping(tmp_path: Path) -> Flyreg:
    site = fake_distribution(tmp_path / "site", "escaping-ops", "[flyreg.ops]\nescaping = escaping_ops\n",
                             {"escaping_ops/__init__.py": ESCAPING})
    return Flyreg(tmp_path / "run", {"escaping-ops": site}, ESCAPE_LOG=str(tmp_path / "spawned.log"),
                  FLYREG_COMPILE_WORKERS="1")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("isolate", ["--no-isolate", "--isolate"])
def test_candidates_that_exit_spawn_or_flood_fail_alone_and_leave_nothing_running(escaping: Flyreg, isolate: str,
                                                                                  tmp_path: Path) -> None:
    log = tmp_path / "spawned.log"
    try:
        done = escaping.run("tune", "escaping", "--spec", "n=64", "--device", "cpu", isolate)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        (row,) = table_rows(done.stdout)
        assert row[0] == "escaping" and row[2] == "K=1 MODE=ok" and row[-1] == "written"
        (artifact,) = escaping.dirs["configs"].glob("escaping*.json")
        assert json.loads(artifact.read_text())["config"]["kwargs"] == {"K": 1, "MODE": "ok"}
        errors = journal_errors(escaping)
        assert "sys.exit(0)" in str(errors["exit_build9"]) and "sys.exit(0)" in str(errors["exit_launch9"])
        # a candidate's output is captured, isolated or not: a failure keeps its end, a success's is dropped
        for mode, why, end in (("loud9", "loud and wrong", "LOUD-END"), ("loud_build9", "loud build", "BUILD-END")):
            error = str(errors[mode])
            assert why in error.split("; the end of its output: ")[0] and error.endswith(end), error[:300]
            assert len(error) < 8192
        assert errors["chatty4"] is None and "CHATTY" not in done.stdout + done.stderr
        assert len(done.stdout) + len(done.stderr) < 100_000  # the failures' tails, not 15 MB
        if isolate == "--no-isolate":  # a warning raised inside a candidate is shown once
            assert done.stderr.count("UserWarning: chatty-warning") == 1
        spawned = [int(p) for p in log.read_text().split()]
        assert len(spawned) == 3
        deadline = time.monotonic() + 30
        while any(map(_running, spawned)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in spawned if _running(p)]
    finally:
        for pid in (int(p) for p in (log.read_text().split() if log.exists() else [])):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_force_checks_journaled_configs_again_and_retries_failures(escaping: Flyreg) -> None:
    command = ("tune", "escaping", "--spec", "n=64", "--device", "cpu", "--force")
    first = escaping.run(*command)
    assert first.returncode == 0, first.stdout + first.stderr
    assert journal_errors(escaping)["ok1"] is None
    again = escaping.run(*command, ESCAPE_REGRESS="1")  # K=1 passed once; now it computes the wrong answer
    assert again.returncode == 0, again.stdout + again.stderr
    (artifact,) = escaping.dirs["configs"].glob("escaping*.json")
    assert json.loads(artifact.read_text())["config"]["kwargs"] == {"K": 2, "MODE": "ok"}
    assert str(journal_errors(escaping)["ok1"]).startswith("rejected: ")
    assert "results read from the tuning journal" in again.stdout  # the other timings were reused
    healed = escaping.run(*command)  # --force tries a failure in the journal again (and reuses the timings)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert json.loads(artifact.read_text())["config"]["kwargs"] == {"K": 1, "MODE": "ok"}


def test_a_plugin_that_ends_the_process_while_loading_is_broken_and_the_others_are_tuned(tmp_path: Path) -> None:
    ending = fake_distribution(tmp_path / "ending", "ending-ops", LOADING, ENDING)
    run = Flyreg(tmp_path / "run", {"ending-ops": ending, TOY: toy_site(tmp_path / "toy")})
    done = run.run("tune", "--where", "n=256", "--device", "cpu")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    rows = {r[0]: r for r in table_rows(done.stdout)}
    assert rows["toyscale"][-1] == "written" and len(list(run.dirs["configs"].glob("toyscale*.json"))) == 1
    for op, how in (("ends_at_import", "exit status 0"), ("ends_killed", "killed by SIGKILL"),
                    ("ends_in_describe", "exit status 0")):
        assert rows[op][-1].startswith("failed: plugin is broken"), rows[op]
        assert f"ended the process while loading ({how})" in rows[op][-1]
        assert f"op {op!r}" in done.stderr  # said once, when it happened
    listed = run.run("list", "--json")  # list finishes too, and says which op ended its first run
    assert listed.returncode == 1 and "ended before it finished" in listed.stderr
    assert {r["op"]: r["status"] for r in json.loads(listed.stdout)["ops"]}["toyscale"] == "ok"


def test_a_hook_that_exits_0_in_the_middle_of_tune_makes_it_fail(tmp_path: Path) -> None:
    ending = fake_distribution(tmp_path / "ending", "ending-ops", "[flyreg.ops]\nends_later = ending_ops.in_workloads\n",
                               ENDING)
    run = Flyreg(tmp_path / "run", {"ending-ops": ending})
    done = run.run("tune", "ends_later", "--device", "cpu")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ended before it finished" in done.stderr and "Traceback" not in done.stderr


def test_force_recovers_from_journal_rows_that_do_not_validate(tmp_path: Path) -> None:
    run = Flyreg(tmp_path / "run", {TOY: toy_site(tmp_path / "toy")})
    command = ("tune", "toyscale", "--spec", "n=256,dtype=float32", "--device", "cpu", "--force")
    first = run.run(*command)
    assert first.returncode == 0, first.stdout + first.stderr
    journal = run.dirs["cache"] / "flyreg-journal.sqlite3"
    with sqlite3.connect(journal) as conn:
        (row,) = conn.execute("SELECT op, spec, config, device, toolchain, timing, created FROM measurements "
                              "WHERE timing = 'cpu' ORDER BY id LIMIT 1").fetchall()
        op, spec, config, device, toolchain, timing, created = row
        hostile = [(config, -1.0, None), (config, "fast", None), ('{"kwargs":{"CHUNK":' + "[" * 50_000, 0.1, None),
                   (config, None, "e" * 100_000)]
        conn.executemany("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, "
                         "reps, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, 0.0, 3, ?, ?)",
                         [(op, spec, c, device, toolchain, timing, m, e, created) for c, m, e in hostile])
    conn.close()
    again = run.run(*command)
    assert again.returncode == 0, again.stdout + again.stderr
    (row,) = table_rows(again.stdout)
    assert row[-1] == "written" and row[-2] == "0"  # nothing failed: the hostile rows never ranked
    assert again.stderr.count("do not validate") == 1 and "Traceback" not in again.stderr
