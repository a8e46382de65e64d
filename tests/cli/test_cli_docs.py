"""docs/cli.md cannot drift: every example on it is run, and must print what the page shows.

After a change to what the command prints, update the page with one command:

    FLYREG_REGEN_DOCS=1 python -m pytest -q tests/cli/test_cli_docs.py

It rewrites the output of every example in docs/cli.md in place (keeping each ``...`` cut where
it is) and passes; review the result with ``git diff docs/cli.md``. Without the variable, the
test fails with the diff between the page and what the commands print now. To add an example,
write its ```console block with just its ``$ `` lines (and a ``...`` line under a command whose
output should be cut there) and run the same command.

An example is a ```console block whose lines starting with ``$ `` are commands (the format, and
the ``<!-- docs-test: ... -->`` directives that set a block up, are in ``doc_examples.py``).
Each block runs in a session: a fresh working directory, shown as ``/tmp/flyreg-demo``, with
``FLYREG_CONFIG_DIR=/tmp/flyreg-demo/configs``, ``FLYREG_CACHE_DIR=/tmp/flyreg-demo/cache``,
the XDG dirs elsewhere, no GPU visible (``CUDA_VISIBLE_DEVICES=""``), ``COLUMNS=100``, and
only flyreg's own ops plus the fake distributions the block names (``broken-ops``), whatever
else is installed. ``flyreg`` commands run as forks of one interpreter that imported torch
already (``command_server.py``), which is what keeps this test fast; any other command runs
in bash. stdout and stderr are shown interleaved, as a terminal shows them.

What varies from run to run or machine to machine is normalized, and the page shows:

- ``/tmp/flyreg-demo`` for the session's directory, and ``<flyreg_rmsnorm>/configs`` for the
  artifacts shipped inside the installed RMSNorm plugin;
- ``CPU_NAME`` and ``cpu-ARCH`` for this machine's device name and architecture;
- ``<winner>``, ``<time>``, ``<speedup>`` and ``<why>`` in the tune summary's timing columns (``<speedup>``,
  ``<of bound>`` and ``<seconds>`` in the report summary's), the table
  laid out again for the new widths (rich's titles are centred again too; a table whose folded
  cells change is shown unfolded, one line a row);
- ``-:--:--`` for the progress bar's elapsed and remaining times, ``<seconds>`` for a tune's
  wall time, ``<cost>`` for what ``check --remeasure`` measured a source to cost, ``<slower>`` in
  its table's timing column (``<time>`` and ``<speedup>`` too), ``<date>`` for a timestamp,
  ``.corrupt-<time>`` for a moved-aside file's suffix and
  ``<GB/s>`` for a measured copy bandwidth;
- ``<progress bar>`` for an unfinished progress bar (an interrupted tune's: its job line, and its search's
  configs line where the interrupt landed while one showed);
- no trailing spaces, and no blank lines at the end of an output.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from cli_harness import BROKEN_ENTRY_POINTS, CommandServer, command_env, fake_distribution
from doc_examples import Example, examples, normalize, rewrite
from flyreg import DeviceIdentity
from on_disk import artifact_name, this_device
from toy_ops import NAP_ENTRY_POINTS, NAP_MODULE, NAP_NAME, shipped_naps

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGEN = os.environ.get("FLYREG_REGEN_DOCS") == "1"
SHOWN_DIR = "/tmp/flyreg-demo"
SHOWN_SHIPPED = "<flyreg_rmsnorm>/configs"
FAKE_DISTRIBUTIONS = {"broken-ops": BROKEN_ENTRY_POINTS, NAP_NAME: NAP_ENTRY_POINTS}
FAKE_MODULES = {NAP_NAME: {"flyreg_nap_ops/__init__.py": "", "flyreg_nap_ops/toynap.py": NAP_MODULE}}
ATTEMPTS = 3  # an interrupted example runs again (at most this often) when SIGINT landed past the next job

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or shutil.which("bash") is None,
                                reason="the examples run in forked interpreters and bash")


def shipped_config_dir() -> Path | None:
    """The artifacts the RMSNorm plugin ships inside its installed package, where it is installed."""
    spec = importlib.util.find_spec("flyreg_rmsnorm")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "configs"


def replacer(demo: Path, ident: DeviceIdentity) -> Callable[[str], str]:
    """The substitutions of the module docstring, for a session in ``demo`` on device ``ident``."""
    name = re.escape(ident.name)
    shipped = shipped_config_dir()
    rules = [
        *([(re.escape(str(shipped)), SHOWN_SHIPPED)] if shipped is not None else []),
        (re.escape(str(demo)), SHOWN_DIR),
        (re.escape(ident.arch), "cpu-ARCH"),
        (rf"(?<=device_name=){name}(?![\w-])|{name}(?= \(cpu-ARCH\)|, cpu-ARCH)|(?<=\"name\": \"){name}(?=\")",
         "CPU_NAME"),
        (r"\b\d+:\d\d:\d\d\b", "-:--:--"),
        (r"^(cost: .*, )\d+(?:\.\d+)? s$", r"\1<seconds> s"),
        (r"^(cost of source \S+: \d+ spec\(s\), ).*$", r"\1<cost>"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?", "<date>"),
        (r"\.corrupt-\d+", ".corrupt-<time>"),
        (r"copy bandwidth \d+(?:\.\d+)? GB/s", "copy bandwidth <GB/s>"),
        # where an interrupted tune's progress bar stood when SIGINT landed varies from run to run
        (r"^.*\S +━+ +\d+/\d+ -:--:-- ETA -:--:--$", "<progress bar>"),
    ]
    compiled = [(re.compile(pattern), to) for pattern, to in rules]

    def replace(text: str) -> str:
        for pattern, to in compiled:
            text = pattern.sub(to, text)
        return text

    return replace


# -- named files a block can ask for ------------------------------------------------------------------------
def bad_artifacts(demo: Path, env: dict[str, str]) -> None:
    """``bad/``: from the first rmsnorm artifact in ``configs/``, a copy cut after three lines, a copy saved under
    another spec's name, a backup copy, a hand-edited config the op does not offer (under another
    spec), and the same artifact as one of ``fused_add_rmsnorm``."""
    source = min((demo / "configs").glob("rmsnorm,*.json"))
    text = source.read_text(encoding="utf-8")
    data = json.loads(text)
    device, bad = data["device"]["name"], demo / "bad"
    bad.mkdir()

    def save(content: dict[str, Any]) -> None:
        (bad / artifact_name(content["op"], content["spec"], device)).write_text(json.dumps(content, indent=2))

    (bad / source.name).write_text("\n".join(text.splitlines()[:3]), encoding="utf-8")  # cut after the hints
    other = {**data["spec"], "M": data["spec"]["M"] * 2}
    (bad / artifact_name("rmsnorm", other, device)).write_text(text, encoding="utf-8")
    (bad / "rmsnorm-backup.json").write_text(text, encoding="utf-8")
    save({**data, "spec": {**data["spec"], "N": data["spec"]["N"] * 2},
          "config": {"kwargs": {"ROW_BLOCK": 7}, "hints": {}}})
    save({**data, "op": "fused_add_rmsnorm"})


#: A service's calls of rmsnorm on the CPU: (rows, width, calls) of float32 inputs.
SERVED = ((32, 1024, 3), (256, 1024, 2), (32, 4096, 4))


def serving_record(demo: Path, env: dict[str, str]) -> None:
    """``serving.sqlite3``: the record (``FLYREG_RECORD``) of a program that makes the calls of :data:`SERVED`."""
    program = ("import sys, torch, flyreg\nop = flyreg.op('rmsnorm')\n"
               f"for m, n, calls in {SERVED!r}:\n"
               "    x, w = torch.randn(m, n), torch.rand(n) + 0.5\n"
               "    for _ in range(calls):\n"
               "        op(x, w)\n")
    subprocess.run([sys.executable, "-c", program], cwd=demo, env={**env, "FLYREG_RECORD": "serving.sqlite3"},
                   check=True, capture_output=True, timeout=120)


def nap_artifacts(demo: Path, env: dict[str, str]) -> None:
    """``shipped/``: toynap's artifacts of ``toy_ops.shipped_naps``, from the one tuned into it."""
    shipped_naps(demo / "shipped")


FILES: dict[str, Callable[[Path, dict[str, str]], None]] = {"bad-artifacts": bad_artifacts,
                                                            "serving-record": serving_record,
                                                            "nap-artifacts": nap_artifacts}


# -- running the page ---------------------------------------------------------------------------------------
@attrs.define
class Session:
    """Where a chain of examples runs: ``root/flyreg-demo`` is the working directory."""

    root: Path
    plugins: tuple[str, ...]
    sites: dict[str, Path]  # every fake distribution's site, by name

    @property
    def demo(self) -> Path:
        return self.root / "flyreg-demo"

    def env(self, **extra: str) -> dict[str, str]:
        dirs = {"cache": self.demo / "cache", "configs": self.demo / "configs",
                "xdg_config": self.root / "xdg_config", "xdg_cache": self.root / "xdg_cache"}
        sites = {name: site for name, site in self.sites.items() if name in self.plugins}
        return command_env(dirs, sites, CUDA_VISIBLE_DEVICES="", COLUMNS="100", LINES="40", **extra)


@attrs.define
class PageRun:
    """Runs chains of examples (a fresh session and the examples that continue it) on command servers."""

    tmp: Path
    sites: dict[str, Path]
    servers: queue.Queue[CommandServer]
    ident: DeviceIdentity

    def command(self, session: Session, server: CommandServer, line: str,
                interrupt: tuple[int, str] | None = None) -> tuple[list[str], int]:
        """Run one command line; its normalized output lines and exit status."""
        words = shlex.split(line)
        assigned = {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            assigned[key] = value
        env = session.env(**assigned)
        output = session.root / "output.txt"
        if words[:1] == ["flyreg"]:
            if set(words) & {"|", ">", "<", "&&", ";", "&"}:
                raise ValueError(f"a flyreg example runs without a shell: {line!r}")
            stop = (interrupt[0], session.demo / interrupt[1]) if interrupt else None
            code = server.run(words[1:], env=env, cwd=session.demo, output=output, interrupt=stop)
            text = output.read_text(encoding="utf-8")
        else:
            proc = subprocess.run(["bash", "-c", line], cwd=session.demo, env={**env, "LC_ALL": "C"}, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            code, text = proc.returncode, proc.stdout
        lines = normalize(text, replacer(session.demo, self.ident))
        # an unfinished bar is one <progress bar>, whether or not its configs line was showing
        return [x for i, x in enumerate(lines) if x != "<progress bar>" or lines[i - 1:i] != [x]], code

    def interrupted(self, session: Session, server: CommandServer, line: str,
                    interrupt: tuple[int, str]) -> tuple[list[str], int]:
        """Run ``line`` until SIGINT stopped it right after the N-th artifact, as the page shows it."""
        count, directory = interrupt
        for _ in range(ATTEMPTS):
            shutil.rmtree(session.demo / directory, ignore_errors=True)
            output, code = self.command(session, server, line, interrupt)
            if any(re.match(rf"{count} tuned, ", out) for out in output):
                return output, code
        raise AssertionError(f"{line!r}: SIGINT never stopped it after {count} artifacts:\n" + "\n".join(output))

    def chain(self, index: int, chain: list[Example]) -> list[tuple[Example, str]]:
        """Run the examples of one session in order; each with its new body."""
        server = self.servers.get()
        try:
            session = Session(self.tmp / f"session{index}", chain[0].plugins, self.sites)
            session.demo.mkdir(parents=True)
            done = []
            for example in chain:
                for kind, value in example.setup:
                    if kind == "files":
                        FILES[value](session.demo, session.env())
                        continue
                    output, code = self.command(session, server, value)
                    assert code == 0, f"setup {value!r} exited {code}:\n" + "\n".join(output)
                runs = []
                for i, command in enumerate(example.commands):
                    if i == 0 and example.interrupt is not None:
                        runs.append(self.interrupted(session, server, command.line, example.interrupt))
                    else:
                        runs.append(self.command(session, server, command.line))
                done.append((example, example.body(runs)))
            return done
        finally:
            self.servers.put(server)


def chains(found: list[Example]) -> list[list[Example]]:
    """The examples grouped by session: each fresh one with those that continue it."""
    grouped: list[list[Example]] = []
    for example in found:
        if example.fresh:
            grouped.append([example])
        else:
            grouped[-1].append(example)
    return grouped


@pytest.fixture(scope="module")
def page_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[tuple[Example, str]]]]:
    """The page as it is, and every example with the body its commands print now."""
    page = PAGE.read_text(encoding="utf-8")
    grouped = chains(examples(page))
    tmp = tmp_path_factory.mktemp("cli-docs")
    sites = {name: fake_distribution(tmp / "sites" / name, name, entry_points, FAKE_MODULES.get(name))
             for name, entry_points in FAKE_DISTRIBUTIONS.items()}
    workers = max(1, min(len(grouped), os.cpu_count() or 1, 4))
    server_env = Session(tmp / "server", tuple(sites), sites).env()  # every fake site on the servers' sys.path
    servers: queue.Queue[CommandServer] = queue.Queue()
    for _ in range(workers):
        servers.put(CommandServer(server_env))
    try:
        run = PageRun(tmp, sites, servers, this_device())
        with ThreadPoolExecutor(workers) as pool:
            bodies = [pair for done in pool.map(run.chain, range(len(grouped)), grouped) for pair in done]
    finally:
        while not servers.empty():
            servers.get().close()
    yield page, bodies


def test_every_console_block_is_a_runnable_example() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert page.count("```console\n") == len(examples(page)) >= 10
    for example in examples(page):
        assert all(command.line.startswith(("flyreg ", "FLYREG_", "ls ")) for command in example.commands), example
        assert all(not line.startswith("$ ") for command in example.commands for line in command.shown)


def test_page_shows_what_its_commands_print(page_run: tuple[str, list[tuple[Example, str]]]) -> None:
    page, bodies = page_run
    new = rewrite(page, bodies)
    if REGEN and new != page:
        PAGE.write_text(new, encoding="utf-8")
        return
    diff = "".join(difflib.unified_diff(page.splitlines(True), new.splitlines(True), "docs/cli.md (page)",
                                        "docs/cli.md (commands now)"))
    assert new == page, f"docs/cli.md differs from what its examples print; to update it run\n" \
                        f"  FLYREG_REGEN_DOCS=1 python -m pytest -q {Path(__file__).relative_to(PAGE.parents[1])}\n{diff}"


# -- the normalization itself -------------------------------------------------------------------------------
def rich_table(title: str, columns: list[tuple[str, str]], rows: list[list[str]], width: int) -> str:
    """``rows`` drawn by rich as the command draws its tables (``columns``: name and justification)."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=width).print(table)
    return out.getvalue()


def test_timing_columns_are_masked_and_the_table_drawn_as_rich_would_draw_it() -> None:
    columns = [("op", "left"), ("winner", "left"), ("time", "right"), ("vs default", "right"), ("tried", "right")]
    runs = [[["rmsnorm", "ROW_BLOCK=32", "81.1 us", "1.00x", "4"], ["rmsnorm", "ROW_BLOCK=256", "1.722 ms", "12.50x", "5"]],
            [["rmsnorm", "ROW_BLOCK=4", "71.929 ms", "1.00x", "4"], ["rmsnorm", "", "", "", ""]]]
    masked = [["rmsnorm", "<winner>", "<time>", "<speedup>", tried] for tried in ("4", "5")]
    for run, shown in zip(runs, [masked, [masked[0], ["rmsnorm", "", "", "", ""]]]):  # an empty cell stays empty
        title = "flyreg tune on AMD_EPYC (cpu-x86_64)"
        assert normalize(rich_table(title, columns, run, 160), lambda text: text.replace("AMD_EPYC", "CPU_NAME")) \
            == normalize(rich_table(title.replace("AMD_EPYC", "CPU_NAME"), columns, shown, 160), str)


def test_a_table_whose_folded_cells_change_is_shown_unfolded_else_as_folded() -> None:
    columns = [("spec", "left"), ("path", "left")]
    path = "/tmp/pytest-of-someone/pytest-12/session3/configs/rmsnorm,M=1,N=4096,device_name=Some_Long_CPU_Name.json"
    rows = [["M=1,N=4096", path], ["M=32,N=4096", " ".join(["a few words that rich wraps at a space"] * 2)]]
    folded = rich_table("rmsnorm on Some_Long_CPU_Name", columns, rows, 60)
    assert len(folded.splitlines()) > len(rows) + 5  # rich folded some cells

    def shorter(text: str) -> str:
        return text.replace("/tmp/pytest-of-someone/pytest-12/session3", "/tmp/demo").replace("Some_Long_CPU_Name", "CPU")

    replaced = [[shorter(cell) for cell in row] for row in rows]
    assert normalize(folded, shorter) == normalize(rich_table("rmsnorm on CPU", columns, replaced, 1000), str)
    assert normalize(folded, lambda text: text.replace("nothing here", "x")) == normalize(folded, str)


def test_a_folded_timing_column_is_masked_whatever_width_rich_gave_it() -> None:
    # rich may give a folded column more room than its longest line: the table is still unfolded and masked
    columns = [("op", "left"), ("winner", "left"), ("time", "right"), ("why", "left"), ("tried", "right")]
    why = "kept default: fastest 30.4% faster, not separable"
    runs = [[["rmsnorm", "ROW_BLOCK=32", "75.1 us", "default is fastest", "4"],
             ["rmsnorm", "ROW_BLOCK=32", "159.0 us", why, "4"]],
            [["rmsnorm", "ROW_BLOCK=8", "1.2 ms", "default is fastest", "4"],
             ["rmsnorm", "ROW_BLOCK=32", "80.0 us", "default is fastest", "4"]]]
    masked = [["rmsnorm", "<winner>", "<time>", "<why>", "4"]] * 2
    folded = rich_table("flyreg tune", columns, runs[0], 70)
    assert len(folded.splitlines()) > len(runs[0]) + 5  # rich folded the long reason
    expected = normalize(rich_table("flyreg tune", columns, masked, 200), str)
    assert normalize(folded, str) == normalize(rich_table("flyreg tune", columns, runs[1], 200), str) == expected
