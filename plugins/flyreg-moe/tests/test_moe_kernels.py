"""Correctness of the fused-MoE kernels (Triton and CPU) against a float32 reference on fresh random inputs.

Without a GPU the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set in
conftest.py) on CPU tensors at tiny shapes; tests marked ``gpu`` run the model shapes on CUDA.
"""

from __future__ import annotations

import pytest
import torch

import flyreg
from flyreg.plugin import Config, Device
from flyreg_moe import cpu, space

from moe_cases import (DEVICE, MODEL, TOL, call, gpu, needs_cuda, needs_triton, reference, rel_err, triton_call,
                        triton_moe)

#: (M, E, N, K, topk, routing): M = 0, 1, 7 and many; topk = 1; N and K not powers of two; one expert
#: taking every pair; experts with no token.
CASES = [
    (0, 4, 48, 40, 2, "random"),
    (1, 4, 48, 40, 1, "random"),
    (7, 8, 48, 40, 2, "random"),
    (7, 6, 40, 56, 3, "one"),
    (40, 8, 24, 40, 2, "skewed"),
]
#: Small tiles for the interpreter: plain, split GEMM 2 with groups, 32-row tiles.
TILES = [
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "SPLIT_K": 2},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 1},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}-E{}-N{}-K{}-top{}-{}".format(*c))
def test_cpu_backend_matches_reference_for_every_expert_group(case: tuple) -> None:
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, routing=routing)
    ref = reference(*args)
    for config in space.cpu_configs({"M": max(M, 1), "E": E, "N": N, "K": K, "topk": topk}):
        out = cpu.fused_moe_cpu(*args, **config.kwargs)
        assert out.shape == (M, K) and out.dtype == torch.bfloat16
        if M:
            assert rel_err(out, ref) < TOL[torch.bfloat16], config


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}-E{}-N{}-K{}-top{}-{}".format(*c))
def test_triton_kernels_match_reference(case: tuple) -> None:
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, device=DEVICE, routing=routing, seed=1)
    ref = reference(*args)
    tiles = TILES if M == 7 else TILES[:1]  # every tile config once, at one M, to keep the interpreter quick
    for knobs in tiles:
        out = triton_call(*args, **knobs, num_warps=4)
        assert out.shape == (M, K) and out.dtype == torch.bfloat16
        if M:
            assert rel_err(out, ref) < TOL[torch.bfloat16], knobs


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_float16_and_bfloat16(dtype: torch.dtype) -> None:
    args = call(9, 4, 40, 48, 2, dtype=dtype, device=DEVICE, seed=2)
    ref = reference(*args)
    out = triton_call(*args, **TILES[1])
    assert out.dtype == dtype and rel_err(out, ref) < TOL[dtype]
    out = triton_call(*args, **{**TILES[2], "TAILS": 1}, TMA=True)
    assert out.dtype == dtype and rel_err(out, ref) < TOL[dtype]


@needs_triton
@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: "M{}-E{}-N{}-K{}-top{}-{}".format(*c))
def test_triton_tma_weight_loads_match_reference(case: tuple) -> None:
    # Every case's K and N give 16-byte weight rows, so TMA reads both GEMMs' weights (the K tail and
    # the last column tiles from the descriptors' zero fill and the next rows).
    M, E, N, K, topk, routing = case
    args = call(M, E, N, K, topk, device=DEVICE, routing=routing, seed=10)
    ref = reference(*args)
    for knobs in TILES[:2]:
        out = triton_call(*args, **knobs, TMA=True, num_warps=4)
        assert rel_err(out, ref) < TOL[torch.bfloat16], knobs


#: Pairs an expert gets, for 64-row tiles with tails: a quarter tail (69 = 64 + 5), a half tail (84),
#: a lone tile wider than half (40), none, a lone quarter (3), exactly one tile (64).
TAIL_COUNTS = [69, 84, 40, 0, 3, 64]


def _routed(counts: list[int], topk: int, seed: int) -> torch.Tensor:
    """topk_ids [sum(counts) / topk, topk] in which expert e gets counts[e] pairs, in a random order."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    return ids[torch.randperm(len(ids), generator=g)].view(-1, topk).to(torch.int32)


@needs_triton
@pytest.mark.parametrize(("tails", "counted"), [(1, False), (2, False), (2, True)])
def test_tile_table_cuts_each_run_into_full_tiles_and_one_tail(tails: int, counted: bool, monkeypatch) -> None:
    from flyreg_moe import routing

    monkeypatch.setattr(routing, "MAX_PROGRAMS", 4)  # 260 pairs over 4 programs of 128-pair chunks, or counted apart
    monkeypatch.setattr(routing, "ONE_LAUNCH_PAIRS", 0 if counted else routing.ONE_LAUNCH_PAIRS)
    ids = _routed(TAIL_COUNTS, 2, seed=12).to(DEVICE).view(-1)
    plan = routing.RoutingPlan.of(len(ids), len(TAIL_COUNTS), 64, tails)
    assert plan.programs == 3 and plan.counted is counted
    views = plan.workspace(ids.device)
    plan.launcher(ids, views)(ids, views)
    table, experts, slots = views.table.cpu(), views.block_expert.cpu(), views.sorted_ids.cpu()
    used = int(table[0])
    firsts, sizes = table[1:1 + plan.tiles][:used].tolist(), table[1 + plan.tiles:][:used].tolist()
    align = 64 >> tails
    want = []  # (expert, slots) of each tile, in order
    for e, c in enumerate(TAIL_COUNTS):
        run = -(-c // align) * align
        want += [(e, min(64, run - i)) for i in range(0, run, 64)]
    assert list(zip(experts[:used].tolist(), sizes)) == want
    assert firsts == [sum(s for _, s in want[:i]) for i in range(used)]  # tiles back to back, runs too
    seen = []
    for first, size, e in zip(firsts, sizes, experts.tolist()):
        pairs = [p for p in slots[first:first + size].tolist() if p < len(ids)]
        assert all(int(ids[p]) == e for p in pairs)
        seen += pairs
    assert sorted(seen) == list(range(len(ids)))  # every pair in exactly one tile


@needs_triton
@pytest.mark.parametrize(("most_programs", "tails", "one_launch", "E"), [
    (64, 0, True, 200), (4, 0, True, 200), (4, 1, True, 200), (64, 0, False, 200), (4, 1, False, 200),
    (64, 0, True, 1500), (4, 1, False, 1500)])
def test_routing_sorts_each_experts_pairs_in_pair_order_from_any_program(most_programs: int, tails: int,
                                                                          one_launch: bool, E: int,
                                                                          monkeypatch) -> None:
    # 200 experts: up to 64 pairs a chunk. At most 64 programs: 44 chunks of 16 pairs, one a program; at most 4: 11
    # chunks of 64, 3 a program. 1500 experts (2048 counted at once): 16-pair chunks. Some pairs name no expert in
    # range. Counted by each program itself (one launch), or by a launch of their own.
    from flyreg_moe import routing

    monkeypatch.setattr(routing, "MAX_PROGRAMS", most_programs)
    monkeypatch.setattr(routing, "ONE_LAUNCH_PAIRS", 700 if one_launch else 699)
    P, block_m = 700, 32
    g = torch.Generator().manual_seed(most_programs + tails)
    ids = torch.randint(0, E // 4, (P,), generator=g, dtype=torch.int32) * 4  # 50 experts, about 14 pairs each
    ids[torch.randperm(P, generator=g)[:9]] = torch.tensor([-1, E, E + 50, -7, E, -1, E + 1, 2 ** 30, -2 ** 30],
                                                           dtype=torch.int32)
    plan = routing.RoutingPlan.of(P, E, block_m, tails)
    assert (plan.chunk, plan.steps, plan.programs) == (
        (16, 1, 44) if most_programs == 64 else (16, 11, 4) if E > 1024 else (64, 3, 4))
    assert plan.counted is not one_launch
    views = plan.workspace(DEVICE)
    ids = ids.to(DEVICE)
    plan.launcher(ids, views)(ids, views)
    align, want, tile_experts = block_m >> tails, [], []
    for e in range(E):
        run = [p for p in range(P) if int(ids[p]) == e]
        padded = -(-len(run) // align) * align
        want += run + [P] * (padded - len(run))
        tile_experts += [e] * -(-padded // block_m)
    used = len(want)
    assert views.sorted_ids[:used].cpu().tolist() == want
    if tails:
        assert int(views.table[0]) == len(tile_experts)
    else:
        assert int(views.used[0]) == used
    assert views.block_expert[:len(tile_experts)].cpu().tolist() == tile_experts


@needs_triton
@pytest.mark.parametrize("counted", [False, True], ids=["one-launch", "counted"])
def test_grouped_path_drops_pairs_out_of_range_on_later_calls(counted: bool, monkeypatch) -> None:
    # Tails, a split GEMM 2 and several routing programs (at most 2, 16-pair chunks), with the routing counted in its
    # own launch or not; pairs out of range after binding add nothing, through the GEMMs and the reduction.
    from flyreg_moe import routing

    monkeypatch.setattr(routing, "MAX_PROGRAMS", 2)
    monkeypatch.setattr(routing, "ONE_LAUNCH_PAIRS", 0 if counted else 10 ** 6)
    knobs = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 2, "TAILS": 1}
    run = triton_moe.bind_fused_moe(*call(24, 4, 32, 32, 3, device=DEVICE, seed=5), **knobs)
    x, w1, w2, tw, ids = call(24, 4, 32, 32, 3, device=DEVICE, routing="skewed", seed=6)
    assert rel_err(run(x, w1, w2, tw, ids), reference(x, w1, w2, tw, ids)) < TOL[torch.bfloat16]
    gone = torch.zeros_like(ids, dtype=torch.bool)
    gone[::5, 1], gone[3, :] = True, True  # a pair of every fifth token, and all of token 3
    bad = torch.where(gone, torch.where(torch.arange(ids.numel()).view_as(ids) % 2 == 0, 4, -1), ids)
    out = run(x, w1, w2, tw, bad.to(ids.dtype))
    assert rel_err(out, reference(x, w1, w2, torch.where(gone, 0.0, tw), torch.where(gone, 0, ids))) < TOL[
        torch.bfloat16]
    assert torch.equal(out[3], torch.zeros_like(out[3]))


@needs_triton
def test_tail_tiles_of_every_size_match_reference() -> None:
    # 64-row tiles whose experts' last tiles take the full, half and quarter paths; GEMM 2 split too.
    topk, E, N, K = 2, len(TAIL_COUNTS), 24, 32
    x, w1, w2, tw, _ = call(sum(TAIL_COUNTS) // topk, E, N, K, topk, device=DEVICE, seed=13)
    args = (x, w1, w2, tw, _routed(TAIL_COUNTS, topk, seed=13).to(DEVICE))
    ref = reference(*args)
    for tails, split, tma in ((1, 1, False), (2, 2, True), (1, 2, False), (2, 1, True)):
        knobs = {"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": split, "TAILS": tails}
        out = triton_call(*args, **knobs, TMA=tma, num_warps=4)
        assert rel_err(out, ref) < TOL[torch.bfloat16], (knobs, tma)


@needs_triton
@pytest.mark.parametrize("block_n_down", [16, 64])
def test_gemm_2_tiles_of_their_own_width_match_reference(block_n_down: int, monkeypatch) -> None:
    # GEMM 2 narrower (16) and wider (64: K = 96 fills 32-wide tiles but not 64-wide ones, so its last column
    # tile is masked) than GEMM 1's 32 columns, with tails, TMA and a split GEMM 2.
    import triton

    from flyreg_moe import gemm_kernels

    launches = []
    real = triton_moe.compiled_launcher
    monkeypatch.setattr(triton_moe, "compiled_launcher",
                        lambda kernel, grid, *a: launches.append((kernel, grid, a[1])) or real(kernel, grid, *a))
    topk, E, N, K = 2, len(TAIL_COUNTS), 24, 96
    x, w1, w2, tw, _ = call(sum(TAIL_COUNTS) // topk, E, N, K, topk, device=DEVICE, seed=15)
    args = (x, w1, w2, tw, _routed(TAIL_COUNTS, topk, seed=15).to(DEVICE))
    ref = reference(*args)
    for tails, split, tma in ((0, 1, False), (2, 2, True), (1, 1, True), (2, 2, False)):
        knobs = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": split, "TAILS": tails,
                 "BLOCK_N_DOWN": block_n_down}
        launches.clear()
        out = triton_call(*args, **knobs, TMA=tma, num_warps=4)
        assert rel_err(out, ref) < TOL[torch.bfloat16], (knobs, tma)
        ups = [(grid, consts) for kernel, grid, consts in launches if kernel is gemm_kernels._gate_up_kernel]
        downs = [(grid, consts) for kernel, grid, consts in launches if kernel is gemm_kernels._down_kernel]
        assert ups and downs and all(c["BLOCK_N"] == 32 for _, c in ups)
        tiles_m = ups[0][0][0] // triton.cdiv(N, 32)  # GEMM 1's grid: row tiles x column tiles of N
        for grid, consts in downs:  # GEMM 2 tiled by its own width
            assert consts["BLOCK_N"] == block_n_down and consts["EVEN_N"] is (K % block_n_down == 0)
            assert grid[0] == tiles_m * triton.cdiv(K, block_n_down)


@needs_triton
@pytest.mark.parametrize("knobs", [{"ONE_DOT": True}, {"MASK_PAD": True}, {"ONE_DOT": True, "MASK_PAD": True}],
                         ids=["one-dot", "mask-pad", "both"])
def test_one_dot_and_masked_padding_match_reference(knobs: dict[str, bool]) -> None:
    # Gate and up in one dot (interleaved pointer columns, or a [2, BLOCK_N, BLOCK_K] TMA block) and padding slots
    # that load nothing, on full, half and quarter tail tiles, a split GEMM 2, and N = 40, K = 40 that neither
    # 16-wide columns nor 32-deep steps divide. Masked padding slots change no stored row: the same bits as without.
    topk, E, N, K = 2, len(TAIL_COUNTS), 40, 40
    x, w1, w2, tw, _ = call(sum(TAIL_COUNTS) // topk, E, N, K, topk, device=DEVICE, seed=17)
    args = (x, w1, w2, tw, _routed(TAIL_COUNTS, topk, seed=17).to(DEVICE))
    ref = reference(*args)
    for tails, split, tma in ((0, 1, False), (0, 2, True), (2, 2, True), (1, 1, True), (2, 2, False)):
        tile = {"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": split, "TAILS": tails, "TMA": tma}
        out = triton_call(*args, **tile, **knobs, num_warps=4)
        assert rel_err(out, ref) < TOL[torch.bfloat16], (tile, knobs)
        if knobs.get("MASK_PAD"):
            unmasked = {**knobs, "MASK_PAD": False}
            assert torch.equal(out, triton_call(*args, **tile, **unmasked, num_warps=4)), (tile, knobs)


def _off_16_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` whose address is 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    at = next(i for i in range(8) if (buf.data_ptr() + i * t.element_size()) % 16 == 2)
    out = buf[at:at + t.numel()].view(t.shape)
    out.copy_(t)
    return out


@needs_triton
def test_tma_launcher_serves_weights_that_tma_cannot_read(monkeypatch) -> None:
    # Bound with TMA on aligned weights, then called with weights off a 16-byte boundary (and the reverse):
    # each call matches the reference, and descriptors are made for the aligned calls of an aligned bind only.
    made = []
    real = triton_moe._weight_descriptors
    monkeypatch.setattr(triton_moe, "_weight_descriptors", lambda *a: made.append(a[0].data_ptr()) or real(*a))
    aligned = call(7, 8, 48, 40, 2, device=DEVICE, seed=11)
    x, w1, w2, tw, ids = aligned
    shifted = (x, _off_16_bytes(w1), _off_16_bytes(w2), tw, ids)
    assert shifted[1].data_ptr() % 16 and shifted[2].data_ptr() % 16
    for first, then in ((aligned, shifted), (shifted, aligned)):
        made.clear()
        run = triton_moe.bind_fused_moe(*first, **TILES[1], TMA=True)
        for args in (first, then, first):
            assert rel_err(run(*args), reference(*args)) < TOL[torch.bfloat16]
        assert made == ([w1.data_ptr()] * 3 if first is aligned else [])  # the bind, then the two aligned calls


@needs_triton
def test_tma_configs_take_pointer_loads_where_the_device_has_no_tma(monkeypatch) -> None:
    # As on a GPU before Hopper: a TMA config (as the default takes above 16 rows an expert) binds, makes no
    # descriptor and is right.
    made = []
    monkeypatch.setattr(triton_moe, "tma_hardware", lambda device: False)
    monkeypatch.setattr(triton_moe, "_weight_descriptors", lambda *a: made.append(a) or pytest.fail("descriptor"))
    args = call(7, 8, 48, 40, 2, device=DEVICE, seed=12)
    run = triton_moe.bind_fused_moe(*args, **TILES[1], TMA=True)
    assert rel_err(run(*args), reference(*args)) < TOL[torch.bfloat16] and made == []


@pytest.mark.parametrize(("capability", "has_tma"), [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)])
def test_tma_hardware_is_hopper_or_later(monkeypatch, capability: tuple[int, int], has_tma: bool) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    assert triton_moe.tma_hardware(torch.device("cuda", 0)) is has_tma
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert triton_moe.tma_hardware(torch.device("cuda", 0)) is False
    assert triton_moe.tma_hardware(torch.device("cpu")) is True  # the interpreter emulates TMA


@needs_triton
def test_bound_launcher_serves_new_values_of_the_same_signature() -> None:
    first = call(7, 8, 48, 40, 2, device=DEVICE, seed=3)
    run = triton_moe.bind_fused_moe(*first, **TILES[0])
    second = call(7, 8, 48, 40, 2, device=DEVICE, routing="skewed", seed=4)
    assert rel_err(run(*second), reference(*second)) < TOL[torch.bfloat16]


@needs_triton
def test_out_of_range_expert_is_an_error_at_bind() -> None:
    x, w1, w2, tw, ids = call(3, 4, 32, 32, 2, device=DEVICE)
    ids[1, 0] = 4
    with pytest.raises(ValueError, match=r"topk_ids must be expert indices in \[0, 4\)"):
        triton_moe.bind_fused_moe(x, w1, w2, tw, ids, **TILES[0])


def test_knobs_are_checked() -> None:
    if triton_moe is None:
        pytest.skip("triton not importable")
    args = call(3, 4, 32, 32, 2)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        triton_moe.bind_fused_moe(*args, **{**TILES[0], "BLOCK_K": 24})
    with pytest.raises(ValueError, match="SPLIT_K must be an int >= 1"):
        triton_moe.bind_fused_moe(*args, **{**TILES[0], "SPLIT_K": 0})
    with pytest.raises(ValueError, match="TMA must be a bool, got 1"):
        triton_moe.bind_fused_moe(*args, **TILES[0], TMA=1)
    for bad in (24, 8, True, "64"):
        with pytest.raises(ValueError, match=f"BLOCK_N_DOWN must be a power of two >= 16, got {bad!r}"):
            triton_moe.bind_fused_moe(*args, **TILES[0], BLOCK_N_DOWN=bad)
    with pytest.raises(ValueError,
                       match="TAILS must be 0, 1 or 2 with BLOCK_M >> TAILS >= 16, got TAILS=1 with BLOCK_M=16"):
        triton_moe.bind_fused_moe(*args, **TILES[0], TAILS=1)
    with pytest.raises(ValueError, match="TAILS must be 0, 1 or 2"):
        triton_moe.bind_fused_moe(*args, **{**TILES[2], "TAILS": 3})
    for knob in ("ONE_DOT", "MASK_PAD"):
        with pytest.raises(ValueError, match=f"{knob} must be a bool, got 'yes'"):
            triton_moe.bind_fused_moe(*args, **TILES[0], **{knob: "yes"})
        for path in ("DECODE", "PAIR_MLP"):  # a knob another path would ignore is refused, not timed as a no-op
            with pytest.raises(ValueError, match="ONE_DOT and MASK_PAD are knobs of the grouped path"):
                triton_moe.bind_fused_moe(*args, **TILES[0], **{knob: True, path: True})


PATHS = {"grouped": {}, "decode": {"DECODE": True}, "pair": {"PAIR_MLP": True}}  #: Each path's knob.


@needs_triton
@pytest.mark.parametrize("path", list(PATHS))
def test_dependent_launches_where_unsupported_are_an_error(path: str) -> None:
    cpu_args = call(3, 4, 32, 32, 2)  # CPU tensors: no programmatic dependent launch
    with pytest.raises(ValueError, match="pdl=True needs a CUDA device of compute capability 9.0"):
        triton_moe.bind_fused_moe(*cpu_args, **TILES[0], **PATHS[path], pdl=True)
    args = call(3, 4, 32, 32, 2, device=DEVICE)
    out = triton_moe.bind_fused_moe(*args, **TILES[0], **PATHS[path], pdl=False)(*args)
    assert rel_err(out, reference(*args)) < TOL[torch.bfloat16]


@needs_triton
@pytest.mark.parametrize(("path", "launches", "counted"), [("grouped", 4, False), ("grouped", 5, True),
                                                           ("decode", 2, False), ("pair", 2, False)])
def test_every_dependent_launch_waits_in_its_kernel(path: str, launches: int, counted: bool, monkeypatch) -> None:
    """A launch marked ``launch_pdl`` whose kernel skipped its wait could read what the launch before is still
    writing: every launch of a call takes the PDL constexpr and the hint together, or neither."""
    from flyreg_moe import decode as decode_path
    from flyreg_moe import pair_mlp, routing

    bound: list[tuple[dict, dict]] = []

    def record(kernel, grid, args, constexprs, hints, device):  # binds nothing: a launch that does nothing
        bound.append((dict(constexprs), dict(hints)))
        return lambda *a: None

    for module in (triton_moe, routing, decode_path, pair_mlp):
        monkeypatch.setattr(module, "compiled_launcher", record)
    monkeypatch.setattr(routing, "ONE_LAUNCH_PAIRS", 0 if counted else routing.ONE_LAUNCH_PAIRS)  # counts launched
    args = call(3, 4, 32, 32, 2)
    for pdl in (True, False):
        bound.clear()
        monkeypatch.setattr(triton_moe, "resolve_pdl", lambda device, wanted, pdl=pdl: pdl)
        triton_moe.bind_fused_moe(*args, **TILES[0], **PATHS[path])
        assert len(bound) == launches
        assert all(c["PDL"] is pdl and h.get("launch_pdl", False) is pdl for c, h in bound), bound




def _gpu_call(M: int, shape: tuple[int, int, int, int], dtype: torch.dtype = torch.bfloat16) -> tuple:
    from flyreg_moe.ops import make_moe_inputs

    E, K, N, topk = shape
    return make_moe_inputs(M, E, N, K, topk, dtype, "cuda", seed=M)


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [1, 3, 7, 32, 300, 2048])
def test_gpu_default_config_on_model_shapes(model: str, M: int) -> None:
    E, K, N, topk = MODEL[model]
    args = _gpu_call(M, MODEL[model])
    spec = {"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk}
    config = space.triton_default(spec, Device.of("cuda"))  # this card's default
    out = triton_call(*args, **config.kwargs, **config.hints)
    assert rel_err(out, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16]


@gpu
@needs_cuda
@pytest.mark.parametrize("M", [5, 600])
def test_gpu_sample_of_the_space(M: int) -> None:
    E, K, N, topk = MODEL["gpt-oss-20b"]
    args = _gpu_call(M, MODEL["gpt-oss-20b"], torch.float16)
    ref = cpu.fused_moe_reference(*args)
    space_ = space.triton_configs({"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk})
    for config in space_[:: max(1, len(space_) // 12)]:
        out = triton_call(*args, **config.kwargs, **config.hints)
        assert rel_err(out, ref) < TOL[torch.float16], config


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [7, 300, 2048])
def test_gpu_tma_weight_loads_on_model_shapes(model: str, M: int) -> None:
    # The default and the shipped config of the spec, each with TMA weight loads, and a split GEMM 2.
    E, K, N, topk = MODEL[model]
    args = _gpu_call(M, MODEL[model])
    ref = cpu.fused_moe_reference(*args)
    spec = {"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk, "backend": "triton", "dtype": "bfloat16"}
    shipped = flyreg.resolve_spec("fused_moe", spec, "cuda").config
    split = Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 4}, num_warps=4,
                   num_stages=4)
    for config in (space.triton_default(spec, Device.of("cuda")), shipped, split):
        out = triton_call(*args, **{**config.kwargs, "TMA": True}, **config.hints)
        assert rel_err(out, ref) < TOL[torch.bfloat16], config


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [300, 2048])
def test_gpu_tail_tiles_on_model_shapes(model: str, M: int) -> None:
    # 128- and 64-row tiles whose experts' last tiles shrink, with pointer and TMA weight loads.
    E, K, N, topk = MODEL[model]
    args = _gpu_call(M, MODEL[model])
    ref = cpu.fused_moe_reference(*args)
    for bm, warps, tails, tma, split in ((128, 8, 2, False, 1), (128, 8, 1, True, 1), (64, 4, 2, True, 1),
                                         (128, 8, 2, True, 1), (128, 8, 1, True, 2), (64, 4, 0, True, 1),
                                         (64, 4, 0, False, 2)):
        knobs = {"BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": split, "TAILS": tails,
                 "TMA": tma}
        for down in (None, 256) if bm == 128 and tails == 2 else (None,):  # GEMM 2 as wide as GEMM 1, and twice
            out = triton_call(*args, **knobs, BLOCK_N_DOWN=down, num_warps=warps, num_stages=3)
            assert rel_err(out, ref) < TOL[torch.bfloat16], (knobs, down)


@gpu
@needs_cuda
@pytest.mark.parametrize("model", list(MODEL))
@pytest.mark.parametrize("M", [64, 512])
def test_gpu_gemm_2_twice_as_wide_as_gemm_1_on_model_shapes(model: str, M: int) -> None:
    # GEMM 1's 64 gate and 64 up columns beside GEMM 2's 128 (the pairing of SGLang's tiles), by pointers and by TMA.
    args = _gpu_call(M, MODEL[model])
    ref = cpu.fused_moe_reference(*args)
    for bm, bk, warps, stages, tma in ((32, 128, 4, 3, False), (64, 128, 8, 4, True), (64, 64, 4, 3, False)):
        knobs = {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1, "TMA": tma,
                 "BLOCK_N_DOWN": 128}
        out = triton_call(*args, **knobs, num_warps=warps, num_stages=stages)
        assert rel_err(out, ref) < TOL[torch.bfloat16], knobs


@gpu
@needs_cuda
@pytest.mark.parametrize("M", [1, 16, 300])
def test_gpu_dependent_launches_give_the_bits_of_plain_ones(M: int) -> None:
    """Each launch waits for the one before it (PDL on Hopper): the same bits as launches in plain stream order,
    called eagerly and replayed back to back in a graph, for the default (at Qwen3 the pair path at 1 row, the decode
    path at 16)."""
    from flyreg.triton import pdl_supported

    args = _gpu_call(M, MODEL["Qwen3-30B-A3B"])
    if not pdl_supported(args[0].device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and a Triton with launch_pdl")
    E, K, N, topk = MODEL["Qwen3-30B-A3B"]
    config = space.triton_default({"M": space.m_bucket(M), "E": E, "N": N, "K": K, "topk": topk}, Device.of("cuda"))
    plain, dependent = (triton_moe.bind_fused_moe(*args, **config.kwargs, **config.hints, pdl=on)
                        for on in (False, True))
    expected = plain(*args)
    assert rel_err(expected, cpu.fused_moe_reference(*args)) < TOL[torch.bfloat16]
    assert torch.equal(dependent(*args), expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [dependent(*args) for _ in range(3)]  # each call's first launch depends on the call before
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(out, expected) for out in outs)


@gpu
@needs_cuda
def test_gpu_graph_capture() -> None:
    args = _gpu_call(33, MODEL["DeepSeek-V2-Lite"])
    ref = cpu.fused_moe_reference(*args)
    config = Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 2}, num_warps=4)
    run = triton_moe.bind_fused_moe(*args, **config.kwargs, **config.hints)
    assert rel_err(run(*args), ref) < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    # TMA descriptors are kernel parameters, captured by value: a replay after the weights change in place.
    run = triton_moe.bind_fused_moe(*args, **{**config.kwargs, "TMA": True}, **config.hints)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*args)
    x, w1, w2, tw, ids = args
    w2.mul_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, -ref) < TOL[torch.bfloat16]
