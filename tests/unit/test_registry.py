"""The op registry: discovery, isolation of broken plugins, in-process registration, resolution.

The plugins here are real CPU kernels with a tunable knob: ``RowScale`` computes
``out[i, :] = x[i, :] * s[i]`` ``ROWS`` rows per step (one row per step is slow, many rows per
step is fast), and counts every hook call so tests can assert when hooks run.
"""

from __future__ import annotations

import collections
import re
import importlib.metadata
import json
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import flyreg
from flyreg import Config, hookimpl
from flyreg._plugins import registry
from flyreg._runtime.builder import BUILD_CACHE
from flyreg._core.keys import identity_of
from flyreg._artifacts.store import artifact_filename, emit_artifact
from flyreg._plugins.manager import DESCRIBE_KEYS, OpPlugin, PluginError
from flyreg._plugins.registry import OpUnavailableError, Registry, UnknownOpError

ROWS = (1, 16, 256)


class RowScale:
    """out[i, :] = x[i, :] * s[i], ROWS rows per step; with ``buggy``, ROWS=7 is offered and computes x * (s + 1)."""

    def __init__(self, tag: str = "scale", default_rows: int = 16, buggy: bool = False) -> None:
        self.tag = tag
        self.default_rows = default_rows
        self.buggy = buggy
        self.calls: collections.Counter[str] = collections.Counter()

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        self.calls["specialize"] += 1
        x = args[0]
        return {"M": x.shape[0], "N": x.shape[1], "op": self.tag}

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Callable[..., torch.Tensor]:
        self.calls["build"] += 1
        rows = config.kwargs["ROWS"]
        bias = 1 if rows == 7 else 0  # the bug of the buggy config

        def launch(x: torch.Tensor, s: torch.Tensor, out: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            for i in range(0, x.shape[0], rows):
                torch.mul(x[i:i + rows], s[i:i + rows, None] + bias, out=out[i:i + rows])
            return out

        return launch

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        self.calls["configs"] += 1
        return [Config({"ROWS": r}) for r in ROWS] + ([Config({"ROWS": 7})] if self.buggy else [])

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        self.calls["default"] += 1
        return Config({"ROWS": self.default_rows})

    @hookimpl
    def workloads(self) -> list[dict[str, Any]]:
        return [{"M": 256, "N": 32, "op": self.tag}]

    @hookimpl
    def make_inputs(self, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = torch.randn(spec["M"], spec["N"], device=device)
        return (x, torch.rand(spec["M"], device=device), torch.empty_like(x)), {}

    @hookimpl
    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        self.calls["reference"] += 1
        return args[0] * args[1][:, None]

    @hookimpl
    def describe(self) -> dict[str, Any]:
        self.calls["describe"] += 1
        return {"description": f"row scale ({self.tag})", "version": "2", "structural": ["ROWS"],
                "ordered_axes": ["M"], "arg_names": ["x", "s", "out"]}


def inputs(m: int = 64, n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(m, n)
    return x, torch.rand(m), torch.empty_like(x)


@attrs.frozen
class FakeDist:
    name: str
    version: str


@attrs.frozen
class FakeEntryPoint:
    """An entry point of a distribution that is not installed: ``load()`` returns ``target`` (or calls it)."""

    name: str
    dist: FakeDist
    target: Any

    def load(self) -> Any:
        return self.target() if callable(self.target) else self.target


def ep(name: str, target: Any, dist: str = "flyreg-fake", version: str = "1.0") -> FakeEntryPoint:
    return FakeEntryPoint(name, FakeDist(dist, version), target)


@pytest.fixture
def use_registry(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Registry]:
    """Install a fresh registry discovering the given entry points as flyreg's process-wide one."""

    def install(*entry_points: Any) -> Registry:
        reg = Registry(entry_points=lambda: list(entry_points))
        monkeypatch.setattr(registry, "REGISTRY", reg)
        return reg

    BUILD_CACHE.clear()
    return install


@pytest.fixture
def empty_registry(use_registry: Callable[..., Registry]) -> Iterator[Registry]:
    yield use_registry()


def module_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """Write ``source`` as module ``name`` on sys.path; returns the module name."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


GOOD_MODULE = """
    import torch
    from flyreg import Config, hookimpl

    IMPORTS = getattr(__import__("builtins"), "_flyreg_test_imports", [])
    IMPORTS.append(__name__)

    @hookimpl
    def specialize(args, kwargs):
        return {"N": args[0].shape[-1]}

    @hookimpl
    def build(config, spec):
        chunk = config.kwargs["CHUNK"]
        def launch(x, out):
            for j in range(0, x.shape[-1], chunk):
                torch.mul(x[..., j:j + chunk], 2, out=out[..., j:j + chunk])
            return out
        return launch

    @hookimpl
    def configs(spec):
        return [Config({"CHUNK": c}) for c in (4, 64)]

    @hookimpl
    def default(spec):
        return Config({"CHUNK": 64})
"""


# -- in-process registration ---------------------------------------------------------------------

def test_register_call_and_unregister(empty_registry: Registry) -> None:
    plugin = RowScale()
    flyreg.register(plugin, name="rowscale")
    x, s, out = inputs()
    assert flyreg.op("rowscale")(x, s, out) is out
    torch.testing.assert_close(out, x * s[:, None])
    (info,) = flyreg.ops()
    assert (info.name, info.distribution, info.version, info.status) == ("rowscale", "<in-process>", "0", "ok")
    assert (info.description, info.structural, info.error) == ("row scale (scale)", ("ROWS",), None)

    with pytest.raises(ValueError, match="already registered by <in-process>"):
        flyreg.register(RowScale(), name="rowscale")
    flyreg.unregister("rowscale")
    assert flyreg.ops() == []
    with pytest.raises(UnknownOpError):
        flyreg.op("rowscale")
    with pytest.raises(UnknownOpError):
        flyreg.unregister("rowscale")

    # The name is free again, and the new plugin's kernels are built afresh (no stale launchers).
    other = RowScale(tag="again")
    flyreg.register(other, name="rowscale", distribution="my-notebook", version="9")
    flyreg.op("rowscale")(x, s, out)
    assert other.calls["build"] == 1
    assert flyreg.ops()[0].distribution == "my-notebook" and flyreg.ops()[0].version == "9"


def test_register_a_module(empty_registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_plugin(tmp_path, monkeypatch, "flyreg_test_double", GOOD_MODULE)
    module = __import__(name)
    flyreg.register(module, name="double")
    x = torch.randn(3, 100)
    out = flyreg.op("double")(x, torch.empty_like(x))
    torch.testing.assert_close(out, 2 * x)


def test_register_rejects_bad_names_and_classes(empty_registry: Registry) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        flyreg.register(RowScale(), name="")
    with pytest.raises(PluginError, match="class RowScale.*instance"):
        flyreg.register(RowScale, name="cls")
    assert flyreg.ops() == []


def test_in_process_ops_coexist_with_installed_ones() -> None:
    """The real process-wide registry: whatever is installed (rmsnorm, ...) stays listed and untouched."""
    BUILD_CACHE.clear("flyreg_test_inproc")
    before = {i.name: i.status for i in flyreg.ops()}
    flyreg.register(RowScale(), name="flyreg_test_inproc")
    try:
        after = {i.name: i.status for i in flyreg.ops()}
        assert after == {**before, "flyreg_test_inproc": "ok"}
        x, s, out = inputs()
        torch.testing.assert_close(flyreg.op("flyreg_test_inproc")(x, s, out), x * s[:, None])
    finally:
        flyreg.unregister("flyreg_test_inproc")
    assert {i.name: i.status for i in flyreg.ops()} == before


# -- broken plugins ------------------------------------------------------------------------------

class MissingBuild:
    @hookimpl
    def specialize(self, args, kwargs):  # type: ignore[no-untyped-def]
        return {"N": 1}

    @hookimpl
    def configs(self, spec):  # type: ignore[no-untyped-def]
        return [Config({"B": 1})]

    @hookimpl
    def default(self, spec):  # type: ignore[no-untyped-def]
        return Config({"B": 1})


class UnmarkedBuild(MissingBuild):
    def build(self, config, spec):  # type: ignore[no-untyped-def]  # forgot @hookimpl
        return lambda x: x


class WrongArgNames(MissingBuild):
    @hookimpl
    def build(self, cfg, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class WithoutOptional(MissingBuild):
    @hookimpl
    def build(self, config, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class UnknownHook(WithoutOptional):
    @hookimpl
    def buidl(self, config, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class BadDescribeKeys(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"description": "typo", "structual": ["ROWS"]}


class BadDescribeTypes(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"structural": "ROWS"}


class BadDescribeTiming(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"timing": "fastest"}


class DescribeRaises(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        raise RuntimeError("boom in describe")


BROKEN = [
    (MissingBuild, r"lacks required hook\(s\) \['build'\]"),
    (UnmarkedBuild, r"lacks required hook\(s\) \['build'\] \(build not marked with @flyreg.hookimpl\)"),
    (WrongArgNames, r"hook build\(cfg, spec\) takes \['cfg'\], which the hook build\(config, spec\) does not pass"),
    (UnknownHook, r"unknown hook 'buidl'"),
    (BadDescribeKeys, r"unknown keys \['structual'\]"),
    (BadDescribeTypes, r"op 'bad': describe\(\): structural must be a list of names, got 'ROWS'"),
    (BadDescribeTiming, r"describe\(\): timing must be one of \['steady', 'flushed', 'graph'\], got 'fastest'"),
]


@pytest.mark.parametrize(("cls", "message"), BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_register_broken_plugin_raises_and_leaves_others_working(
        empty_registry: Registry, cls: type, message: str) -> None:
    flyreg.register(RowScale(), name="good")
    with pytest.raises(PluginError, match=message):
        flyreg.register(cls(), name="bad")
    assert [i.name for i in flyreg.ops()] == ["good"]
    x, s, out = inputs()
    torch.testing.assert_close(flyreg.op("good")(x, s, out), x * s[:, None])


def test_broken_entry_points_are_isolated(use_registry: Callable[..., Registry], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_plugin(tmp_path, monkeypatch, "flyreg_test_raises_on_import", "raise ImportError('no GPU toolkit')\n")
    good = RowScale()
    use_registry(
        ep("good", good),
        ep("missing_module", importlib.metadata.EntryPoint("m", "flyreg_no_such_module_xyz", "g").load),
        ep("import_fails", importlib.metadata.EntryPoint("m", name, "g").load),
        ep("wrong_args", WrongArgNames()),
        ep("missing_hook", MissingBuild()),
        ep("bad_describe", BadDescribeKeys()),
        ep("describe_raises", DescribeRaises()),
    )
    infos = {i.name: i for i in flyreg.ops()}
    assert {n: i.status for n, i in infos.items()} == {
        "good": "ok", "missing_module": "broken", "import_fails": "broken", "wrong_args": "broken",
        "missing_hook": "broken", "bad_describe": "broken", "describe_raises": "broken"}
    assert "ModuleNotFoundError" in infos["missing_module"].error  # type: ignore[operator]
    assert "ImportError: no GPU toolkit" in infos["import_fails"].error  # type: ignore[operator]
    assert "cfg" in infos["wrong_args"].error  # type: ignore[operator]
    assert "['build']" in infos["missing_hook"].error  # type: ignore[operator]
    assert "structual" in infos["bad_describe"].error  # type: ignore[operator]
    assert "RuntimeError: boom in describe" in infos["describe_raises"].error  # type: ignore[operator]
    assert all(i.distribution == "flyreg-fake" and i.version == "1.0" for i in infos.values())

    with pytest.raises(OpUnavailableError, match=r"op 'import_fails' \(flyreg-fake\) is broken: ImportError"):
        flyreg.op("import_fails")
    with pytest.raises(OpUnavailableError, match="cfg"):
        flyreg.resolve_spec("wrong_args", {"N": 1})
    x, s, out = inputs()
    torch.testing.assert_close(flyreg.op("good")(x, s, out), x * s[:, None])


def test_discovery_is_lazy_and_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = module_plugin(tmp_path, monkeypatch, "flyreg_test_lazy", GOOD_MODULE)
    imports: list[str] = []
    monkeypatch.setattr("builtins._flyreg_test_imports", imports, raising=False)
    reads = collections.Counter[str]()
    real = importlib.metadata.EntryPoint("double", name, registry.GROUP)

    def source() -> list[Any]:
        reads["entry_points"] += 1
        return [ep("double", real.load), ep("scale", RowScale())]

    reg = Registry(entry_points=source)
    monkeypatch.setattr(registry, "REGISTRY", reg)
    assert reads["entry_points"] == 0
    flyreg.op("scale")
    assert reads["entry_points"] == 1 and imports == []  # only the op asked for is imported
    x = torch.randn(2, 8)
    flyreg.op("double")(x, torch.empty_like(x))
    flyreg.ops()
    flyreg.op("double")
    assert reads["entry_points"] == 1 and imports == [name]
    assert flyreg.op("double") is flyreg.op("double")  # one tuner per op


# -- duplicates, disabled and unknown ops ------------------------------------------------------------

def test_duplicate_name_across_distributions_names_both(use_registry: Callable[..., Registry]) -> None:
    use_registry(ep("scale", RowScale(), "flyreg-alpha", "1.0"), ep("scale", RowScale(), "flyreg-beta", "2.0"),
                 ep("rowsum", RowScale(tag="rowsum"), "flyreg-beta", "2.0"))
    infos = {i.name: i for i in flyreg.ops()}
    assert infos["scale"].status == "broken"
    assert "flyreg-alpha" in infos["scale"].error and "flyreg-beta" in infos["scale"].error  # type: ignore[operator]
    assert infos["scale"].distribution == "flyreg-alpha, flyreg-beta"
    with pytest.raises(OpUnavailableError, match="registered by 2 distributions: flyreg-alpha and flyreg-beta"):
        flyreg.op("scale")
    assert infos["rowsum"].status == "ok"  # the rest of both distributions works


def test_same_distribution_twice_on_the_path_is_not_a_duplicate(use_registry: Callable[..., Registry]) -> None:
    use_registry(ep("scale", RowScale(), "flyreg-alpha"), ep("scale", RowScale(), "Flyreg_Alpha"))
    assert [(i.name, i.status) for i in flyreg.ops()] == [("scale", "ok")]


def test_duplicates_via_importlib_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default source reads importlib.metadata.entry_points(group="flyreg.ops") when first used."""
    plugin = RowScale()
    monkeypatch.setitem(sys.modules, "flyreg_test_dup_a", types.SimpleNamespace(op=plugin))
    found = []
    for dist in ("flyreg-one", "flyreg-two"):
        entry = importlib.metadata.EntryPoint("dup", "flyreg_test_dup_a:op", registry.GROUP)
        found.append(entry._for(FakeDist(dist, "0.1")))  # type: ignore[attr-defined]
    found.append(importlib.metadata.EntryPoint("solo", "flyreg_test_dup_a:op", registry.GROUP)._for(
        FakeDist("flyreg-one", "0.1")))  # type: ignore[attr-defined]
    groups: list[str] = []

    def fake_entry_points(**selection: str) -> list[Any]:
        groups.append(selection["group"])
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "REGISTRY", Registry())
    BUILD_CACHE.clear()
    infos = {i.name: i for i in flyreg.ops()}
    assert groups == ["flyreg.ops"]
    assert infos["dup"].status == "broken" and "flyreg-one and flyreg-two" in infos["dup"].error  # type: ignore[operator]
    assert (infos["solo"].status, infos["solo"].distribution, infos["solo"].version) == ("ok", "flyreg-one", "0.1")


def test_disabled_ops(use_registry: Callable[..., Registry], monkeypatch: pytest.MonkeyPatch,
                      tmp_path: Path) -> None:
    name = module_plugin(tmp_path, monkeypatch, "flyreg_test_disabled", GOOD_MODULE)
    imports: list[str] = []
    monkeypatch.setattr("builtins._flyreg_test_imports", imports, raising=False)
    use_registry(ep("double", importlib.metadata.EntryPoint("double", name, registry.GROUP).load),
                 ep("scale", RowScale()), ep("keep", RowScale(tag="keep")))
    monkeypatch.setenv("FLYREG_DISABLE_OPS", " double, scale ,")
    assert {i.name: i.status for i in flyreg.ops()} == {"double": "disabled", "scale": "disabled", "keep": "ok"}
    assert imports == []  # a disabled op's plugin is never imported
    for op in ("double", "scale"):
        with pytest.raises(OpUnavailableError, match=f"op '{op}' is disabled by FLYREG_DISABLE_OPS"):
            flyreg.op(op)
    x, s, out = inputs()
    flyreg.op("keep")(x, s, out)
    monkeypatch.delenv("FLYREG_DISABLE_OPS")
    assert {i.name: i.status for i in flyreg.ops()} == {"double": "ok", "scale": "ok", "keep": "ok"}


def test_unknown_op_lists_known_ops_and_the_closest(use_registry: Callable[..., Registry]) -> None:
    use_registry(ep("rmsnorm", RowScale()), ep("rowscale", RowScale()))
    with pytest.raises(UnknownOpError) as err:
        flyreg.op("rowscal")
    assert str(err.value) == "unknown op 'rowscal'; did you mean 'rowscale'? (known ops: rmsnorm, rowscale)"
    assert isinstance(err.value, LookupError)
    with pytest.raises(UnknownOpError, match="did you mean 'rmsnorm'"):
        flyreg.resolve("RMSNorm")
    with pytest.raises(UnknownOpError, match=r"unknown op 'softmax' \(known ops: rmsnorm, rowscale\)"):
        flyreg.resolve_spec("softmax", {})


def test_unknown_op_with_nothing_registered(empty_registry: Registry) -> None:
    with pytest.raises(UnknownOpError, match=r"known ops: none"):
        flyreg.op("anything")


# -- hook isolation and the steady state -------------------------------------------------------------

def test_a_hook_call_reaches_its_own_op_only(empty_registry: Registry) -> None:
    a, b = RowScale(tag="a", default_rows=1), RowScale(tag="b", default_rows=256)
    flyreg.register(a, name="a")
    flyreg.register(b, name="b")
    assert a.calls["describe"] == b.calls["describe"] == 1
    x, s, out = inputs()
    res_a = flyreg.resolve("a", x, s, out)
    assert (res_a.spec["op"], res_a.config) == ("a", Config({"ROWS": 1}))
    assert sum(b.calls.values()) == 1  # only its own describe
    flyreg.op("a")(x, s, out)
    res_b = flyreg.resolve("b", x, s, out)
    assert (res_b.spec["op"], res_b.config) == ("b", Config({"ROWS": 256}))
    assert a.calls["specialize"] == 2 and b.calls["specialize"] == 1
    assert registry.REGISTRY.plugin("a").pm is not registry.REGISTRY.plugin("b").pm


def test_hooks_run_on_new_keys_only(empty_registry: Registry) -> None:
    plugin = RowScale()
    flyreg.register(plugin, name="rowscale")
    op = flyreg.op("rowscale")
    x, s, out = inputs()
    op(x, s, out)
    first = collections.Counter(plugin.calls)
    assert first["specialize"] == 1 and first["default"] >= 1 and first["build"] == 1
    for _ in range(50):
        op(x, s, out)
    op(torch.randn(64, 32), torch.rand(64), out)  # same key: new tensors, same layout
    assert plugin.calls == first

    x2, s2, out2 = inputs(128)
    op(x2, s2, out2)  # a new key: specialize runs again, and a new spec is built
    assert plugin.calls["specialize"] == 2 and plugin.calls["build"] == 2
    after = collections.Counter(plugin.calls)
    for _ in range(10):
        op(x, s, out)
        op(x2, s2, out2)
    assert plugin.calls == after
    torch.testing.assert_close(out2, x2 * s2[:, None])


# -- resolution sources ----------------------------------------------------------------------------------

def test_resolve_sources(empty_registry: Registry, isolated_dirs: dict[str, Path],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = RowScale(default_rows=1)
    flyreg.register(plugin, name="rowscale")
    x, s, out = inputs(256)
    spec = {"M": 256, "N": 32, "op": "scale"}

    res = flyreg.resolve("rowscale", x, s, out)
    assert (res.source, res.config, res.spec) == ("default", Config({"ROWS": 1}), spec)
    assert flyreg.resolve("rowscale", x, s, out).source == "memory"
    assert flyreg.resolve_spec("rowscale", spec).source == "memory"
    other = flyreg.resolve_spec("rowscale", {"M": 8, "N": 32, "op": "scale"})
    assert (other.source, other.config) == ("default", Config({"ROWS": 1}))
    with pytest.raises(TypeError):
        flyreg.resolve_spec("rowscale", {"M": [1, 2]})

    # FLYREG_AUTOTUNE=1: a new key is searched and its winner emitted into FLYREG_CONFIG_DIR.
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    flyreg.unregister("rowscale")
    flyreg.register(plugin, name="rowscale")
    searched = flyreg.resolve("rowscale", x, s, out)
    assert searched.source == "search"
    assert searched.config != Config({"ROWS": 1})  # one row per step is the slowest by far
    expected = isolated_dirs["configs"] / artifact_filename("rowscale", spec, identity_of(None).name)
    assert searched.path == str(expected) and expected.is_file()
    assert flyreg.op("rowscale").stats.searches == 1
    monkeypatch.delenv("FLYREG_AUTOTUNE")

    # A new tuner in this process: the scratch cache serves it (before the artifact).
    flyreg.unregister("rowscale")
    flyreg.register(plugin, name="rowscale")
    cached = flyreg.resolve("rowscale", x, s, out)
    assert (cached.source, cached.config) == ("cache", searched.config)

    # A new tuner and an empty scratch cache: the artifact serves it, by call or by spec alone.
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(isolated_dirs["cache"] / "empty"))
    for resolve in (lambda: flyreg.resolve_spec("rowscale", spec), lambda: flyreg.resolve("rowscale", x, s, out)):
        flyreg.unregister("rowscale")
        flyreg.register(plugin, name="rowscale")
        offline = resolve()
        assert (offline.source, offline.config, offline.path) == ("offline", searched.config, str(expected))
        assert not offline.stale and not offline.nearest
    # ordered_axes=["M"]: a spec with no artifact borrows the nearest M's.
    near = flyreg.resolve_spec("rowscale", {"M": 300, "N": 32, "op": "scale"})
    assert (near.source, near.nearest, near.config) == ("offline", True, searched.config)
    assert flyreg.op("rowscale").stats.searches == 0


def test_tune_rejects_wrong_configs_with_the_reference(empty_registry: Registry,
                                                       isolated_dirs: dict[str, Path]) -> None:
    plugin = RowScale(buggy=True)
    flyreg.register(plugin, name="rowscale")
    x, s, out = inputs(250)
    with pytest.warns(flyreg.FlyregWarning, match=r"Config\(ROWS=7\) rejected .* wrong result"):
        report = flyreg.op("rowscale").tune(x, s, out)
    assert plugin.calls["reference"] == 1
    assert [c for c, _ in report.rejected] == [Config({"ROWS": 7})]
    assert report.winner in {Config({"ROWS": r}) for r in ROWS} and report.winner != Config({"ROWS": 1})
    timings = {c.kwargs["ROWS"]: r.median for c, r in report.timings}
    assert timings[1] > timings[256]  # the knob really changes the cost
    assert report.artifact is not None and Path(report.artifact).parent == isolated_dirs["configs"]
    torch.testing.assert_close(flyreg.op("rowscale")(x, s, out), x * s[:, None])


def test_describe_keys_reach_the_tuner(empty_registry: Registry, tmp_path: Path,
                                       isolated_dirs: dict[str, Path]) -> None:
    shipped = tmp_path / "shipped"
    spec = {"M": 64, "N": 32, "op": "scale"}
    emit_artifact("described", spec, identity_of(None), Config({"ROWS": 256}), "5", 1.0, 2.0, shipped)

    class Described(RowScale):
        @hookimpl
        def describe(self) -> dict[str, Any]:
            return {"description": "all keys", "version": 5, "structural": ["ROWS"], "restore_value": ["x"],
                    "reset_to_zero": ["out"], "ordered_axes": ["M"], "config_dir": shipped,
                    "key_env": ["FLYREG_TEST_KNOB"], "arg_names": ["x", "s", "out"], "timing": "flushed",
                    "strategy": "exhaustive"}

    assert set(Described().describe()) == DESCRIBE_KEYS
    flyreg.register(Described(), name="described")
    tuner = flyreg.op("described")
    assert (tuner.version, tuner.structural, tuner.arg_names) == ("5", ("ROWS",), ("x", "s", "out"))
    assert (tuner.restore_value, tuner.reset_to_zero, tuner.key_env) == (("x",), ("out",), ("FLYREG_TEST_KNOB",))
    assert tuner.timing == "flushed" and tuner.settings.strategy == "exhaustive"
    assert shipped in tuner.offline.dirs()
    res = flyreg.resolve_spec("described", spec)
    assert (res.source, res.config, res.stale) == ("offline", Config({"ROWS": 256}), False)
    assert res.path is not None and Path(res.path).parent == shipped


# -- the shared build cache ----------------------------------------------------------------------

def test_every_tuner_shares_one_build_cache(use_registry: Callable[..., Registry]) -> None:
    plugin = RowScale()
    use_registry(ep("rowscale", plugin), ep("other", RowScale(tag="other")))
    x, s, out = inputs()
    flyreg.op("rowscale")(x, s, out)
    assert flyreg.op("rowscale").build_cache is BUILD_CACHE is flyreg.op("other").build_cache
    assert plugin.calls["build"] == 1

    # Another tuner of the same op plugin reuses the build.
    again = registry.build_tuner(registry.REGISTRY.plugin("rowscale"))
    assert again is not flyreg.op("rowscale")
    again(x, s, out)
    assert plugin.calls["build"] == 1

    # Keyed on (op, structural knobs, spec): hints do not rebuild, another knob or op or spec does.
    tuner = flyreg.op("rowscale")
    spec = tuner.resolve(x, s, out).spec
    launch = BUILD_CACHE.get("rowscale", Config({"ROWS": 16}, num_warps=8), spec, tuner.structural, tuner.build)
    assert plugin.calls["build"] == 1
    assert launch(x, s, out, num_warps=8) is out
    BUILD_CACHE.get("rowscale", Config({"ROWS": 1}), spec, tuner.structural, tuner.build)
    BUILD_CACHE.get("rowscale", Config({"ROWS": 16}), {**spec, "M": 1}, tuner.structural, tuner.build)
    BUILD_CACHE.get("not-rowscale", Config({"ROWS": 16}), spec, tuner.structural, tuner.build)
    assert plugin.calls["build"] == 4


# -- the optional hooks through the plugin facade ----------------------------------------------------

def test_optional_hooks_through_the_facade(empty_registry: Registry) -> None:
    flyreg.register(RowScale(), name="rowscale")
    plugin = registry.REGISTRY.plugin("rowscale")
    (spec,) = plugin.workloads("cpu")
    args, kwargs = plugin.make_inputs(spec, "cpu")
    assert plugin.specialize(args, kwargs) == spec
    torch.testing.assert_close(plugin.reference(args, kwargs), args[0] * args[1][:, None])
    assert all(plugin.implements(h) for h in ("workloads", "make_inputs", "reference", "describe"))

    with pytest.raises(PluginError, match="lacks required hook"):
        OpPlugin("bare", MissingBuild())
    flyreg.register(WithoutOptional(), name="bare")
    bare_plugin = registry.REGISTRY.plugin("bare")
    assert bare_plugin.workloads("cpu") == [] and not bare_plugin.implements("reference")
    assert flyreg.op("bare").settings.reference is None
    with pytest.raises(PluginError, match=r"make_inputs\(\) returned None"):
        bare_plugin.make_inputs({"N": 1}, "cpu")



def test_specname_implementations_are_checked_against_their_own_hook(empty_registry: Registry) -> None:
    class Renamed(WithoutOptional):
        @hookimpl(specname="describe")
        def facts(self) -> dict[str, Any]:
            return {"description": "renamed"}

    flyreg.register(Renamed(), name="renamed")
    assert flyreg.ops()[0].description == "renamed"


# -- op names and describe()'s argument names ---------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 3, b"rowscale", ["rowscale"]])
def test_a_name_that_is_not_a_str_is_a_type_error_naming_it(empty_registry: Registry, bad: Any) -> None:
    flyreg.register(RowScale(), name="rowscale")
    x, s, out = inputs()
    calls = [lambda: flyreg.op(bad), lambda: flyreg.unregister(bad), lambda: flyreg.resolve(bad, x, s, out),
             lambda: flyreg.resolve_spec(bad, {"M": 64, "N": 32, "op": "scale"}),
             lambda: registry.REGISTRY.plugin(bad), lambda: registry.REGISTRY.tuner(bad),
             lambda: flyreg.register(RowScale(), name=bad)]
    for call in calls:
        with pytest.raises(TypeError, match=rf"^name must be an op name \(a non-empty str\), got {type(bad).__name__}"):
            call()
    assert [i.name for i in flyreg.ops()] == ["rowscale"]


@pytest.mark.parametrize("bad", ["", "  "])
def test_an_empty_name_is_a_value_error(empty_registry: Registry, bad: str) -> None:
    for call in (flyreg.op, flyreg.unregister, registry.REGISTRY.plugin):
        with pytest.raises(ValueError, match="name must be a non-empty op name"):
            call(bad)


class ResetWithoutArgNames(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"reset_to_zero": ["out"]}


class RestoreNotAnArgument(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"restore_value": ["x", "acc", "res"], "arg_names": ["x", "s", "out"]}


@pytest.mark.parametrize(("cls", "message"), [
    (ResetWithoutArgNames, r"describe\(\): reset_to_zero names arguments \['out'\], but no arg_names are given"),
    (RestoreNotAnArgument, r"describe\(\): restore_value names arguments \['acc', 'res'\] that are not in "
                           r"arg_names \['x', 's', 'out'\]"),
])
def test_restore_and_reset_names_must_be_arguments(use_registry: Callable[..., Registry], cls: type,
                                                   message: str) -> None:
    with pytest.raises(PluginError, match=message):
        OpPlugin("bad", cls())
    use_registry(ep("bad", cls()), ep("good", RowScale()))
    infos = {i.name: i for i in flyreg.ops()}
    assert infos["bad"].status == "broken" and re.search(message, infos["bad"].error or "")
    assert infos["good"].status == "ok"
    with pytest.raises(OpUnavailableError, match=message):
        flyreg.op("bad")


def test_in_tree_and_thirdparty_plugins_pass_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RMSNorm plugins and the third-party test distribution load (restore/reset names are arguments)."""
    import importlib

    from flyreg_rmsnorm import ops as rms

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "thirdparty" / "flyreg-scale"))
    plugins = [("rmsnorm", rms.rmsnorm), ("fused_add_rmsnorm", rms.fused_add_rmsnorm),
               *((n, importlib.import_module(f"flyreg_scale.{n}")) for n in ("scale", "rowsum"))]
    for name, obj in plugins:
        d = OpPlugin(name, obj).record
        assert set(d.restore_value) | set(d.reset_to_zero) <= set(d.arg_names or ())
    assert OpPlugin("fused", rms.fused_add_rmsnorm).record.restore_value == ("residual",)


# -- flyreg tune's view of an existing artifact ----------------------------------------------------------

def _plan(out_dir: Path) -> list[Any]:
    from flyreg._cli.plan import plan_jobs

    return plan_jobs(["rowscale"], [], "cpu", out_dir, force=False)


def test_tune_skips_only_an_artifact_lookup_would_serve(empty_registry: Registry, tmp_path: Path) -> None:
    from flyreg._core.keys import DeviceIdentity

    flyreg.register(RowScale(), name="rowscale")
    cpu = identity_of(None)
    spec = {"M": 256, "N": 32, "op": "scale"}
    target = tmp_path / artifact_filename("rowscale", spec, cpu.name)
    (job,) = _plan(tmp_path)
    assert (job.spec, job.skip) == (spec, None)

    emit_artifact("rowscale", spec, cpu, Config({"ROWS": 16}), "2", 1.0, 2.0, tmp_path)
    assert [j.skip for j in _plan(tmp_path)] == ["current artifact"]

    not_served = {
        "its config is not one the op takes": lambda: emit_artifact(
            "rowscale", spec, cpu, Config({"ROWS": 7}), "2", 1.0, 2.0, tmp_path),
        "its hints are not the op's": lambda: emit_artifact(
            "rowscale", spec, cpu, Config({"ROWS": 16}, num_warps=4), "2", 1.0, 2.0, tmp_path),
        "its content is another spec's": lambda: emit_artifact(
            "rowscale", {**spec, "M": 64}, cpu, Config({"ROWS": 16}), "2", 1.0, 2.0, tmp_path).rename(target),
        "it is for another architecture": lambda: emit_artifact(
            "rowscale", spec, DeviceIdentity(cpu.name, "other-arch"), Config({"ROWS": 16}), "2", 1.0, 2.0, tmp_path),
        "it is stale": lambda: emit_artifact("rowscale", spec, cpu, Config({"ROWS": 16}), "1", 1.0, 2.0, tmp_path),
    }
    for why, make in not_served.items():
        target.unlink()
        make()
        assert target.is_file()
        assert [j.skip for j in _plan(tmp_path)] == [None], why
        tuner = flyreg.op("rowscale")
        tuner.offline.forget_index()
        res = flyreg.resolve_spec("rowscale", spec)
        assert res.source != "offline" or res.stale, why  # lookup does not serve it as current either


def test_a_retune_moves_a_malformed_artifact_aside(empty_registry: Registry, tmp_path: Path) -> None:
    flyreg.register(RowScale(), name="rowscale")
    x, s, out = inputs(256)
    tuner = flyreg.op("rowscale")
    spec = tuner.resolve(x, s, out).spec
    target = tmp_path / artifact_filename("rowscale", spec, identity_of(None).name)
    target.write_text("{ truncated")
    with pytest.warns(flyreg.FlyregWarning, match="moved it aside"):
        report = tuner.tune(x, s, out, out_dir=tmp_path)
    assert Path(report.artifact) == target and json.loads(target.read_text())["op"] == "rowscale"
    (aside,) = tmp_path.glob(f"{target.name}.corrupt-*")
    assert aside.read_text() == "{ truncated"
    # a well-formed artifact is simply replaced by a re-tune
    tuner.tune(x, s, out, out_dir=tmp_path)
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1


# -- plugins that hang or exit while loading --------------------------------------------------------------
def _hang() -> Any:
    threading.Event().wait()  # never returns


def _exit_at_import() -> Any:
    sys.exit(3)


def test_a_plugin_that_hangs_at_load_times_out_and_others_keep_working(
        use_registry: Callable[..., Registry], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_PLUGIN_TIMEOUT", "0.5")
    reg = use_registry(ep("hangs", _hang), ep("double", RowScale()))
    stuck = threading.Thread(target=lambda: reg.names() and reg.infos(), daemon=True)
    stuck.start()  # another thread is blocked on the hanging load meanwhile
    start = time.monotonic()
    assert reg.plugin("double").name == "double"  # not blocked by the hanging load in the other thread
    assert time.monotonic() - start < 0.4
    infos = {i.name: i for i in reg.infos()}
    assert time.monotonic() - start < 5
    assert infos["hangs"].status == "broken" and "load timed out" in (infos["hangs"].error or "")
    assert infos["double"].status == "ok"
    with pytest.raises(OpUnavailableError, match="load timed out"):
        reg.plugin("hangs")
    stuck.join(timeout=5)
    assert not stuck.is_alive()


def test_a_plugin_that_calls_sys_exit_at_import_is_broken_not_fatal(use_registry: Callable[..., Registry]) -> None:
    reg = use_registry(ep("exits", _exit_at_import), ep("double", RowScale()))
    infos = {i.name: i for i in reg.infos()}
    assert infos["exits"].status == "broken" and "sys.exit(3)" in (infos["exits"].error or "")
    assert infos["double"].status == "ok"
