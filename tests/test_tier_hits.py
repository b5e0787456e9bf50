"""Reads served from a node's tier reach the index (issue 38.5): LRU and `stats` see them.

A read-only reader on a team store (moto S3 over HTTP + PostgreSQL) fetches its
executables once, then serves them from its tier in later runs, which never open the
store. Their hits go to the tier's journal and, once due (ARTSTORE_JOURNAL_SECS), into
one hit journal in the bucket; `artstore fold` credits them, and gc then evicts an
unused entry before the tier-served ones. An offline node keeps them in its tier."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from conftest import artstore, bucket_of, run_program, s3_client


def _entries(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    proc = artstore("ls", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {e["key"]: e for e in json.loads(proc.stdout)}


def _journals(env: dict[str, str]) -> list[str]:
    bucket, prefix = bucket_of(env)
    listed = s3_client(env).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/default/journals/")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_tier_served_hits_are_folded_and_keep_their_entries_from_gc(
    team_env: dict[str, str], tmp_path: Any
) -> None:
    """Slow: six JAX programs (a writer twice, a reader four times) and gc: the path
    under test is a process's exit, which only real processes have."""
    run_program("job.py", team_env)
    used = _entries(team_env)
    reader = dict(team_env, ARTSTORE_READ_ONLY="1", ARTSTORE_JOURNAL_SECS="0",
                  ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    first = run_program("job.py", reader)  # fetched from S3, into the tier
    assert first["xla_compiles"] == [] and first["store"]["hits"] == len(used)
    run_program("job.py", dict(team_env, JOB_VARIANT="0.5"))  # entries no one reads
    unused = {k: e for k, e in _entries(team_env).items() if k not in used}
    assert unused
    assert artstore("fold", env=team_env).returncode == 0
    before = _entries(team_env)

    for _ in range(3):  # served from the tier only: the store is never needed
        warm = run_program("job.py", reader)
        assert warm["store"].get("tier_hits") == len(used) and warm["xla_compiles"] == []
    assert _journals(team_env), "the tier's hits never reached the bucket"
    folded = json.loads(artstore("fold", "--json", env=team_env).stdout)
    assert folded["hits"] == 3 * len(used), folded
    after = _entries(team_env)
    for key in used:
        assert after[key]["hits"] == before[key]["hits"] + 3
        assert after[key]["last_access"] > max(e["created_at"] for e in unused.values())

    # Room for the two used entries only: LRU evicts the unused ones.
    limit = sum(e["size"] for e in after.values() if e["key"] in used)
    gc = artstore("gc", "--max-size", str(limit), "--grace", "0", env=team_env)
    assert gc.returncode == 0, gc.stderr
    assert set(_entries(team_env)) == set(used), gc.stdout


def test_an_offline_node_keeps_its_tier_hits_and_reports_them_when_back(
    team_env: dict[str, str], tmp_path: Any
) -> None:
    """Slow: four JAX programs; one runs with the object store unreachable."""
    run_program("job.py", team_env)
    used = _entries(team_env)
    reader = dict(team_env, ARTSTORE_READ_ONLY="1", ARTSTORE_JOURNAL_SECS="0",
                  ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    run_program("job.py", reader)
    assert artstore("fold", env=team_env).returncode == 0
    before = _entries(team_env)
    offline = dict(reader, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="2")
    away = run_program("job.py", offline)
    assert away["store"].get("tier_hits") == len(used)
    assert list((tmp_path / "tier").rglob("access/*.json")), "the offline hits were not kept"
    assert not _journals(team_env)
    back = run_program("job.py", reader)
    assert back["store"].get("tier_hits") == len(used)
    assert not list((tmp_path / "tier").rglob("access/*.json"))
    assert artstore("fold", env=team_env).returncode == 0
    after = _entries(team_env)
    assert all(after[k]["hits"] == before[k]["hits"] + 2 for k in used)


def test_hits_an_exit_flush_could_not_write_are_kept_and_reported(
    team_env: dict[str, str], tmp_path: Any
) -> None:
    """Slow: three JAX programs. A writer that loads (and, its variant, stores) at exit
    with no time left of its flush bound (as uploads on a loaded machine spend it): its
    hits go back to its tier, and the node's next process reports them.

    Each of its hits is counted once, whenever it is written: its writer's periodic
    flush (a tick every 5 s) writes those it has while the program runs, which on a
    loaded machine is some of them, and the rest are kept in the tier. So the count is
    taken from before it ran, not from after its own hits were folded."""
    run_program("job.py", team_env)
    assert artstore("fold", env=team_env).returncode == 0
    before = json.loads(artstore("stats", "--json", env=team_env).stdout)["hits"]
    node = dict(team_env, ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"), ARTSTORE_JOURNAL_SECS="0")
    late = run_program(
        "job.py", dict(node, JOB_VARIANT="0.5", JOB_SKIP_FLUSH="1", ARTSTORE_FLUSH_TIMEOUT="0")
    )
    loaded = late["store"]["hits"]
    assert loaded >= 1 and late["xla_compiles"]
    assert "hit counts" in late["_stderr"]  # said: not written within the bound
    assert list((tmp_path / "tier").rglob("access/*.json")), "the late hits were dropped"
    assert artstore("fold", env=team_env).returncode == 0
    warm = run_program("job.py", node)  # the node's next process reports them at exit
    assert artstore("fold", env=team_env).returncode == 0
    after = json.loads(artstore("stats", "--json", env=team_env).stdout)["hits"]
    assert after - before == loaded + warm["store"]["hits"]


WARM_EXIT = """
import atexit, sys
# Registered first, so it runs last: after artifactstore's own exit work.
atexit.register(lambda: print(sorted(m for m in ("sqlalchemy", "boto3") if m in sys.modules)))
import jax, jax.numpy as jnp
import artifactstore
artifactstore.configure(min_compile_secs=0)
jax.jit(lambda x: jnp.tanh(x @ x).sum())(jnp.ones((32, 32))).block_until_ready()
print(artifactstore.process_stats().get("tier_hits", 0))
"""


def test_a_warm_process_on_the_embedded_store_imports_no_index_even_at_exit(
    store_env: dict[str, str],
) -> None:
    """A process the tier answered in full never opens the index, not even to report its
    hits at exit: an embedded store's tier is its own directory, which every Store.open
    folds. (Importing the index alone cost a warm process ~0.2 s: 1.2x JAX's wall.)"""

    def run() -> list[str]:
        command = [sys.executable, "-c", WARM_EXIT]
        proc = subprocess.run(command, env=store_env, capture_output=True, text=True, check=True)
        return proc.stdout.split("\n")

    run()  # cold: compiles and stores
    hits, modules = run()[:2]
    assert int(hits) >= 1 and modules == "[]", (hits, modules)
