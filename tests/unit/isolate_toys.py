"""Timing functions for the isolation tests, importable by a spawned worker."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from flyreg import Config


def toy_timer(marker: str) -> Callable[[Config], float]:
    """``time(config)``: MODE "ok" returns COST, "abort" aborts the process, "hang" never returns,
    "raise" raises; every call appends the worker's pid to ``marker``."""

    def time_config(config: Config) -> float:
        with open(marker, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        mode = config.kwargs["MODE"]
        if mode == "abort":
            os.abort()
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("illegal value for this config")
        if mode == "slow":
            time.sleep(float(config.kwargs["COST"]))
        return float(config.kwargs["COST"])

    return time_config


def broken_setup() -> Callable[[Config], float]:
    raise ImportError("no such kernel library")
