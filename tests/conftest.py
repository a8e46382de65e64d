"""Shared fixtures: every test gets its own cache and config directories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
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
