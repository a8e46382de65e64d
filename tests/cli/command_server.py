"""A server that runs ``flyreg`` commands (or Python code) as forks of one interpreter that already imported torch.

``python command_server.py`` (with ``only_plugins/`` on PYTHONPATH) imports torch and the command
once, then runs each request (one JSON line on stdin: ``argv``, ``dists``, ``env``, ``cwd``,
``output`` and optionally ``interrupt``; or ``code`` and ``path`` in place of ``argv``: Python
source run as a script with the ``path`` dirs first on ``sys.path``) in a forked child with that
environment and working directory, its stdout and stderr both written unbuffered to the ``output``
file, and answers ``{"code": EXIT_STATUS}``. The child is a fresh process as far as flyreg can tell: nothing of
flyreg's state (registry, device identity, caches) exists before the fork. It sees the
``flyreg.ops`` entry points of ``dists`` only (``only_plugins/sitecustomize.py``; ``env`` names
them too, for the interpreters the command starts). With ``interrupt`` ``[N, DIR]`` the child
gets SIGINT once DIR holds N ``*.json`` files; a child still running after five minutes is killed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sitecustomize  # only_plugins/sitecustomize.py


def exit_status(run: Callable[[], object]) -> int:
    """Call ``run`` and return the status the interpreter would exit with (a traceback goes to stderr)."""
    try:
        run()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BaseException:  # what an uncaught exception does to a script
        traceback.print_exc()
        return 1
    return 0


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the requested command and exit with its status."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin is the server's request pipe
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        sitecustomize.restrict_plugins(request["dists"])
        sitecustomize.as_from_a_terminal()
        if "code" in request:
            sys.path[:0] = request.get("path", [])
            sys.argv = ["-c"]
            code = exit_status(lambda: exec(compile(request["code"], "<fresh process>", "exec"), {"__name__": "__main__"}))
        else:
            sys.argv = ["flyreg", *request["argv"]]
            code = exit_status(flyreg_main())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def flyreg_main() -> Callable[[], object]:
    """The ``flyreg`` console script's function."""
    return next(iter(importlib.metadata.entry_points(group="console_scripts", name="flyreg"))).load()


def _wait(pid: int, interrupt: list[Any] | None, limit_s: float = 300.0) -> int:
    """Wait for the child (killing it after ``limit_s``); with ``interrupt`` ``[N, DIR]``, SIGINT it
    once DIR holds N artifacts."""
    deadline = time.monotonic() + limit_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if interrupt is not None and len(list(Path(interrupt[1]).glob("*.json"))) >= int(interrupt[0]):
            os.kill(pid, signal.SIGINT)
            interrupt = None
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def serve() -> None:
    """Answer run requests (JSON lines on stdin) with forked children; see the module docstring."""
    import click  # noqa: F401  the slow imports, done once for every request
    import rich.console  # noqa: F401
    import rich.progress  # noqa: F401
    import rich.table  # noqa: F401
    import torch  # noqa: F401

    flyreg_main()

    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        code = _wait(pid, request.get("interrupt"))
        print(json.dumps({"code": code}), flush=True)


if __name__ == "__main__":
    assert hasattr(sitecustomize, "restrict_plugins"), f"{sitecustomize.__file__} is not only_plugins/'s"
    del sys.path[0]  # like the console script, nothing of this directory is importable
    serve()
