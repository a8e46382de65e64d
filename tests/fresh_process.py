"""Python code run in a fresh flyreg process that sees only the op plugins a test names.

Each run is a fork of one server interpreter that already imported torch (``cli/command_server.py``),
so it costs milliseconds; flyreg's process-wide state (the registry, discovery, caches) is new in
each. It sees the ``flyreg.ops`` entry points of flyreg-rmsnorm and of the fake distributions it is
given (``cli_harness.fake_distribution``), never another installed plugin's.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

_CLI = Path(__file__).resolve().with_name("cli")
if str(_CLI) not in sys.path:
    sys.path.insert(0, str(_CLI))

from cli_harness import (IN_TREE, ONLY_PLUGINS, ONLY_PLUGINS_VARIABLE, CommandServer,  # noqa: E402
                         command_env, fake_distribution)

__all__ = ["FreshProcess", "Ran", "fake_distribution"]


@attrs.frozen
class Ran:
    """What one run did: its exit status, its stdout and stderr together, and the JSON lines it printed."""

    code: int
    output: str

    def json(self) -> list[Any]:
        """Every line of the output that is a JSON value, in order."""
        out = []
        for line in self.output.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def one(self) -> Any:
        """The one JSON value the run printed (it must have ended well)."""
        assert self.code == 0, self.output
        (value,) = self.json()
        return value


class FreshProcess:
    """Runs code in fresh processes with flyreg's dirs under ``root`` (``cache``, ``configs``, ...)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dirs = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        self.server = CommandServer(command_env(self.dirs))
        self.runs = 0

    def run(self, code: str, *, sites: Mapping[str, Path] | None = None, path: Sequence[Path] = (),
            env: Mapping[str, str] | None = None, dirs: Mapping[str, Path] | None = None, in_tree: bool = True) -> Ran:
        """Run ``code`` (dedented) with the fake distributions ``sites`` (name -> the dir holding its
        dist-info) visible and importable, the ``path`` dirs importable, ``env`` added to the
        environment, and flyreg's dirs ``dirs`` (default: this runner's); with ``in_tree`` false, not
        even flyreg-rmsnorm's ops are seen."""
        self.runs += 1
        output = self.root / f"run-{self.runs}.txt"
        sites = dict(sites or {})
        full = {**command_env(dict(dirs or self.dirs), sites), **(env or {})}
        path = [*path, Path(__file__).resolve().parent]  # the tests' own helpers are importable too
        full["PYTHONPATH"] = os.pathsep.join([str(ONLY_PLUGINS), *map(str, sites.values()), *map(str, path)])
        full[ONLY_PLUGINS_VARIABLE] = ",".join([*([IN_TREE] if in_tree else []), *sites])
        code_ = self.server.run_code(textwrap.dedent(code), env=full, cwd=self.root, output=output,
                                     path=[*sites.values(), *path])
        return Ran(code_, output.read_text(encoding="utf-8"))

    def close(self) -> None:
        self.server.close()
