"""The RMSNorm ops as torch custom ops through flyreg.torch: registration, torch.compile without graph breaks, opcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import flyreg
from installed import plugin as installed_plugin

TORCH_OPS_NEEDED = pytest.mark.skipif(not hasattr(torch.library, "register_fake"), reason="needs torch >= 2.4")
pytestmark = TORCH_OPS_NEEDED


@pytest.fixture(scope="module")
def ops() -> dict:
    import flyreg.torch

    return {name: flyreg.torch.register(name) for name in ("rmsnorm", "fused_add_rmsnorm")}


class Block(torch.nn.Module):
    """A residual block in the shape serving code uses: fused add + norm, a matmul, a norm."""

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w1 = torch.nn.Parameter(torch.rand(n, generator=g, dtype=dtype) + 0.5, requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.rand(n, generator=g, dtype=dtype) + 0.5, requires_grad=False)
        self.proj = torch.nn.Parameter(torch.randn(n, n, generator=g, dtype=dtype) / n**0.5, requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = torch.ops.flyreg.fused_add_rmsnorm(x, residual, self.w1, 1e-6)
        h = h @ self.proj
        return torch.ops.flyreg.rmsnorm(h, self.w2, 1e-5)


def reference_block(block: Block, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, updated residual) in float64, rounding the stored residual to its dtype like the kernels."""
    stored = (residual.double() + x.double()).to(residual.dtype)
    r = stored.double()
    h = r * torch.rsqrt(r.square().mean(-1, keepdim=True) + 1e-6) * block.w1.double()
    # The compiled and eager graphs both round h to the block's dtype before the matmul.
    h = h.to(x.dtype).double() @ block.proj.double()
    h = h.to(x.dtype).double()
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-5) * block.w2.double(), stored


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def test_importing_flyreg_torch_registers_every_op_with_a_schema_and_nothing_else_does() -> None:
    probe = (
        "import torch, flyreg, flyreg_rmsnorm, flyreg_rmsnorm.ops\n"
        "flyreg.op('rmsnorm')\n"
        "assert not hasattr(torch.ops.flyreg, 'rmsnorm'), 'registered by importing the plugin'\n"
        "import flyreg.torch\n"
        "assert hasattr(torch.ops.flyreg, 'rmsnorm') and hasattr(torch.ops.flyreg, 'fused_add_rmsnorm')\n"
        "assert {'rmsnorm', 'fused_add_rmsnorm'} <= set(flyreg.torch.registered())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # what this process imports
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr


def test_registration_is_idempotent_and_marks_the_residual_written(ops: dict) -> None:
    import flyreg.torch

    again = {name: flyreg.torch.register(name) for name in ops}
    assert all(again[k] is ops[k] for k in again)
    schema = str(ops["fused_add_rmsnorm"].default._schema)
    assert "Tensor(a!) residual" in schema and "Tensor x," in schema and "Tensor weight," in schema
    assert "(a!)" not in str(ops["rmsnorm"].default._schema)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_custom_ops_match_reference_and_the_tuner(ops: dict, dtype: torch.dtype) -> None:
    x = torch.randn(37, 96, dtype=dtype)
    w = torch.rand(96, dtype=dtype) + 0.5
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    ref = installed_plugin("rmsnorm").reference((x, w), {"eps": 1e-5})
    y = torch.ops.flyreg.rmsnorm(x, w, 1e-5)
    assert rel_err(y, ref) < tol
    assert torch.equal(y, flyreg.op("rmsnorm")(x, w, eps=1e-5))  # the same tuner serves both
    residual = torch.randn(37, 96, dtype=dtype)
    clean = residual.clone()
    ref = installed_plugin("fused_add_rmsnorm").reference((x, clean.clone(), w), {})
    y = torch.ops.flyreg.fused_add_rmsnorm(x, residual, w)  # eps defaults to 1e-6
    assert rel_err(y, ref) < tol
    assert torch.equal(residual, (clean.float() + x.float()).to(dtype))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_block_has_no_graph_break_and_matches_eager(ops: dict, backend: str) -> None:
    torch._dynamo.reset()
    block = Block(64, torch.float32)
    compiled = torch.compile(block, backend=backend, fullgraph=True)  # fullgraph: a graph break raises
    for seed in range(3):  # fresh random inputs every call, not the ones traced with
        g = torch.Generator().manual_seed(100 + seed)
        x = torch.randn(24, 64, generator=g)
        residual = torch.randn(24, 64, generator=g)
        eager_res = residual.clone()
        eager = block(x, eager_res)
        ref, stored = reference_block(block, x, residual)
        y = compiled(x, residual)
        assert torch.equal(residual, stored.to(residual.dtype))  # the in-place add is visible to the caller
        assert torch.equal(residual, eager_res)
        assert rel_err(y, ref) < 1e-5
        assert rel_err(y, eager) < 1e-6


def test_explain_reports_one_graph_and_no_break(ops: dict) -> None:
    torch._dynamo.reset()
    block = Block(32, torch.float32)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    explanation = torch._dynamo.explain(block)(x, residual)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    targets = {str(n.target) for gm in explanation.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert any("flyreg.rmsnorm" in t for t in targets) and any("flyreg.fused_add_rmsnorm" in t for t in targets)


def test_compiled_with_dynamic_rows(ops: dict) -> None:
    torch._dynamo.reset()
    block = Block(32, torch.float32)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (3, 17, 40):
        x, residual = torch.randn(rows, 32), torch.randn(rows, 32)
        ref, stored = reference_block(block, x, residual)
        y = compiled(x, residual)
        assert y.shape == (rows, 32) and rel_err(y, ref) < 1e-5
        assert torch.equal(residual, stored)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="needs torch.library.opcheck")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(ops: dict, dtype: torch.dtype) -> None:
    x = torch.randn(8, 64, dtype=dtype)
    w = torch.rand(64, dtype=dtype) + 0.5
    r = torch.randn(8, 64, dtype=dtype)
    torch.library.opcheck(torch.ops.flyreg.rmsnorm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.flyreg.fused_add_rmsnorm.default, (x, r, w, 1e-6))
    # A sliced (strided-rows) input, which the kernels take without a copy.
    big = torch.randn(8, 128, dtype=dtype)
    torch.library.opcheck(torch.ops.flyreg.rmsnorm.default, (big[:, :64], w, 1e-6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_on_cuda(ops: dict, mode: str | None) -> None:
    torch._dynamo.reset()
    block = Block(4096, torch.bfloat16).cuda()
    compiled = torch.compile(block, fullgraph=True, mode=mode)  # the default backend: inductor
    for seed in range(4):  # reduce-overhead warms up, then records a CUDA graph and replays it
        g = torch.Generator(device="cuda").manual_seed(200 + seed)
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        residual = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        ref, stored = reference_block(block, x, residual)
        y = compiled(x, residual).clone()
        torch.cuda.synchronize()
        assert torch.equal(residual, stored)
        assert rel_err(y, ref) < 2e-2


def test_fused_custom_op_bumps_the_residual_version_and_rmsnorm_is_forward_only(ops: dict) -> None:
    x, w = torch.randn(4, 32), torch.rand(32) + 0.5
    residual = torch.randn(4, 32)
    before = residual._version
    torch.ops.flyreg.fused_add_rmsnorm(x, residual, w, 1e-6)
    assert residual._version > before  # autograd can tell the residual was overwritten
    with torch.inference_mode():  # inference tensors have no version counter: still runs
        r = torch.randn(4, 32)
        y = torch.ops.flyreg.fused_add_rmsnorm(torch.randn(4, 32), r, w, 1e-6)
        assert y.shape == (4, 32)
    leaf = torch.randn(4, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="argument 'x' requires grad, but rmsnorm has no backward"):
        torch.ops.flyreg.rmsnorm(leaf, w, 1e-6)  # forward only: refused rather than silently detached
    with torch.no_grad():
        assert torch.ops.flyreg.rmsnorm(leaf, w, 1e-6).shape == (4, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_ops_captured_in_a_cuda_graph_replay_on_new_inputs(ops: dict) -> None:
    n = 4096
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(16, n, device="cuda", dtype=torch.bfloat16, generator=g)
    residual = torch.randn(16, n, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5

    def step() -> torch.Tensor:
        h = torch.ops.flyreg.fused_add_rmsnorm(x, residual, w, 1e-6)
        return torch.ops.flyreg.rmsnorm(h, w, 1e-6)

    start = residual.clone()
    step()  # warm-up outside capture: resolves both keys and binds their launchers
    residual.copy_(start)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):  # new values in the captured buffers, then replay
        gen = torch.Generator(device="cuda").manual_seed(300 + seed)
        x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
        residual.copy_(torch.randn(residual.shape, device="cuda", dtype=residual.dtype, generator=gen))
        before = residual.clone()
        graph.replay()
        torch.cuda.synchronize()
        stored = (before.double() + x.double()).to(residual.dtype)
        assert torch.equal(residual, stored)
        h = stored.double()
        h = (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6) * w.double()).to(x.dtype).double()
        ref = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6) * w.double()
        assert rel_err(out, ref) < 2e-2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="Inductor on the CPU needs a C compiler")
def test_inductor_on_the_cpu_compiles_two_flyreg_ops_with_no_break_and_matches_eager(ops: dict) -> None:
    torch._dynamo.reset()
    block = Block(32, torch.float32)
    compiled = torch.compile(block, fullgraph=True)  # the default backend: Inductor, generating C++
    x, residual = torch.randn(6, 32), torch.randn(6, 32)
    eager_res = residual.clone()
    eager = block(x, eager_res)
    y = compiled(x, residual)
    assert torch.equal(residual, eager_res)
    assert rel_err(y, eager) < 1e-5
