"""The repository holds products, not a lab: every plugin has the same shape, every result is cited by a doc,
every path a doc cites exists, nothing is named after a session or a one-off run, and plugins/ stays small.

Raw evidence of past experiments lives under the tag ``lab-archive-2026-12``; a doc cites such a file as
``lab-archive-2026-12:PATH``, which is checked against the tag where the checkout has it.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE_TAG = "lab-archive-2026-12"
#: Files under plugins/ other than the shipped config JSON, at most.
PLUGIN_FILES_MAX = 70
#: Lines of docs/performance.md, at most: today's numbers, not a diary.
PERFORMANCE_LINES_MAX = 300
#: Directories a tree walk skips: environments, caches and build outputs, never part of the repository.
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "build", "dist", ".whl"}
#: A repository path as docs write it: one of the top-level folders, then path characters. It does not
#: start inside a longer token (a URL, another project's path), and may carry the archive tag before it.
CITED_PATH = re.compile(rf"(?<![\w./:-])(?:({re.escape(ARCHIVE_TAG)}):)?((?:plugins|benchmarks|docs|tests|flyreg)/[\w./-]*)")
#: Names of lab leftovers: session folders and files, patches, numbered run scripts.
LAB_NAME = re.compile(r"^(session.*|.*\.patch|run\d*\.sh)$", re.IGNORECASE)


def _in_git_checkout() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


@functools.cache
def repository_files() -> frozenset[str]:
    """The repository's files, as POSIX paths relative to its root: what git tracks or would add (ignored
    files left out) in a git checkout, else every file of the tree outside environments and caches."""
    if _in_git_checkout():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        return frozenset(p for p in out.split("\0") if p and (ROOT / p).is_file())  # not deleted since
    return frozenset(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()
                     and not any(part in SKIPPED_DIRS or part.endswith(".egg-info")
                                 for part in p.relative_to(ROOT).parts))


@functools.cache
def repository_dirs() -> frozenset[str]:
    return frozenset(str(parent) for f in repository_files() for parent in PurePosixPath(f).parents
                     if str(parent) != ".")


def doc_files() -> list[str]:
    """The docs that may cite files: docs/*.md, the README and each plugin's README."""
    return sorted(f for f in repository_files()
                  if re.fullmatch(r"docs/[^/]+\.md|README\.md|plugins/[^/]+/README\.md", f))


def plugin_dirs() -> list[str]:
    return sorted({f.split("/")[1] for f in repository_files() if f.startswith("plugins/") and f.count("/") >= 2})


def is_shipped_config(path: str) -> bool:
    """A tuned artifact a plugin ships: ``plugins/<plugin>/<package>/configs/*.json``."""
    return re.fullmatch(r"plugins/[^/]+/[^/]+/configs/[^/]+\.json", path) is not None


def cited(path: str) -> bool:
    """Whether a doc names ``path``: by its repository path, or a plugin's README by its path in the plugin."""
    for doc in doc_files():
        text = (ROOT / doc).read_text(encoding="utf-8")
        if path in text:
            return True
        home = doc.rsplit("/", 1)[0] + "/" if doc.startswith("plugins/") else None
        if home and path.startswith(home) and path[len(home):] in text:
            return True
    return False


def test_every_plugin_has_the_same_shape(pytestconfig: pytest.Config) -> None:
    testpaths = pytestconfig.getini("testpaths")
    files = repository_files()
    assert plugin_dirs(), "no plugin found under plugins/"
    for name in plugin_dirs():
        home = f"plugins/{name}"
        for required in ("pyproject.toml", "README.md", "bench/__init__.py"):
            assert f"{home}/{required}" in files, f"{home} has no {required}"
        assert any(f.startswith(f"{home}/tests/test_") for f in files), f"{home} has no tests/"
        assert f"{home}/tests" in testpaths, f"{home}/tests is not in the root pyproject's testpaths"
        assert any(is_shipped_config(f) for f in files if f.startswith(f"{home}/")), f"{home}'s package ships no configs/"
        bench = [f for f in files if f.startswith(f"{home}/bench/")]
        stray = [f for f in bench if not (f.endswith(".py") and f.count("/") == 3) and "/bench/results/" not in f]
        assert not stray, f"{home}/bench holds only benchmark modules and results/: {stray}"


def test_test_modules_of_every_test_path_have_distinct_names(pytestconfig: pytest.Config) -> None:
    """pytest imports a module outside a package by its file name, so the core's tests and each plugin's,
    collected together, must not share one."""
    roots = tuple(f"{p.rstrip('/')}/" for p in pytestconfig.getini("testpaths"))
    files = repository_files()
    modules = [f for f in files if f.startswith(roots) and f.endswith(".py")
               and f"{f.rsplit('/', 1)[0]}/__init__.py" not in files and not f.endswith("/conftest.py")]
    names = [f.rsplit("/", 1)[1] for f in modules]
    clashes = sorted(f for f in modules if names.count(f.rsplit("/", 1)[1]) > 1)
    assert not clashes, f"test modules sharing a file name: {clashes}"


def test_every_result_is_cited_by_a_doc() -> None:
    results = sorted(f for f in repository_files() if "/results/" in f or f.startswith("results/"))
    uncited = [f for f in results if not cited(f)]
    assert not uncited, f"results no doc cites (docs/*.md, README.md, plugins/*/README.md): {uncited}"


def _archived(path: str) -> bool | None:
    """Whether the archive tag holds ``path`` (a file or a folder); None where this checkout lacks the tag."""
    if not _in_git_checkout():
        return None
    tag = subprocess.run(["git", "rev-parse", "-q", "--verify", f"refs/tags/{ARCHIVE_TAG}"], cwd=ROOT,
                         capture_output=True)
    if tag.returncode:
        return None
    found = subprocess.run(["git", "cat-file", "-e", f"{ARCHIVE_TAG}:{path.rstrip('/')}"], cwd=ROOT,
                           capture_output=True)
    return found.returncode == 0


@pytest.mark.parametrize("doc", doc_files())
def test_every_path_a_doc_cites_exists(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing, unarchived = [], []
    for match in CITED_PATH.finditer(text):
        if text[match.end():match.end() + 1] in ("*", "<", "{"):
            continue  # a pattern (flyreg/_*, plugins/<name>/), not a path
        tag, path = match.group(1), match.group(2).rstrip(".")
        if tag:
            if _archived(path) is False:
                unarchived.append(path)
        elif path.rstrip("/") not in repository_files() | repository_dirs():
            missing.append(path)
    assert not missing, f"{doc} cites paths that do not exist: {sorted(set(missing))}"
    assert not unarchived, f"{doc} cites paths the tag {ARCHIVE_TAG} does not hold: {sorted(set(unarchived))}"


def test_nothing_is_named_after_a_session_or_a_one_off_run() -> None:
    named = sorted(f for f in repository_files() if any(LAB_NAME.match(part) for part in PurePosixPath(f).parts))
    assert not named, f"lab leftovers (session folders or files, patches, runN.sh): {named}"


def test_plugins_hold_few_files_besides_their_configs() -> None:
    files = sorted(f for f in repository_files() if f.startswith("plugins/") and not is_shipped_config(f))
    assert len(files) <= PLUGIN_FILES_MAX, f"{len(files)} files under plugins/ besides shipped configs: {files}"


def test_the_performance_page_holds_todays_numbers_only() -> None:
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= PERFORMANCE_LINES_MAX, \
        f"docs/performance.md has {len(lines)} lines: replace numbers, move why to docs/decisions.md"
    assert not [line for line in lines if re.search(r"\bsession \d+", line, re.IGNORECASE)], "a diary entry"


def test_plugin_tests_and_benchmarks_never_edit_sys_path() -> None:
    editing = sorted(f for f in repository_files() if re.fullmatch(r"plugins/[^/]+/(tests|bench)/.+\.py", f)
                     and re.search(r"sys\.path\s*(\.(insert|append|extend)|\[|\+?=)", (ROOT / f).read_text()))
    assert not editing, f"import benchmarks as modules (the plugin's bench package) instead of editing sys.path: {editing}"
