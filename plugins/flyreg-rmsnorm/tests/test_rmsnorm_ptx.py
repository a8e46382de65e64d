"""The plugin's bench/kernel_ptx.py compiles the plugin's kernels for the H200's target without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = "flyreg_rmsnorm_bench.kernel_ptx"


def _ptx(*args: str) -> str:
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the conftest sets it without a GPU
    done = subprocess.run([sys.executable, "-m", SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _vector_loads_before_the_reduction(out: str) -> list[str]:
    lines = out.splitlines()
    loads = [i for i, line in enumerate(lines) if "ld.global" in line and ".v4." in line]
    first_shuffle = next(i for i, line in enumerate(lines) if "shfl.sync" in line)
    assert max(loads) < first_shuffle
    return [lines[i] for i in loads]


def test_a_whole_row_loads_x_and_the_weight_kept_in_l2_in_vectors_before_the_reduction() -> None:
    out = _ptx("--M", "4096", "--N", "1024", "--block-n", "1024", "--warps", "4")
    loads = _vector_loads_before_the_reduction(out)
    # 1024 bf16 over 128 threads: one 16-byte load of x and one of the weight per thread; only the
    # weight's keeps its lines in L2 (x streams).
    assert len(loads) == 2 and sum("evict_last" in line for line in loads) == 1
    assert "griddepcontrol.wait" in out


def test_a_whole_fused_row_keeps_only_the_weight_in_l2() -> None:
    out = _ptx("--M", "4096", "--N", "1024", "--block-n", "1024", "--warps", "4", "--fused")
    loads = _vector_loads_before_the_reduction(out)
    assert len(loads) == 3 and sum("evict_last" in line for line in loads) == 1  # x, residual, weight


def test_no_pdl_compiles_without_grid_dependency_control() -> None:
    out = _ptx("--M", "100", "--N", "3000", "--block-n", "1024", "--warps", "4", "--no-pdl", "--fused")
    assert "_fused_add_rmsnorm_kernel" in out and "'MASK_ROWS': False" in out
    assert "griddepcontrol" not in out and "st.global" in out
