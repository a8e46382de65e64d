"""The Ray tests' fixtures: a short temp dir for Ray, and a Ray head started by the test on 127.0.0.1."""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_harness import RAY, START_S, Cluster, free_port, needs_ray, node_addresses, ray_env  # first: finds cli_harness
from cli_harness import command_env, fake_distribution
from ray_ops import FRAGILE, PACED


@pytest.fixture(scope="session")
def ray_files() -> Iterator[Path]:
    """A short temp dir for Ray's sockets and logs (a socket path must stay under ~100 characters)."""
    root = Path(tempfile.mkdtemp(prefix="fr-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, ray_files: Path) -> Iterator[Cluster]:
    """A Ray head of two CPUs on 127.0.0.1, started with ``ray start --block`` and stopped by its pid."""
    needs_ray()
    root = tmp_path_factory.mktemp("ray_cluster")
    sites = {"paced-ops": fake_distribution(root / "paced", "paced-ops", "[flyreg.ops]\npaced = paced_ops\n",
                                            {"paced_ops/__init__.py": PACED}),
             "fragile-ops": fake_distribution(root / "fragile", "fragile-ops", "[flyreg.ops]\nfragile = fragile_ops\n",
                                              {"fragile_ops/__init__.py": FRAGILE})}
    files = root / "files"
    files.mkdir()
    env = {**ray_env(ray_files / "head", secrets.token_hex(16)),
           "FRAGILE_MARKER": str(files / "killed"), "FRAGILE_LOG": str(files / "inputs.log")}
    dirs = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
    for d in dirs.values():
        d.mkdir()
    address = f"127.0.0.1:{free_port()}"
    log = root / "head.log"
    with open(log, "w", encoding="utf-8") as out:
        head = subprocess.Popen([str(RAY), "start", "--head", "--block", f"--port={address.rpartition(':')[2]}",
                                 "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats"],
                                env=command_env(dirs, sites, **env), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text(encoding="utf-8"):
            assert head.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.5)
        assert node_addresses(address, command_env(dirs, sites, **env)) == ["127.0.0.1"]
        yield Cluster(address, sites, env, files)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=90)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=30)


