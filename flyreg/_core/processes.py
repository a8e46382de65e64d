"""Processes flyreg starts, and what they start: adopted, grouped, and ended with the command.

On Linux a supervising process adopts every orphan among its descendants (``PR_SET_CHILD_SUBREAPER``)
and ends them once its own child is gone (:func:`end_adopted`); a child dies with its supervisor
(``PR_SET_PDEATHSIG``). Worker processes lead a process group of their own (:func:`lead_group`),
so ending a worker ends what its candidates started in it (:func:`kill_group`). Elsewhere on POSIX
the group is still ended; orphans that left it are not adopted.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is not available or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def adopt_orphans() -> bool:
    """Make this process the one its descendants' orphans are re-parented to (Linux); True if it is."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(parent: int) -> None:
    """In a child: be killed (SIGKILL) when ``parent`` (the pid that forked it) ends; if it already has, end now."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def children(pid: int | None = None) -> list[int]:
    """The live (not zombie) child processes of ``pid`` (default: this process), read from ``/proc``; [] elsewhere."""
    parent = str(os.getpid() if pid is None else pid)
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == parent and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def end_adopted(limit_s: float = 10.0) -> int:
    """Kill (SIGKILL) and reap every child of this process, and each orphan re-parented to it meanwhile, within
    ``limit_s``; returns how many were ended. Call once the child a command ran in is gone."""
    ended = 0
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alive = children()
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in alive:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        ended += len(alive)
    reap()
    return ended


def reap() -> None:
    """Collect the exit status of every child of this process that has ended (no zombies are left)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def lead_group() -> None:
    """In a worker process: lead a new session (and so a process group) of its own (:func:`kill_group`)."""
    with contextlib.suppress(OSError):  # already a group leader
        os.setsid()


def kill_group(leader: int | None) -> None:
    """SIGKILL every process still in the group ``leader`` led (what a worker's candidates started in it)."""
    if leader is None or leader <= 0 or leader == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
