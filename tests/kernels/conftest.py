"""Kernel-test setup: Triton's interpreter when there is no GPU, and the in-tree plugin on sys.path."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

# Must happen before triton.jit decorates the kernels (at the plugin's import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_ROOT = Path(__file__).resolve().parents[2]
for _name, _path in (("flyreg", _ROOT), ("flyreg_rmsnorm", _ROOT / "plugins" / "flyreg-rmsnorm")):
    if importlib.util.find_spec(_name) is None:
        sys.path.insert(0, str(_path))
