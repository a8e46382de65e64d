"""Every ``flyreg`` command runs in a child process that must say it finished.

A plugin can end the process it is imported into (``os._exit(0)``, ``sys.exit`` from its import, a
signal to itself) before a report is printed. The child marks on a pipe each op it starts and
ends loading (importing and describing its plugin), and, last, that the command finished. When
it ends before that mark while an op's load was open, that op is marked broken ("ended the
process while loading") and the command runs again with that op never loaded, so the others
still run; the exit status is then at least 1. A child that ends unfinished otherwise makes the
status 1 (128 + N for signal N). ``list`` and ``check`` run in a fresh interpreter; the others in a
fork of this one (it sees what the process registered, and imports nothing twice), except when
``main`` is called with ``argv`` from a process of its own (tests).

SIGINT and SIGTERM sent to this process alone are passed on to the child (a terminal's Ctrl-C
reaches both). On Linux this process adopts whatever the child leaves running and ends it once
the child is gone, and the child dies with this process: nothing the command started outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

import click

from flyreg._core.processes import adopt_orphans, die_with_parent, end_adopted

#: Commands run in a fresh interpreter, and those run in a fork of this process.
SUPERVISED = frozenset({"list", "check"})
FORKED = frozenset({"tune", "show", "report", "cache"})
DONE_FD = "_FLYREG_CLI_DONE_FD"
BROKEN_OPS = "_FLYREG_CLI_BROKEN_OPS"  # op -> why, for a run again after one ended the process
PARENT = "_FLYREG_CLI_PARENT"  # the supervisor's pid, where the child is to die with it
_SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent (a terminal's Ctrl-C), not kill()
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}


def wanted(argv: list[str], in_process: bool = False) -> str | None:
    """How ``argv`` runs supervised ("exec" or "fork"), or None: not a supervised command, already the child,
    or (for a forked command) ``in_process``, when the caller's process is not the command's own."""
    if os.name != "posix" or DONE_FD in os.environ:
        return None
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in SUPERVISED:
        return "exec"
    return "fork" if command in FORKED and not in_process else None


def run(argv: list[str], how: str, in_process: bool = False) -> int | None:
    """Run ``flyreg ARGV`` in a child (again without each op that ended it while loading) and return the exit
    status it earned. In a forked child this returns None: the caller runs the command there.
    ``in_process``: the caller's process is not the command's own, so nothing it started is ended."""
    broken: dict[str, str] = {}
    own = not in_process and adopt_orphans()
    unfinished = False
    while True:
        started = _start(argv, how, broken, own)
        if started is None:
            return None
        pid, marks_fd, mask = started
        code, interrupted, marks = _wait(pid, marks_fd, mask)
        if own:
            end_adopted()
        code = 128 - code if code < 0 else code
        if marks.done:
            break
        loading = marks.loading()
        if interrupted or loading is None or loading in broken:
            if code == 0:
                click.echo(f"flyreg: error: `flyreg {' '.join(argv)}` ended before it finished (a plugin ended the "
                           "process?); its output is incomplete", err=True)
                code = 1
            break
        why = f"its plugin ended the process while loading ({_death(code)})"
        click.echo(f"flyreg: error: `flyreg {' '.join(argv)}` ended before it finished: op {loading!r}: {why}; "
                   f"running it again with {loading!r} marked broken", err=True)
        broken[loading] = why
        unfinished = True
    return max(code, 1) if unfinished else code


class _Marks:
    """What the child marked: each op whose load started and ended, and whether it finished."""

    def __init__(self) -> None:
        self.buffer = b""
        self.open: list[str] = []
        self.done = False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                mark = json.loads(line)
            except ValueError:
                continue
            if mark == ["done"]:
                self.done = True
            elif isinstance(mark, list) and len(mark) == 2 and isinstance(mark[1], str):
                if mark[0] == "load":
                    self.open.append(mark[1])
                elif mark[0] == "loaded" and mark[1] in self.open:
                    self.open.remove(mark[1])

    def loading(self) -> str | None:
        """The op whose load started last and never ended."""
        return self.open[-1] if self.open else None


def _start(argv: list[str], how: str, broken: dict[str, str], own: bool) -> tuple[int, int, set[int]] | None:
    """Start the child: a fresh ``python -m flyreg`` ("exec") or a fork of this process; (its pid, the read end
    of its marks, the signal mask to restore) here, None in a forked child. Signals are blocked here from
    then on (:func:`_wait`)."""
    read_end, write_end = os.pipe()
    env = {DONE_FD: str(write_end), BROKEN_OPS: json.dumps(broken), **({PARENT: str(os.getpid())} if own else {})}
    if how == "exec":
        proc = subprocess.Popen([sys.executable, "-m", "flyreg", *argv], pass_fds=(write_end,),
                                env={**os.environ, **env})
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        pid = proc.pid
        proc.returncode = 0  # waited for by _wait, not by the Popen object
    else:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        pid = os.fork()
        if pid == 0:  # the child: ends with its parent, takes signals as a command does
            os.close(read_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            os.environ.update(env)
            return None
    os.close(write_end)
    os.set_blocking(read_end, False)
    return pid, read_end, previous


def _wait(pid: int, marks_fd: int, mask: set[int]) -> tuple[int, bool, _Marks]:
    """The child's exit status (negative: the signal that ended it), whether this process was asked to stop,
    and the child's marks. SIGINT and SIGTERM that ``kill()`` sent here are passed on to the child."""
    marks, interrupted = _Marks(), False
    try:
        while True:
            info = signal.sigtimedwait(_SIGNALS, 0.1)
            if info is not None and info.si_signo != signal.SIGCHLD:
                interrupted = True
                if info.si_code != _SI_KERNEL:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, info.si_signo)
            _read(marks_fd, marks)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                _read(marks_fd, marks)
                return os.waitstatus_to_exitcode(status), interrupted, marks
    finally:
        while signal.sigtimedwait(_SIGNALS - {signal.SIGCHLD}, 0) is not None:
            interrupted = True  # taken here: it must not reach this process once unblocked
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(marks_fd)


def _read(fd: int, marks: _Marks) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        marks.feed(data)


def _death(code: int) -> str:
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exit status {code}"


# -- in the child ------------------------------------------------------------------------------------------
def _mark(*mark: Any) -> None:
    fd = os.environ.get(DONE_FD)
    if fd is not None:
        with contextlib.suppress(OSError, ValueError):
            os.write(int(fd), json.dumps(list(mark)).encode() + b"\n")


def child_setup() -> None:
    """In the child: mark each op's load on the pipe, and never load an op that ended an earlier run."""
    if DONE_FD not in os.environ:
        return
    from flyreg._plugins.registry import REGISTRY

    parent = os.environ.get(PARENT, "")
    if parent.isdigit():
        die_with_parent(int(parent))

    try:
        broken = json.loads(os.environ.get(BROKEN_OPS) or "{}")
    except ValueError:
        broken = {}
    for name, why in broken.items():
        REGISTRY.refuse(str(name), str(why))
    REGISTRY.mark_loads(lambda name, started: _mark("load" if started else "loaded", name))


def mark_done() -> None:
    """In the child: tell the parent the command ran to its end."""
    _mark("done")
