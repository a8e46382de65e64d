"""The settings object: every FLYREG_* variable read, validated and documented in one place."""

from __future__ import annotations

import ast
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, FlyregWarning

from cpu_kernels import double_op, inputs as double_inputs
from on_disk import SCRATCH_CACHE
from row_scale import RowScale, inputs

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THREADS = min(16, os.cpu_count() or 1)


@pytest.fixture
def rowscale() -> Iterator[None]:
    """The CPU op ``rowscale``, registered in this process."""
    flyreg.register(RowScale(), name="rowscale")
    yield
    flyreg.unregister("rowscale")


def _messages(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FlyregWarning)]


def help_variables(flyreg_cli: Callable[..., Any]) -> dict[str, str]:
    """Each variable ``flyreg --help`` lists, with its text (wrapped lines joined)."""
    out = flyreg_cli("--help").out
    section = out[out.index("Environment"):]
    found: dict[str, str] = {}
    name = None
    for line in section.splitlines()[1:]:
        m = re.match(r"^\s+(FLYREG_\w+)\s+(.*)$", line)
        if m:
            name = m[1]
            found[name] = m[2].strip()
        elif name and line.strip():
            found[name] += " " + line.strip()
    return found


def forced(name: str) -> bool:
    """Whether a new key of a new tuner is searched (FLYREG_AUTOTUNE) though the op has a default."""
    tuner, _ = double_op(name, default=Config({"CHUNK": 16}))
    return tuner.resolve(*double_inputs()).source == "search"


# -- values -------------------------------------------------------------------------------------------

def test_unset_and_blank_variables_get_the_defaults(flyreg_cli: Callable[..., Any], isolated_dirs: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    names = help_variables(flyreg_cli)
    for blank in (False, True):
        for name in names:
            if blank:
                monkeypatch.setenv(name, " ")
            else:
                monkeypatch.delenv(name, raising=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not forced(f"defaults_{blank}")  # FLYREG_AUTOTUNE off
            assert all(i.status == "ok" for i in flyreg.ops())  # no op disabled
            out = Path(str(double_op(f"written_{blank}")[0].tune(*double_inputs()).artifact))
        assert out.parent == isolated_dirs["xdg_config"] / "flyreg"  # no FLYREG_CONFIG_DIR: the user config dir
        assert flyreg_cli("cache", "path").out.strip() == str(isolated_dirs["xdg_cache"] / "flyreg" / SCRATCH_CACHE)


@pytest.mark.parametrize("raw, value", [*((s, True) for s in ("1", "true", "yes", "on", "TRUE", " Yes ", "On")),
                                        *((s, False) for s in ("0", "false", "no", "off", "FALSE", "Off"))])
def test_every_boolean_spelling(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert forced(f"spelled_{raw.strip()}") is value


#: How each bad value is first read: a call of a new tuner (FLYREG_AUTOTUNE), a search (FLYREG_COMPILE_THREADS),
#: an op's load (FLYREG_PLUGIN_TIMEOUT); and what shows the default was used.
def _read_autotune(name: str) -> None:
    assert not forced(name)


def _read_compile_threads(name: str) -> None:
    double_op(name)[0].tune(*double_inputs(), emit=False)


def _read_plugin_timeout(name: str) -> None:
    flyreg.register(RowScale(), name=name)
    flyreg.unregister(name)


#: The isolation settings are used by ``flyreg tune --isolate`` only; any read of the settings checks them.
READERS = {"FLYREG_AUTOTUNE": _read_autotune, "FLYREG_COMPILE_THREADS": _read_compile_threads,
           "FLYREG_PLUGIN_TIMEOUT": _read_plugin_timeout, "FLYREG_COMPILE_WORKERS": _read_autotune,
           "FLYREG_CANDIDATE_TIMEOUT": _read_autotune, "FLYREG_RECORD_INTERVAL": _read_autotune}


@pytest.mark.parametrize("name, raw, allowed", [
    ("FLYREG_AUTOTUNE", "enable", "1/0, true/false, yes/no, on/off"),
    ("FLYREG_AUTOTUNE", "garbage", "1/0, true/false, yes/no, on/off"),
    ("FLYREG_AUTOTUNE", "2", "1/0, true/false, yes/no, on/off"),
    ("FLYREG_COMPILE_THREADS", "0", "an int >= 1"),
    ("FLYREG_COMPILE_THREADS", "-1", "an int >= 1"),
    ("FLYREG_COMPILE_THREADS", "abc", "an int >= 1"),
    ("FLYREG_COMPILE_THREADS", "2.5", "an int >= 1"),
    ("FLYREG_COMPILE_WORKERS", "0", "an int >= 1"),
    ("FLYREG_COMPILE_WORKERS", "many", "an int >= 1"),
    ("FLYREG_CANDIDATE_TIMEOUT", "0", "seconds > 0"),
    ("FLYREG_CANDIDATE_TIMEOUT", "inf", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "0", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "-3", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "nan", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "inf", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "soon", "seconds > 0"),
    ("FLYREG_PLUGIN_TIMEOUT", "1e10", "seconds > 0, at most 1,000,000"),  # past threading.TIMEOUT_MAX
    ("FLYREG_PLUGIN_TIMEOUT", "1000001", "seconds > 0, at most 1,000,000"),
    ("FLYREG_CANDIDATE_TIMEOUT", "9.3e9", "seconds > 0, at most 1,000,000"),
    ("FLYREG_RECORD_INTERVAL", "0", "seconds > 0"),
    ("FLYREG_RECORD_INTERVAL", "1e300", "seconds > 0, at most 1,000,000"),
])
def test_a_bad_value_warns_once_naming_it_and_the_default_is_used(
        name: str, raw: str, allowed: str, monkeypatch: pytest.MonkeyPatch, flyreg_cli: Callable[..., Any]) -> None:
    default = re.search(r"Default: (.*)\.$", help_variables(flyreg_cli)[name])
    assert default is not None
    monkeypatch.setenv(name, raw)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        READERS[name](f"bad_{raw}_first")
        READERS[name](f"bad_{raw}_again")
    (message,) = [m for m in _messages(record) if name in m]
    assert f"{name}={raw!r}" in message and f"expected {allowed}" in message and f"default ({default[1]})" in message


def test_good_values_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flyreg_cli: Callable[..., Any]) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    monkeypatch.setenv("FLYREG_DISABLE_OPS", " x, y ,,")
    monkeypatch.setenv("FLYREG_COMPILE_THREADS", " 3 ")
    monkeypatch.setenv("FLYREG_COMPILE_WORKERS", "2")
    monkeypatch.setenv("FLYREG_CANDIDATE_TIMEOUT", "7.5")
    monkeypatch.setenv("FLYREG_PLUGIN_TIMEOUT", "2.5")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)
        monkeypatch.setenv("FLYREG_AUTOTUNE", "yes")
        assert forced("good_values")
        monkeypatch.delenv("FLYREG_AUTOTUNE")
        flyreg.register(RowScale(), name="x")
        flyreg.register(RowScale(), name="y")
        try:
            assert {i.name: i.status for i in flyreg.ops() if i.name in "xy"} == {"x": "disabled", "y": "disabled"}
        finally:
            flyreg.unregister("x")
            flyreg.unregister("y")
    assert flyreg_cli("cache", "path").out.strip() == str(tmp_path / "c" / SCRATCH_CACHE)
    written = Path(str(double_op("dirs_op")[0].tune(*double_inputs()).artifact))
    assert written.parent == tmp_path / "a"  # the first config dir, the empty entry skipped
    (tmp_path / "b").mkdir()
    moved = tmp_path / "b" / written.name
    written.rename(moved)
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "empty"))
    res = double_op("dirs_op")[0].resolve(*double_inputs())
    assert (res.source, res.path) == ("offline", str(moved))  # the second config dir is looked up too


def test_a_bad_compile_thread_count_with_autotune_does_not_break_the_first_call(
        rowscale: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    for raw in ("0", "-1", "abc"):
        monkeypatch.setenv("FLYREG_COMPILE_THREADS", raw)
        x, s, out = inputs(m=64 + len(raw))  # a new key each time
        with pytest.warns(FlyregWarning, match=f"FLYREG_COMPILE_THREADS={raw!r}"):
            tuner = flyreg.op("rowscale")
            searches = tuner.stats.searches
            assert tuner(x, s, out) is out
        torch.testing.assert_close(out, x * s[:, None])
        assert tuner.stats.searches == searches + 1


def test_the_plugin_load_limit_comes_from_the_settings(fresh_process: Any) -> None:
    got = fresh_process.run("""
        import json, time, warnings
        import flyreg
        from row_scale import RowScale

        class Slow(RowScale):
            def __init__(self, seconds):
                super().__init__()
                self.seconds = seconds

            @flyreg.hookimpl
            def describe(self):
                time.sleep(self.seconds)
                return super().describe()

        def loads(seconds):
            try:
                flyreg.register(Slow(seconds), name="slow")
            except flyreg.PluginError as e:
                return str(e)
            flyreg.unregister("slow")
            return "ok"

        import os
        os.environ["FLYREG_PLUGIN_TIMEOUT"] = "0.5"
        out = [loads(1.5), loads(0.1)]
        os.environ["FLYREG_PLUGIN_TIMEOUT"] = "soon"
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out.append(loads(1.5))  # the default, 30 s
        out.append([str(w.message) for w in record])
        print(json.dumps(out))
    """, path=[Path(__file__).resolve().parent]).one()
    assert "load timed out" in got[0] and "0.5 s" in got[0] and got[1] == "ok" and got[2] == "ok"
    assert any("FLYREG_PLUGIN_TIMEOUT='soon': expected seconds > 0" in m for m in got[3])


# -- directories ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("written, expanded", [
    ("~", "{HOME}"),
    ("~/a/$ROOT", "{HOME}/a/{ROOT}"),
    ("${ROOT}/x/$ROOT", "{ROOT}/x/{ROOT}"),
    ("$FLYREG_TEST_UNSET/x", "$FLYREG_TEST_UNSET/x"),  # left as written, as the shell's expandvars does
    ("a~/b", "a~/b"),
    ("$FLYREG_TEST_EMPTY/x", "/x"),
])
def test_a_directory_expands_home_and_variables(written: str, expanded: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, flyreg_cli: Callable[..., Any]) -> None:
    home, root = tmp_path / "home", tmp_path / "srv"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ROOT", str(root))
    monkeypatch.setenv("FLYREG_TEST_EMPTY", "")
    monkeypatch.delenv("FLYREG_TEST_UNSET", raising=False)
    monkeypatch.setenv("FLYREG_CACHE_DIR", written)
    want = Path(expanded.format(HOME=home, ROOT=root)) / SCRATCH_CACHE
    assert flyreg_cli("cache", "path").out.strip() == str(want)


def test_directories_follow_the_variables_they_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   flyreg_cli: Callable[..., Any]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join(["~/a", "${FLYREG_TEST_ROOT}/b"]))
    monkeypatch.setenv("FLYREG_CACHE_DIR", "$FLYREG_TEST_ROOT/cache")
    assert Path(str(double_op("home_a")[0].tune(*double_inputs()).artifact)).parent == tmp_path / "a"
    assert flyreg_cli("cache", "path").out.strip() == str(tmp_path / "root" / "cache" / SCRATCH_CACHE)
    # A variable a directory names is watched like the FLYREG_* ones.
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path / "moved"))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join(["${FLYREG_TEST_ROOT}/b", "~/a"]))
    assert Path(str(double_op("home_b")[0].tune(*double_inputs()).artifact)).parent == tmp_path / "moved" / "b"
    assert flyreg_cli("cache", "path").out.strip() == str(tmp_path / "moved" / "cache" / SCRATCH_CACHE)


def test_an_artifact_the_cli_tuned_into_a_home_dir_is_served(rowscale: None, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            flyreg_cli: Callable[..., Any]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", "~/x")
    monkeypatch.setenv("FLYREG_CACHE_DIR", "$FLYREG_TEST_ROOT/scratch")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    spec = {"M": 256, "N": 32, "op": "scale"}
    result = flyreg_cli("tune", "rowscale", "--spec", "M=256,N=32,op=scale", "--device", "cpu")
    assert result.code == 0, result.out + result.err
    (artifact,) = (tmp_path / "x").iterdir()
    assert (tmp_path / "scratch" / SCRATCH_CACHE).is_file()
    assert list(work.iterdir()) == []  # no literal ./~/x
    flyreg_cli("cache", "clear")  # the runtime must find the artifact, not the scratch entry the search also wrote
    flyreg.unregister("rowscale")
    flyreg.register(RowScale(), name="rowscale")  # a fresh tuner: nothing in memory
    res = flyreg.resolve_spec("rowscale", spec)
    assert (res.source, res.path) == ("offline", str(artifact))


# -- re-reading ---------------------------------------------------------------------------------------

def test_a_changed_variable_takes_effect_at_once(monkeypatch: pytest.MonkeyPatch, flyreg_cli: Callable[..., Any]) -> None:
    from test_launch_bind import pool_threads_of_a_search

    monkeypatch.setenv("FLYREG_COMPILE_THREADS", "5")
    assert len(pool_threads_of_a_search("reread_5", 20)) == 5
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")
    monkeypatch.delenv("FLYREG_CACHE_DIR")
    assert flyreg_cli("cache", "path").out.startswith("/elsewhere/")
    monkeypatch.delenv("FLYREG_COMPILE_THREADS")
    assert len(pool_threads_of_a_search("reread_default", 20)) == DEFAULT_THREADS


# -- disabled ops ------------------------------------------------------------------------------------

def test_an_unknown_disabled_op_warns_once_with_the_known_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    flyreg.register(RowScale(tag="keep"), name="keep")
    flyreg.register(RowScale(tag="o"), name="other")
    try:
        monkeypatch.setenv("FLYREG_DISABLE_OPS", "nosuchop,keep,*")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert {i.name: i.status for i in flyreg.ops() if i.name in ("keep", "other")} == \
                {"keep": "disabled", "other": "ok"}
            flyreg.ops()
            flyreg.op("other")
        (message,) = _messages(record)
        assert "FLYREG_DISABLE_OPS names no registered op: '*', 'nosuchop'" in message
        known = re.search(r"known ops: (.*)\)", message)
        assert known is not None and {"keep", "other"} <= set(known[1].split(", "))

        monkeypatch.setenv("FLYREG_DISABLE_OPS", "keep")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert {i.name: i.status for i in flyreg.ops() if i.name in ("keep", "other")} == \
                {"keep": "disabled", "other": "ok"}
    finally:
        monkeypatch.delenv("FLYREG_DISABLE_OPS")
        flyreg.unregister("keep")
        flyreg.unregister("other")


# -- one table, documented everywhere ----------------------------------------------------------------------

def _read_variables() -> set[str]:
    """Every FLYREG_* variable flyreg's source names (what the settings module reads)."""
    text = (ROOT / "flyreg" / "_core" / "settings.py").read_text(encoding="utf-8")
    return {node.value for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"FLYREG_[A-Z_]+", node.value)}


def test_help_lists_every_variable(flyreg_cli: Callable[..., Any]) -> None:
    listed = help_variables(flyreg_cli)
    assert set(listed) == _read_variables()
    for name, text in listed.items():
        assert re.fullmatch(r"\S.*\. Values: .+\. Default: .+\.", text), (name, text)


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_docs_show_the_table_of_every_variable(doc: str, flyreg_cli: Callable[..., Any]) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert "| variable | values | default | effect |\n|---|---|---|---|\n" in text
    rows = re.findall(r"^\| `(FLYREG_\w+)` \| (.+?) \| (.+?) \| (.+?) \|$", text, re.M)
    assert [r[0] for r in rows] == list(help_variables(flyreg_cli))  # every variable, in the help's order
    for name, values, default, effect in rows:  # each row says what the help says
        said = f"{effect[:1].upper()}{effect[1:]}. Values: {values}. Default: {default}.".replace("`", "")
        assert help_variables(flyreg_cli)[name] == said, name


def _reads_of_flyreg_variables(path: Path) -> list[str]:
    """Places in ``path`` that pass a FLYREG_* name to a call or a subscript (``get("FLYREG_X")``,
    ``env["FLYREG_X"]``), or touch the process environment."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        keys = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else \
            [node.slice] if isinstance(node, ast.Subscript) else []
        found += [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for k in keys
                  if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("FLYREG_")]
        if isinstance(node, (ast.Attribute, ast.Name)) and getattr(node, "attr", getattr(node, "id", "")) in (
                "environ", "getenv", "environb", "putenv"):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_settings_module_reads_flyreg_variables() -> None:
    package = ROOT / "flyreg"
    # keys.py reads the variables an op declares in key_env (its own, never flyreg's) into cache keys;
    # supervise.py passes the CLI's child the descriptor it marks itself done on (not a setting);
    # triton.py asks whether Triton's own TRITON_INTERPRET is on, where Triton cannot say.
    others = {package / "_core" / "keys.py", package / "_cli" / "supervise.py", package / "triton.py"}
    allowed = {package / "_core" / "settings.py", *others}
    found = [hit for p in sorted(package.rglob("*.py")) if p not in allowed for hit in _reads_of_flyreg_variables(p)]
    assert found == []
    assert "FLYREG_" not in "".join(hit for p in sorted(others) for hit in _reads_of_flyreg_variables(p))
    assert _reads_of_flyreg_variables(package / "_core" / "settings.py")  # the check sees real reads
