"""flyreg: a plugin registry and autotuner for GPU kernels.

``__all__`` is what an application uses: the ops, resolving and tuning them, its own tuners, the
results and errors. A kernel plugin imports what it is written with from :mod:`flyreg.plugin`.
Modules load on first use so ``import flyreg`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from flyreg._version import __version__

_EXPORTS = {
    "Config": "_core.config",
    "Autotuner": "_runtime.tuner",
    "Resolution": "_core.results",
    "TuneError": "_core.results",
    "TuneReport": "_core.results",
    "GraphCaptureError": "_core.results",
    "autotune": "_runtime.builder",
    "autotune_builder": "_runtime.builder",
    "BuildCache": "_runtime.builds",
    "do_bench": "_search.bench",
    "BenchResult": "_core.results",
    "DeviceIdentity": "_core.keys",
    "FlyregWarning": "_core.fileio",
    "check_artifacts": "_artifacts.validate",
    "accepts": "_plugins.registry",
    "op": "_plugins.registry",
    "ops": "_plugins.registry",
    "resolve": "_plugins.registry",
    "resolve_spec": "_plugins.registry",
    "register": "_plugins.registry",
    "unregister": "_plugins.registry",
    "UnknownOpError": "_plugins.registry",
    "OpUnavailableError": "_plugins.registry",
    "PluginError": "_plugins.manager",
    "HookError": "_plugins.manager",
    "SpecError": "_core.keys",
    "record": "_runtime.serving_record",
    "pending": "_runtime.pending",
    "tune_pending": "_runtime.pending",
}

#: A plugin's names, which :mod:`flyreg.plugin` exports; still found here for plugins written before it.
_PLUGIN_NAMES = {
    "hookimpl": "_plugins.hookspecs",
    "hookspec": "_plugins.hookspecs",
    "OpRecord": "_plugins.record",
    "Axis": "_plugins.record",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name) or _PLUGIN_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'flyreg' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
