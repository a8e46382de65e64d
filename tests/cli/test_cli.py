"""The ``flyreg`` command, driven through its real entry points in fresh interpreters.

Every run is ``python -m flyreg ...`` (or the ``flyreg`` console script next to
``sys.executable``) with the cache, config and XDG dirs pointed at temporary folders, and op
discovery limited to flyreg's own distribution and the fake ones a test makes
(``cli_harness.command_env``), so a third-party plugin installed in the same environment changes
nothing here. Two fake distributions are made on disk: ``broken-ops`` (its entry point names a
module that does not exist) and ``sleepy-ops`` (an op whose launches sleep, so a tune can be
interrupted). Tuning always passes ``--device cpu``, so the suite means the same on a GPU machine.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import flyreg
from cli_harness import (BROKEN_ENTRY_POINTS, SCRIPT, Flyreg, fake_distribution, one_line_error, table_rows,
                         unrestricted)
from flyreg import Config
from on_disk import artifact_name, emit, read_json


def named_for_its_content(path: Path) -> bool:
    """Whether an artifact's filename is the one its content implies (the documented name)."""
    art = read_json(path)
    return artifact_name(art["op"], art["spec"], art["device"]["name"]) == path.name

CPU_WORKLOADS = 8  # rmsnorm's default CPU workloads: M in (32, 256) x N in (1024, 4096) x 2 dtypes
SPEC = "M=32,N=1024,backend=cpu,dtype=float32"

SLEEPY_MODULE = '''
"""An op whose launch sleeps DELAY_MS: a tune that is slow on purpose and easy to interrupt."""
import time

import torch

from flyreg import Config, hookimpl


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    delay = config.kwargs["DELAY_MS"] / 1e3

    def launch(x):
        time.sleep(delay)
        return x

    return launch


@hookimpl
def configs(spec):
    return [Config({"DELAY_MS": 8}), Config({"DELAY_MS": 16})]


@hookimpl
def default(spec):
    return Config({"DELAY_MS": 16})


@hookimpl
def workloads(device):
    return [{"n": n} for n in range(1, 21)]


@hookimpl
def make_inputs(spec, device):
    return (torch.zeros(spec["n"], device=device),), {}


@hookimpl
def describe():
    return {"description": "sleeps DELAY_MS per call", "version": "1", "structural": ["DELAY_MS"]}
'''


def artifacts(directory: Path, op: str | None = None) -> dict[str, Path]:
    return {p.name: p for p in directory.glob("*.json") if op is None or p.name.startswith(f"{op},")}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_distribution(tmp_path_factory.mktemp("broken_site"), "broken-ops", BROKEN_ENTRY_POINTS)


@pytest.fixture(scope="module")
def cmd(tmp_path_factory: pytest.TempPathFactory, broken_site: Path) -> Flyreg:
    """The environment most tests share: flyreg's own ops plus the broken distribution."""
    return Flyreg(tmp_path_factory.mktemp("cli"), {"broken-ops": broken_site})


@pytest.fixture(scope="module")
def tuned(cmd: Flyreg) -> subprocess.CompletedProcess[str]:
    """``flyreg tune`` of everything on the CPU into the default dir (FLYREG_CONFIG_DIR), fused op disabled."""
    return cmd.run("tune", "--device", "cpu", FLYREG_DISABLE_OPS="fused_add_rmsnorm")


# -- entry points and user errors ----------------------------------------------------------------------------
def test_version_from_the_script_and_the_module(cmd: Flyreg) -> None:
    from flyreg import __version__

    if not SCRIPT.is_file():
        pytest.skip(f"no flyreg console script next to {sys.executable} (flyreg not installed in this env)")
    by_script, by_module = cmd.run("--version", script=True), cmd.run("--version")
    assert by_script.returncode == by_module.returncode == 0
    assert by_script.stdout == by_module.stdout == f"flyreg, version {__version__}\n"


def test_runs_see_the_ops_of_flyreg_and_the_named_fakes_and_unrestricted_every_installed_one(cmd: Flyreg) -> None:
    argv = cmd.argv(["list", "--json", "--device", "cpu"])
    every, named, bare = [
        subprocess.run(argv, env=env, cwd=cmd.root, capture_output=True, text=True, timeout=120)
        for env in (unrestricted(cmd.env), cmd.env, {**Flyreg(cmd.root / "bare").env, "PYTHONPATH": cmd.env["PYTHONPATH"]})]
    listed = [{row["op"]: row["status"] for row in json.loads(p.stdout)["ops"]} for p in (every, named, bare)]
    mine = {"broken_op": "broken", "fused_add_rmsnorm": "ok", "rmsnorm": "ok"}
    assert listed[0].items() >= mine.items()  # and whatever else this environment has installed
    assert listed[1] == mine
    assert listed[2] == {"fused_add_rmsnorm": "ok", "rmsnorm": "ok"}  # broken-ops is on PYTHONPATH, not named


def test_bare_command_prints_the_usage(cmd: Flyreg) -> None:
    proc = cmd.run()
    assert proc.returncode == 2 and "Usage: flyreg" in proc.stdout + proc.stderr and "error" not in proc.stderr
    assert all(c in proc.stdout + proc.stderr for c in ("list", "tune", "show", "check", "cache"))


def test_import_flyreg_loads_neither_click_nor_rich(cmd: Flyreg) -> None:
    probe = "import sys, flyreg; print(sorted(m for m in ('click', 'rich', 'torch') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], env=cmd.env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    cmd = Flyreg(tmp_path / "run")
    a_file = tmp_path / "a_file"
    a_file.write_text("", encoding="utf-8")
    (unknown_tune, unknown_show, bad_spec, dup_axis, tpu, cuda9, out_file, out_under_file, spec_no_op,
     incomplete, cache_typo, nan_budget, inf_margin, empty_out, empty_report, triton_on_cpu, *empty_ops) = cmd.many([
        ["tune", "rmsnrm"],
        ["show", "rmsnrom", "--spec", SPEC],
        ["tune", "rmsnorm", "--spec", "N"],
        ["show", "rmsnorm", "--spec", "N=1,N=2"],
        ["tune", "--device", "tpu"],
        ["tune", "rmsnorm", "--device", "cuda:9", "--spec", SPEC],
        ["tune", "rmsnorm", "--out", str(a_file)],
        ["tune", "rmsnorm", "--device", "cpu", "--out", str(a_file / "sub"), "--spec", SPEC],
        ["tune", "--spec", SPEC],
        ["show", "rmsnorm", "--spec", "N=1024", "--device", "cpu"],
        ["cache", "clear", "rmsnrm"],
        ["tune", "rmsnorm", "--budget", "nan"],
        ["check", "--remeasure", "--margin", "1e999"],  # inf: no artifact could ever read "retune"
        ["tune", "rmsnorm", "--out", ""],
        ["check", "--remeasure", "--report", ""],
        ["tune", "rmsnorm", "--device", "cpu", "--spec", SPEC.replace("backend=cpu", "backend=triton")],
        ["tune", ""], ["show", ""], ["cache", "clear", ""],
    ])
    for proc in (unknown_tune, unknown_show, cache_typo):
        assert "did you mean 'rmsnorm'?" in one_line_error(proc, 2)
    assert "expected AXIS=VALUE" in one_line_error(bad_spec, 2)
    assert "given twice" in one_line_error(dup_axis, 2)
    assert "expected cpu, cuda or cuda:N, got 'tpu'" in one_line_error(tpu, 2)
    assert "'cuda:9'" in one_line_error(cuda9, 2)  # no CUDA here, or fewer than 10 GPUs
    assert "is a file" in one_line_error(out_file, 2)
    assert "cannot create" in one_line_error(out_under_file, 2)
    assert "--spec needs the OP" in one_line_error(spec_no_op, 2)
    line = one_line_error(incomplete, 2)  # M stands for its buckets, backend is the CPU's: dtype is missing
    assert "rmsnorm: spec {'N': 1024} does not fit the op's axes: missing dtype." in line
    assert "dtype (str, one of bfloat16|float16|float32)" in line
    assert "'--budget': 'nan' is not a finite number" in one_line_error(nan_budget, 2)
    assert "'--margin': '1e999' is not a finite number" in one_line_error(inf_margin, 2)
    assert "--out: expected a path, got ''" in one_line_error(empty_out, 2)
    assert "--report: expected a path, got ''" in one_line_error(empty_report, 2)
    assert ("rmsnorm: backend=triton cannot be tuned on cpu: calls there take backend=cpu"
            in one_line_error(triton_on_cpu, 2))  # its inputs would make a backend=cpu artifact instead
    for proc in empty_ops:
        assert "Invalid value for OP: expected an op name, got ''" in one_line_error(proc, 2)
    assert not list(cmd.dirs["cache"].iterdir())  # the typo created no cache file nor lock


# -- list ----------------------------------------------------------------------------------------------------
def test_list_shows_the_broken_plugin_and_the_others_ok(cmd: Flyreg, tuned: Any) -> None:
    table, as_json = cmd.many([["list", "--device", "cpu"], ["list", "--json", "--device", "cpu"]])
    assert table.returncode == as_json.returncode == 0, table.stderr + as_json.stderr
    ops = {row["op"]: row for row in json.loads(as_json.stdout)["ops"]}
    assert set(ops) == {"broken_op", "fused_add_rmsnorm", "rmsnorm"}
    broken = ops["broken_op"]
    assert (broken["status"], broken["distribution"], broken["version"]) == ("broken", "broken-ops", "0.1")
    assert "flyreg_no_such_module" in broken["error"]
    rms = ops["rmsnorm"]
    assert (rms["status"], rms["error"], rms["distribution"]) == ("ok", None, "flyreg-rmsnorm")
    assert rms["structural"] == ["BLOCK_N", "ROWS", "ROW_BLOCK"] and rms["description"]
    assert rms["artifacts"] == CPU_WORKLOADS  # the ones the tune wrote for this CPU
    rows = {r[0]: r for r in table_rows(table.stdout)}
    assert rows["broken_op"][1:3] == ["broken-ops 0.1", f"broken: {broken['error']}"]
    assert rows["rmsnorm"][2:] == ["ok", rms["description"], "BLOCK_N, ROWS, ROW_BLOCK", str(CPU_WORKLOADS)]
    assert rows["fused_add_rmsnorm"][2] == "ok"


# -- tune ----------------------------------------------------------------------------------------------------
def test_tune_everything_tunes_the_others_and_fails_for_the_broken_one(cmd: Flyreg, tuned: Any) -> None:
    assert tuned.returncode == 1, tuned.stderr  # 1: some job failed (the broken plugin)
    assert "Traceback" not in tuned.stderr
    written = artifacts(cmd.dirs["configs"])
    assert len(written) == CPU_WORKLOADS and all(n.startswith("rmsnorm,") for n in written)
    for path in written.values():
        art = read_json(path)
        assert (art["op"], named_for_its_content(path), art["spec"]["backend"]) == ("rmsnorm", True, "cpu")
    rows = table_rows(tuned.stdout)
    unspaced = [[*r[:-1], "".join(r[-1].split())] for r in rows]  # the result column folds where it must
    assert ["broken_op", "-", "", "", "", "", "", "",
            "failed:pluginisbroken:ModuleNotFoundError:Nomodulenamed'flyreg_no_such_module'"] in unspaced
    assert ["fused_add_rmsnorm", "-", "", "", "", "", "", "", "skipped:disabledbyFLYREG_DISABLE_OPS"] in unspaced
    tuned_rows = [r for r in rows if r[0] == "rmsnorm"]
    assert len(tuned_rows) == CPU_WORKLOADS and {r[-1] for r in tuned_rows} == {"written"}
    for _op, spec, winner, time_, speedup, why, tried, failed, _ in tuned_rows:
        assert f"{spec},device_name=" in " ".join(written) and winner.startswith("ROW_BLOCK=")
        assert time_.endswith(("us", "ms")) and speedup.endswith("x") and int(tried) >= 1 and failed == "0"
        assert why.startswith(("kept default: fastest ", "default is fastest", "fastest", "tied with fastest")), why
    assert f"{CPU_WORKLOADS} tuned, 1 skipped, 1 failed; artifacts in {cmd.dirs['configs']}" in tuned.stdout
    cost = re.search(r"^cost: (\d+) configs benchmarked, (\d+) builds, [\d.]+ s$", tuned.stdout, re.MULTILINE)
    assert cost, tuned.stdout
    assert int(cost[1]) == sum(int(r[6]) for r in tuned_rows)  # every tried CPU config was timed
    assert 1 <= int(cost[2]) <= int(cost[1])
    assert "ETA" in tuned.stderr  # the progress bar


def test_rerun_skips_current_artifacts_and_dry_run_says_so(cmd: Flyreg, tuned: Any) -> None:
    before = {n: p.stat().st_mtime_ns for n, p in artifacts(cmd.dirs["configs"]).items()}
    again, dry = cmd.many([["tune", "rmsnorm", "--device", "cpu"],
                           ["tune", "--device", "cpu", "--dry-run", "--out", str(cmd.root / "fresh")]])
    assert again.returncode == 0, again.stderr
    assert [r[-1] for r in table_rows(again.stdout)] == ["skipped: current artifact"] * CPU_WORKLOADS
    assert f"0 tuned, {CPU_WORKLOADS} skipped, 0 failed" in again.stdout
    assert {n: p.stat().st_mtime_ns for n, p in artifacts(cmd.dirs["configs"]).items()} == before
    assert dry.returncode == 0, dry.stderr
    actions = {(op, spec): action for op, spec, action in table_rows(dry.stdout)}
    assert list(actions.values()).count("tune") == 2 * CPU_WORKLOADS
    assert actions["broken_op", "-"].startswith("fail: plugin is broken: ModuleNotFoundError")
    assert not (cmd.root / "fresh").exists()  # a dry run writes nothing, not even the dir


def test_where_keeps_the_matching_workloads_only(cmd: Flyreg) -> None:
    out = str(cmd.root / "where")
    some, none, typo, bad, clash = cmd.many([
        ["tune", "rmsnorm", "--device", "cpu", "--dry-run", "--out", out, "--where", "dtype=float32,N=1024",
         "--where", "N=4096"],
        ["tune", "rmsnorm", "--device", "cpu", "--dry-run", "--out", out, "--where", "dtype=int8"],
        ["tune", "rmsnorm", "--device", "cpu", "--dry-run", "--out", out, "--where", "dtyp=float32"],
        ["tune", "rmsnorm", "--device", "cpu", "--dry-run", "--out", out, "--where", "dtype"],
        ["tune", "rmsnorm", "--device", "cpu", "--where", "N=1024", "--spec", SPEC]])
    assert some.returncode == 0, some.stderr
    specs = [spec for _, spec, _ in table_rows(some.stdout)]
    assert specs and all(("dtype=float32" in s and "N=1024," in s) or "N=4096," in s for s in specs)
    assert any("N=1024," in s for s in specs) and any("N=4096," in s for s in specs)
    assert [a for _, _, a in table_rows(none.stdout)] == ["fail: no workload for cpu matches --where"]
    assert "--where names axis 'dtyp', which no op here has (did you mean 'dtype'?)" in one_line_error(typo, 2)
    # Every op planned, one of them broken (it may have any axis): each op that loaded says why it has no job.
    anyop = cmd.run("tune", "--device", "cpu", "--dry-run", "--out", out, "--where", "zzz=1")
    assert anyop.returncode == 0, anyop.stderr
    assert {a for _, _, a in table_rows(anyop.stdout) if "broken" not in a} == {
        "skip: --where names axes ['zzz'] that no workload has (its axes: M, N, backend, dtype)"}
    assert bad.returncode == 2 and "--where" in bad.stderr and "--spec" not in bad.stderr
    assert clash.returncode == 2 and "--where filters" in clash.stderr and "Traceback" not in clash.stderr


def test_force_retunes(cmd: Flyreg, tuned: Any) -> None:
    name = f"rmsnorm,{SPEC},device_name="
    (path,) = [p for n, p in artifacts(cmd.dirs["configs"]).items() if n.startswith(name)]
    before = path.stat().st_mtime_ns
    proc = cmd.run("tune", "rmsnorm", "--device", "cpu", "--spec", SPEC, "--force")
    assert proc.returncode == 0, proc.stderr
    assert "1 tuned, 0 skipped, 0 failed" in proc.stdout and "written" in proc.stdout
    assert path.stat().st_mtime_ns > before
    assert named_for_its_content(path)


# -- show ----------------------------------------------------------------------------------------------------
def test_show_after_tune(cmd: Flyreg, tuned: Any) -> None:
    (artifact,) = [p for n, p in artifacts(cmd.dirs["configs"]).items() if n.startswith(f"rmsnorm,{SPEC},")]
    config = Config.from_json(read_json(artifact)["config"])
    # a fresh scratch cache (as on a machine the artifacts are shipped to), and the cache the tune filled
    fresh = {"FLYREG_CACHE_DIR": str(cmd.root / "empty-cache")}
    as_json, as_text, cached = cmd.many(
        [["show", "rmsnorm", "--spec", SPEC, "--spec", "M=32,N=999,backend=cpu,dtype=float32", "--device", "cpu",
          "--json"],
         ["show", "rmsnorm", "--spec", SPEC, "--device", "cpu"],
         ["show", "rmsnorm", "--spec", SPEC, "--device", "cpu"]],
        envs=[fresh, fresh, {}])
    assert as_json.returncode == 0, as_json.stderr
    served, untuned = json.loads(as_json.stdout)
    assert (served["source"], served["path"], served["config"]) == ("offline", str(artifact), config.to_json())
    assert (untuned["source"], untuned["path"]) == ("default", None)
    assert as_text.returncode == 0, as_text.stderr
    assert "source:  offline" in as_text.stdout and f"path:    {artifact}" in as_text.stdout
    # the runtime looks in the scratch cache first, so that is the source; show names the artifact too
    assert cached.returncode == 0, cached.stderr
    assert "source:  cache" in cached.stdout and f"offline: {artifact}" in cached.stdout


# -- check ---------------------------------------------------------------------------------------------------
def test_check_good_and_bad_dirs(cmd: Flyreg, tuned: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (first,) = [p for n, p in artifacts(cmd.dirs["configs"]).items() if n.startswith(f"rmsnorm,{SPEC},")]
    (bad / first.name).write_text("{ not json", encoding="utf-8")
    misnamed = bad / first.name.replace("M=32,", "M=64,")
    misnamed.write_text(first.read_text(encoding="utf-8"), encoding="utf-8")
    good, broken = cmd.many([["check", str(cmd.dirs["configs"])], ["check", str(bad)]])
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"checked {CPU_WORKLOADS} artifact(s) in 1 dir(s): 0 problem(s)" in good.stdout
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert f"{bad / first.name}: error: unreadable JSON" in broken.stdout
    assert f"{misnamed}: error: filename does not match its content" in broken.stdout
    assert "checked 2 artifact(s) in 1 dir(s): 2 problem(s)" in broken.stdout


# -- cache ---------------------------------------------------------------------------------------------------
def test_cache_path_and_clear(cmd: Flyreg, tuned: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(cmd.dirs["cache"], cache)  # the tune's scratch cache; the other tests keep theirs
    database, env = cache / "flyreg-cache.sqlite3", {"FLYREG_CACHE_DIR": str(cache)}
    (path_all,) = cmd.many([["cache", "path"]], **env)
    assert path_all.stdout == f"{database}\n"
    assert database.is_file()  # the tune filled the scratch cache
    one = cmd.run("cache", "clear", "rmsnorm", **env)
    assert one.returncode == 0 and one.stdout.startswith("removed ") and one.stdout.endswith(f" from {database}\n")
    assert int(one.stdout.split()[1]) >= 1
    again = cmd.run("cache", "clear", "rmsnorm", **env)
    assert again.stdout == f"removed 0 cache entries from {database}\n"
    everything = cmd.run("cache", "clear", **env)
    assert everything.returncode == 0 and everything.stdout.startswith("removed ")


# -- interruption --------------------------------------------------------------------------------------------
def test_ctrl_c_keeps_finished_artifacts_and_leaves_no_partial_file(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "sleepy-ops", "[flyreg.ops]\nsleepy = sleepy_ops\n",
                             {"sleepy_ops/__init__.py": SLEEPY_MODULE})
    run = Flyreg(tmp_path / "run", {"sleepy-ops": site})
    out = tmp_path / "out"
    proc = run.popen("tune", "sleepy", "--device", "cpu", "--out", str(out))
    deadline = time.monotonic() + 60
    while not list(out.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()  # still tuning when the first artifact lands
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    assert "interrupted: the artifacts written so far are kept" in stdout
    assert "not run (interrupted)" in stdout
    written = artifacts(out)
    assert 1 <= len(written) < 20
    for path in written.values():
        json.loads(path.read_text(encoding="utf-8"))
        assert named_for_its_content(path)
    assert sorted(p.name for p in out.iterdir()) == sorted(written)  # no .*.tmp left behind


# -- check, show and cache clear against what the runtime would really serve -------------------------------
def test_check_asks_the_op_about_configs_and_warns_for_unusable_ops(cmd: Flyreg, tuned: Any, tmp_path: Path) -> None:
    (good,) = [p for n, p in artifacts(cmd.dirs["configs"]).items() if n.startswith(f"rmsnorm,{SPEC},")]
    data = json.loads(good.read_text(encoding="utf-8"))
    dirs = {name: tmp_path / name for name in ("rejected", "unusable")}
    for d in dirs.values():
        d.mkdir()
    (dirs["rejected"] / good.name).write_text(json.dumps({**data, "config": {"kwargs": {"ROW_BLOCK": 7}, "hints": {}}}))
    for op in ("broken_op", "fused_add_rmsnorm"):
        name = good.name.replace("rmsnorm,", f"{op},", 1)
        (dirs["unusable"] / name).write_text(json.dumps({**data, "op": op}))
    rejected, unusable, strict = cmd.many([["check", str(dirs["rejected"])], ["check", str(dirs["unusable"])],
                                           ["check", "--strict", str(dirs["unusable"])]],
                                          FLYREG_DISABLE_OPS="fused_add_rmsnorm")
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert (f"{dirs['rejected'] / good.name}: error: config not accepted by op 'rmsnorm' for spec {SPEC}: "
            f"it is not among this op's") in rejected.stdout
    assert unusable.returncode == 0, unusable.stdout + unusable.stderr
    lines = unusable.stdout.splitlines()
    assert any(": warning: op 'broken_op' is broken here" in line for line in lines), unusable.stdout
    assert any(": warning: op 'fused_add_rmsnorm' is disabled here" in line for line in lines), unusable.stdout
    assert "unknown op" not in unusable.stdout
    assert "checked 2 artifact(s) in 1 dir(s): 0 problem(s), 2 warning(s) (not an error without --strict)" in lines
    assert strict.returncode == 1 and "checked 2 artifact(s) in 1 dir(s): 2 problem(s)" in strict.stdout


def test_show_names_only_an_artifact_the_runtime_would_serve_and_clear_keeps_user_files(tmp_path: Path) -> None:
    run = Flyreg(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    tune = run.run("tune", "rmsnorm", "--device", "cpu", "--spec", SPEC, "--out", str(elsewhere))
    assert tune.returncode == 0, tune.stdout + tune.stderr  # fills the scratch cache, writes no artifact here
    (written,) = artifacts(elsewhere).values()
    data = json.loads(written.read_text(encoding="utf-8"))
    rejected = run.dirs["configs"] / written.name
    rejected.write_text(json.dumps({**data, "config": {"kwargs": {"ROW_BLOCK": 7}, "hints": {}}}))
    shown = run.run("show", "rmsnorm", "--spec", SPEC, "--device", "cpu", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert (row["source"], row["offline"]) == ("cache", None)  # the runtime would ignore the rejected file

    notes = run.dirs["cache"] / "notes.json"
    notes.write_text('{"mine": true}', encoding="utf-8")
    one = run.run("cache", "clear", "notes")
    everything = run.run("cache", "clear")
    assert one.returncode == 2 and "unknown op 'notes'" in one.stderr  # a file's name does not make an op
    assert everything.returncode == 0 and everything.stdout.startswith("removed 1 cache entry")
    assert sorted(p.name for p in run.dirs["cache"].glob("*.json")) == ["notes.json"]


# -- plugins that end or hang the process while loading ---------------------------------------------------
def test_a_plugin_that_exits_at_import_never_makes_check_or_list_pass(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "exiting-ops", "[flyreg.ops]\nexiting = exiting_ops\n",
                             {"exiting_ops/__init__.py": "import os\nos._exit(0)\n"})
    run = Flyreg(tmp_path / "run", {"exiting-ops": site})
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rmsnorm,M=256,N=4096,backend=cpu,dtype=float32,device=x.json").write_text('{"schema": 1, "op": "rms')
    check, listed = run.many([["check", str(bad)], ["list"]])
    for proc in (check, listed):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "ended before it finished" in proc.stderr and "Traceback" not in proc.stderr


def test_a_plugin_that_hangs_at_import_is_listed_as_broken(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "hanging-ops", "[flyreg.ops]\nhanging = hanging_ops\n",
                             {"hanging_ops/__init__.py": "import threading\nthreading.Event().wait()\n"})
    run = Flyreg(tmp_path / "run", {"hanging-ops": site}, FLYREG_PLUGIN_TIMEOUT="1")
    start = time.monotonic()
    listed = run.run("list", "--json")
    assert time.monotonic() - start < 60
    assert listed.returncode == 0, listed.stderr
    rows = {r["op"]: r for r in json.loads(listed.stdout)["ops"]}
    assert rows["hanging"]["status"] == "broken" and "load timed out" in rows["hanging"]["error"]
    assert rows["rmsnorm"]["status"] == "ok"


# -- specs checked against the op's declared axes ----------------------------------------------------------
def test_show_a_spec_without_its_bucketed_axis_prints_a_row_per_bucket(tmp_path: Path) -> None:
    from flyreg_rmsnorm import space

    run = Flyreg(tmp_path / "run")
    as_table, as_json, wrong, ill_typed = run.many([
        ["show", "rmsnorm", "--spec", "N=8192,dtype=bfloat16", "--device", "cpu"],
        ["show", "rmsnorm", "--spec", "N=8192,dtype=bfloat16", "--device", "cpu", "--json"],
        ["show", "rmsnorm", "--spec", "N=8192,dtyp=bfloat16,backend=tpu", "--device", "cpu"],
        ["show", "rmsnorm", "--spec", "M=many,N=8192,dtype=bfloat16", "--device", "cpu"],
    ])
    specs = [{"M": m, "N": 8192, "backend": "cpu", "dtype": "bfloat16"} for m in space.ROW_BUCKETS]
    assert as_table.returncode == 0, as_table.stderr
    rows = table_rows(as_table.stdout)
    assert [r[0] for r in rows] == [f"M={m},N=8192,backend=cpu,dtype=bfloat16" for m in space.ROW_BUCKETS]
    assert [r[2] for r in rows] == ["default"] * len(specs)
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert [r["spec"] for r in shown] == specs
    assert [r["config"] for r in shown] == [space.cpu_default(s).to_json() for s in specs]

    line = one_line_error(wrong, 2)  # every problem at once, with the axes and values the op allows
    assert line.startswith("flyreg: error: rmsnorm: spec {'N': 8192, 'dtyp': 'bfloat16', 'backend': 'tpu'} "
                           "does not fit the op's axes: missing dtype; unknown axis dtyp (did you mean dtype?); "
                           "backend: tpu is not one of triton|cpu. Axes: M (int, ordered, >= 0, buckets 1|32|256|4096|32768)")
    assert "dtype (str, one of bfloat16|float16|float32)" in line
    assert "M: 'many' is not of type int" in one_line_error(ill_typed, 2)


def test_check_reports_an_artifact_whose_spec_does_not_fit_the_axes(tmp_path: Path) -> None:
    from flyreg_rmsnorm import space

    good = {"M": 32, "N": 1024, "backend": "cpu", "dtype": "float32"}
    version = flyreg.op("rmsnorm").version
    arts = tmp_path / "arts"
    for spec in (good, {**good, "N": "1024"}, {**good, "M": 300}):  # written as any emission writes them
        emit(arts, "rmsnorm", spec, space.cpu_default(good), version)
    proc = Flyreg(tmp_path / "run").run("check", str(arts))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 2, proc.stdout
    assert any(",N=1024-" in e and "N: '1024' is not of type int" in e for e in errors)  # a string, hashed in its name
    assert any(",M=300," in e and "M: 300 is not normalized (the op makes it 4096)" in e for e in errors)
    assert "checked 3 artifact(s) in 1 dir(s): 2 problem(s)" in proc.stdout
