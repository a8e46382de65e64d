"""The decode path (knob ``DECODE``) and the checked-ids mode (``FLYREG_MOE_CHECK_IDS``) of the fused MoE.

Each kernel result is checked against a float32 reference on fresh random inputs; without a GPU the
kernels run in Triton's interpreter at tiny shapes, tests marked ``gpu`` run the model shapes on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from flyreg.plugin import Config
from flyreg_moe import cpu, space
from flyreg_moe.checks import CHECK_IDS_ENV, check_ids_every_call

from moe_cases import (DEVICE, MODEL, TOL, call, gpu, needs_cuda, needs_triton, reference, rel_err, triton_call,
                        triton_moe)

DECODE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "DECODE": True}
GROUPED = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1}
PAIR = {**GROUPED, "PAIR_MLP": True}


@needs_triton
@pytest.mark.parametrize(("case", "down", "dtype"), [
    ((1, 8, 48, 40, 2, "random"), 16, torch.bfloat16),  # one token, N and K not multiples of BLOCK_K
    ((7, 6, 40, 56, 3, "one"), 32, torch.float16),  # every pair to one expert: a token names it three times
    ((20, 4, 32, 48, 2, "skewed"), 16, torch.bfloat16),  # two token tiles; experts with no token
], ids=["one-token", "one-expert", "two-tiles"])
def test_decode_path_matches_reference(case: tuple, down: int, dtype: torch.dtype) -> None:
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, dtype, device=DEVICE, routing=routing, seed=M)
    out = triton_call(*args, **DECODE, BLOCK_N_DOWN=down)
    assert out.shape == (M, K) and out.dtype == dtype
    assert rel_err(out, reference(*args)) < TOL[dtype]


@needs_triton
def test_decode_launcher_serves_new_routings_and_drops_out_of_range_pairs() -> None:
    run = triton_moe.bind_fused_moe(*call(5, 8, 32, 32, 2, device=DEVICE, seed=1), **DECODE)
    x, w1, w2, tw, ids = call(5, 8, 32, 32, 2, device=DEVICE, routing="skewed", seed=2)
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]
    ids[2, 1] = 8  # out of range after the first call: that pair adds nothing
    kept_tw = tw.clone()
    kept_tw[2, 1] = 0.0
    ok_ids = ids.clone()
    ok_ids[2, 1] = 0
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, kept_tw, ok_ids)) < TOL[torch.bfloat16]
    ids.fill_(8)  # no pair in range: no expert is multiplied and out is zero, not left unwritten
    assert torch.equal(run(x, w1, w2, tw, ids), torch.zeros_like(x))


@needs_triton
@pytest.mark.parametrize("knobs", [DECODE, GROUPED, PAIR], ids=["decode", "grouped", "pair"])
def test_checked_mode_checks_every_call(knobs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w1, w2, tw, ids = call(3, 4, 32, 32, 2, device=DEVICE)
    bad = ids.clone()
    bad[1, 0] = -1
    monkeypatch.setenv(CHECK_IDS_ENV, "1")
    run = triton_moe.bind_fused_moe(x, w1, w2, tw, ids, **knobs)
    with pytest.raises(ValueError, match=r"topk_ids must be expert indices in \[0, 4\).*from -1 to"):
        run(x, w1, w2, tw, bad)
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]
    monkeypatch.setenv(CHECK_IDS_ENV, "0")  # unchecked: a later call is not checked again
    run = triton_moe.bind_fused_moe(x, w1, w2, tw, ids, **knobs)
    assert run(x, w1, w2, tw, bad).shape == x.shape


def test_check_ids_setting_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, on in (("1", True), ("yes", True), (" On ", True), ("0", False), ("", False), ("false", False)):
        monkeypatch.setenv(CHECK_IDS_ENV, value)
        assert check_ids_every_call() is on, value
    monkeypatch.delenv(CHECK_IDS_ENV)
    assert check_ids_every_call() is False
    monkeypatch.setenv(CHECK_IDS_ENV, "sometimes")  # a bad setting is off, with one warning naming it
    with pytest.warns(RuntimeWarning, match=f"{CHECK_IDS_ENV}='sometimes' is not 1 or 0"):
        assert check_ids_every_call() is False


def test_decode_knob_is_checked() -> None:
    if triton_moe is None:
        pytest.skip("triton not importable")
    with pytest.raises(ValueError, match="DECODE must be a bool, got 1"):
        triton_moe.bind_fused_moe(*call(3, 4, 32, 32, 2), **{**DECODE, "DECODE": 1})


def test_space_offers_the_decode_path_to_few_rows_and_the_default_takes_it_only_where_set() -> None:
    base = {"E": 128, "K": 2048, "N": 768, "topk": 8}
    for M in (1, 2, 4, 16, 32, 64, 128):
        spec = {**base, "M": M}
        decode = [c for c in space.triton_configs(spec) if c.kwargs.get("DECODE")]
        assert decode == space.decode_configs(spec)
        assert (len(decode) > 0) == (M <= space.DECODE_ROWS)
        assert all(c.kwargs["BLOCK_M"] == max(16, M) for c in decode)
        default = space.triton_default(spec)
        pair = space.pair_default(spec)  # the pair path's rows (test_moe_pair.py), at N = 768 one and two
        assert bool(default.kwargs.get("DECODE")) == (pair is None and M <= space.DECODE_DEFAULT_ROWS)
        assert bool(default.kwargs.get("PAIR_MLP")) == (pair is not None) == (M <= 2)
        if default.kwargs.get("DECODE"):
            assert default in decode
            tile = default.kwargs["BLOCK_N"], default.kwargs["BLOCK_N_DOWN"], default.hints["num_stages"]
            assert tile == (32, 64, 5)
    wide = space.decode_default({**base, "M": 32})  # the decode path's best at 32 rows: GEMM 1 twice as wide
    assert (wide.kwargs["BLOCK_N"], wide.kwargs["BLOCK_N_DOWN"], wide.hints["num_stages"]) == (64, 32, 4)



@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [1, 5, 16, 40])
def test_gpu_decode_path_on_model_shapes(model: str, M: int) -> None:
    from flyreg_moe.ops import make_moe_inputs

    E, K, N, topk = MODEL[model]
    spec = {"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk}
    configs = space.decode_configs(spec)
    picks = [space.decode_default(spec), configs[0], configs[-1]]
    for seed, config in enumerate(picks):
        args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda", seed=seed)
        out = triton_call(*args, **config.kwargs, **config.hints)
        assert rel_err(out, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16], config


@gpu
@needs_cuda
def test_gpu_decode_path_in_a_graph_with_the_checked_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyreg_moe.ops import make_moe_inputs

    E, K, N, topk = MODEL["Qwen3-30B-A3B"]
    args = make_moe_inputs(4, E, N, K, topk, torch.bfloat16, "cuda", seed=7)
    monkeypatch.setenv(CHECK_IDS_ENV, "1")
    config = Config({**DECODE, "BLOCK_N": 32, "BLOCK_K": 128}, num_warps=4, num_stages=3)
    run = triton_moe.bind_fused_moe(*args, **config.kwargs, **config.hints)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capture skips the check (it would sync)
        out = run(*args)
    x, w1, w2, tw, ids = args
    ids.copy_(make_moe_inputs(4, E, N, K, topk, torch.bfloat16, "cuda", seed=8)[4])  # a new routing, in place
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16]
    bad = ids.clone()
    bad[0, 0] = E
    with pytest.raises(ValueError, match="topk_ids must be expert indices"):
        run(x, w1, w2, tw, bad)
