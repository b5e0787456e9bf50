"""How CI runs the suite: the JAX adapter on both ends of the range, timing tests alone.

Timing-sensitive tests (bounds on how long a command waits for a frozen server), and a load
test that would starve its neighbours (200 reader processes), are marked `serial`:
`.ci/run` runs them after the rest, on their own, not beside xdist workers.

What depends on JAX's version is the adapter: the modules of artifactstore that import JAX
(and `jaxhook/`). What depends on the interpreter's version is the code that leans on the
standard library's edges: signals, tarfile (bundles/bounds.py overrides a private member),
fcntl, ctypes, `dir_fd` walks (safedir), `sys.version_info`. Everything else behaves the
same on every supported JAX and Python, so CI runs the whole suite once, on the newest end,
and on the oldest end (Python 3.11, the oldest JAX) only enough tests to run every line of
both kinds that the whole suite runs. Nobody keeps a list that could drift:

- `--jax-record FILE` (newest end) notes, per test, which adapter lines it ran, in the
  pytest process and in every process it started: a `.pth` file makes every Python process
  of the environment watch the adapter with `sys.monitoring` (tests/adapter_probe.py); a
  started program writes its lines at exit with its parent-process chain, and the test
  whose process is in that chain claims them;
- `--jax-only FILE` (oldest end) runs the cheapest set of recorded tests that together
  run every recorded line (greedy weighted set cover: lines gained per second);
- `--interpreter-only FILE` (a Python between the ends, on the newest JAX) the same for
  the lines of the interpreter-dependent modules alone: its JAX is the newest end's.

The same module enforces "no test over 15 s without a reason": a slower one without
`Slow:` in its docstring is named in the summary (a report, never a wall-clock assertion).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator, Set
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "artifactstore"
PROBE = "artstore_tests_adapter_probe"  # tests/adapter_probe.py, copied into site-packages
SLOW_SECS = 15.0
# Files whose tests assert how long something waits (tight bounds): run them alone.
SERIAL = ("faults/",)
# Run on both ends whatever lines they cover: the trust boundary's tests (issue 38), since
# what a hostile record costs must be shown on every JAX and Python the project supports.
BOTH_ENDS = ("security/",)
COVER = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("artifactstore")
    group.addoption("--jax-record", metavar="FILE", help="append which adapter lines tests run")
    group.addoption("--jax-only", metavar="FILE", help="run the fewest tests that run them all")
    group.addoption(
        "--interpreter-only",
        metavar="FILE",
        help="run the fewest tests that run every recorded interpreter-dependent line",
    )


def _notes(record: str) -> Path:
    return Path(record + ".notes")


def imports_jax(path: Path) -> bool:
    """Whether a module imports JAX (at any depth, so lazy imports count)."""
    return bool(_imports(path) & {"jax", "jaxlib"})


# Standard-library modules whose behaviour changes between Python versions in ways we rely on.
INTERPRETER_MODULES = {"signal", "tarfile", "fcntl", "ctypes"}


def depends_on_interpreter(path: Path) -> bool:
    """Whether a module leans on the interpreter's version: imports one of
    INTERPRETER_MODULES, or reads `sys.version_info`, or walks with `dir_fd`."""
    if _imports(path) & INTERPRETER_MODULES:
        return True
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "version_info":
            return True
        if isinstance(node, ast.keyword) and node.arg == "dir_fd":
            return True
    return False


def _imports(path: Path) -> set[str]:
    """The top-level names of what a module imports (at any depth: lazy imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def adapter_files(*, jax: bool = True) -> dict[str, str]:
    """The files whose lines the oldest end must run: the JAX adapter and the modules
    that depend on the interpreter (absolute path -> path relative to the repository);
    without `jax`, only the latter (what a Python between the ends must run)."""
    files = sorted(PACKAGE.rglob("*.py"))
    return {
        str(f): f.relative_to(PACKAGE.parent).as_posix()
        for f in files
        if (jax and (f.parent.name == "jaxhook" or imports_jax(f))) or depends_on_interpreter(f)
    }


def _probe() -> ModuleType | None:
    """The probe module as the .pth loaded it (or loads it now, in this process)."""
    try:
        return importlib.import_module(PROBE)
    except ImportError:
        return None


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("--jax-record")
    if not record:
        return
    notes = _notes(record)
    if not hasattr(config, "workerinput"):  # xdist workers share the controller's
        if sys.version_info < (3, 12):
            raise pytest.UsageError("--jax-record needs Python >= 3.12 (sys.monitoring)")
        shutil.rmtree(notes, ignore_errors=True)
        notes.mkdir(parents=True)
        (notes / "config.json").write_text(json.dumps({"files": adapter_files()}))
        site = Path(sysconfig.get_paths()["purelib"])
        shutil.copyfile(HERE / "adapter_probe.py", site / f"{PROBE}.py")
        at = repr(str(notes))
        line = f"import os; os.path.isdir({at}) and __import__({PROBE!r}).install({at})\n"
        (site / f"{PROBE}.pth").write_text(line)
        importlib.invalidate_caches()
    probe = _probe()
    if probe is not None:
        probe.install(str(notes))  # the controller started before the .pth existed
        probe.claim_in_process()


def pytest_unconfigure(config: pytest.Config) -> None:
    record = config.getoption("--jax-record")
    if not record or hasattr(config, "workerinput"):
        return
    site = Path(sysconfig.get_paths()["purelib"])
    (site / f"{PROBE}.pth").unlink(missing_ok=True)
    (site / f"{PROBE}.py").unlink(missing_ok=True)
    shutil.rmtree(_notes(record), ignore_errors=True)


def _claim(notes: Path) -> set[tuple[str, int]]:
    """The lines of the programs this process started (their notes name it as a parent)."""
    me, lines = str(os.getpid()), set()
    for note in notes.glob("*.json") if notes.is_dir() else ():
        if note.name == "config.json":
            continue
        try:
            said = json.loads(note.read_text())
            if me not in said["parents"]:
                continue
            note.unlink()
        except (OSError, ValueError, KeyError):
            continue
        lines.update((f, n) for f, n in said["lines"])
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    record = item.config.getoption("--jax-record")
    probe = _probe() if record else None
    if probe is not None:
        probe.take()  # what ran between tests (collection, fixtures of others) is not ours
    started = time.monotonic()
    yield
    if not record:
        return
    lines = (probe.take() if probe is not None else set()) | _claim(_notes(record))
    if lines:
        said = {"test": item.nodeid, "secs": round(time.monotonic() - started, 2)}
        said["lines"] = sorted(lines)
        with open(record, "a") as out:  # one write per test: O_APPEND keeps lines whole
            out.write(json.dumps(said) + "\n")


def cover(recorded: list[dict[str, object]], running: Set[str] = frozenset()) -> list[str]:
    """The tests that together run every recorded line, cheapest first (greedy), beside
    the tests that run anyway (`running`: their lines need no other test)."""
    tests: dict[str, tuple[float, set[tuple[str, int]]]] = {}
    for said in recorded:
        name = str(said["test"])
        secs, lines = tests.get(name, (0.0, set()))
        more = {(str(f), int(n)) for f, n in said["lines"]}  # type: ignore[attr-defined]
        tests[name] = (secs + float(said["secs"]), lines | more)  # type: ignore[arg-type]
    left = set().union(*(lines for _, lines in tests.values())) if tests else set()
    for name in running & tests.keys():
        left -= tests.pop(name)[1]
    chosen: list[str] = []
    while left:
        name = max(tests, key=lambda t: (len(tests[t][1] & left) / (tests[t][0] + 1.0), t))
        left -= tests.pop(name)[1]
        chosen.append(name)
    return chosen


def _read_record(only: str) -> list[dict[str, object]]:
    try:
        text = Path(only).read_text()
    except OSError as exc:
        why = f"--jax-only {only}: {exc.strerror}; run the suite with --jax-record first"
        raise pytest.UsageError(why) from None
    recorded = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not recorded:
        raise pytest.UsageError(f"--jax-only {only}: no test is recorded there")
    return recorded


# Markers whose tests run only where `-m` names them (fresh venvs from the package index:
# minutes to tens of minutes; the benchmarks, on the venv with their extras): CI's "docs as
# written" phase, the extras' installs, and CI's "benchmarks at smoke size" phase.
ON_REQUEST = ("docs_phase", "docs_install", "bench_smoke")


def _on_request(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the tests of each ON_REQUEST marker that `-m` does not name (`-m docs_phase`
    names it; `-m "not docs_phase"` does not)."""
    named = config.getoption("markexpr") or ""
    wanted = [m for m in ON_REQUEST if re.search(rf"(?<!not )\b{m}\b", named)]
    out = [
        item
        for item in items
        for marker in ON_REQUEST
        if marker not in wanted and item.get_closest_marker(marker)
    ]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _on_request(config, items)
    for item in items:
        if item.path.relative_to(HERE).as_posix().startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    if hasattr(config, "workerinput"):  # an xdist worker: what it collects is the schedule
        _longest_first(items)
    end, middle = config.getoption("--jax-only"), config.getoption("--interpreter-only")
    if not (end or middle):
        return
    recorded = _read_record(end or middle)
    ran = len({str(r["test"]) for r in recorded})
    if middle:  # on the newest JAX: only the interpreter-dependent lines can differ
        recorded = _only_lines(recorded, set(adapter_files(jax=False).values()))
    anyway = {i.nodeid for i in items if end and _on_both_ends(i)}
    chosen = set(cover(recorded, anyway))
    keep = [i for i in items if i.nodeid in chosen | anyway]
    lines = {(f, n) for said in recorded for f, n in said["lines"]}  # type: ignore[attr-defined]
    what = "adapter and interpreter-dependent" if end else "interpreter-dependent"
    said = f"{len(chosen)} of {ran} recorded tests run all {len(lines)} {what} lines the suite ran"
    if end:
        said = f"the {len(anyway)} tests under {', '.join(BOTH_ENDS)} and {said}"
    config.stash[COVER] = said + " (-m selects among them)"
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


def _longest_first(items: list[pytest.Item]) -> None:
    """Files by their expected time, longest first (each file's tests in their order), so
    that `--dist loadfile --no-loadscope-reorder` hands the long ones out first and no worker
    is left alone with one at the end (xdist's own order, by test count, put files of a few
    slow tests last). A test over SLOW_SECS says `Slow:` in its docstring; others take ~2 s."""
    cost: dict[Path, float] = {}
    for item in items:
        cost[item.path] = cost.get(item.path, 0.0) + (SLOW_SECS if "Slow:" in _doc(item) else 2.0)
    items.sort(key=lambda item: -cost[item.path])


def _doc(item: pytest.Item) -> str:
    return getattr(getattr(item, "function", None), "__doc__", None) or ""


def _only_lines(recorded: list[dict[str, object]], files: set[str]) -> list[dict[str, object]]:
    """The record, each test's lines narrowed to `files` (tests left with none dropped)."""
    narrowed = [
        dict(said, lines=[ln for ln in said["lines"] if ln[0] in files])  # type: ignore[attr-defined]
        for said in recorded
    ]
    return [said for said in narrowed if said["lines"]]


def _on_both_ends(item: pytest.Item) -> bool:
    return item.path.relative_to(HERE).as_posix().startswith(BOTH_ENDS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.duration > SLOW_SECS and "Slow:" not in _doc(item):
        report.user_properties.append(("slow_without_reason", round(report.duration, 1)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COVER in terminalreporter.config.stash:
        terminalreporter.section("which tests this interpreter runs (suite_rules.py)")
        terminalreporter.line(terminalreporter.config.stash[COVER])
    slow = [
        (r.nodeid, dict(r.user_properties)["slow_without_reason"])
        for r in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
        if "slow_without_reason" in dict(r.user_properties)
    ]
    if slow:
        terminalreporter.section(f"tests over {SLOW_SECS:g} s without 'Slow:' in the docstring")
        for nodeid, secs in sorted(slow, key=lambda s: -s[1]):
            terminalreporter.line(f"{secs:7.1f} s  {nodeid}")
