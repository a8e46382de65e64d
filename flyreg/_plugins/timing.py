"""What worker processes run for a registered op: an isolated tune's benchmarking worker and compile
task, and a config timer. Each makes the op's inputs itself, with its ``make_inputs`` hook."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import FlyregWarning
from flyreg._core.results import CallKey, TunerStats
from flyreg._core.search_terms import Call
from flyreg._core.spec import canonical_spec, spec_text
from flyreg._plugins import registry
from flyreg._runtime.tuner import Autotuner, call_of
from flyreg._search.candidates import Measured
from flyreg._search.in_process import evaluating
from flyreg._search.worker import WorkerUnusable

#: The call made last in this process, by (op, spec text, device): a worker serves one spec at a time.
_made: dict[tuple[str, str, str], tuple[Autotuner, CallKey, Call, dict[str, JSONScalar]]] = {}


def tuned_spec(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], device: str) -> dict[str, JSONScalar]:
    """The spec ``specialize()`` gives the call, checked against the op's axes, as an artifact names it."""
    plugin = registry.REGISTRY.plugin(op)
    return canonical_spec(plugin.check_spec(canonical_spec(plugin.specialize(args, kwargs),
                                                           f"{op}: specialize() result"), device))


def _op_call(op: str, spec: dict[str, JSONScalar], device: str) -> tuple[Autotuner, CallKey, Call,
                                                                          dict[str, JSONScalar]]:
    """The op's tuner, the key and call of the inputs ``make_inputs`` makes of ``spec``, and their tuned spec."""
    key = (op, spec_text(spec), device)
    if key not in _made:
        _made.clear()
        tuner = registry.REGISTRY.tuner(op)
        args, kwargs = registry.REGISTRY.plugin(op).make_inputs(dict(spec), device)
        _hand_back(device)  # the last spec's inputs and make_inputs' temporaries
        ck, call = call_of(tuner, args, kwargs)
        _made[key] = (tuner, ck, call, tuned_spec(op, args, kwargs, device))
    return _made[key]


class OpBench:
    """The benchmarking worker of an isolated tune of ``op`` on ``spec``: ``bench(config, **options)`` is
    :meth:`InProcessEvaluator.measure <flyreg._search.in_process.InProcessEvaluator.measure>` on the
    inputs ``make_inputs`` makes, kept for the worker's life. ``info`` is what the tune needs of the
    call: its ``spec`` and scratch-cache key ``pkey``, and the ``tuned`` spec an artifact names."""

    def __init__(self, op: str, spec: dict[str, JSONScalar], device: str) -> None:
        warnings.simplefilter("ignore", FlyregWarning)  # the tune reports each failure itself
        tuner, ck, call, tuned = _op_call(op, spec, device)
        self.info = {"spec": ck.spec, "pkey": ck.pkey, "tuned": tuned}
        self._device = torch.device(device)

        def build(config: Config) -> object:
            return tuner.build_cache.get(tuner.name, config, ck.spec, tuner.structural, tuner.build)

        self._stack = contextlib.ExitStack()
        self._evaluate = self._stack.enter_context(evaluating(
            tuner.settings, ck.spec, call, build, lambda c: tuner.bind(c, ck.spec, call.args, call.kwargs),
            TunerStats(), None))

    def __call__(self, config: Config, **options: Any) -> Measured:
        measured = self._evaluate.measure(config, **options)
        if measured.result is None and self._device.type == "cuda" and not _cuda_usable(self._device):
            first = (measured.error or "failed").strip().splitlines()[0]  # torch appends debugging hints
            raise WorkerUnusable(f"{first} (it left the worker's CUDA context unusable)")
        return measured


def _cuda_usable(device: torch.device) -> bool:
    """False once a CUDA error (an illegal memory access, a device-side assert) has poisoned this process's
    context on ``device``."""
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        return False
    return True


def compile_config(op: str, spec: dict[str, JSONScalar], device: str, config: dict[str, JSONScalar]) -> str | None:
    """In a compile pool process: build ``config`` and bind it to the inputs ``make_inputs`` makes of ``spec``,
    where a backend compiles (a :func:`flyreg.triton.compiled_launcher` fills Triton's on-disk cache);
    returns why it failed, or None. Running out of device memory is no failure of the config (the pool's
    processes each hold the op's inputs): it is left to the benchmarking worker, which builds it itself."""
    try:
        tuner, ck, call, _ = _op_call(op, spec, device)
        tuner.bind(Config.from_json(config), ck.spec, call.args, call.kwargs)
    except Exception as e:  # the config's failure, reported by the search
        if not out_of_memory(e):
            return f"{type(e).__name__}: {e}"
        _hand_back(device)  # what the failed attempt reserved
    return None


def _hand_back(device: str) -> None:
    """Return the device memory this process's allocator holds unused (the pool's processes share one GPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from (a hook's error wraps the hook's), is torch's out of memory."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, torch.cuda.OutOfMemoryError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
