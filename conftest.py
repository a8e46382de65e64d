"""Every test of the repository (the core's and each plugin's) gets its own cache and config directories,
and leaves flyreg's environment and registry as it found them."""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def _flyreg_env() -> dict[str, str]:
    """The environment variables that change what flyreg does."""
    return {k: v for k, v in os.environ.items() if k.startswith(("FLYREG_", "XDG_")) or k == "PYTHONPATH"}


@functools.cache
def _installed_op_names() -> frozenset[str]:
    """The op names the installed distributions declare (entry points of the group ``flyreg.ops``)."""
    return frozenset(ep.name for ep in importlib.metadata.entry_points(group="flyreg.ops"))


@pytest.fixture
def no_leaked_state() -> Iterator[None]:
    """Fail a test that leaves flyreg's environment variables or its process-wide registry changed.

    Set up before (so checked after) every other function-scoped fixture, monkeypatch included.
    """
    import flyreg

    env = _flyreg_env()
    yield
    assert _flyreg_env() == env, f"the test left environment variables changed: {env} -> {_flyreg_env()}"
    registered = {info.name for info in flyreg.ops()}
    extra, missing = registered - _installed_op_names(), _installed_op_names() - registered
    assert not extra and not missing, \
        f"the test left flyreg's registry changed: ops {sorted(extra)} added, {sorted(missing)} removed"


@pytest.fixture(autouse=True)
def isolated_dirs(no_leaked_state: None, tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Point the scratch cache, the emit dir and platformdirs' user dirs at fresh temporary folders."""
    root = tmp_path_factory.mktemp("flyreg")
    dirs = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(dirs["cache"]))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(dirs["configs"]))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(dirs["xdg_config"]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(dirs["xdg_cache"]))
    monkeypatch.delenv("FLYREG_AUTOTUNE", raising=False)
    monkeypatch.delenv("FLYREG_DISABLE_OPS", raising=False)
    # Each test sees flyreg's one-time warnings afresh, as a new process would (no public call resets them).
    from flyreg._core import fileio

    fileio._warned.clear()
    return dirs
