"""PyTorch through torchax: a training step's executables from the store, in fresh processes.

torchax turns a PyTorch function into a JAX function that `jax.jit` compiles, so the store
serves it through the same hook as any JAX program (ARTSTORE_URL alone turns it on). The
program is the example artifactstore/examples/torchax_mlp.py (an MLP's SGD step, three
steps), counted by tests/programs/torchax_job.py. Skipped where torch or torchax does not
import; in CI's torch phase (ARTSTORE_TORCH_CI=1) a skip fails (tests/security/ci_rules.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import artstore, run_program, skip_unless_importable

pytestmark = [pytest.mark.torch, pytest.mark.slow]
NAMED = "torchax/mlp-step@1"


@pytest.fixture(scope="module", autouse=True)
def torchax_imports() -> None:
    """Skip unless torch and torchax import here: one probe process per module."""
    skip_unless_importable(["torch", "torchax"], "pip install 'artifactstore[torch]'")


def activated(env: dict[str, str], **extra: str) -> dict[str, str]:
    """`env` as a user's: ARTSTORE_URL turns the store on, no code (clean_env turns that
    off for the test programs that configure it themselves)."""
    out = {k: v for k, v in env.items() if k != "ARTSTORE_ACTIVATE"}
    return {**out, **extra}


def test_second_process_loads_every_step_read_only(any_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: two torchax processes (PyTorch's import alone is seconds), on both stores."""
    a = run_program("torchax_job.py", activated(any_env))
    assert a["xla_compiles"], "the first process must compile"
    assert a["store"]["stored"] == len(a["xla_compiles"])  # the step and torchax's eager ops
    assert a["store"].get("hits", 0) == 0
    assert any("jax_func" in name or "call_torch" in name for name in a["xla_compiles"])

    # A read-only worker on a fresh host (no local tier of its own yet).
    b = run_program(
        "torchax_job.py",
        activated(any_env, ARTSTORE_READ_ONLY="1", XDG_CACHE_HOME=str(tmp_path / "host-b")),
    )
    assert b["xla_compiles"] == []
    assert b["events"]["/jax/compilation_cache/cache_hits"] == len(a["xla_compiles"])
    assert "/jax/compilation_cache/cache_misses" not in b["events"]
    assert b["store"]["hits"] == len(a["xla_compiles"])
    assert b["store"].get("misses", 0) == 0
    assert b["store"].get("stored", 0) == 0
    assert b["losses"] == a["losses"]  # float.hex: bit for bit
    assert len(set(a["losses"])) == len(a["losses"])  # it trains: each step's loss differs

    stats = json.loads(artstore("stats", "--json", env=any_env).stdout)
    assert stats["entries"] == len(a["xla_compiles"])


def test_named_step_loads_without_pytorch(store_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: a torchax step built as a named executable; a worker runs it with JAX alone."""
    batch = tmp_path / "batch.npz"
    a = run_program(
        "torchax_job.py",
        dict(store_env, TORCHAX_ARGS=f"--named {NAMED} --save-batch {batch}"),
    )
    assert a["store"]["stored"] == 2  # native for this host, and the portable jax.export form
    b = run_program(
        "torchax_named_load.py",
        dict(store_env, TORCHAX_NAMED=NAMED, TORCHAX_BATCH=str(batch)),
    )
    assert b["torch_imported"] is False
    assert b["xla_compiles"] == []
    assert b["store"]["hits"] == 1
    assert b["losses"] == a["losses"]
    listed = json.loads(artstore("ls", "--named", "--json", env=store_env).stdout)
    name, version = NAMED.split("@")
    assert {(r["name"], r["version"], r["platform"]) for r in listed} == {
        (name, version, "cpu"),
        (name, version, "portable"),
    }
