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
}
INTERNAL = re.compile(r"\bflyreg\._[A-Za-z]|\bfrom\s+flyreg\s+import\s+(?:\(\s*)?(?:[\w\s,]*,\s*)?_[A-Za-z]")


def python_files() -> list[Path]:
    skip = {".venv", "build", "dist", "__pycache__", ".pytest_cache"}
    return [ROOT / "conftest.py"] + [
        p for top in ("tests", "benchmarks", "plugins") for p in sorted((ROOT / top).rglob("*.py"))
    "tests/serving/test_served_imports.py",  # names the search's package, to find that a served call imports none
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
