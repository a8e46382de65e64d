"""A serving process stopped by a signal keeps its serving record: on SIGTERM (as ``docker stop``,
Kubernetes and systemd stop it) the counts are flushed before the application's handler or the
default action runs; a SIGKILL loses at most the last ``FLYREG_RECORD_INTERVAL`` seconds.

Each case is a real child process (it must receive the signal) that serves a builder-mode op on
the CPU from ``tests/unit/cpu_kernels.py``; it needs no plugin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from on_disk import record_calls

UNIT = Path(__file__).resolve().parent.parent / "unit"
CALLS = 7
#: argv: the record's marker file. Optionally installs the application's own SIGTERM handler (APP_HANDLER=1:
#: it writes the marker and exits 3; APP_HANDLER=ignore: SIGTERM ignored), then serves CALLS calls, says
#: "ready" and waits to be stopped.
SERVER = f"""
import os, signal, sys, time
from pathlib import Path
if os.environ.get("APP_HANDLER") == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif os.environ.get("APP_HANDLER"):
    def stop(signum, frame):
        Path(sys.argv[1]).write_text("the application's handler ran")
        sys.exit(3)
    signal.signal(signal.SIGTERM, stop)
from cpu_kernels import double_op, inputs
tuner, _ = double_op("served")
x, out = inputs()
for _ in range({CALLS}):
    tuner(x, out)
print("ready", flush=True)
time.sleep(600)
"""


def serve(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """The child, started and past its calls; its FLYREG_RECORD is ``tmp_path/record.sqlite3``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLYREG_RECORD")}
    full.update(FLYREG_RECORD=str(tmp_path / "record.sqlite3"), PYTHONPATH=str(UNIT), OMP_NUM_THREADS="1", **env)
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "marker")], env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        pytest.fail(f"the server did not start: {line}{proc.communicate(timeout=60)[1]}")
    return proc


def recorded_calls(tmp_path: Path) -> int:
    return record_calls(tmp_path / "record.sqlite3").get("served", 0)


def wait_for_calls(tmp_path: Path) -> int:
    """The record's calls once it holds all CALLS, or after a minute (a generous bound on a loaded machine)."""
    deadline = time.monotonic() + 60
    while recorded_calls(tmp_path) < CALLS and time.monotonic() < deadline:
        time.sleep(0.1)
    return recorded_calls(tmp_path)


def stop(proc: subprocess.Popen[str], sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_sigterm_flushes_the_record_then_ends_the_process_as_by_default(tmp_path: Path) -> None:
    proc = serve(tmp_path)
    code, err = stop(proc, signal.SIGTERM)
    assert code == -signal.SIGTERM, err  # the default action still ends it, with its status
    assert recorded_calls(tmp_path) == CALLS


def test_sigterm_runs_the_applications_handler_after_the_flush(tmp_path: Path) -> None:
    proc = serve(tmp_path, APP_HANDLER="1")
    code, err = stop(proc, signal.SIGTERM)
    assert code == 3, err  # the application's handler decided how it ends
    assert (tmp_path / "marker").read_text() == "the application's handler ran"
    assert recorded_calls(tmp_path) == CALLS  # flushed on the signal, and not again at exit


def test_an_ignored_sigterm_flushes_and_stays_ignored(tmp_path: Path) -> None:
    proc = serve(tmp_path, APP_HANDLER="ignore")
    proc.send_signal(signal.SIGTERM)
    assert wait_for_calls(tmp_path) == CALLS
    assert proc.poll() is None  # still serving
    code, _ = stop(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL and recorded_calls(tmp_path) == CALLS


def test_a_sigkill_loses_at_most_one_interval(tmp_path: Path) -> None:
    proc = serve(tmp_path, FLYREG_RECORD_INTERVAL="0.2")
    wait_for_calls(tmp_path)  # a few intervals pass
    code, _ = stop(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert recorded_calls(tmp_path) == CALLS
