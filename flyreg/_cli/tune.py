"""``flyreg tune``: tune ops over their workloads (or given specs) and write their offline artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from flyreg._cli.common import (PositiveNumber, artifact_dir, check_op_names, device_option, given_path, ray_address,
                                resolve_device, spec_values, user_errors)
from flyreg._tuning.isolated_jobs import ISOLATE_ABOVE


@click.command()
@click.argument("op_names", nargs=-1, metavar="[OP]...")
@click.option("--spec", "specs", multiple=True, callback=spec_values, metavar="AXIS=V,...",
              help="Tune this spec instead of the op's workloads (repeatable; needs OP).")
@click.option("--where", "where", multiple=True, callback=spec_values, metavar="AXIS=V,...",
              help="Tune only the workloads with these axis values (repeatable: any of them).")
@device_option("Device to tune on")
@click.option("--out", type=click.Path(file_okay=False), default=None, callback=given_path, metavar="DIR",
              help="Artifact dir (default: the first FLYREG_CONFIG_DIR entry, else the user config dir).")
@click.option("--force", is_flag=True, help="Re-tune specs that already have a current artifact in the artifact dir.")
@click.option("--dry-run", is_flag=True, help="List the jobs and what would happen to each; tune nothing.")
@click.option("--effort", type=click.Choice(["auto", "quick", "full"]), default="auto", show_default=True,
              help="How much of each spec's config space to time: full (all), quick (a seeded local search), "
                   "auto (full for a small space, quick for a large one).")
@click.option("--budget", type=PositiveNumber(), default=None, metavar="SECONDS",
              help="Seconds each spec's search may take before its final round (default: no limit).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the local search's random choices.")
@click.option("--fresh", is_flag=True, help="Time every config again instead of reading the tuning journal.")
@click.option("--isolate/--no-isolate", default=None,
              help="Compile candidates in a pool of processes and time them in a worker process, so one that "
                   f"crashes or hangs fails alone (default: on for a space of more than {ISOLATE_ABOVE} configs "
                   "on CUDA).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, callback=ray_address,
              metavar="[ADDRESS]", help="Tune on Ray actors, one per GPU: a local instance, or the cluster at ADDRESS "
                                        "(HOST:PORT, ray://HOST:PORT or auto). Needs flyreg[ray].")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --ray: how many actors (default: one per GPU, or one per CPU when tuning on the CPU).")
@click.option("--device-name", default=None, metavar="NAME",
              help="With --ray: tune only on the actors whose device is this model (as `flyreg list` names it).")
@click.option("--from-record", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Tune the specs a serving record (FLYREG_RECORD) saw served by a default or a nearest artifact.")
@user_errors
def tune(op_names: tuple[str, ...], specs: list[dict[str, Any]], where: list[dict[str, Any]], device: str | None,
         out: Path | None, force: bool, dry_run: bool, effort: str, budget: float | None, seed: int,
         fresh: bool, isolate: bool | None, ray_address: str | None, workers: int | None, device_name: str | None,
         from_record: Path | None) -> int:
    """Tune every registered op (or the OPs given) and write their offline artifacts.

    Each op is tuned over the workloads it declares for the device, or over the --spec values.
    A spec whose artifact in the artifact dir is current (lookup would serve it: named by its
    content, for this device, a config the op offers, the same toolchain) is skipped unless
    --force; a malformed one is moved aside before it is re-tuned. A failing op or spec is reported and the others still run; the exit code is then 1.
    Ctrl-C stops after keeping the artifacts written so far (exit 130). Every measurement is
    journaled as it is taken: the same command run again times nothing already measured.
    """
    from flyreg._tuning.display import print_plan
    from flyreg._tuning.jobs import run_jobs
    from flyreg._tuning.plan import plan_jobs

    names = list(dict.fromkeys(op_names))
    if specs and not names:
        raise click.UsageError("--spec needs the OP(s) to tune: each op has its own spec axes")
    if specs and where:
        raise click.UsageError("--where filters the ops' workloads; with --spec there are none to filter")
    if from_record is not None and (specs or where):
        raise click.UsageError("--from-record tunes the record's specs; it takes no --spec or --where")
    check_op_names(names)
    options = {"effort": effort, "budget_s": budget, "seed": seed, "resume": not fresh, "retry_failed": force}
    if ray_address is not None:
        from flyreg._ray.driver import Request, tune_on_ray

        if from_record is not None:
            raise click.UsageError("--from-record is not supported with --ray")
        if isolate:
            raise click.UsageError("--isolate is not supported with --ray: each actor runs its candidates itself")
        if device is not None and device not in ("cpu", "cuda"):
            raise click.BadParameter("with --ray, cpu or cuda: Ray gives each actor its GPU", param_hint="--device")
        request = Request(names, specs, where, artifact_dir(out, create=not dry_run), force, options)
        return tune_on_ray(request, ray_address, device, workers, device_name, dry_run)
    if workers is not None or device_name is not None:
        raise click.UsageError(f"{'--workers' if workers is not None else '--device-name'} needs --ray")
    dev = resolve_device(device)
    out_dir = artifact_dir(out, create=not dry_run)
    if from_record is not None:
        from flyreg._tuning.from_record import plan_from_record

        jobs = plan_from_record(from_record, names, dev, out_dir, force)
    else:
        jobs = plan_jobs(names, specs, dev, out_dir, force, where)
    if dry_run:
        print_plan(jobs, dev, out_dir)
        return 0
    return run_jobs(jobs, dev, out_dir, force, options, isolate)  # the status; a SystemExit here is a plugin's


