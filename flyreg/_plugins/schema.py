"""An op's torch schema, as its record declares it: parsed (without torch) and given its mutation marks.

A record writes the schema without the op's name, ``"(Tensor x, Tensor weight, float eps=1e-06) -> Tensor"``.
Arguments the record lists in ``restore_value`` or ``reset_to_zero`` are written in place by the
kernel; :func:`schema_for` marks each as mutated (``Tensor(a!) residual``), so torch.compile
and functionalization see the write.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Sequence

import attrs

_SCHEMA = re.compile(r"^\s*\((?P<args>.*)\)\s*->\s*(?P<returns>.+?)\s*$", re.S)
_ALIAS = re.compile(r"\((?P<set>[a-z])(?P<write>!?)\)")


class SchemaError(ValueError):
    """A torch schema that flyreg cannot read; the message names what is wrong."""


@attrs.frozen
class SchemaArg:
    """One argument: its type as written (``Tensor(a!)``), name, default (as written, or None), keyword-only."""

    type: str
    name: str
    default: str | None
    kw_only: bool

    @property
    def is_tensor(self) -> bool:
        return self.type.split("(")[0].rstrip("?") == "Tensor"

    @property
    def mutated(self) -> bool:
        m = _ALIAS.search(self.type)
        return m is not None and m.group("write") == "!"

    def text(self) -> str:
        return f"{self.type} {self.name}" + (f"={self.default}" if self.default is not None else "")


@attrs.frozen
class Schema:
    args: tuple[SchemaArg, ...]
    returns: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @property
    def returns_nothing(self) -> bool:
        return self.returns.replace(" ", "") == "()"

    def arg(self, name: str) -> SchemaArg | None:
        return next((a for a in self.args if a.name == name), None)

    def text(self, op: str) -> str:
        """The schema ``torch.library`` defines: ``op(Tensor x, *, float eps=1e-06) -> Tensor``."""
        parts: list[str] = []
        for a in self.args:
            if a.kw_only and "*" not in parts:
                parts.append("*")
            parts.append(a.text())
        return f"{op}({', '.join(parts)}) -> {self.returns}"


def _split(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_schema(text: object) -> Schema:
    """The schema ``text`` (no op name) as a :class:`Schema`; :class:`SchemaError` saying what is malformed."""
    if not isinstance(text, str):
        raise SchemaError(f"torch_schema must be a str like '(Tensor x, float eps=1e-06) -> Tensor', got {text!r}")
    return _parse(text)


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> Schema:
    # Parsed once per text: an op's record, its declaration and its tuner each read the same schema.
    m = _SCHEMA.match(text)
    if m is None:
        raise SchemaError(f"torch_schema {text!r} is not '(<arguments>) -> <returns>' "
                          f"(write it without the op's name, e.g. '(Tensor x, float eps=1e-06) -> Tensor')")
    args: list[SchemaArg] = []
    kw_only = False
    for part in _split(m.group("args")):
        if part == "*":
            kw_only = True
            continue
        decl, _, default = part.partition("=")
        pieces = decl.rsplit(None, 1)
        if len(pieces) != 2 or not pieces[1].isidentifier():
            raise SchemaError(f"torch_schema {text!r}: argument {part!r} is not '<type> <name>[=<default>]'")
        args.append(SchemaArg(pieces[0].strip(), pieces[1], default.strip() or None if "=" in part else None,
                              kw_only))
    names = [a.name for a in args]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchemaError(f"torch_schema {text!r} names arguments {twice} more than once")
    return Schema(tuple(args), m.group("returns").strip())


def mark_mutated(schema: Schema, written: Sequence[str]) -> Schema:
    """``schema`` with each argument of ``written`` marked mutated (``Tensor(a!)``), in a fresh alias set.

    Raises :class:`SchemaError` for a written argument that is not a Tensor of the schema, or is
    marked as an alias but not written, and for an argument marked written that ``written`` lacks.
    """
    used = {m.group("set") for a in schema.args for m in _ALIAS.finditer(a.type)}
    used |= {m.group("set") for m in _ALIAS.finditer(schema.returns)}
    free = (c for c in string.ascii_lowercase if c not in used)
    out: list[SchemaArg] = []
    for a in schema.args:
        if a.name not in written:
            if a.mutated:
                raise SchemaError(f"torch_schema marks {a.name!r} as written in place ({a.type}), but the record's "
                                  f"restore_value and reset_to_zero do not name it; add it to one of them")
            out.append(a)
            continue
        if not a.is_tensor:
            raise SchemaError(f"{a.name!r} is written in place (restore_value/reset_to_zero), so its torch_schema "
                              f"type must be a Tensor, got {a.type!r}")
        if a.mutated:
            out.append(a)
            continue
        if _ALIAS.search(a.type):
            raise SchemaError(f"torch_schema marks {a.name!r} as an alias ({a.type}) but not as written; write "
                              f"'Tensor(a!)' or leave the mark to flyreg")
        letter = next(free, None)
        if letter is None:
            raise SchemaError("torch_schema has more in-place arguments than alias sets (a-z)")
        base, optional = a.type.rstrip("?"), a.type.endswith("?")
        out.append(attrs.evolve(a, type=f"{base}({letter}!)" + ("?" if optional else "")))
    missing = [n for n in written if schema.arg(n) is None]
    if missing:
        raise SchemaError(f"restore_value/reset_to_zero name {missing}, which the torch_schema lacks "
                          f"(its arguments: {list(schema.names)})")
    return attrs.evolve(schema, args=tuple(out))
