"""flyreg's modules import each other without cycles, and each layer only imports the layers below it.

Every import statement counts, wherever it is: at module level, inside a function, or under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "flyreg"

#: The internal layers, lowest first: a module may import its own layer and the ones before it.
LAYERS = ("_core", "_artifacts", "_search", "_runtime", "_plugins", "_tuning", "_ray", "_report", "_cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The flyreg modules ``name`` (at ``path``) imports, by every import statement in it."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    edges = graph()
    assert "flyreg._runtime.tuner" in edges["flyreg._runtime.builder"]  # module level
    assert "flyreg._runtime.builds" in edges["flyreg._plugins.registry"]  # inside a function
    assert "flyreg._runtime.tuner" in edges["flyreg._plugins.registry"]  # under TYPE_CHECKING
    assert "flyreg._core.keys" in edges["flyreg._core.results"]


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("low", LAYERS)
def test_each_layer_imports_only_itself_and_the_layers_below(low: str) -> None:
    edges = graph()
    rank = LAYERS.index(low)
    upward = sorted(f"{a} -> {b}" for a, targets in edges.items() if layer(a) == rank
                    for b in targets if (layer(b) or -1) > rank)
    assert not upward, f"{low} imports a higher layer: {upward}"


def test_the_lowest_modules_import_no_layer() -> None:
    edges = graph()
    assert edges["flyreg._version"] == set()
    assert all(layer(b) is None or b == "flyreg" for b in edges["flyreg"])
