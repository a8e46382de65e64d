"""The settings object: every FLYREG_* variable read, validated and documented in one place."""

from __future__ import annotations

import ast
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import torch
from click.testing import CliRunner

import flyreg
from flyreg import FlyregWarning
from flyreg._artifacts import cache
from flyreg._core import settings
from flyreg._core.settings import NAMES, VARIABLES, Settings, current, expand_path
from flyreg._plugins import registry
from flyreg._plugins.registry import Registry
from flyreg._runtime.tuner import autotune_forced
from flyreg._search.engine import compile_threads

from test_registry import RowScale, ep, inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_flyreg_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def rowscale(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A fresh process-wide registry holding the CPU op ``rowscale``, registered in-process."""
    from flyreg._runtime.builder import BUILD_CACHE

    reg = Registry(entry_points=lambda: [])
    monkeypatch.setattr(registry, "REGISTRY", reg)
    BUILD_CACHE.clear()
    flyreg.register(RowScale(), name="rowscale")
    yield reg


def _messages(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FlyregWarning)]


# -- values -------------------------------------------------------------------------------------------

def test_unset_and_empty_variables_get_the_defaults(no_flyreg_env: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        defaults = Settings.from_env({})
        assert Settings.from_env({name: " " for name in NAMES}) == defaults
    assert (defaults.autotune, defaults.config_dirs, defaults.disable_ops, defaults.plugin_timeout) == \
        (False, (), frozenset(), 30.0)
    assert defaults.compile_threads == min(16, os.cpu_count() or 1)
    assert [v.field for v in VARIABLES] == list(attrs.fields_dict(Settings))  # one variable per field


@pytest.mark.parametrize("raw, value", [*((s, True) for s in ("1", "true", "yes", "on", "TRUE", " Yes ", "On")),
                                        *((s, False) for s in ("0", "false", "no", "off", "FALSE", "Off"))])
def test_every_boolean_spelling(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert current().autotune is value
        assert autotune_forced() is value


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
])
def test_a_bad_value_warns_once_naming_it_and_the_default_is_used(name: str, raw: str, allowed: str) -> None:
    var = next(v for v in VARIABLES if v.name == name)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = Settings.from_env({name: raw})
        again = Settings.from_env({name: raw})
    (message,) = _messages(record)
    assert f"{name}={raw!r}" in message and f"expected {allowed}" in message and f"default ({var.default})" in message
    assert first == again == Settings.from_env({})


def test_good_values_are_read(tmp_path: Path) -> None:
    env = {"FLYREG_AUTOTUNE": "yes", "FLYREG_CACHE_DIR": str(tmp_path / "c"),
           "FLYREG_CONFIG_DIR": os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]),
           "FLYREG_DISABLE_OPS": " x, y ,,", "FLYREG_COMPILE_THREADS": " 3 ", "FLYREG_COMPILE_WORKERS": "2",
           "FLYREG_CANDIDATE_TIMEOUT": "7.5", "FLYREG_PLUGIN_TIMEOUT": "2.5"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = Settings.from_env(env)
    assert s == Settings(True, tmp_path / "c", (tmp_path / "a", tmp_path / "b"), frozenset({"x", "y"}), 3, 2, 7.5,
                         2.5)


def test_a_bad_compile_thread_count_with_autotune_does_not_break_the_first_call(
        rowscale: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
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
        assert compile_threads() == min(16, os.cpu_count() or 1)


def test_the_plugin_load_limit_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_PLUGIN_TIMEOUT", "0.5")
    assert registry.plugin_load_timeout() == 0.5
    monkeypatch.setenv("FLYREG_PLUGIN_TIMEOUT", "soon")
    with pytest.warns(FlyregWarning, match="FLYREG_PLUGIN_TIMEOUT='soon': expected seconds > 0"):
        assert registry.plugin_load_timeout() == 30.0


# -- directories ----------------------------------------------------------------------------------------

def test_expand_path() -> None:
    env = {"HOME": "/home/u", "ROOT": "/srv", "EMPTY": ""}
    assert expand_path("~", env) == Path("/home/u")
    assert expand_path("~/a/$ROOT", env) == Path("/home/u/a/srv")
    assert expand_path("${ROOT}/x/$ROOT", env) == Path("/srv/x/srv")
    assert expand_path("$UNSET/x", env) == Path("$UNSET/x")  # left as written, as the shell's expandvars does
    assert expand_path("a~/b", env) == Path("a~/b")
    assert expand_path("$EMPTY/x", env) == Path("/x")


def test_directories_expand_home_and_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join(["~/a", "${FLYREG_TEST_ROOT}/b"]))
    monkeypatch.setenv("FLYREG_CACHE_DIR", "$FLYREG_TEST_ROOT/cache")
    assert current().config_dirs == (tmp_path / "a", tmp_path / "root" / "b")
    assert cache.cache_dir() == tmp_path / "root" / "cache"
    # A variable a directory names is watched like the FLYREG_* ones.
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path / "moved"))
    assert current().config_dirs == (tmp_path / "a", tmp_path / "moved" / "b")
    assert cache.cache_dir() == tmp_path / "moved" / "cache"


def test_an_artifact_the_cli_tuned_into_a_home_dir_is_served(rowscale: Registry, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from flyreg._cli.main import cli

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLYREG_TEST_ROOT", str(tmp_path))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", "~/x")
    monkeypatch.setenv("FLYREG_CACHE_DIR", "$FLYREG_TEST_ROOT/scratch")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    spec = {"M": 256, "N": 32, "op": "scale"}
    result = CliRunner().invoke(cli, ["tune", "rowscale", "--spec", "M=256,N=32,op=scale", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    (artifact,) = (tmp_path / "x").iterdir()
    assert (tmp_path / "scratch" / cache.DB_NAME).is_file()
    assert list(work.iterdir()) == []  # no literal ./~/x
    cache.clear()  # the runtime must find the artifact, not the scratch entry the search also wrote
    flyreg.unregister("rowscale")
    flyreg.register(RowScale(), name="rowscale")  # a fresh tuner: nothing in memory
    res = flyreg.resolve_spec("rowscale", spec)
    assert (res.source, res.path) == ("offline", str(artifact))


# -- re-reading ---------------------------------------------------------------------------------------

def test_current_rereads_only_when_a_variable_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    first = current()
    assert current() is first  # nothing changed: the same object, nothing parsed again
    monkeypatch.setenv("FLYREG_COMPILE_THREADS", "5")
    assert current().compile_threads == 5
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")
    monkeypatch.delenv("FLYREG_CACHE_DIR")
    assert current().cache_dir.parts[:2] == ("/", "elsewhere")
    monkeypatch.delenv("FLYREG_COMPILE_THREADS")
    assert current().compile_threads == min(16, os.cpu_count() or 1)


# -- disabled ops ------------------------------------------------------------------------------------

def test_an_unknown_disabled_op_warns_once_with_the_known_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REGISTRY", Registry(entry_points=lambda: [ep("keep", RowScale(tag="keep")),
                                                                             ep("other", RowScale(tag="o"))]))
    monkeypatch.setenv("FLYREG_DISABLE_OPS", "nosuchop,keep,*")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert {i.name: i.status for i in flyreg.ops()} == {"keep": "disabled", "other": "ok"}
        flyreg.ops()
        flyreg.op("other")
    (message,) = _messages(record)
    assert "FLYREG_DISABLE_OPS names no registered op: '*', 'nosuchop'" in message
    assert "known ops: keep, other" in message

    monkeypatch.setenv("FLYREG_DISABLE_OPS", "keep")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert {i.name: i.status for i in flyreg.ops()} == {"keep": "disabled", "other": "ok"}


# -- one table, documented everywhere ----------------------------------------------------------------------

def test_help_lists_every_variable() -> None:
    from flyreg._cli.main import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for var in VARIABLES:
        assert re.search(rf"^\s+{var.name}\s+\S", result.output, re.M), var.name


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_docs_show_the_table_of_every_variable(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert settings.markdown_table() in text
    documented = set(re.findall(r"^\| `(FLYREG_\w+)`", text, re.M))
    assert documented == set(NAMES)


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
