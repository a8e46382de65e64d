"""The op registry: discovery, isolation of broken plugins, in-process registration, resolution.

The plugins here are real CPU kernels with a tunable knob (``row_scale.RowScale``). In-process
registrations use names of their own next to whatever is installed; discovery from entry points
runs in fresh processes that see only fake distributions made on disk (``fresh_process``).
"""

from __future__ import annotations

import collections
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, OpUnavailableError, UnknownOpError, hookimpl
from flyreg.plugin import PluginError

from fresh_process import FreshProcess, fake_distribution
from on_disk import artifact_name, read_json, this_device, write_artifact
from row_scale import (ROWS, BadDescribeKeys, BadDescribeTiming, BadDescribeTypes, MissingBuild,  # noqa: F401
                       ResetWithoutArgNames, RestoreNotAnArgument, RowScale, UnknownHook, UnmarkedBuild,
                       WithoutOptional, WrongArgNames, inputs)

HERE = Path(__file__).resolve().parent


@pytest.fixture
def registered() -> Iterator[Callable[..., None]]:
    """``register(obj, name, ...)``: register in this process, unregistered again when the test ends."""
    names: list[str] = []

    def register(obj: object, name: str, **kw: Any) -> None:
        flyreg.register(obj, name=name, **kw)
        names.append(name)

    yield register
    for name in names:
        if name in {i.name for i in flyreg.ops()}:
            flyreg.unregister(name)


def statuses(*names: str) -> dict[str, str]:
    """The status of each of ``names`` that is registered."""
    return {i.name: i.status for i in flyreg.ops() if i.name in names}


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


#: The module of a fake distribution's plugin objects: each class of ``row_scale`` instantiated once.
FAKE_OPS = """
from row_scale import *
good = RowScale()
rowsum = RowScale(tag="rowsum")
keep = RowScale(tag="keep")
wrong_args = WrongArgNames()
missing_hook = MissingBuild()
bad_describe = BadDescribeKeys()
describe_raises = DescribeRaises()
reset_without_arg_names = ResetWithoutArgNames()
restore_not_an_argument = RestoreNotAnArgument()
"""


def fake_dist(tmp_path: Path, name: str, entry_points: dict[str, str], modules: dict[str, str] | None = None) -> Path:
    """A fake distribution ``name`` (version 0.1) in a site dir of its own whose ``flyreg.ops`` entry points are
    ``entry_points`` (op -> object reference); its modules are ``fake_ops`` and ``modules``."""
    text = "[flyreg.ops]\n" + "".join(f"{op} = {ref}\n" for op, ref in entry_points.items())
    site = tmp_path / f"site-{name}"
    return fake_distribution(site, name, text, {"fake_ops.py": FAKE_OPS, **(modules or {})})


def run_with(fresh: FreshProcess, sites: dict[str, Path], *code: str, **kw: Any) -> Any:
    """The one JSON value the ``code`` parts (each dedented) print in a fresh process that sees the fake
    distributions ``sites``."""
    return fresh.run("\n".join(textwrap.dedent(c) for c in code), sites=sites, path=[HERE], **kw).one()


#: Code that prints every registered op that is not flyreg-rmsnorm's: name -> [status, error, distribution, version].
PRINT_OPS = """
import json, flyreg
ops = {i.name: [i.status, i.error, i.distribution, i.version] for i in flyreg.ops()
       if i.distribution != "flyreg-rmsnorm"}
"""


# -- in-process registration ---------------------------------------------------------------------

def test_register_call_and_unregister(registered: Callable[..., None]) -> None:
    plugin = RowScale()
    registered(plugin, "rowscale")
    x, s, out = inputs()
    assert flyreg.op("rowscale")(x, s, out) is out
    torch.testing.assert_close(out, x * s[:, None])
    (info,) = [i for i in flyreg.ops() if i.name == "rowscale"]
    assert (info.name, info.distribution, info.version, info.status) == ("rowscale", "<in-process>", "0", "ok")
    assert (info.description, info.structural, info.error) == ("row scale (scale)", ("ROWS",), None)

    with pytest.raises(ValueError, match="already registered by <in-process>"):
        flyreg.register(RowScale(), name="rowscale")
    flyreg.unregister("rowscale")
    assert statuses("rowscale") == {}
    with pytest.raises(UnknownOpError):
        flyreg.op("rowscale")
    with pytest.raises(UnknownOpError):
        flyreg.unregister("rowscale")

    # The name is free again, and the new plugin's kernels are built afresh (no stale launchers).
    other = RowScale(tag="again")
    registered(other, "rowscale", distribution="my-notebook", version="9")
    flyreg.op("rowscale")(x, s, out)
    assert other.calls["build"] == 1
    (info,) = [i for i in flyreg.ops() if i.name == "rowscale"]
    assert info.distribution == "my-notebook" and info.version == "9"


def test_register_a_module(registered: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_plugin(tmp_path, monkeypatch, "flyreg_test_double", GOOD_MODULE)
    module = __import__(name)
    registered(module, "double")
    x = torch.randn(3, 100)
    out = flyreg.op("double")(x, torch.empty_like(x))
    torch.testing.assert_close(out, 2 * x)


def test_register_rejects_bad_names_and_classes() -> None:
    before = statuses(*(i.name for i in flyreg.ops()))
    with pytest.raises(ValueError, match="non-empty"):
        flyreg.register(RowScale(), name="")
    with pytest.raises(PluginError, match="class RowScale.*instance"):
        flyreg.register(RowScale, name="cls")
    assert {i.name: i.status for i in flyreg.ops()} == before


def test_in_process_ops_coexist_with_installed_ones() -> None:
    """The real process-wide registry: whatever is installed (rmsnorm, ...) stays listed and untouched."""
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

BROKEN = [
    (MissingBuild, r"lacks required hook\(s\) \['build'\]"),
    (UnmarkedBuild, r"lacks required hook\(s\) \['build'\] \(build not marked with @flyreg.hookimpl\)"),
    (WrongArgNames, r"hook build\(cfg, spec\) takes \['cfg'\], which the hook build\(config, spec\) does not pass"),
    (UnknownHook, r"unknown hook 'buidl' in plugin .* \(did you mean 'build'\?\)$"),
    (BadDescribeKeys, r"unknown keys \['structual'\]"),
    (BadDescribeTypes, r"op 'bad': describe\(\): structural must be a list of names, got the string 'ROWS'"),
    (BadDescribeTiming, r"describe\(\): timing must be one of \['steady', 'flushed', 'graph'\], got 'fastest'"),
]




@pytest.mark.parametrize(("cls", "message"), BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_register_broken_plugin_raises_and_leaves_others_working(
        registered: Callable[..., None], cls: type, message: str) -> None:
    registered(RowScale(), "good")
    with pytest.raises(PluginError, match=message):
        flyreg.register(cls(), name="bad")
    assert statuses("good", "bad") == {"good": "ok"}
    x, s, out = inputs()
    torch.testing.assert_close(flyreg.op("good")(x, s, out), x * s[:, None])


def test_broken_entry_points_are_isolated(fresh_process: FreshProcess, tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {
        "good": "fake_ops:good", "missing_module": "flyreg_no_such_module_xyz", "import_fails": "raises_on_import",
        "wrong_args": "fake_ops:wrong_args", "missing_hook": "fake_ops:missing_hook",
        "bad_describe": "fake_ops:bad_describe", "describe_raises": "fake_ops:describe_raises"},
        {"raises_on_import.py": "raise ImportError('no GPU toolkit')\n"})
    got = run_with(fresh_process, {"flyreg-fake": site}, PRINT_OPS, """
        errors = {}
        for call in (lambda: flyreg.op("import_fails"), lambda: flyreg.resolve_spec("wrong_args", {"N": 1})):
            try:
                call()
            except flyreg.OpUnavailableError as e:
                errors[len(errors)] = str(e)
        import torch
        from row_scale import inputs
        x, s, out = inputs()
        good = bool(torch.allclose(flyreg.op("good")(x, s, out), x * s[:, None]))
        print(json.dumps({"ops": ops, "errors": errors, "good": good}))
    """)
    infos = got["ops"]
    assert {n: i[0] for n, i in infos.items()} == {
        "good": "ok", "missing_module": "broken", "import_fails": "broken", "wrong_args": "broken",
        "missing_hook": "broken", "bad_describe": "broken", "describe_raises": "broken"}
    assert "ModuleNotFoundError" in infos["missing_module"][1]
    assert "ImportError: no GPU toolkit" in infos["import_fails"][1]
    assert "cfg" in infos["wrong_args"][1]
    assert "['build']" in infos["missing_hook"][1]
    assert "structual" in infos["bad_describe"][1]
    assert "RuntimeError: boom in describe" in infos["describe_raises"][1]
    assert all(i[2:] == ["flyreg-fake", "0.1"] for i in infos.values())
    assert re.match(r"op 'import_fails' \(flyreg-fake\) is broken: ImportError", got["errors"]["0"])
    assert "cfg" in got["errors"]["1"]
    assert got["good"] is True


def test_discovery_is_lazy_and_once(fresh_process: FreshProcess, tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {"double": "flyreg_test_lazy", "scale": "fake_ops:good"},
                     {"flyreg_test_lazy.py": textwrap.dedent(GOOD_MODULE)})
    got = run_with(fresh_process, {"flyreg-fake": site}, """
        import importlib.metadata, json, sys
        import torch
        import flyreg

        reads = []
        every = importlib.metadata.entry_points

        def counted(**params):
            reads.append(params.get("group"))
            return every(**params)

        importlib.metadata.entry_points = counted
        steps = [len(reads)]
        flyreg.op("scale")
        steps += [reads.count("flyreg.ops"), "flyreg_test_lazy" in sys.modules]  # only the op asked for is imported
        x = torch.randn(2, 8)
        flyreg.op("double")(x, torch.empty_like(x))
        flyreg.ops()
        flyreg.op("double")
        steps += [reads.count("flyreg.ops"), "flyreg_test_lazy" in sys.modules, flyreg.op("double") is flyreg.op("double")]
        print(json.dumps(steps))
    """)
    assert got == [0, 1, False, 1, True, True]  # one tuner per op


# -- duplicates, disabled and unknown ops ------------------------------------------------------------

def test_duplicate_name_across_distributions_names_both(fresh_process: FreshProcess, tmp_path: Path) -> None:
    sites = {"flyreg-alpha": fake_dist(tmp_path, "flyreg-alpha", {"scale": "fake_ops:good"}),
             "flyreg-beta": fake_dist(tmp_path, "flyreg-beta", {"scale": "fake_ops:good", "rowsum": "fake_ops:rowsum"})}
    got = run_with(fresh_process, sites, PRINT_OPS, """
        try:
            flyreg.op("scale")
        except flyreg.OpUnavailableError as e:
            print(json.dumps({"ops": ops, "error": str(e)}))
    """)
    scale = got["ops"]["scale"]
    assert scale[0] == "broken" and "flyreg-alpha" in scale[1] and "flyreg-beta" in scale[1]
    assert scale[2] == "flyreg-alpha, flyreg-beta"
    assert "registered by 2 distributions: flyreg-alpha and flyreg-beta" in got["error"]
    assert got["ops"]["rowsum"][0] == "ok"  # the rest of both distributions works


def test_same_distribution_twice_on_the_path_is_not_a_duplicate(fresh_process: FreshProcess, tmp_path: Path) -> None:
    sites = {"flyreg-alpha": fake_dist(tmp_path, "flyreg-alpha", {"scale": "fake_ops:good"}),
             "Flyreg_Alpha": fake_dist(tmp_path, "Flyreg_Alpha", {"scale": "fake_ops:good"})}
    got = run_with(fresh_process, sites, PRINT_OPS, "print(json.dumps({n: i[0] for n, i in ops.items()}))")
    assert got == {"scale": "ok"}


def test_disabled_ops(fresh_process: FreshProcess, tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {"double": "flyreg_test_disabled", "scale": "fake_ops:good",
                                               "keep": "fake_ops:keep"},
                     {"flyreg_test_disabled.py": textwrap.dedent(GOOD_MODULE)})
    got = run_with(fresh_process, {"flyreg-fake": site}, """
        import json, os, sys
        import flyreg
        from row_scale import inputs
        mine = ("double", "scale", "keep")
        os.environ["FLYREG_DISABLE_OPS"] = " double, scale ,"
        disabled = {i.name: i.status for i in flyreg.ops() if i.name in mine}
        imported = "flyreg_test_disabled" in sys.modules  # a disabled op's plugin is never imported
        errors = []
        for op in ("double", "scale"):
            try:
                flyreg.op(op)
            except flyreg.OpUnavailableError as e:
                errors.append(str(e))
        flyreg.op("keep")(*inputs())
        del os.environ["FLYREG_DISABLE_OPS"]
        enabled = {i.name: i.status for i in flyreg.ops() if i.name in mine}
        print(json.dumps([disabled, imported, errors, enabled]))
    """)
    disabled, imported, errors, enabled = got
    assert disabled == {"double": "disabled", "scale": "disabled", "keep": "ok"} and imported is False
    assert errors == [f"op '{op}' is disabled by FLYREG_DISABLE_OPS" for op in ("double", "scale")]
    assert enabled == {"double": "ok", "scale": "ok", "keep": "ok"}


def test_unknown_op_lists_known_ops_and_the_closest(fresh_process: FreshProcess, tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {"rowscale": "fake_ops:good"})
    got = run_with(fresh_process, {"flyreg-fake": site}, """
        import json, flyreg
        out = []
        for call in (lambda: flyreg.op("rowscal"), lambda: flyreg.resolve("RMSNorm"),
                     lambda: flyreg.resolve_spec("softmax", {})):
            try:
                call()
            except flyreg.UnknownOpError as e:
                out.append([str(e), isinstance(e, LookupError)])
        print(json.dumps(out))
    """)
    known = "(known ops: fused_add_rmsnorm, rmsnorm, rowscale)"
    assert got == [[f"unknown op 'rowscal'; did you mean 'rowscale'? {known}", True],
                   [f"unknown op 'RMSNorm'; did you mean 'rmsnorm'? {known}", True],
                   [f"unknown op 'softmax' {known}", True]]


def test_unknown_op_with_nothing_registered(fresh_process: FreshProcess) -> None:
    got = fresh_process.run("""
        import json, flyreg
        try:
            flyreg.op("anything")
        except flyreg.UnknownOpError as e:
            print(json.dumps([[i.name for i in flyreg.ops()], str(e)]))
    """, in_tree=False).one()
    assert got[0] == [] and got[1].endswith("(known ops: none)")


# -- hook isolation and the steady state -------------------------------------------------------------

def test_a_hook_call_reaches_its_own_op_only(registered: Callable[..., None]) -> None:
    a, b = RowScale(tag="a", default_rows=1), RowScale(tag="b", default_rows=256)
    registered(a, "a")
    registered(b, "b")
    assert a.calls["describe"] == b.calls["describe"] == 1
    x, s, out = inputs()
    res_a = flyreg.resolve("a", x, s, out)
    assert (res_a.spec["op"], res_a.config) == ("a", Config({"ROWS": 1}))
    assert sum(b.calls.values()) == 1  # only its own describe
    flyreg.op("a")(x, s, out)
    res_b = flyreg.resolve("b", x, s, out)
    assert (res_b.spec["op"], res_b.config) == ("b", Config({"ROWS": 256}))
    assert a.calls["specialize"] == 2 and b.calls["specialize"] == 1


def test_hooks_run_on_new_keys_only(registered: Callable[..., None]) -> None:
    plugin = RowScale()
    registered(plugin, "rowscale")
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

def test_resolve_sources(registered: Callable[..., None], isolated_dirs: dict[str, Path],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = RowScale(default_rows=1)
    registered(plugin, "rowscale")
    x, s, out = inputs(256)
    spec = {"M": 256, "N": 32, "op": "scale"}

    def again() -> None:
        flyreg.unregister("rowscale")
        flyreg.register(plugin, name="rowscale")

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
    again()
    searched = flyreg.resolve("rowscale", x, s, out)
    assert searched.source == "search"
    assert searched.config != Config({"ROWS": 1})  # one row per step is the slowest by far
    expected = isolated_dirs["configs"] / artifact_name("rowscale", spec, this_device().name)
    assert searched.path == str(expected) and expected.is_file()
    assert flyreg.op("rowscale").stats.searches == 1
    monkeypatch.delenv("FLYREG_AUTOTUNE")

    # A new tuner in this process: the scratch cache serves it (before the artifact).
    again()
    cached = flyreg.resolve("rowscale", x, s, out)
    assert (cached.source, cached.config) == ("cache", searched.config)

    # A new tuner and an empty scratch cache: the artifact serves it, by call or by spec alone.
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(isolated_dirs["cache"] / "empty"))
    for resolve in (lambda: flyreg.resolve_spec("rowscale", spec), lambda: flyreg.resolve("rowscale", x, s, out)):
        again()
        offline = resolve()
        assert (offline.source, offline.config, offline.path) == ("offline", searched.config, str(expected))
        assert not offline.stale and not offline.nearest
    # ordered_axes=["M"]: a spec with no artifact borrows the nearest M's.
    near = flyreg.resolve_spec("rowscale", {"M": 300, "N": 32, "op": "scale"})
    assert (near.source, near.nearest, near.config) == ("offline-nearest", True, searched.config)
    assert flyreg.op("rowscale").stats.searches == 0


def test_tune_rejects_wrong_configs_with_the_reference(registered: Callable[..., None],
                                                       isolated_dirs: dict[str, Path]) -> None:
    plugin = RowScale(buggy=True)
    registered(plugin, "rowscale")
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


def legacy_describe_keys() -> set[str]:
    """The keys a ``describe()`` dict may hold, as the error about an unknown one lists them."""
    class Unknown(RowScale):
        @hookimpl
        def describe(self) -> dict[str, Any]:
            return {"no_such_key": 1}

    with pytest.raises(PluginError, match="unknown keys") as info:
        flyreg.register(Unknown(), name="unknown_keys")
    return set(re.findall(r"'(\w+)'", str(info.value).rpartition("known:")[2]))


def test_describe_keys_reach_the_tuner(registered: Callable[..., None], tmp_path: Path) -> None:
    shipped = tmp_path / "shipped"
    spec = {"M": 64, "N": 32, "op": "scale"}
    write_artifact(shipped, "described", spec, Config({"ROWS": 256}), op_version="5")

    class Described(RowScale):
        @hookimpl
        def describe(self) -> dict[str, Any]:
            return {"description": "all keys", "version": 5, "structural": ["ROWS"], "restore_value": ["x"],
                    "reset_to_zero": ["out"], "ordered_axes": ["M"], "config_dir": shipped,
                    "key_env": ["FLYREG_TEST_KNOB"], "arg_names": ["x", "s", "out"], "timing": "flushed",
                    "strategy": "exhaustive"}

    assert set(Described().describe()) == legacy_describe_keys()
    registered(Described(), "described")
    tuner = flyreg.op("described")
    assert (tuner.version, tuner.structural, tuner.arg_names) == ("5", ("ROWS",), ("x", "s", "out"))
    assert (tuner.restore_value, tuner.reset_to_zero, tuner.key_env) == (("x",), ("out",), ("FLYREG_TEST_KNOB",))
    assert tuner.timing == "flushed" and tuner.settings.strategy == "exhaustive"
    res = flyreg.resolve_spec("described", spec)
    assert (res.source, res.config, res.stale) == ("offline", Config({"ROWS": 256}), False)
    assert res.path is not None and Path(res.path).parent == shipped


# -- the shared build cache ----------------------------------------------------------------------

def test_every_tuner_shares_one_build_cache(registered: Callable[..., None]) -> None:
    plugin = RowScale()
    registered(plugin, "rowscale")
    registered(RowScale(tag="other"), "other")
    x, s, out = inputs()
    flyreg.op("rowscale")(x, s, out)
    assert flyreg.op("rowscale").build_cache is flyreg.op("other").build_cache
    assert plugin.calls["build"] == 1

    # Keyed on (op, structural knobs, spec): hints do not rebuild, another knob or op or spec does.
    tuner = flyreg.op("rowscale")
    cache = tuner.build_cache
    spec = tuner.resolve(x, s, out).spec
    launch = cache.get("rowscale", Config({"ROWS": 16}, num_warps=8), spec, tuner.structural, tuner.build)
    assert plugin.calls["build"] == 1
    assert launch(x, s, out, num_warps=8) is out
    cache.get("rowscale", Config({"ROWS": 1}), spec, tuner.structural, tuner.build)
    cache.get("rowscale", Config({"ROWS": 16}), {**spec, "M": 1}, tuner.structural, tuner.build)
    cache.get("not-rowscale", Config({"ROWS": 16}), spec, tuner.structural, tuner.build)
    assert plugin.calls["build"] == 4


# -- the optional hooks ----------------------------------------------------------------------------

def test_optional_hooks_serve_flyreg_tune(registered: Callable[..., None], flyreg_cli: Callable[..., Any],
                                          tmp_path: Path) -> None:
    plugin = RowScale()
    registered(plugin, "rowscale")
    planned = flyreg_cli("tune", "rowscale", "--device", "cpu", "--out", str(tmp_path), "--dry-run")
    assert planned.code == 0 and "M=256,N=32,op=scale" in planned.out  # its workloads
    tuned = flyreg_cli("tune", "rowscale", "--device", "cpu", "--out", str(tmp_path))
    assert tuned.code == 0, tuned.err
    (artifact,) = tmp_path.glob("rowscale,*.json")  # its make_inputs gave the call, its reference gated it
    assert read_json(artifact)["spec"] == {"M": 256, "N": 32, "op": "scale"} and plugin.calls["reference"] == 1

    with pytest.raises(PluginError, match="lacks required hook"):
        flyreg.register(MissingBuild(), name="bare")
    registered(WithoutOptional(), "bare")
    nothing = flyreg_cli("tune", "bare", "--device", "cpu", "--out", str(tmp_path), "--dry-run")
    assert "bare" not in nothing.out.replace("tune bare", "") or "0 job(s)" in nothing.out  # no workloads
    failed = flyreg_cli("tune", "bare", "--spec", "N=1", "--device", "cpu", "--out", str(tmp_path))
    assert failed.code != 0 and "no make_inputs hook, so it cannot be tuned offline" in failed.out

    class NoInputs(WithoutOptional):
        @hookimpl
        def make_inputs(self, spec: dict[str, Any], device: str) -> Any:
            return None

    registered(NoInputs(), "no_inputs")
    failed = flyreg_cli("tune", "no_inputs", "--spec", "N=1", "--device", "cpu", "--out", str(tmp_path))
    assert failed.code != 0 and "make_inputs() returned None" in failed.out.replace("\n", "").replace("│", "")
    report = flyreg.op("bare").tune(torch.zeros(3), emit=False)  # no reference: nothing is rejected
    assert report.rejected == () and report.winner == Config({"B": 1})


def test_specname_implementations_are_checked_against_their_own_hook(registered: Callable[..., None]) -> None:
    class Renamed(WithoutOptional):
        @hookimpl(specname="describe")
        def facts(self) -> dict[str, Any]:
            return {"description": "renamed"}

    registered(Renamed(), "renamed")
    assert [i.description for i in flyreg.ops() if i.name == "renamed"] == ["renamed"]


# -- op names and describe()'s argument names ---------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 3, b"rowscale", ["rowscale"]])
def test_a_name_that_is_not_a_str_is_a_type_error_naming_it(registered: Callable[..., None], bad: Any) -> None:
    registered(RowScale(), "rowscale")
    before = {i.name for i in flyreg.ops()}
    x, s, out = inputs()
    calls = [lambda: flyreg.op(bad), lambda: flyreg.unregister(bad), lambda: flyreg.resolve(bad, x, s, out),
             lambda: flyreg.resolve_spec(bad, {"M": 64, "N": 32, "op": "scale"}),
             lambda: flyreg.register(RowScale(), name=bad)]
    for call in calls:
        with pytest.raises(TypeError, match=rf"^name must be an op name \(a non-empty str\), got {type(bad).__name__}"):
            call()
    assert {i.name for i in flyreg.ops()} == before


@pytest.mark.parametrize("bad", ["", "  "])
def test_an_empty_name_is_a_value_error(bad: str) -> None:
    for call in (flyreg.op, flyreg.unregister, lambda name: flyreg.resolve_spec(name, {}),
                 lambda name: flyreg.register(RowScale(), name=name)):
        with pytest.raises(ValueError, match="name must be a non-empty op name"):
            call(bad)


RESET_AND_RESTORE = [
    ("reset_without_arg_names",
     r"describe\(\): reset_to_zero names arguments \['out'\], but no arg_names are given"),
    ("restore_not_an_argument", r"describe\(\): restore_value names arguments \['acc', 'res'\] that are not in "
                                r"arg_names \['x', 's', 'out'\]"),
]


def test_restore_and_reset_names_must_be_arguments(fresh_process: FreshProcess, tmp_path: Path) -> None:
    for cls, (_, message) in zip((ResetWithoutArgNames, RestoreNotAnArgument), RESET_AND_RESTORE):
        with pytest.raises(PluginError, match=message):
            flyreg.register(cls(), name="bad")
    site = fake_dist(tmp_path, "flyreg-fake", {"good": "fake_ops:good",
                                               **{n: f"fake_ops:{n}" for n, _ in RESET_AND_RESTORE}})
    got = run_with(fresh_process, {"flyreg-fake": site}, PRINT_OPS, """
        errors = {}
        for name in ("reset_without_arg_names", "restore_not_an_argument"):
            try:
                flyreg.op(name)
            except flyreg.OpUnavailableError as e:
                errors[name] = str(e)
        print(json.dumps([ops, errors]))
    """)
    infos, errors = got
    assert infos["good"][0] == "ok"
    for name, message in RESET_AND_RESTORE:
        assert infos[name][0] == "broken" and re.search(message, infos[name][1])
        assert re.search(message, errors[name])


def test_in_tree_and_thirdparty_plugins_pass_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RMSNorm plugins and the third-party test distribution load (restore/reset names are arguments)."""
    import importlib

    from flyreg_rmsnorm import ops as rms

    monkeypatch.syspath_prepend(str(HERE.parent / "thirdparty" / "flyreg-scale"))
    plugins = [("rmsnorm", rms.rmsnorm), ("fused_add_rmsnorm", rms.fused_add_rmsnorm),
               *((n, importlib.import_module(f"flyreg_scale.{n}")) for n in ("scale", "rowsum"))]
    restored = {}
    for name, obj in plugins:
        flyreg.register(obj, name=f"checked_{name}")
        try:
            tuner = flyreg.op(f"checked_{name}")
            assert set(tuner.restore_value) | set(tuner.reset_to_zero) <= set(tuner.arg_names)
            restored[name] = tuner.restore_value
        finally:
            flyreg.unregister(f"checked_{name}")
    assert restored["fused_add_rmsnorm"] == ("residual",)


# -- flyreg tune's view of an existing artifact ----------------------------------------------------------

def planned(flyreg_cli: Callable[..., Any], out_dir: Path) -> list[str]:
    """The action ``flyreg tune rowscale --dry-run`` plans for each job, writing into ``out_dir``."""
    run = flyreg_cli("tune", "rowscale", "--device", "cpu", "--out", str(out_dir), "--dry-run")
    assert run.code == 0, run.err
    return [line.split("│")[3].strip() for line in run.out.splitlines() if line.startswith("│ rowscale")]


def test_tune_skips_only_an_artifact_lookup_would_serve(registered: Callable[..., None], tmp_path: Path,
                                                        flyreg_cli: Callable[..., Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    registered(RowScale(), "rowscale")
    cpu = this_device()
    spec = {"M": 256, "N": 32, "op": "scale"}
    assert planned(flyreg_cli, tmp_path / "empty") == ["tune"]
    current = tmp_path / "current"
    write_artifact(current, "rowscale", spec, Config({"ROWS": 16}), op_version="2")
    assert planned(flyreg_cli, current) == ["skip: current artifact"]

    name = artifact_name("rowscale", spec, cpu.name)
    not_served = {
        "its config is not one the op takes": dict(config=Config({"ROWS": 7})),
        "its hints are not the op's": dict(config=Config({"ROWS": 16}, num_warps=4)),
        "its content is another spec's": dict(spec={**spec, "M": 64}, name=name),
        "it is for another architecture": dict(device=flyreg.DeviceIdentity(cpu.name, "other-arch")),
        "it is stale": dict(op_version="1"),
    }
    for i, (why, change) in enumerate(not_served.items()):
        out_dir = tmp_path / f"case{i}"  # a directory of its own: each is listed afresh
        fields = {"spec": spec, "config": Config({"ROWS": 16}), "op_version": "2", **change}
        path = write_artifact(out_dir, "rowscale", fields.pop("spec"), fields.pop("config"), **fields)
        assert path.name == name
        assert planned(flyreg_cli, out_dir) == ["tune"], why
        monkeypatch.setenv("FLYREG_CONFIG_DIR", str(out_dir))
        res = flyreg.resolve_spec("rowscale", spec)
        assert res.source != "offline" or res.stale, why  # lookup does not serve it as current either


def test_a_retune_moves_a_malformed_artifact_aside(registered: Callable[..., None], tmp_path: Path) -> None:
    registered(RowScale(), "rowscale")
    x, s, out = inputs(256)
    tuner = flyreg.op("rowscale")
    spec = tuner.resolve(x, s, out).spec
    target = tmp_path / artifact_name("rowscale", spec, this_device().name)
    target.write_text("{ truncated")
    with pytest.warns(flyreg.FlyregWarning, match="moved it aside"):
        report = tuner.tune(x, s, out, out_dir=tmp_path)
    assert Path(str(report.artifact)) == target and json.loads(target.read_text())["op"] == "rowscale"
    (aside,) = tmp_path.glob(f"{target.name}.corrupt-*")
    assert aside.read_text() == "{ truncated"
    # a well-formed artifact is simply replaced by a re-tune
    tuner.tune(x, s, out, out_dir=tmp_path)
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1


# -- plugins that hang or exit while loading --------------------------------------------------------------

def test_a_plugin_that_hangs_at_load_times_out_and_others_keep_working(fresh_process: FreshProcess,
                                                                      tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {"hangs": "hangs_at_import", "double": "fake_ops:good"},
                     {"hangs_at_import.py": "import threading\nthreading.Event().wait()\n"})
    got = run_with(fresh_process, {"flyreg-fake": site}, """
        import json, threading, time
        import flyreg

        stuck = threading.Thread(target=flyreg.ops, daemon=True)
        stuck.start()  # another thread is blocked on the hanging load meanwhile
        time.sleep(0.1)
        start = time.monotonic()
        flyreg.op("double")  # not blocked by the hanging load in the other thread
        unblocked = time.monotonic() - start
        infos = {i.name: [i.status, i.error] for i in flyreg.ops() if i.name in ("hangs", "double")}
        listed = time.monotonic() - start
        try:
            flyreg.op("hangs")
        except flyreg.OpUnavailableError as e:
            error = str(e)
        stuck.join(timeout=5)
        print(json.dumps([unblocked, listed, infos, error, stuck.is_alive()]))
    """, env={"FLYREG_PLUGIN_TIMEOUT": "0.5"})
    unblocked, listed, infos, error, alive = got
    assert unblocked < 0.4 and listed < 5
    assert infos["hangs"][0] == "broken" and "load timed out" in infos["hangs"][1]
    assert infos["double"][0] == "ok"
    assert "load timed out" in error and alive is False


def test_a_plugin_that_calls_sys_exit_at_import_is_broken_not_fatal(fresh_process: FreshProcess,
                                                                   tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "flyreg-fake", {"exits": "exits_at_import", "double": "fake_ops:good"},
                     {"exits_at_import.py": "import sys\nsys.exit(3)\n"})
    infos = run_with(fresh_process, {"flyreg-fake": site}, PRINT_OPS, "print(json.dumps(ops))")
    assert infos["exits"][0] == "broken" and "sys.exit(3)" in infos["exits"][1]
    assert infos["double"][0] == "ok"
