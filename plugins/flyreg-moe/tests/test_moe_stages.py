"""The stage breakdown (``bench/moe_stages.py``): kernel names to stages, on the CPU."""

from __future__ import annotations

import pytest

from flyreg_moe import decode, gemm_kernels, pair_mlp, routing
from flyreg_moe_bench import moe_stages


def test_every_stage_names_a_kernel_of_the_op() -> None:
    kernels = {name for module in (gemm_kernels, routing, decode, pair_mlp) for name in vars(module)
               if name.endswith("_kernel")}
    assert set(moe_stages.STAGES) == kernels  # a renamed or new kernel must be given its stage
    assert moe_stages.stage_of("_decode_down_kernel") == "gemm2" and moe_stages.stage_of("_down_kernel") == "gemm2"
    assert moe_stages.stage_of("_decode_gate_up_kernel") == "gemm1"
    assert moe_stages.stage_of("_pair_mlp_kernel") == "mlp" and moe_stages.stage_of("_pair_sum_kernel") == "reduce"


def test_stage_ms_sums_each_stage_per_call() -> None:
    records = [("_route_kernel_0d1d2d", 12.0),
               ("_gate_up_kernel", 900.0), ("_down_kernel", 500.0), ("_reduce_kernel", 30.0),
               ("Memset (Device)", 1.0)] * 4
    ms = moe_stages.stage_ms(records, calls=4)
    assert ms == pytest.approx({"routing": 0.012, "gemm1": 0.9, "gemm2": 0.5, "reduce": 0.03, "other": 0.001})
    with pytest.raises(ValueError, match="calls"):
        moe_stages.stage_ms(records, calls=0)
