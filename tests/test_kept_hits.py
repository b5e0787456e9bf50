"""Hits and misses over the same span in every view (issue 38.6): the hits of entries gc
evicted or `rm` removed stay in `stats` (index/kept_hits.py), so its hit rate agrees with
`stats --by day` instead of counting hits on the entries still held only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import OpenStore, artstore, clean_env

from artifactstore.config import host
from artifactstore.formats.put import Put

FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-a",
                  device_count=1, jax_version="1", jaxlib_version="0.9.1")  # fmt: skip
K1, K2, K3 = ("a1" * 32, "b2" * 32, "c3" * 32)


def _stats(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("stats", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_evicted_and_removed_entries_keep_their_hits(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    assert store.put(Put(K1, b"a" * 3000, FP, "jit_a", 2.0))
    assert store.put(Put(K2, b"b" * 1000, FP, "jit_b", 1.0))
    for _ in range(3):
        assert store.get(K1, FP.digest) is not None
    assert store.get(K2, FP.digest) is not None
    assert store.get(K3, FP.digest) is None
    store.parts.accounts.flush()
    before = _stats(any_env)
    assert (before["hits"], before["misses"]) == (4, 1)
    assert before["hit_rate"] == pytest.approx(0.8)

    gc = artstore("gc", "--max-size", "0", "--grace", "0", env=any_env)  # evicts both
    assert gc.returncode == 0, gc.stderr
    after = _stats(any_env)
    assert after["entries"] == 0
    assert (after["hits"], after["misses"], after["hit_rate"]) == (4, 1, before["hit_rate"])
    assert after["bytes_fetched"] == before["bytes_fetched"] > 0
    assert after["compile_secs_saved"] == pytest.approx(before["compile_secs_saved"])
    assert _stats(any_env, "--by", "day")["total"]["hits"] == after["hits"]  # one span

    assert store.put(Put(K3, b"c" * 500, FP, "jit_c", 1.0))
    assert store.get(K3, FP.digest) is not None
    store.parts.accounts.flush()
    removed = artstore("rm", "--all", "--yes", env=any_env)
    assert removed.returncode == 0, removed.stderr
    assert _stats(any_env)["hits"] == 5


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + '{namespace="default"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in `artstore metrics`:\n{text}")


def test_index_metrics_count_hits_and_misses_as_stats_does(
    tmp_path: Any, open_store: OpenStore
) -> None:
    """`artstore metrics`' hits and misses equal `stats`': misses are compiles the store
    could have served (a quick compile's lookup is no miss), evicted hits count."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    assert store.put(Put(K1, b"a" * 3000, FP, "jit_a", 2.0))
    assert store.get(K1, FP.digest) is not None
    assert store.get(K2, FP.digest) is None  # an eligible miss
    assert store.get(K3, FP.digest) is None
    store.compiled_below_threshold(K3, FP.digest)  # quick: not a miss
    store.parts.accounts.flush()
    assert artstore("gc", "--max-size", "0", "--grace", "0", env=env).returncode == 0
    stats = _stats(env)
    assert (stats["hits"], stats["misses"], stats["lookups_missed"]) == (1, 1, 2)
    text = artstore("metrics", env=env).stdout
    assert _metric(text, "artstore_index_misses") == stats["misses"]
    assert _metric(text, "artstore_index_hits") == stats["hits"]


def test_hits_that_arrive_after_their_entry_was_removed_count_in_every_view(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A reader's hits journalled before `rm`, folded after it (and a writer's flushed
    after it) happened: stats, every --by view and metrics count them alike."""
    writer = open_store(team_env)
    assert writer.put(Put(K1, b"a" * 3000, FP, "jit_a", 2.0))
    assert writer.put(Put(K2, b"b" * 1000, FP, "jit_b", 1.0))
    reader = open_store(team_env, lazy_index=True, read_only=True)
    assert reader.get(K1, FP.digest) is not None
    assert reader.get(K3, FP.digest) is None  # an eligible miss
    assert reader.parts.backends.journals_hits
    reader.flush()  # a hit journal in the bucket
    assert writer.get(K2, FP.digest) is not None  # a writer's hit, not yet flushed
    removed = artstore("rm", K1, K2, "--yes", env=team_env)
    assert removed.returncode == 0, removed.stderr
    writer.parts.accounts.flush()  # its entry is gone
    assert artstore("fold", env=team_env).returncode == 0  # the reader's, after the rm

    plain = _stats(team_env)
    assert (plain["hits"], plain["misses"]) == (2, 1)
    assert plain["hit_rate"] == pytest.approx(2 / 3)
    for by in ("day", "fingerprint", "module"):
        assert _stats(team_env, "--by", by)["total"]["hits"] == plain["hits"], by
    assert _stats(team_env, "--by", "day")["total"]["hit_rate"] == plain["hit_rate"]
    text = artstore("metrics", env=team_env).stdout
    assert _metric(text, "artstore_index_hits") == plain["hits"]
