"""A process that waited on another's compile lease and loaded the result counted a hit,
not a miss (issue 38.6): `stats` counts one miss per compile the store could have served.

Four cold writers of job.py start at once on a team store (moto S3 over HTTP +
PostgreSQL), their main compiles slowed so that they overlap: each key is compiled
once, and the other processes wait for it and load it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import artstore
from test_single_flight import compiles, env_for, finish, paused, resume, start, total

pytestmark = pytest.mark.slow


def test_lease_waiters_that_load_count_hits_not_misses(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """Slow: four JAX processes started together, the point of the test."""
    procs = [start(env_for(team_env, tmp_path, i, JOB_PAUSE="open")) for i in range(4)]
    for proc in procs:
        paused(proc)
    resume(*procs)
    results = [finish(p) for p in procs]
    compiled = sum(compiles(results).values())
    loaded = total(results, "lease_loaded")
    assert loaded >= 1, "no process waited and loaded: the case under test did not happen"
    stats = json.loads(artstore("stats", "--json", env=team_env).stdout)
    assert stats["misses"] == compiled, (stats, compiled, loaded)
    assert stats["hits"] == total(results, "hits")
    assert stats["hits"] >= loaded
