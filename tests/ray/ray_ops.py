"""The test ops of the Ray tests, each the module of a fake third-party distribution.

``paced``: two configs whose calls sleep 0.5 and 2 ms, so the winner is the same whoever times it.
``fragile``: like ``paced``, but its ``specialize()`` adds the axis ``dtype`` to the planned spec;
the first process that tunes spec ``n=3`` kills itself with SIGKILL in the middle of the search
(``FRAGILE_MARKER`` records its pid); every config fails on ``n=4``; every process notes which
spec it makes inputs for in ``FRAGILE_LOG``.
"""

from __future__ import annotations

PACED = '''
import os
import time

import torch

from flyreg import Config, OpRecord, hookimpl


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    delay = config.kwargs["DELAY_US"] / 1e6

    def launch(x):
        time.sleep(delay)
        return x * 2

    return launch


@hookimpl
def configs(spec):
    return [Config({"DELAY_US": 500}), Config({"DELAY_US": 2000})]


@hookimpl
def default(spec):
    return Config({"DELAY_US": 2000})


@hookimpl
def workloads(device):
    return [{"n": n} for n in range(1, int(os.environ.get("PACED_SPECS", "4")) + 1)]


@hookimpl
def make_inputs(spec, device):
    return (torch.randn(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0].double() * 2


@hookimpl
def describe():
    return OpRecord(description="sleeps DELAY_US per call", version="1", structural=["DELAY_US"], arg_names=["x"])
'''

FRAGILE = PACED.replace('''@hookimpl
def build(config, spec):
    delay = config.kwargs["DELAY_US"] / 1e6

    def launch(x):
        time.sleep(delay)
        return x * 2
''', '''def _die_once(spec):
    """The first process to run spec n=3 records its pid and kills itself."""
    marker = os.environ["FRAGILE_MARKER"]
    if spec["n"] != 3:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), 9)


@hookimpl
def build(config, spec):
    delay = config.kwargs["DELAY_US"] / 1e6

    def launch(x):
        time.sleep(delay)
        _die_once(spec)
        if spec["n"] == 4:
            raise RuntimeError("no config runs on n=4")
        return x * 2
''').replace('''@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}
''', '''@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0]), "dtype": str(args[0].dtype).removeprefix("torch.")}
''').replace('''@hookimpl
def make_inputs(spec, device):
''', '''@hookimpl
def make_inputs(spec, device):
    with open(os.environ["FRAGILE_LOG"], "a", encoding="utf-8") as f:
        f.write(f"{spec['n']} {os.getpid()}\\n")
''')
assert FRAGILE.count("_die_once") == 2 and "FRAGILE_LOG" in FRAGILE and '"dtype":' in FRAGILE
