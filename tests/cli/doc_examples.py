"""The example blocks of a markdown page of shell sessions: parsing, normalizing output, and rewriting.

An example block is a ```console fence whose first line starts with ``$ ``. Each ``$ `` line is
one command; the lines up to the next ``$ `` line are what it printed, then ``[exit N]`` when
it exited with N != 0. A line ``...`` in a command's output stands for lines cut out there: the
lines above it are the first lines of the output, the lines below it the last ones.

An HTML comment right above the fence, ``<!-- docs-test: ... -->`` with one directive a line,
says how to run the block (see ``Example``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import attrs

CUT = "..."
EXAMPLE = re.compile(r"(?:<!-- docs-test:(?P<directives>[^>]*?)-->\n)?```console\n(?P<body>\$ .*?)^```$",
                     re.S | re.M)


@attrs.frozen
class Command:
    line: str  # as typed after "$ "
    shown: tuple[str, ...]  # the output lines shown, with their "..." cut and "[exit N]" line

    def cut(self) -> tuple[int, int] | None:
        """(lines kept above the cut, lines kept below it), or None when nothing is cut."""
        if CUT not in self.shown:
            return None
        at = self.shown.index(CUT)
        return at, len(self.shown) - at - 1

    def render(self, output: Sequence[str], code: int) -> list[str]:
        """What the page shows for ``output`` and exit status ``code``, cut where this command's output is."""
        lines = [*output, *([f"[exit {code}]"] if code else [])]
        cut = self.cut()
        if cut is not None and len(lines) > sum(cut):
            head, tail = cut
            lines = [*lines[:head], CUT, *(lines[len(lines) - tail:] if tail else [])]
        return [f"$ {self.line}", *lines]


@attrs.frozen
class Example:
    """One example block and how to run it.

    Directives: ``continue`` runs the block in the session (directory, environment) of the block
    before it, else it gets a fresh one; ``plugins: NAME,...`` adds fake distributions to flyreg's
    own ops; ``setup: COMMAND`` runs COMMAND first, unshown (repeatable); ``files: NAME`` makes
    the named files, unshown (repeatable); ``interrupt: N artifacts in DIR`` sends SIGINT to the
    block's first command once DIR holds N artifacts.
    """

    start: int  # offsets of the block's body in the page
    end: int
    commands: tuple[Command, ...]
    fresh: bool = True
    plugins: tuple[str, ...] = ()
    setup: tuple[tuple[str, str], ...] = ()  # ("setup" | "files", value), in order
    interrupt: tuple[int, str] | None = None

    def body(self, runs: Sequence[tuple[list[str], int]]) -> str:
        """The block's new body for each command's (output, exit status)."""
        lines = [line for command, (output, code) in zip(self.commands, runs) for line in command.render(output, code)]
        return "\n".join(lines) + "\n"


def _commands(body: str) -> tuple[Command, ...]:
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    return tuple(Command(line, tuple(shown)) for line, shown in commands)


def parse_directives(text: str) -> dict[str, object]:
    """The ``Example`` fields an HTML comment's directives set; ValueError for one it does not know."""
    fields: dict[str, object] = {}
    setup: list[tuple[str, str]] = []
    for raw in text.strip().splitlines():
        key, _, value = (part.strip() for part in raw.partition(":"))
        if key == "continue" and not value:
            fields["fresh"] = False
        elif key == "plugins":
            fields["plugins"] = tuple(v.strip() for v in value.split(","))
        elif key in ("setup", "files"):
            setup.append((key, value))
        elif key == "interrupt" and (m := re.fullmatch(r"(\d+) artifacts in (\S+)", value)):
            fields["interrupt"] = (int(m[1]), m[2])
        else:
            raise ValueError(f"unknown docs-test directive {raw.strip()!r}")
    fields["setup"] = tuple(setup)
    return fields


def examples(page: str) -> list[Example]:
    """Every example block of ``page``, in order."""
    found: list[Example] = []
    for m in EXAMPLE.finditer(page):
        fields = parse_directives(m["directives"] or "")
        if not fields.get("fresh", True) and (fields.get("plugins") or not found):
            raise ValueError(f"an example that continues a session cannot set plugins or come first: {m[0][:80]!r}")
        found.append(Example(m.start("body"), m.end("body"), _commands(m["body"]), **fields))  # type: ignore[arg-type]
    return found


def rewrite(page: str, bodies: Sequence[tuple[Example, str]]) -> str:
    """``page`` with each example's body replaced."""
    for example, body in sorted(bodies, key=lambda pair: -pair[0].start):
        page = page[:example.start] + body + page[example.end:]
    return page


# -- normalizing what a command printed ---------------------------------------------------------------------
#: Tune and report summary columns whose values come from timing, and what they show instead.
MASKED_COLUMNS = {"winner": "<winner>", "time": "<time>", "vs default": "<speedup>", "speedup": "<speedup>",
                  "why": "<why>", "of bound": "<of bound>", "measuring": "<seconds>", "slower": "<slower>"}


def _cells(line: str, edge: str) -> list[str]:
    return line[1:-1].split(edge)


def _render_table(title: str | None, header: list[str], rows: list[list[str]], right: list[bool]) -> list[str]:
    """A table as rich draws it (box.HEAVY_HEAD, one space of padding), its title centred above."""
    widths = [max(len(c) for c in column) for column in zip(header, *rows)]

    def rule(left: str, fill: str, sep: str, end: str) -> str:
        return left + sep.join(fill * (w + 2) for w in widths) + end

    def cells(edge: str, values: list[str]) -> str:
        return edge + edge.join(f" {v.rjust(w) if r else v.ljust(w)} " for v, w, r in zip(values, widths, right)) + edge

    lines = [rule("┏", "━", "┳", "┓"), cells("┃", header), rule("┡", "━", "╇", "┩"),
             *(cells("│", row) for row in rows), rule("└", "─", "┴", "┘")]
    if title is not None:
        lines.insert(0, " " * ((len(lines[0]) - len(title)) // 2) + title)
    return lines


def _unfolded(raw_rows: list[list[str]]) -> list[list[str]]:
    """Body rows with each cell that rich folded over several lines joined back: with a space where
    the line was cut at one (the fragment falls short of the column), else without (a long word)."""
    rows: list[list[str]] = []
    for raw in raw_rows:
        cells = [c.strip() for c in raw]
        if rows and not cells[0]:
            rows[-1] = [f"{done}{' ' if short else ''}{more}" if more else done
                        for done, more, short in zip(rows[-1], cells, last_short)]
        else:
            rows.append(cells)
        last_short = [len(c.rstrip()) < len(c) - 1 for c in raw]
    return rows


def _table(lines: list[str], replace: Callable[[str], str]) -> list[str]:
    """One rich table (its title line first, if any), with ``replace`` applied to the title and every cell,
    and the timing columns masked, laid out again. A table with folded cells is shown as rich folded
    it, unless that changes a cell: it is then shown unfolded, one line a row."""
    title = lines[0].strip() if not lines[0].startswith("┏") else None
    box = lines[1:] if title is not None else lines
    if len(box) < 4 or not (box[1].startswith("┃") and box[2].startswith("┡") and box[-1].startswith("└")):
        raise ValueError(f"not a rich table as expected: {lines[:3]}")
    raw_rows = [_cells(line, "│") for line in box[3:-1]]
    raw_header = _cells(box[1], "┃")
    right = [any(c[1:-1].startswith(" ") and c.strip() for c in column) for column in zip(raw_header, *raw_rows)]
    header, physical = [c.strip() for c in raw_header], [[c.strip() for c in row] for row in raw_rows]
    drawn, shown = _render_table(title, header, physical, right), [line.rstrip() for line in lines]
    if title is not None:  # rich rounds a centred title's odd spare column either way
        drawn, shown = [drawn[0].strip(), *drawn[1:]], [shown[0].strip(), *shown[1:]]
    rows, masks = _unfolded(raw_rows), [MASKED_COLUMNS.get(h) for h in header]
    # A layout this re-drawing does not reproduce is shown as printed, each line replaced; but a folded one with
    # timing columns (rich may give a folded column more room than its longest line) is unfolded, masked and laid
    # out again, so what timing put in it does not show.
    if drawn != shown and not (len(rows) < len(physical) and any(masks)):
        out = [replace(line).rstrip() for line in lines]
        if title is not None:  # centred again over the box: rich centred it as long as the unreplaced title was
            shown_title = replace(title)
            out[0] = " " * max(0, (len(out[1]) - len(shown_title)) // 2) + shown_title
        return out
    changed = [[m if m and c else replace(c) for c, m in zip(row, masks)] for row in rows]
    if len(rows) < len(physical) and changed == rows:
        changed = physical
    return _render_table(replace(title) if title is not None else None, header, changed, right)


def normalize(text: str, replace: Callable[[str], str]) -> list[str]:
    """The lines of ``text``, trailing spaces and blank lines at the end removed, with ``replace`` applied
    to each line (to each title and cell of a rich table, which is then laid out again)."""
    lines = [line.rstrip() for line in text.splitlines()]
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("┏"):
            end = next(j for j in range(i, len(lines)) if lines[j].startswith("└"))
            has_title = i > 0 and lines[i - 1].startswith(" ") and bool(lines[i - 1].strip())
            start = i - 1 if has_title else i
            if has_title:
                out.pop()
            out.extend(_table(lines[start:end + 1], replace))
            i = end + 1
            continue
        out.append(replace(lines[i]))
        i += 1
    while out and not out[-1]:
        out.pop()
    return out
