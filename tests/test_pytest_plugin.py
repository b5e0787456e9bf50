"""The pytest plugin (`--artstore`, `-p artifactstore`), in real pytest sessions.

Each test writes a small suite into tmp_path and runs pytest on it in a fresh process,
twice where the second run must load what the first stored; the counts come from the
plugin's one summary line. The suite's JAX tests feed NumPy arrays to one jitted
function each (constants differ, so keys differ), so each test compiles exactly once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import clean_env

pytestmark = pytest.mark.slow

JIT_TEST = """\
import jax
import jax.numpy as jnp
import numpy as np


def test_jit_{i}():
    out = jax.jit(lambda x: jnp.sin(x) @ x.T + {i}.25)(np.ones((64, 64), np.float32))
    assert np.asarray(out).shape == (64, 64)
"""

# Runs in every session: the plugin is registered (an entry point) whether or not it is
# enabled, and the environment it leaves to tests (and so to their subprocesses).
ENV_TEST = """\
import os


def test_plugin_environment(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("artifactstore")
    if os.environ["PLUGIN_SUITE_ACTIVE"] == "1":
        assert os.environ["ARTSTORE_ACTIVATE"] == "1"  # not the inherited 0
        assert os.path.isdir(os.environ["ARTSTORE_RUN"])
        assert "artifactstore" in os.environ["PYTHONPATH"]  # the startup hook
    else:
        assert os.environ["ARTSTORE_ACTIVATE"] == "0"
        assert "ARTSTORE_RUN" not in os.environ
"""

CHILD_TEST = """\
import subprocess
import sys

CHILD = (
    "import jax, numpy as np; "
    "print(float(jax.jit(lambda x: (x * 7.5).sum())(np.ones(8, np.float32))))"
)


def test_child_process():
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == 60.0
"""

# A conftest that imports JAX: the plugin's pytest_configure then comes after the import.
EARLY_JAX_CONFTEST = """\
import jax  # noqa: F401
"""

SUMMARY = re.compile(
    r"^artifactstore: hits (?P<loaded>\d+), misses (?P<compiled>\d+) "
    r"\((?P<stored>\d+) stored\), ~[\d.]+ s of compiling saved, "
    r"(?P<processes>\d+) process(?:es)?"
    r"(?:; (?P<quick>\d+) quick compiles not stored \(ARTSTORE_MIN_COMPILE_SECS\)"
    r"(?:, \d+ kept on this host)?)?"
    r"(?:; \d+ of the hits quick compiles kept on this host)?"
    r"(?:; compiling took [\d.]+ s)?$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Counts:
    loaded: int
    compiled: int
    stored: int
    processes: int


def write_suite(
    root: Path, *, jit_tests: int = 3, child: bool = False, early_jax: bool = False
) -> None:
    (root / "pytest.ini").write_text("[pytest]\n")  # this is the rootdir: not the repo's
    for i in range(1, jit_tests + 1):
        (root / f"test_jit_{i}.py").write_text(JIT_TEST.format(i=i))
    (root / "test_env.py").write_text(ENV_TEST)
    if child:
        (root / "test_child.py").write_text(CHILD_TEST)
    if early_jax:
        (root / "conftest.py").write_text(EARLY_JAX_CONFTEST)


def run_suite(root: Path, *args: str, active: bool = True) -> subprocess.CompletedProcess[str]:
    """pytest on the suite in `root`, in a fresh process; it must pass."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("PYTEST_")}
    env.update(
        ARTSTORE_URL=str(root / "store"),
        PLUGIN_SUITE_ACTIVE="1" if active else "0",
        TMPDIR=str(root / "tmp"),  # where the plugin keeps the processes' records
    )
    (root / "tmp").mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root)]
    proc = subprocess.run(
        [*argv, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (
        f"inner pytest failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    # Nothing from the store on stderr (a record it failed to write, a failed activation),
    # and the records' directory removed.
    assert not re.search(r"^artifactstore", proc.stderr, re.MULTILINE), proc.stderr
    assert not list((root / "tmp").glob("artstore-pytest-*"))
    return proc


def counts(proc: subprocess.CompletedProcess[str]) -> Counts:
    found = SUMMARY.findall(proc.stdout)
    assert len(found) == 1, f"expected one summary line:\n{proc.stdout[-4000:]}"
    loaded, compiled, stored, processes = map(int, found[0][:4])
    return Counts(loaded=loaded, compiled=compiled, stored=stored, processes=processes)


def test_artstore_flag_stores_then_loads(tmp_path: Path) -> None:
    write_suite(tmp_path, jit_tests=3)
    first = counts(run_suite(tmp_path, "--artstore"))
    assert first == Counts(loaded=0, compiled=3, stored=3, processes=1)
    assert (tmp_path / "store").is_dir()
    second = counts(run_suite(tmp_path, "--artstore"))
    assert second == Counts(loaded=3, compiled=0, stored=0, processes=1)


def test_p_artifactstore_with_jax_imported_by_conftest(tmp_path: Path) -> None:
    """The opt-in spelling; and JAX already imported when the plugin configures."""
    write_suite(tmp_path, jit_tests=2, early_jax=True)
    first = counts(run_suite(tmp_path, "-p", "artifactstore"))
    assert first == Counts(loaded=0, compiled=2, stored=2, processes=1)
    second = counts(run_suite(tmp_path, "-p", "artifactstore"))
    assert second == Counts(loaded=2, compiled=0, stored=0, processes=1)


def test_xdist_workers_store_then_load(tmp_path: Path) -> None:
    """Each worker is one process of the summary; the controller runs no test."""
    write_suite(tmp_path, jit_tests=3)
    first = run_suite(tmp_path, "--artstore", "-n", "2")
    assert "4 passed" in first.stdout
    assert counts(first) == Counts(loaded=0, compiled=3, stored=3, processes=2)
    second = counts(run_suite(tmp_path, "--artstore", "-n", "2"))
    assert second == Counts(loaded=3, compiled=0, stored=0, processes=2)


def test_inert_without_the_flag(tmp_path: Path) -> None:
    write_suite(tmp_path, jit_tests=2)
    proc = run_suite(tmp_path, active=False)  # test_env: registered, environment untouched
    assert "3 passed" in proc.stdout
    assert not re.search(r"^artifactstore:", proc.stdout, re.MULTILINE), proc.stdout
    assert not re.search(r"^-+ artifactstore -+$", proc.stdout, re.MULTILINE)
    assert not (tmp_path / "store").exists()


def test_subprocess_of_a_test_is_counted(tmp_path: Path) -> None:
    write_suite(tmp_path, jit_tests=1, child=True)
    first = counts(run_suite(tmp_path, "--artstore"))
    assert first == Counts(loaded=0, compiled=2, stored=2, processes=2)
    second = counts(run_suite(tmp_path, "--artstore"))
    assert second == Counts(loaded=2, compiled=0, stored=0, processes=2)


def test_no_assert_rewrite_warning(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    proc = run_suite(tmp_path, "--artstore", active=True)
    assert "PytestAssertRewriteWarning" not in proc.stdout, proc.stdout


def test_read_only_and_namespace_options(tmp_path: Path) -> None:
    """`--artstore-read-only` loads and stores nothing; `--artstore-namespace NS` reads and
    writes NS only (each option alone also turns the plugin on)."""
    write_suite(tmp_path, jit_tests=2)
    stored = counts(run_suite(tmp_path, "--artstore-namespace", "ci"))
    assert stored == Counts(loaded=0, compiled=2, stored=2, processes=1)
    other = counts(run_suite(tmp_path, "--artstore-read-only"))  # the default namespace
    assert other == Counts(loaded=0, compiled=2, stored=0, processes=1)
    again = counts(run_suite(tmp_path, "--artstore-read-only"))
    assert again == Counts(loaded=0, compiled=2, stored=0, processes=1)  # it stored nothing
    hits = counts(run_suite(tmp_path, "--artstore-read-only", "--artstore-namespace", "ci"))
    assert hits == Counts(loaded=2, compiled=0, stored=0, processes=1)
