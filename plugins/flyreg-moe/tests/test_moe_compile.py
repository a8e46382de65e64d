"""The fused-MoE kernels compile for the H200's target (sm_90a) without a GPU: the GEMMs with each knob,
the shipped decode configs' two kernels, the pair path's two under each config its space offers and the routing
kernel, each as a dependent launch.

The CPU suite runs the kernels in Triton's interpreter, which does not compile them: it once passed a
tail-tile path that Triton's compiler refused. ``bench/moe_kernel_regs.py`` compiles them (a tile's two
GEMM binaries with and without a variant's knobs) in a process without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flyreg_moe import space

SCRIPT = "flyreg_moe_bench.moe_kernel_regs"
#: The H200's shared memory a block may use.
SMEM_LIMIT = 227 * 1024

CASES = [
    ("128,128,64,8,4,2880,2880", "TMA,TAILS=2"),  # gpt-oss's served large-M tile, K and N tails
    ("128,128,64,8,4,4096,14336", "TAILS=1"),     # Mixtral's
    ("64,256,64,8,3,2048,768", "TMA"),
    ("32,128,64,4,4,2880,2880", "TAILS=1"),       # a 16-row tail path
    ("16,128,128,4,3,2048,768", "TMA"),           # a decode tile
    ("128,128,64,8,4,2880,2880", "TMA,TAILS=2,BLOCK_N_DOWN=256"),  # the default's 128-row tile, GEMM 2 256 wide
    ("64,64,128,8,4,4096,14336", "TMA,BLOCK_N_DOWN=128"),  # SGLang's Mixtral M = 128 tile: GEMM 2 twice GEMM 1
    ("64,128,64,4,4,4096,14336", "TMA,ONE_DOT,MASK_PAD"),  # the H200's Mixtral M = 256 tile, gate and up in one dot
    ("64,64,64,4,3,2048,768", "ONE_DOT"),                  # one dot with pointer loads
    ("64,64,64,4,3,2048,768", "MASK_PAD"),                 # padding slots masked, pointer loads
    ("128,128,64,8,4,2880,2880", "TMA,TAILS=2,ONE_DOT"),   # one dot on the tail paths, K and N tails
]


def compiled(tmp_path: Path, *flags: str) -> dict:
    """The JSON ``moe_kernel_regs`` writes for ``flags``, run where Triton compiles (the conftest sets
    ``TRITON_INTERPRET`` without a GPU)."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "regs.json"
    done = subprocess.run([sys.executable, "-m", SCRIPT, *flags, "--json", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("tile, variant", CASES)
def test_gemm_variant_compiles_for_sm90(tile: str, variant: str, tmp_path: Path) -> None:
    data = compiled(tmp_path, "--tile", tile, "--variant", variant)
    assert data["summary"] == {**data["summary"], "kernels": 2, "failed": 0}, data["rows"]
    for row in data["rows"]:
        base, var = row["base"], row["variant"]
        assert base["tma"] == 0 and var["smem"] <= SMEM_LIMIT and var["regs"] <= 255
        assert base["griddep"] >= 2 and var["griddep"] >= 2  # waits for the launch before, then releases the next
        if "TMA" in variant:
            assert var["tma"] > 0 and var["cp_async"] < base["cp_async"]  # the weight tiles moved to TMA
            assert not var["spill_bytes"]  # (pointer loads of the 128 x 128 x 64 GEMM 1 tile spill; TMA frees them)
        else:
            assert var["tma"] == 0 and var["smem"] == base["smem"]  # the tail paths share the tile's buffers
        one_dot = "ONE_DOT" in variant and row["kernel"] == "gate_up"
        if "TAILS" in variant and base["wgmma"] and not one_dot:
            assert var["wgmma"] > base["wgmma"]  # the half-tile path is a second wgmma loop in the binary
        elif one_dot and "TAILS" not in variant:
            assert var["wgmma"] * 2 == base["wgmma"] > 0  # gate and up in one wgmma ...
        elif "TAILS" not in variant:
            assert var["wgmma"] == base["wgmma"]  # MASK_PAD, and GEMM 2 under ONE_DOT, keep their dots
        if one_dot:
            assert var["wgmma_widest_n"] == 2 * base["wgmma_widest_n"] > 0  # ... twice as wide (the full tile's)
        elif "BLOCK_N_DOWN" not in variant:
            assert var["wgmma_widest_n"] == base["wgmma_widest_n"]
        if "MASK_PAD" in variant:  # each row's copy sized by its slot's validity, not one size a stage
            assert var["copy_sizes"] > base["copy_sizes"] > 0


def test_shipped_decode_configs_compile_for_sm90_as_pipelined_dependent_launches(tmp_path: Path) -> None:
    rows = compiled(tmp_path, "--decode")["rows"]
    assert {r["kernel"] for r in rows} == {"decode_gate_up", "decode_down"}
    for row in rows:
        b = row["binary"]
        assert "error" not in b, row
        assert b["smem"] <= SMEM_LIMIT and b["regs"] <= 255 and b["spill_bytes"] in (0, None), row
        assert b["cp_async"] > 0 and b["griddep"] >= 2, row  # pipelined weight loads; waits, then releases the next
        # GEMM 2 counts itself in on its column tile once a program; GEMM 1 needs no atomic
        assert b["atomic"] == (1 if row["kernel"] == "decode_down" else 0), row


def test_routing_kernel_compiles_for_sm90_as_a_dependent_launch(tmp_path: Path) -> None:
    rows = compiled(tmp_path, "--routing")["rows"]
    assert [r["E_P2"] for r in rows] == [16, 64, 128, 512]
    for row in rows:
        for binary in (row["base"], row["variant"], row["count"]):  # one launch; counted, with the tile table
            assert "error" not in binary and binary["regs"] <= 255 and binary["spill_bytes"] in (0, None), row
            assert binary["griddep"] >= 2, row  # waits for the launch before, then releases the next


@pytest.mark.parametrize(("shape", "stages"), [((32, 2880, 2880, 4), None), ((128, 2048, 768, 8), 4)],
                         ids=["gpt-oss-every-config", "qwen3-4-stages"])  # K, N not multiples of 128; multiples
def test_pair_configs_compile_for_sm90_as_pipelined_dependent_launches(shape: tuple[int, ...], stages: int | None,
                                                                       tmp_path: Path) -> None:
    flags = ["--pair", ",".join(map(str, shape))] + ([] if stages is None else ["--stages", str(stages)])
    rows = compiled(tmp_path, *flags)["rows"]
    E, K, N, topk = shape
    offered = [c for c in space.pair_configs({"E": E, "K": K, "N": N, "topk": topk, "M": 1})
               if stages is None or c.hints["num_stages"] == stages]
    assert len([r for r in rows if r["kernel"] == "pair_mlp"]) == len(offered) > 0
    assert {r["kernel"] for r in rows} == {"pair_mlp", "pair_sum"}
    for row in rows:
        b = row["binary"]
        assert "error" not in b, row
        # ptxas may hold a config at 80 or 128 registers and spill a word or two there (seen at 3 of 123 binaries)
        assert b["smem"] <= SMEM_LIMIT and b["regs"] <= 255 and (b["spill_bytes"] or 0) <= 8, row
        assert b["griddep"] >= 2 and b["atomic"] == 0 and b["wgmma"] == 0, row  # no tensor cores, fixed-order sums
        if row["kernel"] == "pair_mlp":
            # every weight load pipelined in 16-byte vectors: at most x's element a thread is a 2-byte load
            assert b["cp_async"] > 0 and b["scalar_b16_loads"] <= 1, row
