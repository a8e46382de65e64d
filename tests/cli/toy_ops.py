"""A toy op for the report and record tests, installed as a fake distribution ``toy-ops``.

``toyscale``: ``out = 2 x``, ``CHUNK`` elements at a time. Every config is offered for every spec,
so an artifact tuned for one ``n`` serves its neighbours along the ordered axis ``n`` (a nearest
artifact); the ``dtype`` axis is not ordered, so another dtype gets the default. It states its
work in bytes and flops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_harness import fake_distribution

NAME = "toy-ops"
ENTRY_POINTS = "[flyreg.ops]\ntoyscale = flyreg_toy_ops.toyscale\n"
MODULE = '''
"""toyscale: out = 2 x, CHUNK elements at a time."""
import torch

from flyreg.plugin import Axis, Config, OpRecord, Work, hookimpl

CHUNKS = (64, 256, 1024)


@hookimpl
def specialize(args, kwargs):
    x = args[0]
    return {"n": x.numel(), "dtype": str(x.dtype).removeprefix("torch.")}


@hookimpl
def build(config, spec):
    chunk = config.kwargs["CHUNK"]

    def launch(x):
        out = torch.empty_like(x)
        flat, dst = x.view(-1), out.view(-1)
        for i in range(0, flat.numel(), chunk):
            torch.mul(flat[i:i + chunk], 2, out=dst[i:i + chunk])
        return out

    return launch


@hookimpl
def configs(spec):
    return [Config({"CHUNK": c}) for c in CHUNKS]


@hookimpl
def default(spec):
    return Config({"CHUNK": 256})


@hookimpl
def workloads(device):
    return [{"n": n, "dtype": "float32"} for n in (256, 4096)]


@hookimpl
def make_inputs(spec, device):
    return (torch.randn(spec["n"], dtype=getattr(torch, spec["dtype"]), device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0].double() * 2


@hookimpl
def work(spec):
    size = getattr(torch, spec["dtype"]).itemsize
    return Work(bytes=2 * spec["n"] * size, flops=spec["n"])


@hookimpl
def describe():
    return OpRecord(description="out = 2 x, CHUNK elements at a time", version="1", structural=["CHUNK"],
                    arg_names=["x"], axes=[Axis("n", int, ordered=True), Axis("dtype", str, values=("float32", "float64"))])
'''


def toy_site(root: Path) -> Path:
    """The site dir of the fake distribution ``toy-ops`` under ``root``."""
    return fake_distribution(root, NAME, ENTRY_POINTS,
                             {"flyreg_toy_ops/__init__.py": "", "flyreg_toy_ops/toyscale.py": MODULE})


NAP_NAME = "nap-ops"
NAP_ENTRY_POINTS = "[flyreg.ops]\ntoynap = flyreg_nap_ops.toynap:OP\n"
#: The sleep of each config (ms): well apart, so even a loaded machine times them in this order.
NAPS = (1, 6, 18)
NAP_DEFAULT = 6
NAP_MODULE = '''
"""toynap: out = 2 x after a nap of NAP ms (configs differ in time by their naps alone)."""
import time

import torch

from flyreg.plugin import Axis, Config, OpRecord, hookimpl

NAPS = %r
DEFAULT = %r


class _Nap:
    @hookimpl
    def specialize(self, args, kwargs):
        return {"n": args[0].numel()}

    @hookimpl
    def build(self, config, spec):
        nap = config.kwargs["NAP"] / 1000

        def launch(x):
            time.sleep(nap)
            return x * 2

        return launch

    @hookimpl
    def configs(self, spec):
        return [Config({"NAP": n}) for n in NAPS]

    @hookimpl
    def default(self, spec):
        return Config({"NAP": DEFAULT})

    @hookimpl
    def workloads(self, device):
        return [{"n": n} for n in (64, 4096)]

    @hookimpl
    def make_inputs(self, spec, device):
        return (torch.randn(spec["n"], device=device),), {}

    @hookimpl
    def reference(self, args, kwargs):
        return args[0].double() * 2

    @hookimpl
    def describe(self):
        return OpRecord(description="out = 2 x after a nap", version="1", arg_names=["x"],
                        axes=[Axis("n", int, ordered=True)])


OP = _Nap()
''' % (NAPS, NAP_DEFAULT)


def nap_site(root: Path) -> Path:
    """The site dir of the fake distribution ``nap-ops`` (op ``toynap``) under ``root``."""
    return fake_distribution(root, NAP_NAME, NAP_ENTRY_POINTS,
                             {"flyreg_nap_ops/__init__.py": "", "flyreg_nap_ops/toynap.py": NAP_MODULE})


def nap_artifact_like(template: dict[str, Any], directory: Path, n: int, nap: int, device: str | None = None,
                      torch_version: str | None = None) -> Path:
    """A copy of the toynap artifact ``template`` for spec ``n`` with config ``NAP=nap`` (on ``device``, tuned with
    torch ``torch_version``), named by its content."""
    data = json.loads(json.dumps(template))
    data["spec"], data["config"]["kwargs"] = {"n": n}, {"NAP": nap}
    if device is not None:
        data["device"]["name"] = device
    if torch_version is not None:
        data["provenance"]["toolchain"]["torch"] = torch_version
    path = directory / f"toynap,n={n},device_name={data['device']['name']}.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def shipped_naps(directory: Path) -> None:
    """From the one toynap artifact tuned into ``directory``: n=64 with the fastest config, n=128 with the slowest,
    n=256 with the fastest tuned on another product of this arch, n=512 with the fastest tuned with another torch."""
    (tuned,) = directory.glob("toynap,*.json")
    template = json.loads(tuned.read_text(encoding="utf-8"))
    tuned.unlink()
    nap_artifact_like(template, directory, 64, NAPS[0])
    nap_artifact_like(template, directory, 128, NAPS[-1])
    nap_artifact_like(template, directory, 256, NAPS[0], device="Other_CPU_9000")
    nap_artifact_like(template, directory, 512, NAPS[0], torch_version="0.0.1")
