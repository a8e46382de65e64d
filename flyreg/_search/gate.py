"""The correctness gate: the reference's result, and whether a candidate's output matches it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from flyreg._core.launch import arg_name

#: (rtol, atol) by the output's dtype; outputs are compared in float64 on the output's device.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (4e-3, 2e-3),
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-9),
}


def mismatch(out: Any, ref: Any, where: str = "output") -> str | None:
    """Why ``out`` differs from ``ref`` beyond the tolerance of ``out``'s dtype, or None if it matches."""
    if isinstance(ref, torch.Tensor):
        if not isinstance(out, torch.Tensor):
            return f"{where} is {type(out).__name__}, expected a tensor"
        if out.shape != ref.shape:
            return f"{where} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        ref = ref.detach().to(out.device)  # compare where the output lives: no host round trip
        if not out.is_floating_point():
            return None if torch.equal(out, ref.to(out.dtype)) else f"{where} differs"
        rtol, atol = TOLERANCES.get(out.dtype, (1e-2, 1e-2))
        a = out.detach().double()
        b = ref.double()
        if torch.isnan(a).any() and not torch.isnan(b).any():
            return f"{where} has NaN"
        bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            err = (a - b).abs().nan_to_num(float("inf")).max().item()
            return f"{where}: {int(bad.sum())} of {a.numel()} elements off (max abs error {err:.3g})"
        return None
    if isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            return f"{where} is not a sequence of {len(ref)}"
        for i, (o, r) in enumerate(zip(out, ref)):
            why = mismatch(o, r, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(ref, Mapping):
        if not isinstance(out, Mapping) or set(out) != set(ref):
            return f"{where} is not a mapping with keys {sorted(map(str, ref))}"
        for k in ref:
            why = mismatch(out[k], ref[k], f"{where}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(out, torch.Tensor):
        return f"{where} is a tensor, expected {type(ref).__name__} {ref!r}"
    return None if out == ref else f"{where} is {out!r}, expected {ref!r}"


def run_reference(reference: Callable[[tuple[Any, ...], dict[str, Any]], Any], arg_names: Sequence[str],
                  args: tuple[Any, ...], kwargs: dict[str, Any], snapshot: dict[str, torch.Tensor],
                  zeroed: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
    """The reference's result, and the in-place tensors it changed (name -> their state after it).

    It gets the call's arguments with each in-place tensor swapped for a private copy: a
    restored one for ``restore_value``, a zeroed one for ``reset_to_zero``.
    """
    copies = {n: t.clone() for n, t in snapshot.items()}
    copies.update({n: torch.zeros_like(t) for n, t in zeroed.items()})
    before = {n: c.clone() for n, c in copies.items()}
    ref_args = tuple(copies.get(arg_name(arg_names, i), a) for i, a in enumerate(args))
    ref_kwargs = {k: copies.get(k, v) for k, v in kwargs.items()}
    ref = _detach(reference(ref_args, ref_kwargs))  # it may return a copy it updated in place
    changed = {n: c for n, c in copies.items() if not torch.equal(c, before[n])}
    return ref, changed


def _detach(value: Any) -> Any:
    """A copy of ``value``'s tensors, so restoring or zeroing the inputs cannot change it."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value) if type(value) in (tuple, list) else [_detach(v) for v in value]
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value
