"""What a kernel plugin imports: the hook markers, the config type, the op, launch and device records, the plugin
errors, and the declaration (:func:`declare`, :func:`triton_op`) that derives an op's hooks from one description.

This module and ``flyreg.__all__`` are flyreg's whole public API; everything under a
``flyreg._*`` package is internal. See ``docs/plugin_authoring.md``.
"""

from __future__ import annotations

from flyreg._core.config import Config, JSONScalar
from flyreg._core.device import Device
from flyreg._core.fileio import FlyregWarning
from flyreg._core.keys import SpecError
from flyreg._core.launch import Launch
from flyreg._plugins.declared import Declaration, DeclaredOp, declare
from flyreg._plugins.hookspecs import hookimpl, hookspec
from flyreg._plugins.kernel_op import triton_op
from flyreg._plugins.manager import HookError, PluginError
from flyreg._plugins.record import Axis, OpRecord, RecordError
from flyreg._plugins.work import Work

__all__ = ["Axis", "Config", "Declaration", "DeclaredOp", "Device", "FlyregWarning", "HookError", "JSONScalar",
           "Launch", "OpRecord", "PluginError", "RecordError", "SpecError", "Work", "declare", "hookimpl", "hookspec",
           "triton_op"]
