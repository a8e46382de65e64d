"""RMSNorm test setup: Triton's interpreter when there is no GPU (set before the kernels are decorated)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
