"""What the CLI tests share: a controlled environment, fake distributions, a runner (``Flyreg``), its output
parsers, and a command server.

Every run sees only the ``flyreg.ops`` entry points of flyreg itself and of the fake
distributions a test names (``only_plugins/sitecustomize.py``, through PYTHONPATH and
``_FLYREG_TEST_DISTRIBUTIONS``), so a plugin installed in the same environment never changes a
result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("command_server.py")
ONLY_PLUGINS = Path(__file__).with_name("only_plugins")  # its sitecustomize.py limits op discovery
ONLY_PLUGINS_VARIABLE = "_FLYREG_TEST_DISTRIBUTIONS"
SCRIPT = Path(sys.executable).with_name("flyreg")
IN_TREE = "flyreg-rmsnorm"  # the distribution of the in-tree ops

BROKEN_ENTRY_POINTS = "[flyreg.ops]\nbroken_op = flyreg_no_such_module.ops:op\n"

#: Variables that would change what the command prints (colour, terminal size, a GPU, flyreg's own).
_DROPPED = ("FLYREG_", "_FLYREG_", "XDG_", "FORCE_COLOR", "NO_COLOR", "CLICOLOR", "TTY_", "JUPYTER_", "COLUMNS", "LINES",
            "TERM", "PYTHONPATH", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "TRITON_INTERPRET")


def fake_distribution(site: Path, name: str, entry_points: str, modules: dict[str, str] | None = None) -> Path:
    """A ``<name>-0.1.dist-info`` (METADATA, entry_points.txt) and its modules under ``site``."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    for rel, text in (modules or {}).items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return site


def command_env(dirs: Mapping[str, Path], sites: Mapping[str, Path] | None = None, **extra: str) -> dict[str, str]:
    """This process's environment less what changes the output, with flyreg's dirs (``cache``, ``configs``,
    ``xdg_config``, ``xdg_cache``), and op discovery limited to flyreg's own ops and the fake
    distributions ``sites`` (name -> the dir holding its dist-info) puts on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env.update({
        "FLYREG_CACHE_DIR": str(dirs["cache"]), "FLYREG_CONFIG_DIR": str(dirs["configs"]),
        "XDG_CONFIG_HOME": str(dirs["xdg_config"]), "XDG_CACHE_HOME": str(dirs["xdg_cache"]),
        "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning", "PYTHONIOENCODING": "utf-8",
        "PYTHONPATH": os.pathsep.join(str(p) for p in (ONLY_PLUGINS, *(sites or {}).values())),
        ONLY_PLUGINS_VARIABLE: ",".join([IN_TREE, *(sites or {})]),
    })
    env.update(extra)
    return env


class Flyreg:
    """Runs the command with its own cache/config/XDG dirs, seeing flyreg's own ops and those of the fake
    distributions in ``sites`` (name -> site dir) only; ``env`` adds or overrides variables."""

    def __init__(self, root: Path, sites: dict[str, Path] | None = None, **env: str) -> None:
        self.root = root
        self.dirs = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        self.env = command_env(self.dirs, sites, **env)

    def argv(self, args: Sequence[str], script: bool = False) -> list[str]:
        return [str(SCRIPT), *args] if script else [sys.executable, "-m", "flyreg", *args]

    def popen(self, *args: str, script: bool = False, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(args, script), env={**self.env, **env}, cwd=self.root, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, *args: str, script: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
        return self.many([args], script=script, **env)[0]

    def many(self, runs: Sequence[Sequence[str]], script: bool = False, envs: Sequence[dict[str, str]] = (),
             **env: str) -> list[subprocess.CompletedProcess[str]]:
        """Run several commands at once (each its own interpreter, ``envs[i]`` added to run i) and wait for all."""
        procs = [self.popen(*args, script=script, **{**env, **(envs[i] if i < len(envs) else {})})
                 for i, args in enumerate(runs)]
        done = []
        for args, p in zip(runs, procs):
            out, err = p.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(self.argv(args, script), p.returncode, out, err))
        return done


def one_line_error(proc: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The single ``flyreg: error:`` line of a failed run (no traceback), checked against ``code``."""
    assert proc.returncode != 0, proc
    if code is not None:
        assert proc.returncode == code, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flyreg: error: "), proc.stderr
    return lines[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table printed in ``text``, a cell folded over several lines joined back."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if rows and not cells[0]:  # a continuation line of the previous row
            rows[-1] = [f"{a} {b}".strip() if b else a for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return rows


def unrestricted(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every installed op visible again."""
    return {k: v for k, v in env.items() if k != ONLY_PLUGINS_VARIABLE}


class CommandServer:
    """A ``command_server.py`` process: each command is a fork of one interpreter that already imported
    torch, so a run costs milliseconds instead of a fresh interpreter's seconds. ``env`` is a
    ``command_env`` (its PYTHONPATH is the server's for good)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], env={**env, "PYTHONUNBUFFERED": "1"},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, output: Path,
            interrupt: tuple[int, Path] | None = None) -> int:
        """Run ``flyreg ARGV`` in ``env`` (a ``command_env``); its stdout and stderr, interleaved, land in
        ``output``; returns its exit status."""
        request: dict[str, Any] = {"argv": list(argv)}
        if interrupt is not None:
            request["interrupt"] = [interrupt[0], str(interrupt[1])]
        return self._request(request, env, cwd, output)

    def run_code(self, code: str, *, env: Mapping[str, str], cwd: Path, output: Path,
                 path: Sequence[Path] = ()) -> int:
        """Run the Python ``code`` as a script, with the ``path`` dirs first on ``sys.path``, as :meth:`run` runs a
        command."""
        return self._request({"code": code, "path": [str(p) for p in path]}, env, cwd, output)

    def _request(self, request: dict[str, Any], env: Mapping[str, str], cwd: Path, output: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request.update({"dists": env[ONLY_PLUGINS_VARIABLE].split(","), "env": {**env, "PYTHONUNBUFFERED": "1"},
                        "cwd": str(cwd), "output": str(output)})
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the command server exited (status {self.proc.wait()})")
        return int(json.loads(answer)["code"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
