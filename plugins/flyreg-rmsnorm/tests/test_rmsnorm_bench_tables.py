"""The benchmark helpers that turn measurements into the docs' table and bar checks (no GPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flyreg_rmsnorm_bench import bandwidth_table
from flyreg_rmsnorm_bench.rmsnorm_bandwidth import merged, paired_ratios, weight_copies


def _row(M: int, N: int, flyreg: float, default: float, compile_: float | None) -> dict[str, Any]:
    return {"M": M, "N": N, "flyreg": flyreg, "flyreg_us": 1.0 / flyreg, "no_pdl": flyreg * 0.9,
            "default": default, "torch": 1.0, "torch_us": 1.0, "compile": compile_,
            "compile_us": 1.0 / compile_ if compile_ else None, "liger": None, "config": "Config(BLOCK_N=1)"}


def test_bars_name_the_losses_and_the_defaults_beaten() -> None:
    data = {"copy_tbps": 4.0, "rows": [
        _row(32768, 1024, 3.9, 3.9, 3.8),  # 97.5 % of copy
        _row(32768, 2048, 3.7, 3.0, 3.8),  # 92.5 %, slower than compile, default 19 % off
        _row(4096, 4096, 3.5, 3.5, None),  # compile missing: torch is the only peer
        _row(256, 512, 1.0, 1.0, 1.2),  # the default is 17 % behind compile, and so is the tuned config
    ]}
    lines = bandwidth_table.bars(data)
    assert lines[0].startswith("- M = 32768, N >= 1024 at >= 95 % of copy: 1 of 2 (92.5 to 97.5 %)")
    assert lines[1].startswith("- M = 4096, N >= 4096 at >= 85 % of copy: 1 of 1")
    assert "2 of 4; slower on 32768 x 2048: 0.9737x compile" in lines[2] and "256 x 512: 0.8333x compile" in lines[2]
    assert lines[3].endswith("2 shapes; tuned faster on 1")
    assert lines[4].endswith("none")
    table = bandwidth_table.table(data)
    assert len(table) == 2 + 4 and table[3].count("|") == 14 and "| - |" in table[4]


def test_repeats_merge_to_medians() -> None:
    rows = [{"M": 1, "flyreg": v, "flyreg_us": 10.0 / v, "torch": t, "torch_us": t and 10.0 / t, "config": "c"}
            for v, t in ((1.0, 2.0), (4.0, None), (2.0, 2.0))]
    rows[1]["torch_error"] = "RuntimeError: boom"
    out = merged(rows)
    assert out["flyreg"] == 2.0 and out["flyreg_us"] == pytest.approx(5.0) and out["repeats"] == 3
    assert out["torch"] is None and "torch_us" not in out  # a peer that failed once has no median
    assert out["torch_error"] == "RuntimeError: boom"  # and says why, whichever repeat failed
    assert merged(rows[:1]) == {**rows[0], "repeats": 1}


def test_a_close_peer_is_decided_by_its_back_to_back_pairs() -> None:
    won_in_pairs = {**_row(32768, 12288, 4.27, 4.0, 4.28), "recheck": {"compile": [1.001, 0.999, 1.002]}}
    lost_in_pairs = {**_row(4096, 8192, 3.99, 3.99, 3.98), "recheck": {"compile": [0.998, 0.997, 1.003]}}
    lines = bandwidth_table.bars({"copy_tbps": 4.0, "recheck_band": 0.01, "rows": [won_in_pairs, lost_in_pairs]})
    assert "1 of 2 (2 peer cells within the recheck band decided by back-to-back pairs)" in lines[2]
    assert "slower on 4096 x 8192: 0.9980x compile (median of 3 back-to-back pairs)" in lines[2]
    assert "32768 x 12288" not in lines[2]
    table = bandwidth_table.table({"copy_tbps": 4.0, "recheck_band": 0.01, "rows": [won_in_pairs]})
    assert "| 0.998x (pairs 1.001x compile) |" in table[2]
    # pairs a repeat took, for a peer the repeats' median puts outside the band, do not decide
    far = {**_row(32768, 12288, 4.27, 4.0, 4.40), "recheck": {"compile": [1.01, 1.02, 1.03]}}
    far_lines = bandwidth_table.bars({"copy_tbps": 4.0, "recheck_band": 0.01, "rows": [far]})
    assert "slower on 32768 x 12288: 0.9705x compile (0.23 against 0.23 us)" in far_lines[2]
    assert "decided by back-to-back pairs" not in far_lines[2]


def test_pairs_alternate_which_goes_first() -> None:
    order: list[str] = []
    a, b = [lambda: None], [lambda: None]

    def time(fns: list[Any]) -> float:
        order.append("a" if fns is a else "b")
        return 2.0 if fns is a else 3.0

    assert paired_ratios(a, b, 4, time) == [1.5] * 4
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_repeats_pool_their_pairs() -> None:
    rows = [{"M": 1, "flyreg": 1.0, "config": "c", "recheck": {"compile": [1.0, 1.1]}},
            {"M": 1, "flyreg": 1.0, "config": "c"},
            {"M": 1, "flyreg": 1.0, "config": "c", "recheck": {"compile": [0.9], "liger": [1.2]}}]
    assert merged(rows)["recheck"] == {"compile": [1.0, 1.1, 0.9], "liger": [1.2]}
    assert "recheck" not in merged(rows[1:2])


def test_each_input_set_gets_its_own_weight_unless_shared() -> None:
    w = torch.rand(37) + 0.5
    own = weight_copies(w, 4)
    assert own[0] is w
    assert len({t.data_ptr() for t in own}) == 4
    assert all(torch.equal(t, w) for t in own)
    shared = weight_copies(w, 4, shared=True)
    assert len(shared) == 4 and all(t is w for t in shared)
