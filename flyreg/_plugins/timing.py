"""What a candidate worker process times: an op's config on inputs its ``make_inputs`` hook makes."""

from __future__ import annotations

from collections.abc import Callable

from flyreg._core.config import Config, JSONScalar
from flyreg._plugins.registry import REGISTRY


def op_config_timer(op: str, spec: dict[str, JSONScalar], device: str) -> Callable[[Config], float]:
    """``time(config) -> ms`` for ``op`` on ``spec``: the inputs are made once, each config is checked
    and timed as a search would (see :func:`flyreg._search.isolate.WorkerEvaluator`)."""
    tuner = REGISTRY.tuner(op)
    args, kwargs = REGISTRY.plugin(op).make_inputs(spec, device)

    def time_config(config: Config) -> float:
        return tuner.time_config(config, *args, **kwargs)

    return time_config
