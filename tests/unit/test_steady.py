"""The timing option of a tuner: checked, steady state by default, ``cuda_graph=`` a deprecated alias.

What steady-state timing does with a call's inputs is seen through searches on a GPU, in
``tests/kernels/test_steady_gpu.py``: off CUDA a search times single calls on the call's own inputs.
"""

from __future__ import annotations

from typing import Any

import pytest

from flyreg import Config, autotune_builder


def _tuner(**kw: Any) -> Any:
    return autotune_builder("steady_opts_probe", lambda config, spec: (lambda x: x), lambda x: {"n": 1},
                            [Config({"K": 1})], **kw)


def test_timing_is_checked_and_cuda_graph_is_a_deprecated_alias() -> None:
    assert _tuner().timing == "steady"
    assert _tuner(timing="flushed").timing == "flushed"
    with pytest.raises(ValueError, match="timing must be one of"):
        _tuner(timing="fast")
    with pytest.warns(DeprecationWarning, match="cuda_graph= is deprecated"):
        assert _tuner(cuda_graph=True).timing == "graph"
