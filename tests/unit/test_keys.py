"""The persistent key of a call: every axis changes it; keyword order does not.

Each key is what a search stores its winner under in the scratch cache (read back as the documented table);
two calls share a key exactly when a new tuner serves the second from the first's entry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config

from cpu_kernels import FAST, chunked_double
from on_disk import cache_entries, latest_cache_key


def keyed_op(spec: dict[str, Any] | None = None, *, version: str = "1", env: tuple[str, ...] = (),
             name: str = "op") -> Any:
    """A tuner whose calls take tensors by keyword and specialize to ``spec`` (default ``{"n": 64}``)."""
    return flyreg.autotune_builder(name, lambda config, spec: (lambda **tensors: None),
                                   lambda **tensors: spec if spec is not None else {"n": 64}, [Config({"K": 1})],
                                   version=version, key_env=env, build_cache=BuildCache(), warmup=0, rep=1)


def key_of(tensors: dict[str, torch.Tensor], spec: dict[str, Any] | None = None, *, version: str = "1",
           env: tuple[str, ...] = ()) -> str:
    """The key a search of a call with these keyword tensors stores its winner under."""
    keyed_op(spec, version=version, env=env).tune(**tensors, emit=False)
    return latest_cache_key("op")


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(64, 32)


def test_an_entry_records_what_its_key_holds(x: torch.Tensor) -> None:
    key_of({"x": x})
    ((_, entry),) = cache_entries("op").items()
    assert entry["spec"] == {"n": 64} and entry["toolchain"]["op"] == "1"
    assert entry["device"]["name"] and entry["device"]["arch"].startswith("cpu-")


def test_spec_values_and_axes_change_the_key(x: torch.Tensor) -> None:
    base = key_of({"x": x}, {"n": 64})
    assert key_of({"x": x}, {"n": 128}) != base
    assert key_of({"x": x}, {"m": 64}) != base
    assert key_of({"x": x}, {"n": 64, "eps": 1e-6}) != base
    assert key_of({"x": x}, {"n": 64.0}) != base  # JSON keeps 64 and 64.0 apart
    assert key_of({"x": x}, {"n": 64}) == base


def test_dtype_changes_the_key(x: torch.Tensor) -> None:
    keys_ = {key_of({"x": x.to(dt)}) for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
    assert len(keys_) == 4


def test_stride_pattern_changes_the_key(x: torch.Tensor) -> None:
    big = torch.randn(64, 64)
    layouts = {
        "contiguous": x,
        "broadcast": torch.randn(32).expand(64, 32),
        "strided": big[:, ::2],
        "transposed": torch.randn(32, 64).t(),
    }
    found = {name: key_of({"x": t}) for name, t in layouts.items()}
    assert len(set(found.values())) == len(layouts), found
    # The same pattern with other sizes and strides is the same key: the pattern is the axis.
    assert key_of({"x": torch.randn(64, 64)[:, ::4]}) == found["strided"]
    assert key_of({"x": torch.randn(8).expand(3, 8)}) == found["broadcast"]
    assert key_of({"x": torch.randn(16, 8)}) == found["contiguous"]


def test_op_version_changes_the_key(x: torch.Tensor) -> None:
    assert key_of({"x": x}, version="2") != key_of({"x": x})


#: A process that forks one child per toolchain variant (a JSON list of {distribution: version} overrides: what
#: that child sees installed) and in each searches a torch spec and a Triton spec of one op; each child prints
#: the JSON {backend: the key its winner was stored under}, one line per variant.
TOOLCHAINS = """
import importlib.metadata, json, os, sqlite3, sys
import torch
import flyreg
from flyreg import Config


def keys(overrides):
    real = importlib.metadata.version
    importlib.metadata.version = lambda name: overrides.get(name) or real(name)
    out = {}
    for backend in ("cpu", "triton"):
        op = flyreg.autotune_builder("op", lambda c, s: (lambda x: None), lambda x, b=backend: {"n": 64, "backend": b},
                                     [Config({"K": 1})], warmup=0, rep=1)
        op.tune(torch.zeros(1), emit=False)
        path = os.path.join(os.environ["FLYREG_CACHE_DIR"], "flyreg-cache.sqlite3")
        with sqlite3.connect(path) as conn:
            out[backend] = conn.execute("SELECT key FROM entries ORDER BY updated DESC LIMIT 1").fetchone()[0]
    print(json.dumps(out), flush=True)


for overrides in json.loads(sys.argv[1]):
    if os.fork() == 0:
        code = 1
        try:
            keys(overrides)
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.wait()[1]) == 0
"""


def test_only_the_toolchain_a_backend_depends_on_changes_its_key() -> None:
    import importlib.metadata

    variants = [{}, {"torch": importlib.metadata.version("torch") + "+other"}, {"triton": "99.0"}]
    done = subprocess.run([sys.executable, "-c", TOOLCHAINS, json.dumps(variants)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    base, other_torch, other_triton = (json.loads(line) for line in done.stdout.splitlines())
    assert other_torch["cpu"] != base["cpu"]  # a torch kernel depends on torch...
    assert other_triton["cpu"] == base["cpu"]  # ...and installing another Triton keeps its entries
    assert other_triton["triton"] != base["triton"]  # a Triton kernel depends on Triton...
    assert other_torch["triton"] == base["triton"]  # ...not on torch


def test_declared_env_var_changes_the_key(x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYREG_TEST_VARIANT", raising=False)
    unset = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    a = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "b")
    b = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    assert len({unset, a, b}) == 3
    monkeypatch.setenv("UNDECLARED_VARIABLE", "x")
    assert key_of({"x": x}, env=("FLYREG_TEST_VARIANT",)) == b


def test_keyword_order_does_not_change_the_key(x: torch.Tensor) -> None:
    w = torch.randn(32, dtype=torch.float16)
    assert key_of({"x": x, "w": w}) == key_of({"w": w, "x": x})
    assert key_of({"x": x, "w": w}) != key_of({"x": w, "w": x})  # but names stay bound to their tensor


def test_non_tensors_are_not_layout_axes(x: torch.Tensor) -> None:
    def op() -> Any:
        return flyreg.autotune_builder("scalars", lambda c, s: (lambda x, **rest: None), lambda x, **rest: {"n": 64},
                                       [Config({"K": 1})], build_cache=BuildCache(), warmup=0, rep=1)

    op()(x)
    for rest in ({"n": 3}, {"eps": 1e-6}, {"name": "a"}):
        assert op().resolve(x, **rest).source == "cache"  # the scalars outside the spec leave the key alone
    assert len(cache_entries("scalars")) == 1


@pytest.mark.parametrize("spec, error, match", [
    ({"shape": (1, 2)}, TypeError, r"shape.*JSON scalar"),
    ({"t": torch.tensor(1)}, TypeError, r"'t'.*JSON scalar"),
    ({"n": float("nan")}, ValueError, "finite"),
    ({1: 2}, TypeError, "axis names"),
    ([("n", 1)], TypeError, "dict"),
])
def test_a_bad_spec_is_a_clear_error(spec: Any, error: type[Exception], match: str) -> None:
    tuner = flyreg.autotune_builder("bad_spec", lambda c, s: (lambda x: None), lambda x: spec, [Config({"K": 1})],
                                    build_cache=BuildCache(), warmup=0, rep=1)
    with pytest.raises(error, match=match):
        tuner(torch.zeros(1))


@pytest.mark.parametrize("name", ["NVIDIA H200", "a/../b", "x:y*z", "ü", ".hidden"])
def test_an_op_name_becomes_a_safe_artifact_name(name: str, tmp_path: Path) -> None:
    tuner = flyreg.autotune_builder(name, lambda c, s: (lambda x: None), lambda x: {"n": 1}, [Config({"K": 1})],
                                    build_cache=BuildCache(), warmup=0, rep=1)
    path = Path(str(tuner.tune(torch.zeros(1), out_dir=tmp_path).artifact))
    assert path.parent == tmp_path and not path.name.startswith(".")
    assert all(c.isascii() and (c.isalnum() or c in "._=,-") for c in path.name)
    assert json.loads(path.read_text())["op"] == name


# -- the keys inside a tuner ---------------------------------------------------------------


def _tuner(key_env: tuple[str, ...] = ()) -> tuple[Any, list[int]]:
    launches: list[int] = []

    def specialize(x: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
        return {"n": int(x.shape[0])}

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]

        def launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            launches.append(chunk)
            return chunked_double(x * w, torch.empty_like(x), chunk)

        return launch

    tuner = flyreg.autotune_builder("keyed", build, specialize, [Config({"CHUNK": c}) for c in (4, 64)],
                                    key_env=key_env, build_cache=BuildCache(), **FAST)
    return tuner, launches


def test_tuner_keyword_order_is_one_key(x: torch.Tensor) -> None:
    w = torch.randn(32)
    tuner, _ = _tuner()
    first = tuner(x=x, w=w)
    assert tuner.stats.searches == 1
    second = tuner(w=w, x=x)
    assert tuner.stats.searches == 1
    assert torch.equal(first, second)
    assert tuner.resolve(w=w, x=x).source == "memory"
    assert tuner.resolve(x, w).source == "memory"  # positional names are the same axes


def test_tuner_layout_is_a_new_resolution(x: torch.Tensor) -> None:
    tuner, _ = _tuner()
    w = torch.randn(32)
    tuner(x, w)
    tuner(x, torch.randn(32))  # same spec and layout: a memory hit
    assert tuner.stats.searches == 1
    tuner(x, torch.randn(1).expand(32))  # w broadcast: another key
    assert tuner.stats.searches == 2
    tuner(x.to(torch.float64), w.to(torch.float64))
    assert tuner.stats.searches == 3


def test_env_change_is_a_new_resolution(x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(32)
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    tuner, _ = _tuner(key_env=("FLYREG_TEST_VARIANT",))
    tuner(x, w)
    tuner(x, w)
    assert tuner.stats.searches == 1
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "b")
    assert tuner.resolve(x, w).source == "search"
    tuner(x, w)
    assert tuner.stats.searches == 2
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    assert tuner.resolve(x, w).source == "memory"
    assert tuner.stats.searches == 2
    assert len(cache_entries("keyed")) == 2


def plain_op() -> Any:
    return flyreg.autotune_builder("plain", lambda c, s: (lambda x: None), lambda x: {"n": 1}, [Config({"K": 1})],
                                   lambda spec: Config({"K": 1}), build_cache=BuildCache(), warmup=0, rep=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cuda_identity_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        plain_op().resolve_spec({"n": 1}, "cuda:0")


@pytest.mark.parametrize("device", ["gpu", torch.device("meta"), "meta", "cuda:x", "mps", "", -1, 1.5, True,
                                    object()])
def test_bad_devices_are_clear_value_errors(device: Any) -> None:
    with pytest.raises(ValueError, match="device") as info:
        plain_op().resolve_spec({"n": 1}, device)
    assert repr(device) in str(info.value)  # it names the device it was given


def test_cpu_spellings_are_one_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain_op().tune(torch.zeros(1), out_dir=tmp_path)  # an artifact for this CPU
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(tmp_path))
    for device in ("cpu", "cpu:0", torch.device("cpu"), None):
        assert plain_op().resolve_spec({"n": 1}, device).source in ("cache", "offline")
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "empty_cache"))
    for device in ("cpu", "cpu:0", torch.device("cpu"), None):
        assert plain_op().resolve_spec({"n": 1}, device).source == "offline"


#: A process with two fake CUDA devices (an H200 and an A100; ``torch.cuda.set_device`` switches the current
#: one) that prints the device ``flyreg show`` resolves for each of its arguments, one JSON line each (or the
#: error line).
FAKE_CUDA = """
import importlib.metadata, json, sys, types
import torch
import flyreg
from flyreg import Config, hookimpl

state = {"current": 0}
props = [types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0),
         types.SimpleNamespace(name="NVIDIA A100", major=8, minor=0)]
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 2
torch.cuda.current_device = lambda: state["current"]
torch.cuda.set_device = lambda i: state.update(current=i)
torch.cuda.get_device_properties = lambda i: props[i]
torch.version.hip = None


class Plain:
    @hookimpl
    def specialize(self, args, kwargs):
        return {"n": 1}

    @hookimpl
    def build(self, config, spec):
        return lambda x: x

    @hookimpl
    def configs(self, spec):
        return [Config({"K": 1})]

    @hookimpl
    def default(self, spec):
        return Config({"K": 1})


flyreg.register(Plain(), "plain")
main = next(iter(importlib.metadata.entry_points(group="console_scripts", name="flyreg"))).load()
for device in sys.argv[1:]:
    if device.startswith("set:"):
        torch.cuda.set_device(int(device[4:]))
        continue
    try:
        main(["show", "plain", "--spec", "n=1", "--device", device, "--json"])
    except SystemExit:
        pass
    sys.stdout.flush()
"""


def test_current_cuda_device_is_read_on_every_call() -> None:
    argv = ["cuda", "cuda:0", "set:1", "cuda", "cuda:0", "cuda:1", "cuda:2"]
    done = subprocess.run([sys.executable, "-c", FAKE_CUDA, *argv], capture_output=True, text=True, timeout=120)
    decoder, text, shown = json.JSONDecoder(), done.stdout, []
    while text.strip():
        (row,), end = decoder.raw_decode(text.lstrip())
        shown.append((row["device"]["name"], row["device"]["arch"]))
        text = text.lstrip()[end:]
    h200, a100 = ("NVIDIA_H200", "sm_90"), ("NVIDIA_A100", "sm_80")
    assert shown == [h200, h200, a100, h200, a100]  # "cuda" is the current device, read on every call
    assert "'cuda:2': no such device; this machine has 2 CUDA device(s)" in done.stderr
