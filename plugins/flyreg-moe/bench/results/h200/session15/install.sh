#!/bin/bash
# The wheels the device lacks (platformdirs, pluggy 1.7; carried in .whl/), then the core and both plugins.
python3 -m pip install -q --no-index --no-deps .whl/*.whl  # into the environment: the CLI tests' subprocesses drop PYTHONPATH
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/flyreg-moe -e plugins/flyreg-rmsnorm 2>&1 | grep -v WARN
