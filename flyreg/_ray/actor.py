"""The Ray actor of ``flyreg tune --ray``: tunes one job at a time on its own device and returns the result.

This module imports no Ray: the driver wraps :class:`TuneActor` with ``ray.remote``. An actor writes
nothing the user owns. Its scratch cache and tuning journal live in a private temp dir: the driver
hands it the journal's rows of each job's spec, and gets back the rows the search added, to append
to its own journal; the winner goes back to the driver, which writes the artifact.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import Config
from flyreg._core.fileio import process_gone
from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._core.results import TuneReport
from flyreg._core.settings import set_cache_dir
from flyreg._core.spec import spec_text
from flyreg._core.toolchain import fingerprint
from flyreg._search import journal

#: The private dirs of actors: ``flyreg-ray-<pid>-<random>`` in the system temp dir.
_WORKDIR = re.compile(r"^flyreg-ray-(\d+)-")


@attrs.frozen
class JobResult:
    """What one job on an actor gave: the spec ``specialize()`` computed (``tuned_spec``), the search's
    ``report`` or the one-line ``error`` that ended it, the ``toolchain`` it ran with, the journal
    rows it added (``measurements``), the builds it made and its wall time.

    ``searched`` is False when the tuned spec differs from the job's and the job did not say to go on:
    the driver first decides whether that spec still needs tuning.
    """

    ident: DeviceIdentity
    tuned_spec: dict[str, Any]
    searched: bool
    report: TuneReport | None = None
    error: str | None = None
    toolchain: dict[str, str] = attrs.field(factory=dict)
    measurements: tuple[journal.Measurement, ...] = ()
    builds: int = 0
    seconds: float = 0.0


class TuneActor:
    """One device's worker: ``"cuda"`` (Ray gives the actor its own GPU, seen as ``cuda:0``) or ``"cpu"``."""

    def __init__(self, device: str) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.device = device
        _remove_dead_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"flyreg-ray-{os.getpid()}-"))
        atexit.register(shutil.rmtree, self.workdir, True)
        set_cache_dir(self.workdir)

    def identity(self) -> DeviceIdentity:
        """The product this actor tunes on (read from its device)."""
        return identity_of(self.device)

    def tune(self, op: str, spec: dict[str, Any], options: dict[str, Any], known: list[journal.Measurement],
             go_on: bool) -> JobResult:
        """Tune ``op`` on ``spec`` as a local ``flyreg tune`` does, writing no artifact, with ``known``
        (the driver's journal rows of the spec) to resume from. A job that fails returns its error."""
        from flyreg._core.text import one_line
        from flyreg._plugins.registry import REGISTRY
        from flyreg._runtime.builds import BUILD_CACHE
        from flyreg._tuning.jobs import job_inputs

        ident, start, builds = self.identity(), time.perf_counter(), BUILD_CACHE.builds
        tuned: dict[str, Any] = dict(spec)
        added: tuple[journal.Measurement, ...] = ()
        try:
            tuner = REGISTRY.tuner(op)
            toolchain = fingerprint(tuner.version)
            args, kwargs, tuned = job_inputs(op, spec, self.device)
            if spec_text(tuned) != spec_text(spec) and not go_on:
                return JobResult(ident, tuned, searched=False, toolchain=toolchain)
            journal.append(known)
            mark = journal.last_id()
            try:
                report = tuner.tune(*args, emit=False, search_options=options, **kwargs)
            finally:
                added = tuple(journal.after(mark))
        except Exception as e:  # reported as the job's failure, as a local tune reports it
            return JobResult(ident, tuned, searched=True, error=one_line(e), measurements=added,
                             builds=BUILD_CACHE.builds - builds, seconds=time.perf_counter() - start)
        return JobResult(ident, tuned, searched=True, report=portable(report), toolchain=toolchain,
                         measurements=added, builds=BUILD_CACHE.builds - builds, seconds=time.perf_counter() - start)

def portable(report: TuneReport) -> TuneReport:
    """``report`` with each config as its JSON form reads back (no ``pre_hook``), safe to send to another process."""

    def plain(config: Config) -> Config:
        return Config.from_json(config.to_json())

    return attrs.evolve(report, winner=plain(report.winner),
                        timings=tuple((plain(c), r) for c, r in report.timings),
                        failed=tuple((plain(c), why) for c, why in report.failed),
                        rejected=tuple((plain(c), why) for c, why in report.rejected))


def _remove_dead_workdirs() -> None:
    """Delete the private dirs that actors killed before they could clean up left in the temp dir."""
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            m = _WORKDIR.match(path.name)
            if m is not None and int(m[1]) != os.getpid() and process_gone(int(m[1])) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
