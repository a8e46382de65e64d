"""The public API: every exported name resolves, and ``import flyreg`` stays light."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flyreg


@pytest.mark.parametrize("name", flyreg.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(flyreg, name) is not None
    assert name in dir(flyreg)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        flyreg.nope  # noqa: B018


def test_import_loads_no_heavy_module() -> None:
    code = "import sys, json, flyreg; print(json.dumps(sorted(m for m in ('torch', 'click', 'rich', 'pluggy') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == []


def test_pending_and_tune_pending_are_public_and_cost_nothing_with_nothing_pending() -> None:
    assert {"pending", "tune_pending"} <= set(flyreg.__all__)
    code = ("import sys, json, flyreg; out = [flyreg.pending(), flyreg.tune_pending()]; "
            "print(json.dumps([out, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == [[[], []], False]  # a fresh process: nothing missed, and torch not even loaded


def test_accepts_asks_the_installed_op_about_a_stored_config() -> None:
    spec = {"M": 32, "N": 1024, "backend": "cpu", "dtype": "float32"}
    served = flyreg.resolve_spec("rmsnorm", spec).config
    assert flyreg.accepts("rmsnorm", spec, served) is None
    why = flyreg.accepts("rmsnorm", spec, flyreg.Config({"NOT_A_KNOB": 1}))
    assert why is not None and "NOT_A_KNOB" in why
    with pytest.raises(flyreg.SpecError, match="dtyp"):
        flyreg.accepts("rmsnorm", {**spec, "dtyp": "float32"}, served)


# -- tests, benchmarks and plugins use the public API only ------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
#: Files that may name flyreg's internals, each for the reason docs/architecture.md gives.
EXCEPTIONS = {
    "tests/unit/test_imports.py",  # reads flyreg's own source to check its layering
    "conftest.py",  # resets flyreg's one-time warnings between tests, as a new process would have none
    "tests/serving/test_served_imports.py",  # names the search's package, to find that a served call imports none
    "tests/unit/test_captured_output.py",  # drives the output capture: its restore after SystemExit has no public call
    "tests/unit/test_draws.py",  # drives the steady timing's input sets (only a GPU search reaches them) and record
    "tests/unit/test_local_search_budget.py",  # drives the local search on a clock of its own, not the machine's
}
INTERNAL = re.compile(r"\bflyreg\._[A-Za-z]|\bfrom\s+flyreg\s+import\s+(?:\(\s*)?(?:[\w\s,]*,\s*)?_[A-Za-z]")


def python_files() -> list[Path]:
    skip = {".venv", "build", "dist", "__pycache__", ".pytest_cache"}
    return [ROOT / "conftest.py"] + [
        p for top in ("tests", "benchmarks", "plugins") for p in sorted((ROOT / top).rglob("*.py"))
        if not skip & set(p.relative_to(ROOT).parts) and not any(part.endswith(".egg-info") for part in p.parts)]


def test_tests_benchmarks_and_plugins_name_no_internal_module() -> None:
    offenders = {}
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXCEPTIONS:
            continue
        hits = [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if INTERNAL.search(line)]
        if hits:
            offenders[rel] = hits
    assert not offenders, "\n".join(hit for hits in offenders.values() for hit in hits)


def test_every_exception_still_needs_to_be_one() -> None:
    for rel in sorted(EXCEPTIONS):
        path = ROOT / rel
        assert path.is_file() and INTERNAL.search(path.read_text(encoding="utf-8")), \
            f"{rel} names no internal module any more: take it off the list"
    documented = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert all(f"`{rel}`" in documented for rel in EXCEPTIONS)


P, U = "flyreg.", "_"  # so this file itself names no internal module


@pytest.mark.parametrize("text, internal", [
    (f"from {P}{U}core import fileio", True), (f"import {P}{U}plugins.registry", True),
    (f"{P}{U}artifacts.store.load()", True), (f"from flyreg import {U}version", True),
    (f"from flyreg import Config, {U}secret", True), ("from flyreg import __version__", False),
    ("flyreg.__file__", False), ("from flyreg import Config", False), ("flyreg.plugin.OpRecord", False),
])
def test_the_check_tells_internal_names_from_public_ones(text: str, internal: bool) -> None:
    assert bool(INTERNAL.search(text)) is internal


# -- flyreg.__all__ is for applications, flyreg.plugin for plugin authors -------------------------------------
#: The names a plugin is written with that an application never needs.
AUTHORING = ("hookimpl", "hookspec", "OpRecord", "Axis")


@pytest.mark.parametrize("name", AUTHORING)
def test_an_authoring_name_is_in_flyreg_plugin_not_in_the_application_api(name: str) -> None:
    import flyreg.plugin

    assert name not in flyreg.__all__ and name not in dir(flyreg)
    assert name in flyreg.plugin.__all__
    assert getattr(flyreg, name) is getattr(flyreg.plugin, name)  # still found for plugins written before


def plugin_modules() -> list[Path]:
    """The modules of the in-tree plugins' packages (not their tests or benchmarks)."""
    return [p for p in python_files() if p.relative_to(ROOT).parts[0] == "plugins"
            and p.relative_to(ROOT).parts[2].startswith("flyreg_")]


def guide_blocks() -> list[str]:
    """The Python code blocks of docs/plugin_authoring.md."""
    guide = (ROOT / "docs" / "plugin_authoring.md").read_text(encoding="utf-8")
    return re.findall(r"```py(?:thon)?\n(.*?)```", guide, flags=re.S)


#: What a plugin may import of flyreg: the plugin API, and Triton's plumbing for a hand-written launch.
AUTHOR_MODULES = {"flyreg.plugin", "flyreg.triton"}


def flyreg_imports(source: str) -> list[str]:
    """The flyreg modules ``source`` imports from, and ``flyreg.NAME`` attributes it uses, as written."""
    found = re.findall(r"^\s*from\s+(flyreg(?:\.\w+)*)\s+import", source, flags=re.M)
    found += re.findall(r"^\s*import\s+(flyreg(?:\.\w+)*)", source, flags=re.M)
    return found + [f"flyreg.{n}" for n in re.findall(r"\bflyreg\.(\w+)\b", source) if n in AUTHORING]


def test_plugins_and_the_guide_take_authoring_names_from_flyreg_plugin() -> None:
    modules = plugin_modules()
    assert len(modules) >= 4  # both in-tree plugins' packages were read
    for path in modules:
        bad = [m for m in flyreg_imports(path.read_text(encoding="utf-8")) if m not in AUTHOR_MODULES]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}; a plugin imports from flyreg.plugin"
    blocks = guide_blocks()
    assert blocks
    used = [m for block in blocks for m in flyreg_imports(block) if m.removeprefix("flyreg.") in AUTHORING]
    assert not used, f"docs/plugin_authoring.md writes {used}; authors import these from flyreg.plugin"
    assert not re.search(r"from\s+flyreg\s+import\s+[^\n]*\b(?:" + "|".join(AUTHORING) + r")\b",
                         "\n".join(blocks))
    assert "`@flyreg.hookimpl`" not in (ROOT / "docs" / "plugin_authoring.md").read_text(encoding="utf-8")
