"""The core tests' fixtures: the ``flyreg`` console script in process, and fresh flyreg processes (the isolation
of every test's directories is the repository root's conftest.py)."""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest


@attrs.frozen
class CliRun:
    """What one ``flyreg`` command did: its exit status and what it wrote to stdout and stderr."""

    code: int
    out: str
    err: str


@functools.cache
def _console_entry_point() -> Callable[[list[str]], None]:
    """The ``flyreg`` console script's function, as installed."""
    script = next(iter(importlib.metadata.entry_points(group="console_scripts", name="flyreg")))
    return script.load()  # type: ignore[no-any-return]


@pytest.fixture
def flyreg_cli(capfd: pytest.CaptureFixture[str]) -> Callable[..., CliRun]:
    """``flyreg_cli(*argv)`` runs ``flyreg ARGV`` in this process (``list`` and ``check`` in the child the
    command starts), with this test's environment, and returns what it did."""

    def run(*argv: str) -> CliRun:
        capfd.readouterr()
        code = 0
        try:
            _console_entry_point()([*argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = capfd.readouterr()
        return CliRun(code, out, err)

    return run


@pytest.fixture(scope="session")
def fresh_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A :class:`fresh_process.FreshProcess`: code run in new flyreg processes that see only the plugins a test names."""
    from fresh_process import FreshProcess

    runner = FreshProcess(tmp_path_factory.mktemp("fresh"))
    yield runner
    runner.close()
