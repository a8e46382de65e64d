"""Wall time of a cold ``flyreg tune`` (empty Triton cache, ``--fresh``, ``--no-isolate``) of one RMSNorm spec,
with the bind as landed (a ``RESCUE_AFTER`` config compiles the rescue-free kernel too, to cap registers:
``triton_kernels._capped``) or with ``--uncapped`` (``_capped`` returns the options unchanged).

    python cold_tune.py [--uncapped] -- rmsnorm --spec ... --device cuda --out DIR --force --fresh --no-isolate
"""

from __future__ import annotations

import runpy
import sys
import time
from typing import Any

from flyreg_rmsnorm import triton_kernels


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--uncapped":
        args = args[1:]

        def uncapped(kernel: Any, grid: Any, a: Any, consts: Any, options: dict[str, Any], device: Any) -> Any:
            return options

        triton_kernels._capped = uncapped
    if args and args[0] == "--":
        args = args[1:]
    sys.argv = ["flyreg", "tune", *args]
    start = time.perf_counter()
    try:
        runpy.run_module("flyreg", run_name="__main__")  # `python -m flyreg tune ...`, in this process
    finally:
        print(f"wall {time.perf_counter() - start:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
