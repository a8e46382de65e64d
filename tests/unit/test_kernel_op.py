"""``triton_op``: a declaration whose configs, grid or args do not fit its kernel fails with an error naming the
fault, when the op is declared (configs given as values) or when a launcher is bound (configs by spec); never at
the first compile on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flyreg.plugin import Axis, Config, triton_op

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _scale(X, Y, n, alpha, BLOCK_N: tl.constexpr, EVEN: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * alpha, mask=offs < n)


SPEC = {"n": 64, "dtype": "float32"}


def scale_op(**changed: Any) -> Any:
    fields: dict[str, Any] = dict(
        schema="(Tensor x, float alpha=2.0) -> Tensor", output_like="x", name="scale",
        args=lambda x, alpha, y: (x, y, x.numel(), alpha),
        grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK_N"]),),
        key=lambda x, alpha: {"n": x.numel(), "dtype": x.dtype},
        axes=[Axis("n", int, ordered=True), Axis("dtype", str)],
        configs=[Config({"BLOCK_N": b}, num_warps=4) for b in (32, 64)],
        default=Config({"BLOCK_N": 64}, num_warps=4))
    return triton_op(_scale, **{**fields, **changed})


def bind(op: Any, config: Config) -> Any:
    """Bind ``config`` to a call on CPU tensors: the checks run before anything is compiled."""
    return op.build(config, SPEC).bind((torch.randn(SPEC["n"]), 2.0), {})


def test_a_knob_that_is_no_constexpr_fails_the_declaration() -> None:
    with pytest.raises(TypeError, match=r"^configs .*BLOCK.* does not fit the kernel _scale\(.*\): knob 'BLOCK' is "
                                        r"no constexpr of it \(did you mean 'BLOCK_N'\?\); constexpr 'BLOCK_N' has "
                                        r"no value$"):
        scale_op(configs=[Config({"BLOCK_N": 32}), Config({"BLOCK": 64})])
    with pytest.raises(TypeError, match=r"^default .* knob 'n' is no constexpr of it"):
        scale_op(default=Config({"BLOCK_N": 64, "n": 3}))  # a runtime argument is no knob


def test_a_config_leaving_out_a_constexpr_fails_unless_the_kernel_defaults_it() -> None:
    with pytest.raises(TypeError, match=r"^default Config\(num_warps=4\) does not fit .*: constexpr 'BLOCK_N' has no value$"):
        scale_op(default=Config({}, num_warps=4))
    op = scale_op(configs=[Config({"BLOCK_N": 32, "EVEN": True}), Config({"BLOCK_N": 64})])  # EVEN has a default
    assert [c.kwargs for c in op.configs(SPEC)] == [{"BLOCK_N": 32, "EVEN": True}, {"BLOCK_N": 64}]


def test_configs_by_spec_are_checked_when_a_launcher_is_bound() -> None:
    op = scale_op(configs=lambda spec: [Config({"BLOK_N": 32})], default=lambda spec: Config({"BLOK_N": 32}))
    with pytest.raises(TypeError, match=r"^the config's knobs \{\} \(hints \{'BLOK_N': 32\}\) does not fit the kernel "
                                        r"_scale\(.*\): constexpr 'BLOCK_N' has no value$"):
        bind(op, op.default(SPEC))


def test_a_failing_grid_or_args_names_itself_and_what_it_was_given() -> None:
    op = scale_op(grid=lambda meta: (meta["rows"],))
    with pytest.raises(TypeError, match=r"^grid\(meta\) raised KeyError: 'rows'; meta holds \['BLOCK_N', 'X', 'Y', "
                                        r"'alpha', 'n'\]$"):
        bind(op, Config({"BLOCK_N": 32}))
    op = scale_op(args=lambda x, y: (x, y, x.numel(), 2.0))  # forgets alpha
    with pytest.raises(TypeError, match=r"^args, called with the call's 2 arguments and the output, raised "
                                        r"TypeError: .*takes 2 positional arguments but 3 were given"):
        bind(op, Config({"BLOCK_N": 32}))


def test_grid_and_args_must_be_callables_or_a_fixed_grid() -> None:
    with pytest.raises(TypeError, match=r"^grid must be a function of meta .* or a tuple of ints, got 'big'$"):
        scale_op(grid="big")
    with pytest.raises(TypeError, match=r"^args must be a function of the call's arguments"):
        scale_op(args=(1, 2))
    with pytest.raises(TypeError, match=r"^kernel must be a @triton.jit function, got function$"):
        triton_op(lambda x: x, schema="(Tensor x) -> Tensor", grid=(1,), args=lambda x: (x,), key=lambda x: {},
                  configs=[Config()], default=Config())
    run = bind(scale_op(grid=(0,)), Config({"BLOCK_N": 32}))  # a fixed grid; an empty one launches nothing
    assert run(torch.ones(SPEC["n"]), 2.0).shape == (SPEC["n"],)


def test_the_description_defaults_to_the_first_docstring_line() -> None:
    assert scale_op().declaration.record.description == __doc__.strip().splitlines()[0]  # _scale has no docstring
    assert scale_op(description="y = alpha * x").declaration.record.description == "y = alpha * x"


@triton.jit
def _rows(X, Y, n, num_rows: tl.constexpr):
    tl.store(Y + tl.arange(0, num_rows), tl.load(X + tl.arange(0, num_rows)))


def test_hints_and_wrapped_kernels_are_not_taken_for_knobs() -> None:
    # A hint beside a constexpr of a similar name (num_warps, num_rows) binds; an empty grid launches nothing.
    op = triton_op(_rows, schema="(Tensor x) -> Tensor", output_like="x", args=lambda x, y: (x, y, x.numel()),
                   grid=(0,), key=lambda x: {"n": x.numel()}, axes=[Axis("n", int)],
                   configs=lambda spec: [Config({"num_rows": 16}, num_warps=4)],
                   default=lambda spec: Config({"num_rows": 16}, num_warps=4))
    run = op.build(op.default({"n": 16}), {"n": 16}).bind((torch.ones(16),), {"num_warps": 4})
    assert run(torch.ones(16)).shape == (16,)
    # @triton.heuristics supplies BLOCK_N itself: a config need not give it.
    wrapped = triton.heuristics({"BLOCK_N": lambda meta: 64})(_scale)
    assert triton_op(wrapped, schema="(Tensor x, float alpha=2.0) -> Tensor", output_like="x",
                     args=lambda x, alpha, y: (x, y, x.numel(), alpha), grid=(1,), key=lambda x, alpha: {"n": 1},
                     axes=[Axis("n", int)], configs=[Config({}, num_warps=4)], default=Config({}, num_warps=4))
