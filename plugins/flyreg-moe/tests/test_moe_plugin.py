"""The fused-MoE plugin through flyreg's public API: listing, specs, bad input, the torch op, tuning on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyreg
from flyreg.plugin import Config, Device
from flyreg_moe import space

from moe_cases import TOL, call, reference, rel_err

SPEC = {"E": 8, "K": 40, "N": 48, "topk": 2, "dtype": "bfloat16"}
H200, H100 = Device.named("NVIDIA_H200", "sm_90"), Device.named("NVIDIA_H100_80GB_HBM3", "sm_90")


def test_listed_ok_with_its_distribution() -> None:
    info = {i.name: i for i in flyreg.ops()}["fused_moe"]
    assert info.status == "ok", info.error
    assert info.distribution == "flyreg-moe"


def test_served_on_the_cpu_matches_the_reference() -> None:
    args = call(7, 8, 48, 40, 2, seed=5)
    out = flyreg.op("fused_moe")(*args)
    assert rel_err(out, reference(*args)) < TOL[torch.bfloat16]
    res = flyreg.resolve("fused_moe", *args)
    assert res.spec == {**SPEC, "M": 8, "backend": "cpu"}  # M is rounded up to its bucket


def test_keyword_arguments_reach_the_op() -> None:
    x, w1, w2, tw, ids = call(3, 4, 32, 24, 1, seed=6)
    out = flyreg.op("fused_moe")(x, w1, w2, topk_ids=ids, topk_weights=tw)
    assert rel_err(out, reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]


def test_m_buckets_and_nearest_lookup_axis() -> None:
    assert flyreg.resolve_spec("fused_moe", {**SPEC, "M": 300}).spec["M"] == 512
    assert flyreg.resolve_spec("fused_moe", {**SPEC, "M": 100000}).spec["M"] == 8192
    with pytest.raises(flyreg.SpecError, match="dtype: float32 is not one of bfloat16|float16"):
        flyreg.resolve_spec("fused_moe", {**SPEC, "M": 4, "dtype": "float32"})


BAD = [
    ("x and w1 disagree on K", lambda a: (a[0][:, :-1], *a[1:]), ValueError, "w1 .* x's K=39"),
    ("ids out of range", lambda a: (*a[:4], a[4] + 8), ValueError, r"topk_ids must be expert indices in \[0, 8\)"),
    ("negative ids", lambda a: (*a[:4], a[4] - 9), ValueError, r"topk_ids must be expert indices"),
    ("float ids", lambda a: (*a[:4], a[4].float()), TypeError, "topk_ids must be int32 or int64"),
    ("mixed dtypes", lambda a: (a[0], a[1], a[2].half(), *a[3:]), TypeError, "w2 must have x's dtype"),
    ("fp16 weights", lambda a: (a[0], a[1], a[2], a[3].half(), a[4]), TypeError, "topk_weights must be float32"),
    ("weights wrong shape", lambda a: (*a[:3], a[3][:, :1].contiguous(), a[4]), ValueError,
     r"topk_weights must be \[M, topk\] = \(5, 2\)"),
    ("wrong device", lambda a: (a[0], a[1].to("meta"), *a[2:]), ValueError, "w1 must be on x's device cpu"),
    ("not a tensor", lambda a: (a[0].tolist(), *a[1:]), TypeError, "x must be a torch.Tensor"),
    ("w2 wrong shape", lambda a: (a[0], a[1], a[2][:, :, :-1], *a[3:]), ValueError, r"w2 must be \[E, K, N\]"),
]


@pytest.mark.parametrize("make, error, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error_naming_the_argument(make, error: type, match: str) -> None:
    args = call(5, 8, 48, 40, 2, seed=7)
    with pytest.raises(error, match=match):
        flyreg.op("fused_moe")(*make(args))


def test_space_is_pruned_by_shared_memory_and_rows() -> None:
    big = {"E": 8, "K": 4096, "N": 14336, "topk": 2, "M": 8192}
    small = {**big, "M": 1}
    configs = space.triton_configs(big)
    assert len(configs) > 500
    for c in configs:
        k = c.kwargs
        stages = c.hints["num_stages"]
        assert stages * (k["BLOCK_M"] * k["BLOCK_K"] + 2 * k["BLOCK_K"] * k["BLOCK_N"]) * 2 <= 227 * 1024
    decode = space.triton_configs(small)
    assert {c.kwargs["BLOCK_M"] for c in decode} == {16}  # one row an expert: the smallest tile only
    assert {c.kwargs["SPLIT_K"] for c in decode} > {1} and {c.kwargs["SPLIT_K"] for c in configs} == {1}
    for spec in (big, small):
        assert space.triton_default(spec) in space.triton_configs(spec)


def test_tma_variants_are_offered_where_the_weight_rows_allow_it() -> None:
    spec = {"E": 8, "K": 4096, "N": 14336, "topk": 2, "M": 1024}
    configs = space.triton_configs(spec)
    plain = [c for c in configs if "TMA" not in c.kwargs]
    tma = [c for c in configs if "TMA" in c.kwargs]
    assert all(c.kwargs["TMA"] is True for c in tma)
    # Each TMA config is a pointer-load config of the space with TMA on, and every one has its twin.
    assert sorted(map(repr, plain)) == sorted(repr(Config({k: v for k, v in c.kwargs.items() if k != "TMA"},
                                                          **c.hints)) for c in tma)
    assert space.triton_default(spec).kwargs["TMA"] is True
    for odd in ({**spec, "K": 4100}, {**spec, "N": 1001}):  # a 16-byte row stride needs K and N % 8 == 0
        assert all("TMA" not in c.kwargs for c in space.triton_configs(odd)), odd
        assert "TMA" not in space.triton_default(odd).kwargs
    assert not space.tma_fits(2 ** 20, 2 ** 11, 64) and space.tma_fits(8, 14336, 4096)


def test_tail_tiles_are_offered_where_an_expert_fills_a_tile() -> None:
    spec = {"E": 8, "K": 4096, "N": 14336, "topk": 2, "M": 1024}  # 256 rows an expert
    tails = {(c.kwargs["BLOCK_M"], c.kwargs.get("TAILS", 0)) for c in space.triton_configs(spec)}
    assert tails == {(16, 0), (32, 0), (32, 1), (64, 0), (64, 1), (64, 2), (128, 0), (128, 1), (128, 2)}
    few = {**spec, "M": 32}  # 8 rows an expert: no tile is filled
    assert all("TAILS" not in c.kwargs for c in space.triton_configs(few))
    assert space.triton_default(spec).kwargs["TAILS"] == 2


@pytest.mark.parametrize(("M", "tiles"), [(16, {16}), (32, {16}), (64, {16, 32}), (128, {16, 32, 64}), (256, {16, 32, 64, 128}),
                                          (4096, {16, 32, 64, 128})])
def test_row_tiles_reach_twice_the_rows_an_expert_gets(M: int, tiles: set[int]) -> None:
    spec = {"E": 8, "K": 4096, "N": 14336, "topk": 2, "M": M}  # M / 4 rows an expert on average
    grouped = [c for c in space.triton_configs(spec) if not c.kwargs.get("DECODE")]
    assert {c.kwargs["BLOCK_M"] for c in grouped} == tiles
    # A tile taller than an expert's rows never takes tails (its expert does not fill it).
    r = space.rows_per_expert(spec)
    assert all(c.kwargs.get("TAILS", 0) == 0 for c in grouped if c.kwargs["BLOCK_M"] > r)


@pytest.mark.parametrize("M", [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
@pytest.mark.parametrize("shape", ["Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V2-Lite", "gpt-oss-20b"])
def test_the_default_takes_tma_and_tails_above_16_rows_an_expert(shape: str, M: int) -> None:
    from flyreg_moe.ops import MODEL_SHAPES

    E, K, N, topk = MODEL_SHAPES[shape]
    spec = {"E": E, "K": K, "N": N, "topk": topk, "M": M}
    r = space.rows_per_expert(spec)
    k = space.triton_default(spec).kwargs
    if M <= space.DECODE_DEFAULT_ROWS:  # the pair or decode path takes the few rows (test_moe_decode.py, _pair.py)
        assert k.get("DECODE", False) is not k.get("PAIR_MLP", False)
        return
    tile = {16: 16, 32: 32, 64: 64}.get(max(16, min(128, 1 << (r - 1).bit_length())), 128)
    assert k["BLOCK_M"] == tile
    assert k.get("TMA", False) is (r > 16)  # every model shape's weight rows are 16-byte strided
    # Half tails on the 32-row tile, quarter tails on the larger ones, each once an expert fills its tile.
    assert k.get("TAILS", 0) == (0 if r < tile or tile == 16 else 1 if tile == 32 else 2)
    assert k.get("BLOCK_N_DOWN") == (256 if tile == 128 else None)  # every model's K spans a 256-wide tile


def test_wide_gemm_2_tiles_are_offered_where_they_fit() -> None:
    spec = {"E": 32, "K": 2880, "N": 2880, "topk": 4, "M": 4096}
    configs = space.triton_configs(spec)
    grouped = [c for c in configs if space.grouped(c.kwargs)]
    wide = [c for c in grouped if "BLOCK_N_DOWN" in c.kwargs]
    assert wide and all(c.kwargs["BLOCK_N_DOWN"] == 2 * c.kwargs["BLOCK_N"] for c in wide)
    assert {c.kwargs["BLOCK_N_DOWN"] for c in wide} == set(space.WIDE_DOWNS)
    for c in wide:  # GEMM 2's wide accumulator and pipeline fit, and each has its twin as wide as GEMM 1
        k, h, down = c.kwargs, c.hints, c.kwargs["BLOCK_N_DOWN"]
        assert k["BLOCK_M"] * down <= space.MAX_ACC_PER_THREAD * 32 * h["num_warps"]
        assert h["num_stages"] * (k["BLOCK_M"] * k["BLOCK_K"] + k["BLOCK_K"] * down) * 2 <= space.SMEM_BYTES
        assert Config({n: v for n, v in k.items() if n != "BLOCK_N_DOWN"}, **h) in configs
    # every grouped tile whose doubled width is offered has its wide twin (SGLang's pairing of the two GEMMs' tiles)
    for c in grouped:
        if "BLOCK_N_DOWN" not in c.kwargs and 2 * c.kwargs["BLOCK_N"] in space.WIDE_DOWNS:
            assert Config({**c.kwargs, "BLOCK_N_DOWN": 2 * c.kwargs["BLOCK_N"]}, **c.hints) in configs, c
    by_width = {d: {(c.kwargs["BLOCK_M"], c.hints["num_warps"]) for c in wide if c.kwargs["BLOCK_N_DOWN"] == d}
                for d in space.WIDE_DOWNS}
    assert by_width[256] >= {(128, 8), (64, 4)} and by_width[128] >= {(128, 8), (64, 4), (32, 4)}
    assert (128, 4) not in by_width[256]  # 256 float32 a thread
    narrow = {**spec, "K": 200}  # K narrower than a 256-wide tile: only the 128-wide ones
    narrow_downs = {c.kwargs.get("BLOCK_N_DOWN") for c in space.triton_configs(narrow) if space.grouped(c.kwargs)}
    assert narrow_downs == {None, 128}
    assert "BLOCK_N_DOWN" not in space.triton_default(narrow).kwargs


@settings(max_examples=300, deadline=None)
@given(E=st.integers(1, 256), N=st.integers(1, 20000), K=st.integers(1, 8192), topk=st.integers(1, 8),
       M=st.integers(0, 10000))
def test_the_default_is_a_config_of_the_pruned_space(E: int, N: int, K: int, topk: int, M: int) -> None:
    spec = {"E": E, "K": K, "N": N, "topk": topk, "M": M}
    default = space.triton_default(spec)
    assert default in space.triton_configs(spec)
    if space.rows_per_expert(spec) > space.SPLIT_ROWS:
        assert default.kwargs["SPLIT_K"] == 1


@pytest.mark.parametrize("shape", [(64, 2048, 1024, 8), (60, 2048, 1408, 4), (32, 2880, 2880, 4), (8, 4096, 14336, 2)])
def test_the_default_takes_the_grouped_path_from_32_rows(shape: tuple[int, ...]) -> None:
    E, K, N, topk = shape
    spec = {"E": E, "K": K, "N": N, "topk": topk, "M": 32}
    default = space.triton_default(spec)  # the default's smallest tile, ungrouped, pointer loads, unsplit
    rows, bm, bn, bk, warps, stages, _, _ = space.DEFAULT_TILES[0]
    assert space.grouped(default.kwargs) and space.rows_per_expert(spec) <= rows
    assert default == Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1},
                             num_warps=warps, num_stages=stages)
    assert space.triton_default({**spec, "M": 16}).kwargs.get("DECODE")


def test_workloads_cover_the_model_shapes_on_cuda_and_small_shapes_on_the_cpu() -> None:
    from flyreg_moe import ops

    gpu = ops.fused_moe.workloads("cuda")
    assert len(gpu) == 4 * 14 and {w["M"] for w in gpu} == set(space.M_BUCKETS)
    assert {(w["E"], w["K"], w["N"], w["topk"]) for w in gpu} == {(8, 4096, 14336, 2), (128, 2048, 768, 8),
                                                                  (64, 2048, 1408, 6), (32, 2880, 2880, 4)}
    assert all(w["backend"] == "cpu" for w in ops.fused_moe.workloads("cpu"))


def test_each_seed_draws_its_own_routing_so_a_tune_times_several() -> None:
    from flyreg_moe import ops

    spec = {"E": 8, "K": 128, "M": 32, "N": 160, "dtype": "float32", "topk": 2, "backend": "cpu"}
    assert flyreg.op("fused_moe").seeded_inputs
    first, again, other = (ops.fused_moe.make_inputs(spec, "cpu", seed)[0] for seed in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # a seed is one draw
    assert not torch.equal(first[4], other[4]) and [a.shape for a in first] == [a.shape for a in other]
    assert first[4].min() >= 0 and first[4].max() < 8 and all(len(set(row.tolist())) == 2 for row in other[4])
    with pytest.raises(ValueError, match="topk must be at most E .*, got topk=9, E=8"):  # a --spec no model has
        ops.fused_moe.make_inputs({**spec, "topk": 9}, "cpu", 0)


def test_torch_op_through_flyreg_torch() -> None:
    import flyreg.torch

    flyreg.torch.register("fused_moe")
    args = call(4, 4, 32, 24, 2, seed=8)
    out = torch.ops.flyreg.fused_moe(*args)
    assert rel_err(out, reference(*args)) < TOL[torch.bfloat16]

    @torch.compile(fullgraph=True, backend="eager")
    def step(*a: torch.Tensor) -> torch.Tensor:
        return torch.ops.flyreg.fused_moe(*a) * 2

    assert rel_err(step(*args), 2 * reference(*args)) < TOL[torch.bfloat16]


def test_tune_on_the_cpu_writes_an_artifact_that_is_served(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "cache"))
    args = call(6, 4, 32, 24, 2, seed=9)
    report = flyreg.op("fused_moe").tune(*args, out_dir=tmp_path / "configs")
    written = list((tmp_path / "configs").glob("fused_moe,*.json"))
    assert len(written) == 1
    data = json.loads(written[0].read_text())
    assert data["spec"]["M"] == 8 and data["config"]["kwargs"]["EXPERT_GROUP"] in (1, 2, 4)
    assert report.winner == flyreg.resolve("fused_moe", *args).config and not report.failed and not report.rejected


def test_declared_flops_equal_the_matmul_flops_of_the_reference() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from flyreg_moe import ops
    from flyreg_moe.cpu import fused_moe_reference  # matmuls over each expert's rows, as counted

    M, E, N, K, topk = 13, 8, 48, 40, 3
    args = call(M, E, N, K, topk, seed=9)
    with FlopCounterMode(display=False) as counter:
        fused_moe_reference(*args)
    spec = {"E": E, "K": K, "N": N, "topk": topk, "dtype": "bfloat16", "M": M}
    assert ops.fused_moe.work(spec).flops == counter.get_total_flops()


def test_every_shipped_artifact_is_a_config_of_its_spec_space_and_a_declared_workload() -> None:
    import json
    from pathlib import Path

    import flyreg_moe
    from flyreg_moe import ops

    paths = sorted((Path(flyreg_moe.__file__).parent / "configs").glob("fused_moe,*.json"))
    workloads = [{k: v for k, v in w.items() if k != "backend"} for w in ops.fused_moe.workloads("cuda")]
    assert len(workloads) == 56
    seen: dict[str, list[dict]] = {}
    for path in paths:
        artifact = json.loads(path.read_text(encoding="utf-8"))
        spec = artifact["spec"]
        seen.setdefault(artifact["device"]["name"], []).append(spec)
        assert {k: v for k, v in spec.items() if k != "backend"} in workloads, path.name
        assert Config.from_json(artifact["config"]) in space.triton_configs(spec), path.name
    # The H200 has every workload; another device (the H100's decode buckets) a subset, each spec once.
    assert len(seen.pop("NVIDIA_H200")) == len(workloads)
    assert all(len(specs) == len({str(sorted(s.items())) for s in specs}) for specs in seen.values())


@pytest.mark.parametrize("shape", [(64, 2048, 1024, 8), (60, 2048, 1408, 4), (16, 4096, 6400, 2), (128, 2048, 768, 8)])
def test_a_high_bandwidth_device_gets_the_wide_first_tile(shape: tuple[int, ...]) -> None:
    from flyreg_moe.ops import fused_moe

    E, K, N, topk = shape
    spec = {"E": E, "K": K, "N": N, "topk": topk, "M": 32, "dtype": "bfloat16", "backend": "triton"}
    tiles = {}
    for device in (None, H100, H200):
        default = fused_moe.default(spec, device)  # the declared op's hook passes the device on
        assert default == space.triton_default(spec, device) and default in space.triton_configs(spec)
        tiles[device] = default.kwargs["BLOCK_N"], default.hints["num_stages"]
    assert tiles[None] == tiles[H100] == (64, 5) and tiles[H200] == (128, 3)
    unknown = Device.named("Some_New_GPU", "sm_90")  # no datasheet bandwidth: the default of no device
    assert space.triton_default(spec, unknown) == space.triton_default(spec)


def test_the_high_bandwidth_rule_starts_at_its_bandwidth() -> None:
    at, below = Device("At", "sm_90", bandwidth=space.HIGH_BANDWIDTH), Device("Below", "sm_90", bandwidth=4.49e12)
    assert space.high_bandwidth(at) and space.high_bandwidth(H200)
    assert not any(space.high_bandwidth(d) for d in (below, H100, None, Device("Unknown", "sm_90")))
    spec = {"E": 64, "K": 2048, "N": 1024, "topk": 8, "M": 32}
    assert space.triton_default(spec, at) == space.triton_default(spec, H200) != space.triton_default(spec, below)


@pytest.mark.parametrize(("N", "wide_pair"), [(768, True), (1408, True), (2048, True), (2049, False), (6400, False)])
def test_a_high_bandwidth_device_takes_the_pair_path_at_four_rows_up_to_its_n(N: int, wide_pair: bool) -> None:
    for M in (1, 2, 3, 4, 16, 32):
        spec = {"E": 64, "K": 2048, "N": N, "topk": 4, "M": space.m_bucket(M)}
        h200, h100 = space.triton_default(spec, H200), space.triton_default(spec, H100)
        assert h200 in space.triton_configs(spec) and h100 == space.triton_default(spec)
        if space.m_bucket(M) == 4:
            assert not h100.kwargs.get("PAIR_MLP")  # decode on the H100
            assert h200.kwargs.get("PAIR_MLP", False) is wide_pair
            if wide_pair:  # 64 of N, 64 deep, 4 warps, 128 outputs a step, 3 stages
                assert (h200.kwargs["BLOCK_N"], h200.kwargs["BLOCK_K"], h200.hints["num_warps"],
                        h200.kwargs["BLOCK_N_DOWN"], h200.hints["num_stages"]) == (64, 64, 4, 128, 3)
                assert h200 == space.pair_default(spec, H200) and space.pair_default(spec, H100) is None
        elif M < 32:
            assert h200 == h100  # one and two rows, and 16, the same on both cards


def test_every_device_default_is_a_config_of_its_space() -> None:
    from flyreg_moe.ops import MODEL_SHAPES

    from flyreg_moe_bench.vs_incumbent import UNSEEN_SHAPES

    for E, K, N, topk in [*MODEL_SHAPES.values(), *UNSEEN_SHAPES.values()]:
        for M in space.M_BUCKETS:
            spec = {"E": E, "K": K, "N": N, "topk": topk, "M": M}
            configs = space.triton_configs(spec)
            assert all(space.triton_default(spec, d) in configs for d in (None, H100, H200)), spec
