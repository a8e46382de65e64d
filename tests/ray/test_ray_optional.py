"""Ray is optional: without it ``--ray`` says in one line how to install it, and nothing else imports it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from ray_harness import Flyreg, needs_ray, ray_env

#: ``python -m flyreg ARGV`` in an interpreter where ``import ray`` fails as if Ray were not installed;
#: prints whether ``ray`` was imported, on stderr, as it ends.
WITHOUT_RAY = textwrap.dedent("""
    import runpy, sys
    hide = sys.argv[1] == "hide"
    if hide:
        sys.modules["ray"] = None
    sys.argv = ["flyreg", *sys.argv[2:]]
    try:
        runpy.run_module("flyreg", run_name="__main__")
    finally:
        print("ray imported:", not hide and "ray" in sys.modules, file=sys.stderr)
""")


def flyreg(run: Flyreg, hide: bool, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_RAY, "hide" if hide else "keep", *args], env=run.env,
                          cwd=run.root, capture_output=True, text=True, timeout=120)


def test_ray_without_ray_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    proc = flyreg(Flyreg(tmp_path, {}), True, "tune", "rmsnorm", "--device", "cpu", "--ray")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[0] == ("flyreg: error: --ray needs Ray, which is not installed here: "
                                           "pip install 'flyreg[ray]'")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_local_tune_works_without_ray_and_imports_none(tmp_path: Path) -> None:
    run = Flyreg(tmp_path, {})
    hidden = flyreg(run, True, "tune", "rmsnorm", "--device", "cpu", "--where", "M=32,N=1024,dtype=float32")
    assert hidden.returncode == 0, hidden.stdout + hidden.stderr
    assert "1 tuned, 0 skipped, 0 failed" in hidden.stdout
    again = flyreg(run, False, "tune", "rmsnorm", "--device", "cpu", "--dry-run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stderr.splitlines()[-1] == "ray imported: False"  # installed or not, only --ray imports it


def test_ray_refuses_isolate_in_one_line_before_starting_ray(tmp_path: Path) -> None:
    needs_ray()
    run = Flyreg(tmp_path, {}, **ray_env(tmp_path / "ray", "unused"))  # loopback, were Ray started
    proc = flyreg(run, False, "tune", "rmsnorm", "--device", "cpu", "--dry-run", "--isolate", "--ray")
    assert proc.returncode == 2, proc.stderr
    assert "--isolate is not supported with --ray" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.splitlines()[-1] == "ray imported: False"
