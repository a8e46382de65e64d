"""The pair path of the fused MoE (knob ``PAIR_MLP``): each kernel result against a float32 reference on fresh random
inputs, in Triton's interpreter at tiny shapes without a GPU; tests marked ``gpu`` run the model shapes on CUDA."""

from __future__ import annotations

import pytest
import torch

from flyreg_moe import cpu, space

from moe_cases import (DEVICE, MODEL, TOL, call, gpu, needs_cuda, needs_triton, reference, rel_err, triton_call,
                        triton_moe)

PAIR = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "PAIR_MLP": True}


@needs_triton
@pytest.mark.parametrize(("case", "tile", "dtype"), [
    ((1, 8, 40, 40, 2, "random"), (16, 16, 16, 2), torch.bfloat16),  # N, K not multiples of the tiles
    ((2, 8, 40, 64, 2, "random"), (16, 16, 32, 2), torch.bfloat16),  # N not a multiple, K one of every tile
    ((3, 6, 40, 56, 3, "one"), (32, 32, 16, 3), torch.float16),  # every pair to one expert: a token names it 3 times
    ((4, 8, 64, 64, 2, "skewed"), (16, 64, 64, 2), torch.bfloat16),  # experts with no token; tiles that divide
], ids=["one-token", "uneven-n", "one-expert", "even"])
def test_pair_path_matches_reference(case: tuple, tile: tuple, dtype: torch.dtype) -> None:
    M, E, N, K, topk, routing = case
    bn, bk, bnd, stages = tile
    args = call(M, E, N, K, topk, dtype, device=DEVICE, routing=routing, seed=M)
    out = triton_call(*args, **{**PAIR, "BLOCK_N": bn, "BLOCK_K": bk}, BLOCK_N_DOWN=bnd, num_warps=4,
                      num_stages=stages)
    assert out.shape == (M, K) and out.dtype == dtype
    assert rel_err(out, reference(*args)) < TOL[dtype]


@needs_triton
@pytest.mark.parametrize("case", [(1, 8, 40, 40, 2), (2, 8, 200, 72, 3)], ids=["one-row", "two-rows"])
def test_the_pair_default_matches_reference_on_shapes_narrower_than_its_tile(case: tuple[int, ...]) -> None:
    # 40 or 200 of N under 64-column chunks, K of 40 or 72 under 128-deep steps and 128-wide GEMM 2 steps: every
    # tile masked at its edge.
    M, E, N, K, topk = case
    config = space.triton_default({"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk})
    assert config == space.pair_default({"M": M, "E": E, "N": N, "K": K, "topk": topk}) is not None
    args = call(M, E, N, K, topk, torch.bfloat16, device=DEVICE, seed=N)
    out = triton_call(*args, **config.kwargs, **config.hints)
    assert rel_err(out, reference(*args)) < TOL[torch.bfloat16]


@needs_triton
def test_pair_sum_walks_many_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyreg_moe import pair_mlp

    monkeypatch.setattr(pair_mlp, "SUM_PARTS", 4)  # 2 pairs x 5 chunks a token: loads of 4, 4 and 2 partials
    args = call(2, 8, 80, 48, 2, device=DEVICE, seed=5)
    assert rel_err(triton_call(*args, **PAIR), reference(*args)) < TOL[torch.bfloat16]


@needs_triton
def test_pair_launcher_serves_new_routings_and_drops_out_of_range_pairs() -> None:
    run = triton_moe.bind_fused_moe(*call(3, 8, 32, 48, 2, device=DEVICE, seed=1), **PAIR)
    x, w1, w2, tw, ids = call(3, 8, 32, 48, 2, device=DEVICE, routing="skewed", seed=2)
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]
    ids[1, 0] = -1  # out of range after the first call: that pair adds nothing
    kept_tw, ok_ids = tw.clone(), ids.clone()
    kept_tw[1, 0], ok_ids[1, 0] = 0.0, 0
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, kept_tw, ok_ids)) < TOL[torch.bfloat16]
    ids.fill_(8)  # no pair in range: out is zero, not left unwritten
    assert torch.equal(run(x, w1, w2, tw, ids), torch.zeros_like(x))


@needs_triton
def test_pair_path_reads_rows_by_their_stride() -> None:
    x, w1, w2, tw, ids = call(3, 6, 40, 48, 2, device=DEVICE, seed=7)
    wide = torch.randn(3, 80, dtype=x.dtype, device=DEVICE)
    wide[:, 16:64] = x  # x's rows 80 apart, not K
    strided = wide[:, 16:64]
    out = triton_call(strided, w1, w2, tw, ids, **PAIR)
    assert rel_err(out, reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]


def test_pair_knob_is_checked() -> None:
    if triton_moe is None:
        pytest.skip("triton not importable")
    with pytest.raises(ValueError, match="PAIR_MLP must be a bool, got 1"):
        triton_moe.bind_fused_moe(*call(3, 4, 32, 32, 2), **{**PAIR, "PAIR_MLP": 1})
    with pytest.raises(ValueError, match="DECODE and PAIR_MLP choose two paths; at most one may be True"):
        triton_moe.bind_fused_moe(*call(3, 4, 32, 32, 2), **PAIR, DECODE=True)


def test_space_offers_the_pair_path_to_few_rows_only() -> None:
    base = {"E": 128, "K": 2048, "N": 768, "topk": 8}
    for M in (1, 2, 4, 8, 16):
        spec = {**base, "M": M}
        pairs = [c for c in space.triton_configs(spec) if c.kwargs.get("PAIR_MLP")]
        assert pairs == space.pair_configs(spec)
        assert (len(pairs) > 0) == (M <= space.PAIR_ROWS)
        assert len(set(pairs)) == len(pairs)
        assert not any(c.kwargs.get("DECODE") for c in pairs)
        # no pair program holds more w2 elements a thread than the space allows (ptxas would spill them)
        most = space.PAIR_W2_PER_THREAD * 32
        assert all(c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_N_DOWN"] <= most * c.hints["num_warps"] for c in pairs)


@pytest.mark.parametrize(("N", "topk", "rows"), [
    (768, 8, (1, 2)), (1408, 6, (1, 2)), (2048, 4, (1, 2)), (2049, 4, (1,)), (2880, 4, (1,)), (4096, 2, (1,)),
    (4097, 2, ()), (6400, 2, ()), (14336, 2, ())])
def test_the_default_takes_the_pair_path_at_one_or_two_rows_up_to_its_n(N: int, topk: int,
                                                                         rows: tuple[int, ...]) -> None:
    # One row up to N = 4096, two up to N = 2048 (the decode path past either, and at more rows)
    for M in (1, 2, 3, 4, 16):
        spec = {"E": 32, "K": 2048, "N": N, "topk": topk, "M": space.m_bucket(M)}
        default = space.triton_default(spec)
        assert default in space.triton_configs(spec)
        assert default.kwargs.get("PAIR_MLP", False) is (M in rows), (M, default)
        assert default.kwargs.get("DECODE", False) is (M not in rows), (M, default)
        if M in rows:
            assert default == space.pair_default(spec)
            assert default.hints["num_stages"] == (4 if M == 1 else 3)
        else:
            assert space.pair_default(spec) is None


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [1, 3, 4])
def test_gpu_pair_path_on_model_shapes(model: str, M: int) -> None:
    from flyreg_moe.ops import make_moe_inputs

    E, K, N, topk = MODEL[model]
    configs = space.pair_configs({"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk})
    for seed, config in enumerate((configs[0], configs[len(configs) // 2], configs[-1])):
        args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda", seed=seed)
        out = triton_call(*args, **config.kwargs, **config.hints)
        assert rel_err(out, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16], config
