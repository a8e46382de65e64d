"""The RMSNorm ops as torch custom ops, for ``torch.compile``: ``torch.ops.flyreg.rmsnorm`` and
``torch.ops.flyreg.fused_add_rmsnorm``.

Importing this module (or calling :func:`register_torch_ops`) registers them; importing
``flyreg_rmsnorm`` does not. Each op's real implementation calls the flyreg tuner of the op of
the same name (``flyreg.op("rmsnorm")``), so scratch-cache entries, offline artifacts and
defaults apply exactly as in eager code; its fake (meta) implementation only allocates the
output, so ``torch.compile`` traces through it with no graph break::

    from flyreg_rmsnorm.torch_ops import register_torch_ops

    register_torch_ops()
    y = torch.ops.flyreg.rmsnorm(x, weight, 1e-6)
    y = torch.ops.flyreg.fused_add_rmsnorm(x, residual, weight, 1e-6)  # residual += x, in place

Cost: the ops are defined with ``torch.library.Library`` (a schema and one
CompositeExplicitAutograd kernel), not ``torch.library.custom_op``, whose Python wrapper
layers cost about 25 us per eager call on the H200's host. The dispatcher then calls the
tuner directly; ``benchmarks/launch_overhead.py`` measures what is left. Inside a compiled
graph replayed through CUDA graphs the dispatch cost is paid at capture only.

Forward only: no autograd formula is registered. A backward through an op's output warns
that no autograd kernel is registered and passes no gradient to its inputs (their ``.grad``
stays None); an Autograd-key kernel that raised instead would run Python on every eager call.
The in-place write to ``residual`` bumps its version counter, so autograd still refuses a
backward through a graph that saved the old residual.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

NAMESPACE = "flyreg"
OPS = ("rmsnorm", "fused_add_rmsnorm")

_lock = threading.Lock()
_defs: dict[str, Any] = {}
_libs: list[Any] = []
_tuners: dict[str, Any] = {}


def _tuner(name: str) -> Any:
    """The flyreg tuner of op ``name``, looked up in the registry once per process."""
    tuner = _tuners.get(name)
    if tuner is None:
        import flyreg

        tuner = _tuners[name] = flyreg.op(name)
    return tuner


def _fake_output(x: torch.Tensor) -> torch.Tensor:
    # The real kernels return a new contiguous tensor of x's shape and dtype on x's device.
    return x.new_empty(x.shape)


#: Schemas: ``Tensor(a!)`` marks the residual as written in place.
SCHEMAS = {
    "rmsnorm": "rmsnorm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor",
    "fused_add_rmsnorm": "fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps=1e-06) -> Tensor",
}


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight``, computed by flyreg's tuned kernel."""
    return _tuner("rmsnorm")(x, weight, eps)


def _fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6) -> torch.Tensor:
    """``residual += x`` in place, then the RMSNorm of the stored residual, by flyreg's tuned kernel."""
    y = _tuner("fused_add_rmsnorm")(x, residual, weight, eps)
    if not residual.is_inference():  # what custom_op's ADInplaceOrView kernel did: autograd sees the write
        torch.autograd.graph.increment_version(residual)
    return y


def _rmsnorm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _fake_output(x)


def _fused_add_rmsnorm_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6) -> torch.Tensor:
    return _fake_output(x)


def register_torch_ops() -> dict[str, Any]:
    """Register ``torch.ops.flyreg.rmsnorm`` and ``torch.ops.flyreg.fused_add_rmsnorm`` (once per process).

    Returns the op packets (``torch.ops.flyreg.<name>``) by name. Raises RuntimeError on a torch
    without ``torch.library.register_fake`` (torch < 2.4).
    """
    with _lock:
        if _defs:
            return dict(_defs)
        register_fake = getattr(torch.library, "register_fake", None)
        if register_fake is None:
            raise RuntimeError(f"flyreg torch ops need torch.library.register_fake (torch >= 2.4); "
                               f"this is torch {torch.__version__}")
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        impls = {"rmsnorm": (_rmsnorm, _rmsnorm_fake), "fused_add_rmsnorm": (_fused_add_rmsnorm, _fused_add_rmsnorm_fake)}
        for name, (impl, fake) in impls.items():
            lib.define(SCHEMAS[name])
            lib.impl(name, impl, "CompositeExplicitAutograd")
            register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        _libs.append(lib)  # the registrations live as long as the Library object
        _defs.update((name, getattr(getattr(torch.ops, NAMESPACE), name)) for name in OPS)
        return dict(_defs)


register_torch_ops()
