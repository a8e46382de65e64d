"""What the Ray tests share: running the command, the Ray environment, and asking a head for its nodes.

Every Ray instance here, the head of ``conftest.cluster`` and the ones ``flyreg tune --ray`` starts
itself, binds to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), keeps its files in a temp dir of its own
(``RAY_TMPDIR``), authenticates with a token of its own (``RAY_AUTH_TOKEN``, never the user's) and
reports no usage. Each test that needs Ray skips where Ray is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # cli_harness, as the CLI tests use it

from cli_harness import command_env  # noqa: E402

RAY = Path(sys.executable).with_name("ray")
#: How long the head may take to start (seconds), and any one command of a test.
START_S, COMMAND_S = 150, 240


@attrs.frozen
class Cluster:
    """The head's address, the fake distributions (name -> site dir) and the variables every run here needs."""

    address: str
    sites: dict[str, Path]
    env: dict[str, str]
    files: Path


class Flyreg:
    """Runs ``python -m flyreg`` with its own cache, config and XDG dirs under ``root``, seeing flyreg's
    own ops and those of ``sites`` only, with ``env`` added."""

    def __init__(self, root: Path, sites: dict[str, Path], **env: str) -> None:
        self.dirs = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.env = command_env(self.dirs, sites, **env)

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "flyreg", *args], env={**self.env, **env}, cwd=self.root,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        proc = self.popen(*args, **env)
        out, err = proc.communicate(timeout=COMMAND_S)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)


def needs_ray() -> None:
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:  # no origin: this directory, found as a namespace package
        pytest.skip("Ray is not installed (pip install 'flyreg[ray]')")


def ray_env(ray_tmp: Path, token: str) -> dict[str, str]:
    """The variables that keep a Ray instance on loopback, its files and its workers' temp files in
    ``ray_tmp``, with its own token."""
    (ray_tmp / "tmp").mkdir(parents=True, exist_ok=True)
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp / "tmp"),
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_addresses(address: str, env: dict[str, str]) -> list[str]:
    """The addresses of the live nodes, as ``ray.nodes()`` reports them to a driver that joins ``address``."""
    probe = textwrap.dedent(f"""
        import json, ray
        ray.init(address={address!r}, logging_level="ERROR")
        print(json.dumps(sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])))
        ray.shutdown()
    """)
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=COMMAND_S)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))
