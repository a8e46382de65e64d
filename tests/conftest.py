"""Shared fixtures: every test gets its own cache and config directories, and leaves no state behind."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def _flyreg_env() -> dict[str, str]:
    """The environment variables that change what flyreg does."""
    return {k: v for k, v in os.environ.items() if k.startswith(("FLYREG_", "XDG_")) or k == "PYTHONPATH"}


@functools.cache
def _installed_op_names() -> frozenset[str]:
    from flyreg._plugins.registry import Registry

    return frozenset(Registry().names())


@pytest.fixture
def no_leaked_state() -> Iterator[None]:
    """Fail a test that leaves flyreg's environment variables or its process-wide registry changed.

    Set up before (so checked after) every other function-scoped fixture, monkeypatch included.
    """
    from flyreg._plugins import registry

    env, reg = _flyreg_env(), registry.REGISTRY
    yield
    assert _flyreg_env() == env, f"the test left environment variables changed: {env} -> {_flyreg_env()}"
    assert registry.REGISTRY is reg, "the test left another registry in place of flyreg's process-wide one"
    if reg._entries is not None:
        extra, missing = set(reg._entries) - _installed_op_names(), _installed_op_names() - set(reg._entries)
        assert not extra and not missing, \
            f"the test left flyreg's registry changed: ops {sorted(extra)} added, {sorted(missing)} removed"


@pytest.fixture(autouse=True)
def isolated_dirs(no_leaked_state: None, tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
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
    from flyreg._core import fileio as _fileio
    from flyreg._artifacts import store as offline

    offline._index.clear()
    _fileio._warned.clear()
    yield dirs
    offline._index.clear()
