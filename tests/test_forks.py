"""The suite's forked processes (tests/forks.py) answer as fresh interpreters do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import forks
import pytest
from conftest import PROGRAMS, clean_env


def _cli(*args: str, env: dict[str, str], fresh: bool) -> subprocess.CompletedProcess[str]:
    if not fresh:
        assert forks._server("cli", env) is not None, "the CLI's fork server did not start"
    return forks.run("cli", forks.CLI, list(args), env, 300, fresh=fresh)


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("gc", "--max-size", "500Q"),  # bad input: one line, exit 2
        ("ls",),
        ("stats", "--json"),
        ("no-such-command",),
    ],
)
def test_a_forked_cli_call_answers_as_a_fresh_one(args: tuple[str, ...], tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    fresh = _cli(*args, env=env, fresh=True)
    forked = _cli(*args, env=env, fresh=False)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_each_forked_process_has_the_environment_it_was_given(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_NAMESPACE="forked")
    first = _cli("stats", "--json", env=env, fresh=False)
    env2 = clean_env(ARTSTORE_URL=str(tmp_path / "s2"))
    second = _cli("stats", "--json", env=env2, fresh=False)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert '"forked"' in first.stdout and '"forked"' not in second.stdout
    assert str(tmp_path / "s2") in second.stdout


def test_a_forked_job_computes_and_stores_as_a_fresh_one(tmp_path: Path) -> None:
    """The forked writer compiles and stores (its exit flush included); a fresh reader
    then loads every executable it stored and computes the same."""
    program = str(PROGRAMS / "job.py")
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    assert forks._server("jax", env) is not None, "the JAX fork server did not start"
    forked = forks.run("jax", {"path": program}, [], env, 300)
    fresh = forks.run("jax", {"path": program}, [], env, 300, fresh=True)
    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    cold, warm = (json.loads(p.stdout.splitlines()[-1]) for p in (forked, fresh))
    assert cold["results"] == warm["results"]
    assert len(cold["xla_compiles"]) >= 2 and warm["xla_compiles"] == []


def test_a_call_that_differs_in_what_starts_jax_runs_fresh(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    assert forks._server("jax", env) is not None
    assert forks._server("jax", {**env, "XLA_FLAGS": "--xla_dump_to=/tmp/x"}) is None
    assert forks._server("jax", {**env, "ARTSTORE_ACTIVATE": "1"}) is None
    assert forks._server("cli", {**env, "PYTHONPATH": os.fspath(tmp_path)}) is None
    assert forks._server("cli", {**env, "JAX_PLATFORMS": "tpu"}) is not None  # read later


def test_a_started_fork_talks_and_ends_as_a_popen_does(tmp_path: Path) -> None:
    """forks.popen: job.py paused at `open` answers on its stdout, resumes on a stdin line,
    and ends with its exit status; another is killed as Popen kills (-SIGKILL), and
    communicate reads both streams to their end."""
    program = {"path": str(PROGRAMS / "job.py")}
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), JOB_PAUSE="open")
    pipe = subprocess.PIPE
    job = forks.popen("jax", program, [], env, stdin=pipe, stdout=pipe, stderr=pipe)
    assert isinstance(job, forks.Forked), "job.py was not forked"
    assert job.stdout is not None and job.stdin is not None
    assert json.loads(job.stdout.readline())["paused"] == "open"
    assert job.poll() is None
    out, err = job.communicate("go\n", timeout=300)
    assert job.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["store"]["stored"] > 0
    killed = forks.popen("jax", program, [], env, stdin=pipe, stdout=pipe, stderr=pipe)
    assert killed.stdout is not None and killed.stdout.readline()
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    paused = forks.popen("jax", program, [], env, stdin=pipe, stdout=pipe, stderr=pipe)
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # paused until its stdin says go
            paused.wait(0.5)
    finally:
        paused.kill()
        paused.wait()


def test_what_importing_jax_sets_is_set_as_in_a_fresh_process(tmp_path: Path) -> None:
    """`import jax` sets TF_CPP_MIN_LOG_LEVEL unless set: a forked child (the server
    imported JAX) has it as a fresh one does; and a test process that imported JAX, so
    that its environments carry what JAX set, still forks."""
    program = tmp_path / "env.py"
    program.write_text("import os, jax\nprint(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n")
    env = {k: v for k, v in clean_env().items() if k not in forks.JAX_SETS}
    assert forks._server("jax", env) is not None
    assert forks._server("jax", {**env, **forks.JAX_SETS}) is not None
    for given in (None, "3"):
        run_env = env if given is None else {**env, "TF_CPP_MIN_LOG_LEVEL": given}
        forked, fresh = (
            forks.run("jax", {"path": str(program)}, [], run_env, 300, fresh=f)
            for f in (False, True)
        )
        assert forked.stdout == fresh.stdout == f"{given or 1}\n", forked.stderr + fresh.stderr
