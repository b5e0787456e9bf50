"""How CI runs the suite: JAX tests on both ends of the range, timing tests without xdist.

Timing-sensitive tests (bounds on how long a command waits for a frozen server) are marked
`serial`: `.ci/run` runs them after the rest, on their own, not beside xdist workers.

Which tests touch JAX is found by running them: CI runs the rest once, these on both ends.

`.ci/run` runs the whole suite on the newest JAX with `--jax-record FILE`, then only the
recorded tests on the oldest (`--jax-only FILE`). Nobody keeps a list that could drift:

- a test whose file imports JAX (or the parts of artifactstore that do) counts, read from
  the file's syntax tree;
- a test that starts a process that imports JAX counts: while recording, a `.pth` file in
  this interpreter's site-packages makes every Python process of this environment note,
  on its first `import jax`, the chain of its parent processes; after each test, the pytest
  process (an xdist worker too) claims the notes that name it among the parents.

The same module enforces "no test over 15 s without a reason": a slower one without
`Slow:` in its docstring is named in the summary (a report, never a wall-clock assertion).
"""

from __future__ import annotations

import ast
import os
import shutil
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PTH_NAME = "artstore_tests_jaxprobe.pth"
# What a test file may import that means JAX runs in the test process itself.
JAX_MODULES = ("jax", "jaxlib", "artifactstore.jaxhook", "artifactstore.named")
SLOW_SECS = 15.0
# Files whose tests assert how long something waits (tight bounds): run them alone.
SERIAL = ("faults/",)

# Run by every Python process of this environment while a recording is on (the .pth).
PROBE = r"""
import os, sys
class _JaxProbe:
    def find_spec(self, name, path=None, target=None):
        if name not in ("jax", "jaxlib"):
            return None
        sys.meta_path.remove(self)
        pids, pid = [], os.getpid()
        while pid > 1 and len(pids) < 32:
            pids.append(str(pid))
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
        try:
            with open(os.path.join(NOTES, f"{os.getpid()}-{id(self)}"), "w") as f:
                f.write(" ".join(pids))
        except OSError:
            pass
        return None
sys.meta_path.insert(0, _JaxProbe())
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("artifactstore")
    group.addoption("--jax-record", metavar="FILE", help="append the ids of tests that touch JAX")
    group.addoption("--jax-only", metavar="FILE", help="run only the tests a --jax-record listed")


def _notes(record: str) -> Path:
    return Path(record + ".notes")


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("--jax-record")
    if not record or hasattr(config, "workerinput"):  # xdist workers share the controller's
        return
    notes = _notes(record)
    shutil.rmtree(notes, ignore_errors=True)
    notes.mkdir(parents=True)
    code = PROBE.replace("NOTES", repr(str(notes)))
    line = f"import os; exec({code!r}) if os.path.isdir({str(notes)!r}) else None\n"
    (Path(sysconfig.get_paths()["purelib"]) / PTH_NAME).write_text(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    record = config.getoption("--jax-record")
    if not record or hasattr(config, "workerinput"):
        return
    (Path(sysconfig.get_paths()["purelib"]) / PTH_NAME).unlink(missing_ok=True)
    shutil.rmtree(_notes(record), ignore_errors=True)


@cache
def imports_jax(path: Path) -> bool:
    """Whether the test file imports JAX (at any depth, so lazy imports count)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        if any(n == m or n.startswith(m + ".") for n in names for m in JAX_MODULES):
            return True
    return False


def _claim(notes: Path) -> bool:
    """Take the notes of this process and those below it (they imported JAX)."""
    me, found = str(os.getpid()), False
    for note in notes.iterdir() if notes.is_dir() else ():
        try:
            if me not in note.read_text().split():
                continue
            note.unlink()
        except OSError:
            continue
        found = True
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    record = item.config.getoption("--jax-record")
    yield
    if record and (imports_jax(item.path) or _claim(_notes(record))):
        with open(record, "a") as out:  # O_APPEND: workers' lines do not interleave
            out.write(item.nodeid + "\n")


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(HERE).as_posix().startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    only = config.getoption("--jax-only")
    if not only:
        return
    try:
        recorded = set(Path(only).read_text().split("\n"))
    except OSError as exc:
        why = f"--jax-only {only}: {exc.strerror}; run the suite with --jax-record first"
        raise pytest.UsageError(why) from None
    if not recorded - {""}:
        raise pytest.UsageError(f"--jax-only {only}: no test is recorded there")
    keep = [i for i in items if i.nodeid in recorded or imports_jax(i.path)]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    if report.when == "call" and report.duration > SLOW_SECS and "Slow:" not in doc:
        report.user_properties.append(("slow_without_reason", round(report.duration, 1)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    slow = [
        (r.nodeid, dict(r.user_properties)["slow_without_reason"])
        for r in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
        if "slow_without_reason" in dict(r.user_properties)
    ]
    if slow:
        terminalreporter.section(f"tests over {SLOW_SECS:g} s without 'Slow:' in the docstring")
        for nodeid, secs in sorted(slow, key=lambda s: -s[1]):
            terminalreporter.line(f"{secs:7.1f} s  {nodeid}")
