#!/bin/bash
# The wheels the device lacks (platformdirs, pluggy 1.7; carried in .whl/) installed into the environment (the
# CLI tests' subprocesses drop PYTHONPATH), checked from a process without PYTHONPATH; then the core and both plugins.
python3 -m pip install -q --no-index --no-deps .whl/*.whl || python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl
env -u PYTHONPATH python3 -c "import platformdirs, pluggy, sys; print(sys.executable, 'pluggy', pluggy.__version__)" || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/flyreg-moe -e plugins/flyreg-rmsnorm 2>&1 | { grep -v WARN || true; }
exit "${PIPESTATUS[0]}"
