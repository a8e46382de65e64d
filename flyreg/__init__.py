"""flyreg: a plugin registry and autotuner for GPU kernels.

The public API is listed in ``__all__``; modules load on first use so ``import flyreg`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

_EXPORTS = {
    "Config": "config",
    "Autotuner": "tuner",
    "Resolution": "results",
    "TuneError": "results",
    "TuneReport": "results",
    "GraphCaptureError": "results",
    "autotune": "builder",
    "autotune_builder": "builder",
    "BuildCache": "builder",
    "do_bench": "bench",
    "BenchResult": "bench",
    "DeviceIdentity": "keys",
    "FlyregWarning": "_fileio",
    "hookimpl": "hookspecs",
    "hookspec": "hookspecs",
    "check_artifacts": "validate",
    "op": "registry",
    "ops": "registry",
    "resolve": "registry",
    "resolve_spec": "registry",
    "register": "registry",
    "unregister": "registry",
    "UnknownOpError": "registry",
    "OpUnavailableError": "registry",
    "PluginError": "plugin",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flyreg' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
