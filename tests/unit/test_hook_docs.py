"""Every hook is typed, documented with an example, listed, described in the authoring guide and exercised."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from flyreg._plugins import hookspecs
from flyreg._plugins.record import DESCRIBE_KEYS, OpRecord

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugin_authoring.md"
TESTS = ROOT / "tests"


def hooks() -> dict[str, Callable[..., Any]]:
    marker = f"{hookspecs.PROJECT}_spec"
    return {name: fn for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and hasattr(fn, marker)}


HOOKS = sorted(hooks())


def test_hooks_are_found() -> None:
    assert len(HOOKS) >= 8


def test_required_and_optional_lists_partition_the_hooks() -> None:
    listed = [*hookspecs.REQUIRED_HOOKS, *hookspecs.OPTIONAL_HOOKS]
    assert sorted(listed) == HOOKS and len(set(listed)) == len(listed)


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_firstresult_typed_and_has_an_example(name: str) -> None:
    fn = hooks()[name]
    assert getattr(fn, f"{hookspecs.PROJECT}_spec")["firstresult"] is True
    doc = inspect.getdoc(fn) or ""
    assert "Example::" in doc, f"{name}: its docstring has no 'Example::' block"
    assert f"def {name}(" in doc and "@hookimpl" in doc, f"{name}: its example does not implement it"
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return annotation"
    for p in sig.parameters.values():
        assert p.annotation is not inspect.Parameter.empty, f"{name}: argument {p.name} is not annotated"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_in_the_authoring_guide(name: str) -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    params = ", ".join(inspect.signature(hooks()[name]).parameters)
    kind = "required" if name in hookspecs.REQUIRED_HOOKS else "optional"
    heading = f"### `{name}({params})` ({kind})"
    assert heading in guide, f"docs/plugin_authoring.md has no section {heading!r}"
    section = guide.split(heading, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    assert re.search(rf"^def {name}\(", section, re.M), f"the {name} section has no example implementing it"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_exercised_by_the_tests(name: str) -> None:
    """Some test plugin implements the hook (the example in the guide counts: it is executed)."""
    pattern = re.compile(rf"^\s*def {name}\(", re.M)
    here = Path(__file__).resolve()
    sources = [p for p in TESTS.rglob("*.py") if p.resolve() != here]
    users = [p for p in sources if pattern.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert users, f"no test implements the hook {name}"
    callers = [p for p in sources if re.search(rf"\b{name}\b", p.read_text(encoding="utf-8", errors="replace"))
               and "test_" in p.name]
    assert callers, f"no test module mentions the hook {name}"


def test_record_fields_are_documented() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    doc = inspect.getdoc(hookspecs.describe) or ""
    fields = [f.name for f in attrs.fields(OpRecord)]
    assert DESCRIBE_KEYS <= set(fields)  # a legacy describe() dict holds record fields only
    for key in fields:
        assert f"| `{key}` |" in guide, f"record field {key!r} is not in the guide's table"
        assert f"``{key}``" in doc, f"record field {key!r} is not in the hookspec's docstring"
