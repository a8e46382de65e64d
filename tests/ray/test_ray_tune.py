"""``flyreg tune --ray`` on two CPU workers: the artifacts a local tune writes, and what a fault leaves.

Each command runs in a fresh interpreter that sees flyreg's own ops and the fake third-party ones
of ``ray_ops`` only. The first test's command starts its own Ray instance (``--ray --workers 2``);
the others join the head the ``cluster`` fixture started.
"""

from __future__ import annotations

import json
import secrets
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from ray_harness import COMMAND_S, Cluster, Flyreg, needs_ray, ray_env
from cli_harness import fake_distribution, table_rows
from ray_ops import PACED

OPS = ("rmsnorm", "paced")
SPECS = 8 + 4  # rmsnorm's CPU workloads, paced's


def artifacts(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in directory.glob("*.json")}


def squeezed(text: str) -> str:
    """``text`` without its whitespace: what a table cell says however it was folded."""
    return "".join(text.split())


def journaled_specs(cache: Path) -> set[tuple[str, str]]:
    """The (op, spec) pairs the tuning journal in ``cache`` holds measurements of."""
    with sqlite3.connect(cache / "flyreg-journal.sqlite3") as conn:
        return {(op, spec) for op, spec in conn.execute("SELECT op, spec FROM measurements WHERE error IS NULL")}


def test_two_workers_write_the_artifacts_a_local_tune_writes(tmp_path: Path, ray_files: Path,
                                                             cluster: Cluster) -> None:
    needs_ray()
    sites = {"paced-ops": fake_distribution(tmp_path / "site", "paced-ops", "[flyreg.ops]\npaced = paced_ops\n",
                                            {"paced_ops/__init__.py": PACED})}
    local = Flyreg(tmp_path / "local", sites)
    on_ray = Flyreg(tmp_path / "ray", sites, **ray_env(ray_files / "local", secrets.token_hex(16)))
    here = local.run("tune", *OPS, "--device", "cpu")
    assert here.returncode == 0, here.stdout + here.stderr
    ray = on_ray.run("tune", *OPS, "--device", "cpu", "--ray", "--workers", "2")
    assert ray.returncode == 0, ray.stdout + ray.stderr
    assert "ray: 2 actors on 127.0.0.1: 2 x " in ray.stdout  # its own instance, on loopback
    assert f"{SPECS} tuned, 0 skipped, 0 failed" in ray.stdout and ray.stdout.count("written") == SPECS
    want, got = artifacts(local.dirs["configs"]), artifacts(on_ray.dirs["configs"])
    assert len(want) == SPECS and sorted(got) == sorted(want)
    for name, artifact in got.items():
        for field in ("op", "spec", "device", "schema"):
            assert artifact[field] == want[name][field], name
        assert artifact["provenance"]["toolchain"] == want[name]["provenance"]["toolchain"], name
        if artifact["op"] == "paced":  # its configs are 4x apart: the same winner whoever times them
            assert artifact["config"] == want[name]["config"] == {"hints": {}, "kwargs": {"DELAY_US": 500}}, name
    tuned = {(a["op"], json.dumps(a["spec"], sort_keys=True, separators=(",", ":"))) for a in got.values()}
    assert journaled_specs(on_ray.dirs["cache"]) == tuned  # the driver journaled what the actors measured

    joined = Flyreg(tmp_path / "ray", sites, **cluster.env)
    plan = joined.run("tune", *OPS, "--device", "cpu", "--dry-run", "--ray", cluster.address,
                      "--device-name", want[name]["device"]["name"])
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert plan.stdout.count("skip: current artifact") == SPECS  # planned as a local tune plans: all current
    wrong = joined.run("tune", *OPS, "--device", "cpu", "--ray", cluster.address, "--device-name", "H200")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr, wrong.stderr
    assert f"flyreg: error: --device-name 'H200': no actor has that device; the cluster has " \
           f"{want[name]['device']['name']}" in wrong.stderr


def test_a_killed_actor_has_its_job_finished_by_the_other(tmp_path: Path, cluster: Cluster) -> None:
    run = Flyreg(tmp_path, cluster.sites, **cluster.env)
    proc = run.run("tune", "fragile", "--device", "cpu", "--ray", cluster.address)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # n=4 failed in the engine, the others did not
    assert "3 tuned, 0 skipped, 1 failed" in proc.stdout
    (failed,) = [row for row in table_rows(proc.stdout) if row[-1].startswith("failed")]
    assert failed[1].split()[0] == "n=4"
    # the result cell may fold over lines, anywhere: compare it with its whitespace taken out
    assert squeezed(failed[-1]).startswith(squeezed("failed: TuneError: fragile: every config failed on spec"))
    assert "retried: fragile n=3 on another actor after its actor died" in proc.stdout
    assert proc.stdout.count("(as dtype=float32)") == 4  # specialize() added an axis to each planned spec
    assert sorted((a["spec"]["n"], a["spec"]["dtype"]) for a in artifacts(run.dirs["configs"]).values()) == \
        [(1, "float32"), (2, "float32"), (3, "float32")]
    killed = int((cluster.files / "killed").read_text(encoding="utf-8"))
    made = [tuple(map(int, line.split())) for line in (cluster.files / "inputs.log").read_text().splitlines()]
    third = [pid for n, pid in made if n == 3]  # asked for its spec, killed, then tuned
    assert len(third) == 3 and third[1] == killed
    assert third[2] != killed and third[2] in {pid for n, pid in made if n in (1, 2)}  # by the other actor


def test_ctrl_c_keeps_finished_artifacts_and_leaves_no_partial_file(tmp_path: Path, cluster: Cluster) -> None:
    run = Flyreg(tmp_path, cluster.sites, **cluster.env, PACED_SPECS="24")
    out = tmp_path / "out"
    proc = run.popen("tune", "paced", "--device", "cpu", "--out", str(out), "--ray", cluster.address)
    deadline = time.monotonic() + COMMAND_S
    while not list(out.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()  # still tuning when the first artifact lands
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=COMMAND_S)
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted: the artifacts written so far are kept" in stdout and "not run (interrupted)" in stdout
    written = artifacts(out)
    assert 1 <= len(written) < 24
    for name, artifact in written.items():
        assert name.startswith(f"paced,n={artifact['spec']['n']},") and artifact["config"]["kwargs"]
    assert sorted(p.name for p in out.iterdir()) == sorted(written)  # no temp file left behind
