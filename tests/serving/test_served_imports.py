"""A served call never imports the search: a cold process serving an op's default, or its artifact, loads
no module of flyreg's search package, which only a search needs.

Each call runs in a new interpreter (not a fork of the test harness's command server, which has the
command line and, with it, the search's process workers imported already). The op is a toy one
registered with ``flyreg.register``, so the test does not depend on which plugins are installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SEARCH_PACKAGE = "flyreg._search"

SERVE = textwrap.dedent(f'''
    import json, sys
    import torch
    import flyreg
    from flyreg.plugin import Config, hookimpl

    class Scale:
        """``x * FACTOR``, spec ``{{"n": len(x)}}``."""

        @hookimpl
        def specialize(self, args, kwargs):
            return {{"n": int(args[0].shape[0])}}

        @hookimpl
        def build(self, config, spec):
            factor = config.kwargs["FACTOR"]
            return lambda x: x * factor

        @hookimpl
        def configs(self, spec):
            return [Config({{"FACTOR": 2}}), Config({{"FACTOR": 3}})]

        @hookimpl
        def default(self, spec):
            return Config({{"FACTOR": 2}})

    flyreg.register(Scale(), "served_scale")
    out = flyreg.op("served_scale")(torch.ones(4))
    source = flyreg.resolve("served_scale", torch.ones(4)).origin
    search = sorted(m for m in sys.modules if m == {SEARCH_PACKAGE!r} or m.startswith({SEARCH_PACKAGE!r} + "."))
    print(json.dumps([out.tolist(), source, search]))
''')


def serve(env: dict[str, str]) -> list[object]:
    """What a new process serving one call printed: its output, where its config came from, and the search
    modules it imported."""
    ran = subprocess.run([sys.executable, "-c", SERVE], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_a_cold_call_served_its_default_imports_no_search_module() -> None:
    out, origin, search = serve(dict(os.environ))
    assert out == [2.0] * 4
    assert origin == "default"
    assert search == []


def test_a_cold_call_served_an_artifact_imports_no_search_module(tmp_path: Path) -> None:
    # a forced search writes the artifact into the first FLYREG_CONFIG_DIR; that process imports the search
    tuned = serve({**os.environ, "FLYREG_AUTOTUNE": "1"})
    assert tuned[1] == "search" and tuned[2] != []
    assert list(Path(os.environ["FLYREG_CONFIG_DIR"].split(os.pathsep)[0]).glob("served_scale,*.json"))
    # a new scratch cache: the next process finds only the artifact
    out, origin, search = serve({**os.environ, "FLYREG_CACHE_DIR": str(tmp_path / "empty-cache")})
    assert origin == "offline"
    assert out in ([2.0] * 4, [3.0] * 4)
    assert search == []
