"""``flyreg list`` and ``flyreg check`` run in a child process that must say it finished.

A plugin can end the process it is imported into (``os._exit(0)``) before a report is printed.
The parent then turns a child that exited 0 without writing its done mark into exit status 1
with one line, so a check that did not finish never passes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import click

#: Commands whose exit status a CI may gate on.
SUPERVISED = frozenset({"list", "check"})
DONE_FD = "_FLYREG_CLI_DONE_FD"
DONE = b"done"


def wanted(argv: list[str]) -> bool:
    """True when ``argv`` runs a supervised command and this process is not already the child."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command in SUPERVISED and DONE_FD not in os.environ and os.name == "posix"


def run(argv: list[str]) -> int:
    """Run ``flyreg ARGV`` in a child and return the exit status it earned."""
    read_end, write_end = os.pipe()
    env = {**os.environ, DONE_FD: str(write_end)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flyreg", *argv], pass_fds=(write_end,), env=env)
    finally:
        os.close(write_end)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child gets Ctrl-C and reports it
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    with os.fdopen(read_end, "rb") as f:
        finished = f.read() == DONE
    if code < 0:
        return 128 - code
    if code == 0 and not finished:
        click.echo(f"flyreg: error: `flyreg {' '.join(argv)}` ended before it finished (a plugin ended the "
                   "process while loading?); its output is incomplete", err=True)
        return 1
    return code


def mark_done() -> None:
    """In the child: tell the parent the command ran to its end."""
    fd = os.environ.get(DONE_FD)
    if fd is not None:
        with contextlib.suppress(OSError, ValueError):
            os.write(int(fd), DONE)
