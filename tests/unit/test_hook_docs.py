"""Every hook is typed, documented with an example, listed, described in the authoring guide and exercised.

The hook specs are read from flyreg's source (``flyreg/_plugins/hookspecs.py``) as a syntax tree, as
``test_imports.py`` reads the package: a check of the package's own structure, importing nothing internal.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs
import pytest

from flyreg.plugin import OpRecord, PluginError, hookimpl

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugin_authoring.md"
TESTS = ROOT / "tests"
SPECS = ast.parse((ROOT / "flyreg" / "_plugins" / "hookspecs.py").read_text(encoding="utf-8"))


def _is_spec(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == "hookspec"


def hooks() -> dict[str, ast.FunctionDef]:
    """Each hook spec's definition, by name."""
    return {node.name: node for node in SPECS.body
            if isinstance(node, ast.FunctionDef) and any(_is_spec(d) for d in node.decorator_list)}


def constant(name: str) -> tuple[str, ...]:
    """The tuple of names the module-level constant ``name`` of the hookspecs module holds."""
    (value,) = [node.value for node in SPECS.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    return tuple(ast.literal_eval(value))


def params(name: str) -> list[str]:
    return [a.arg for a in hooks()[name].args.args]


HOOKS = sorted(hooks())
REQUIRED, OPTIONAL = constant("REQUIRED_HOOKS"), constant("OPTIONAL_HOOKS")


def test_hooks_are_found() -> None:
    assert len(HOOKS) >= 8


def test_required_and_optional_lists_partition_the_hooks() -> None:
    listed = [*REQUIRED, *OPTIONAL]
    assert sorted(listed) == HOOKS and len(set(listed)) == len(listed)


def test_a_plugin_lacking_a_required_hook_is_named_broken() -> None:
    """The lists the source declares are the ones a plugin is held to."""
    import flyreg

    for missing in REQUIRED:
        class Partial:
            pass

        for name in REQUIRED:
            if name != missing:
                setattr(Partial, name, hookimpl(lambda self, *a: None, specname=name))
        with pytest.raises(PluginError, match=rf"lacks required hook\(s\) \['{missing}'\]"):
            flyreg.register(Partial(), name="partial")


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_firstresult_typed_and_has_an_example(name: str) -> None:
    fn = hooks()[name]
    (spec,) = [d for d in fn.decorator_list if _is_spec(d)]
    assert any(k.arg == "firstresult" and ast.literal_eval(k.value) is True for k in spec.keywords)  # type: ignore[attr-defined]
    doc = ast.get_docstring(fn) or ""
    assert "Example::" in doc, f"{name}: its docstring has no 'Example::' block"
    assert f"def {name}(" in doc and "@hookimpl" in doc, f"{name}: its example does not implement it"
    assert fn.returns is not None, f"{name}: no return annotation"
    for a in fn.args.args:
        assert a.annotation is not None, f"{name}: argument {a.arg} is not annotated"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_in_the_authoring_guide(name: str) -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    kind = "required" if name in REQUIRED else "optional"
    heading = f"### `{name}({', '.join(params(name))})` ({kind})"
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


def legacy_describe_keys() -> set[str]:
    """The keys a legacy ``describe()`` dict may hold, as the error about an unknown one lists them."""
    with pytest.raises(ValueError, match="unknown keys") as info:
        OpRecord.of({"no_such_key": 1})
    return set(re.findall(r"'(\w+)'", str(info.value).rpartition("known:")[2]))


def test_record_fields_are_documented() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    doc = ast.get_docstring(hooks()["describe"]) or ""
    fields = [f.name for f in attrs.fields(OpRecord)]
    assert legacy_describe_keys() <= set(fields)  # a legacy describe() dict holds record fields only
    for key in fields:
        assert f"| `{key}` |" in guide, f"record field {key!r} is not in the guide's table"
        assert f"``{key}``" in doc, f"record field {key!r} is not in the hookspec's docstring"
