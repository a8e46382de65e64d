"""What a kernel plugin imports: the hook markers, the config type and the plugin error.

This module and ``flyreg.__all__`` are flyreg's whole public API; everything under a
``flyreg._*`` package is internal. See ``docs/plugin_authoring.md``.
"""

from __future__ import annotations

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import FlyregWarning
from flyreg._plugins.hookspecs import hookimpl, hookspec
from flyreg._plugins.manager import PluginError

__all__ = ["Config", "FlyregWarning", "JSONScalar", "PluginError", "hookimpl", "hookspec"]
