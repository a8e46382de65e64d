"""docs/plugin_authoring.md's second example, a Triton plugin exposed through flyreg.torch, runs as written
(under Triton's interpreter on the CPU): served by flyreg, registered as torch.ops.flyreg.scaled_add when
registered, traced by torch.compile with no graph break, and removed again when unregistered."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not hasattr(torch.library, "register_fake"), reason="needs torch >= 2.4")

import flyreg  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin_authoring.md"
SECOND = "## A second example"
NAME = "scaled_add"


def example_source() -> str:
    page = DOC.read_text(encoding="utf-8")
    (code, *_) = re.findall(r"^```python\n(.*?)^```", page.split(SECOND, 1)[1], re.S | re.M)
    return code


@pytest.fixture
def scaled_add(monkeypatch: pytest.MonkeyPatch, isolated_dirs: dict[str, Path]) -> Iterator[types.ModuleType]:
    """The example imported as ``my_kernels.scaled_add`` and registered in-process after ``import flyreg.torch``."""
    import flyreg.torch  # noqa: F401  (registering the op below then registers its torch op)

    module = types.ModuleType("my_kernels.scaled_add")
    module.__file__ = str(DOC)
    monkeypatch.setitem(sys.modules, "my_kernels.scaled_add", module)
    exec(compile(example_source(), f"{DOC}:triton-example", "exec"), module.__dict__)
    flyreg.register(module, name=NAME)
    try:
        yield module
    finally:
        flyreg.unregister(NAME)


def test_the_example_is_under_100_lines_and_writes_no_torch_library_code() -> None:
    code = example_source()
    assert len(code.splitlines()) < 100
    assert "torch.library" not in code and "flyreg.triton" in code and "torch_schema" in code


def test_served_by_flyreg_and_as_a_torch_op(scaled_add: types.ModuleType) -> None:
    import flyreg.torch

    x, y = torch.randn(3000), torch.randn(3000)
    torch.testing.assert_close(flyreg.op(NAME)(x, y, 0.5), x + 0.5 * y)
    assert NAME in flyreg.torch.registered()
    torch.testing.assert_close(torch.ops.flyreg.scaled_add(x, y, 0.25), x + 0.25 * y)
    torch.testing.assert_close(torch.ops.flyreg.scaled_add(x, y), x + y)  # alpha's default from the schema
    assert flyreg.resolve(NAME, x, y, 0.5).config.kwargs == {"BLOCK": 1024}  # the default, no search
    with pytest.raises(ValueError, match="y must match x"):
        torch.ops.flyreg.scaled_add(x, torch.randn(10))


def test_compiled_graph_of_two_flyreg_ops_has_no_break_and_matches_eager(scaled_add: types.ModuleType) -> None:
    pytest.importorskip("flyreg_rmsnorm")

    def model(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.ops.flyreg.scaled_add(x, y, 0.5)
        return torch.ops.flyreg.rmsnorm(h.relu() + 1.0, w, 1e-6)

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(torch.randn(8, 64), torch.randn(8, 64), torch.rand(64))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x, y, w = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g), torch.rand(64, generator=g)
        torch.testing.assert_close(compiled(x, y, w), model(x, y, w))


def test_unregistering_the_op_removes_its_torch_op(scaled_add: types.ModuleType) -> None:
    import flyreg.torch

    flyreg.unregister(NAME)
    assert NAME not in flyreg.torch.registered()
    assert not hasattr(torch.ops.flyreg, NAME)
    flyreg.register(scaled_add, name=NAME)  # registered again (the fixture unregisters it at the end)
    x = torch.randn(5)
    torch.testing.assert_close(torch.ops.flyreg.scaled_add(x, x, 2.0), 3 * x)
