"""The default's menu (``bench/moe_menu.py``): which configs it times for a spec, on the CPU."""

from __future__ import annotations

import argparse

import pytest

from flyreg.plugin import Device
from flyreg_moe import space
from flyreg_moe.ops import MODEL_SHAPES
from flyreg_moe_bench import moe_menu


def _spec(model: str, M: int) -> dict[str, int]:
    E, K, N, topk = MODEL_SHAPES[model]
    return {"E": E, "K": K, "N": N, "topk": topk, "M": M}


def test_knob_sets_add_the_offered_twins_of_the_menu_tiles() -> None:
    spec = _spec("Mixtral-8x7B", 1024)  # 256 rows an expert: every tile takes TMA, tiles of 64 rows up both tails
    plain = moe_menu.menu_configs(spec)
    sets = [moe_menu.knob_set("TMA=true"), moe_menu.knob_set("TMA=true,TAILS=2")]
    both = moe_menu.menu_configs(spec, sets)
    offered = set(space.triton_configs(spec))
    assert plain and set(both) <= offered
    assert {c for c in both if "TMA" not in c.kwargs} == set(plain)
    for extra in sets:  # each plain config's twin with the set, wherever the space offers that twin
        twins = {c for c in both if {k: c.kwargs.get(k) for k in extra} == extra and len(c.kwargs) == 5 + len(extra)}
        assert len(twins) == sum(1 for c in plain if type(c)({**c.kwargs, **extra}, **c.hints) in offered) > 0


def test_knob_sets_the_space_refuses_are_left_out() -> None:
    spec = _spec("Mixtral-8x7B", 32)  # 8 rows an expert: no tile is filled, so no tails
    assert moe_menu.menu_configs(spec, [moe_menu.knob_set("TAILS=2")]) == moe_menu.menu_configs(spec)


def test_knob_set_parses_json_values_and_rejects_a_bare_name_or_a_repeat() -> None:
    assert moe_menu.knob_set("TMA=true,TAILS=2") == {"TMA": True, "TAILS": 2}
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
        moe_menu.knob_set("TMA")
    with pytest.raises(argparse.ArgumentTypeError, match="once"):
        moe_menu.knob_set("TMA=true,TMA=false")


def test_the_incumbent_benchmarks_unseen_shapes_are_real_shapes_the_plugin_never_names() -> None:
    from flyreg_moe import ops
    from flyreg_moe_bench import vs_incumbent

    tuned = {(w["E"], w["K"], w["N"], w["topk"]) for w in ops.fused_moe.workloads("cuda")}
    assert len(vs_incumbent.UNSEEN_SHAPES) >= 3
    for name, (E, K, N, topk) in vs_incumbent.UNSEEN_SHAPES.items():
        assert name not in MODEL_SHAPES and (E, K, N, topk) not in tuned and E >= 16 and 1 <= topk < E
        spec = {"E": E, "K": K, "N": N, "topk": topk, "M": 1, "dtype": "bfloat16", "backend": "triton"}
        assert space.triton_default(spec) in space.triton_configs(spec)  # the default serves them


def test_the_incumbent_benchmarks_grouped_menu_times_offered_tiles_only() -> None:
    from flyreg_moe_bench import vs_incumbent

    for model, M in (("Mixtral-8x7B", 128), ("Qwen3-30B-A3B", 512), ("Qwen3-30B-A3B", 1024), ("gpt-oss-20b", 256)):
        spec = _spec(model, M)
        menu = vs_incumbent.grouped_menu(spec)
        offered = set(space.triton_configs(spec))
        assert menu and set(menu.values()) <= offered
        assert all(space.grouped(c.kwargs) for c in menu.values())  # no decode config shares a grouped tile's name
        for tile in vs_incumbent.GROUPED_MENU:  # GROUP_M 1 and the most offered up to 16, for each tile timed
            ours = [c for c in offered if space.grouped(c.kwargs) and c.kwargs["SPLIT_K"] == 1
                    and not c.kwargs.get("TAILS") and vs_incumbent.tiling(c) == tile]
            timed = {c.kwargs["GROUP_M"] for c in menu.values() if c in ours}
            assert timed == ({1, max(g for g in {c.kwargs["GROUP_M"] for c in ours} if g <= 16)} if ours else set())
        assert {vs_incumbent.tiling(c) for c in menu.values()} <= set(vs_incumbent.GROUPED_MENU)
        for c in menu.values():  # unsplit, untailed, GROUP_M 1 or the most up to 16, TMA off and on where offered
            assert c.kwargs["SPLIT_K"] == 1 and not c.kwargs.get("TAILS") and c.kwargs["GROUP_M"] <= 16
            twin = type(c)({**c.kwargs, "TMA": not c.kwargs.get("TMA")}, **c.hints)
            if twin.kwargs["TMA"] is False:
                twin = type(c)({k: v for k, v in c.kwargs.items() if k != "TMA"}, **c.hints)
            assert (twin in offered) is (twin in set(menu.values()))
    # 32 rows of an unseen shape, where the default's grouped path starts: the default (its smallest tile) is timed
    E, K, N, topk = vs_incumbent.UNSEEN_SHAPES["OLMoE-1B-7B"]
    spec = {"E": E, "K": K, "N": N, "topk": topk, "M": 32, "dtype": "bfloat16", "backend": "triton"}
    assert space.triton_default(spec) in vs_incumbent.grouped_menu(spec).values()
    h200 = Device.named("NVIDIA_H200", "sm_90")  # the high-bandwidth rule's first tile is timed too
    assert space.triton_default(spec, h200) in vs_incumbent.grouped_menu(spec).values()
    # Mixtral at 128 rows: SGLang's tiling there (64 rows, GEMM 1 64 gate and 64 up columns, GEMM 2 128) is timed
    assert any((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs.get("BLOCK_N_DOWN")) == (64, 64, 128)
               for c in vs_incumbent.grouped_menu(_spec("Mixtral-8x7B", 128)).values())


def test_the_incumbent_benchmark_times_a_knob_only_on_configs_that_take_it() -> None:
    from flyreg_moe_bench import vs_incumbent

    grouped = space.triton_default(_spec("Mixtral-8x7B", 256))
    decode = space.triton_default(_spec("Mixtral-8x7B", 8))
    assert decode.kwargs.get("DECODE") or decode.kwargs.get("PAIR_MLP")
    knobs = [("ONE_DOT", True), ("MASK_PAD", True)]
    variants = vs_incumbent.knob_variants(grouped, knobs)
    assert list(variants) == ["served+ONE_DOT=true", "served+MASK_PAD=true"]
    assert variants["served+ONE_DOT=true"].kwargs == {**grouped.kwargs, "ONE_DOT": True}
    assert variants["served+ONE_DOT=true"].hints == grouped.hints
    assert vs_incumbent.knob_variants(decode, knobs) == {}  # the decode and pair paths refuse both
    assert grouped.kwargs["TMA"] is True  # a knob the config already has is no variant
    assert list(vs_incumbent.knob_variants(grouped, [("TMA", False), ("TMA", True)])) == ["served+TMA=false"]


def test_the_benchmarks_end_on_a_wrong_answer_naming_the_config() -> None:
    from flyreg_moe_bench import moe_knob_ab

    moe_knob_ab.exit_on_wrong("Qwen3 M=1", {"served": 1e-3, "served+ONE_DOT=true": 2e-3})  # both right: no exit
    for bad in (0.5, float("nan")):
        with pytest.raises(SystemExit, match=r"Qwen3 M=1: relative error over .*'served\+ONE_DOT=true'"):
            moe_knob_ab.exit_on_wrong("Qwen3 M=1", {"served": 1e-3, "served+ONE_DOT=true": bad})
