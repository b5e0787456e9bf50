"""The local disk tier: warm hosts load without the index or the object store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import artstore, clean_env, run_program

from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.config import resolve
from artifactstore.formats import codec
from artifactstore.store.tier import LocalTier, TierEntry
from artifactstore.store.tiers import open_quick_tier, open_tier

FP_A = "a" * 64
FP_B = "b" * 64
KEY = "0123456789abcdef" * 4


def _tier_objects(env: dict[str, str]) -> list[Path]:
    tier = open_tier(resolve(environ=env))
    assert tier is not None and tier.owns_objects
    return sorted(p for p in tier.blobs.objects.rglob("*") if p.is_file())


def _quick_tier_dir(env: dict[str, str]) -> Path:
    """This host's tier of compiles under the store threshold (store.tiers)."""
    tier = open_quick_tier(resolve(environ=env))
    assert tier is not None
    return tier.base


def test_warm_host_loads_from_its_tier_while_the_store_is_down(
    team_env: dict[str, str],
) -> None:
    a = run_program("job.py", team_env)
    assert a["xla_compiles"]
    # Same host, same tier, object store unreachable: opening the store would fail
    # with a log line, so silence proves that neither it nor the index was needed.
    down = dict(
        team_env,
        AWS_ENDPOINT_URL_S3="http://127.0.0.1:1",
        ARTSTORE_TIMEOUT="2",
    )
    b = run_program("job.py", down)
    assert b["xla_compiles"] == []
    assert b["store"]["tier_hits"] == len(a["xla_compiles"])
    assert b["results"] == a["results"]
    assert "artifactstore" not in b["_stderr"]  # the store was never needed


def test_tier_keeps_serving_after_the_store_failed_to_open(team_env: dict[str, str]) -> None:
    """A miss opens the store, which is down; the compiles after it still load from the tier."""
    a = run_program("job.py", team_env)
    down = dict(team_env, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="2",
                JOB_VARIANT="1")  # fmt: skip
    b = run_program("job.py", down)  # mlp changed: its key misses and needs the store
    assert b["xla_compiles"] == ['"jit_mlp"']
    assert b["store"]["active"] == 0
    assert b["store"]["tier_hits"] == len(a["xla_compiles"]) - 1
    lines = [line for line in b["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "object store unavailable" in lines[0], b["_stderr"]
    assert (
        b["store"]["breaker_opened_object_store"] == 1 and "breaker_opened_index" not in b["store"]
    )


def test_writer_keeps_its_compiles_in_the_tier_while_the_store_is_down(
    team_env: dict[str, str],
) -> None:
    """Compiled while S3 was down: kept on this host (counted), so the next process here
    loads them from the tier although the store never got them."""
    # A closed port fails at once: the bound is for the real index, which must answer under
    # load too (2 s was short at load 11: "index unavailable", a second line).
    down = dict(team_env, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="30")
    a = run_program("job.py", down)
    assert a["store"]["kept_in_tier"] == len(a["xla_compiles"]) > 0, a["store"]
    assert a["store"]["breaker_opened"] == 1  # concurrent compiles did not each try to open
    lines = [line for line in a["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "object store unavailable" in lines[0], a["_stderr"]
    b = run_program("job.py", down)
    assert b["xla_compiles"] == [] and b["results"] == a["results"]
    assert b["store"]["tier_hits"] == a["store"]["kept_in_tier"]
    assert "artifactstore" not in b["_stderr"]  # never needed the store
    assert json.loads(artstore("ls", "--json", env=team_env).stdout) == []  # not uploaded


def test_warm_process_opens_neither_index_nor_object_store(any_env: dict[str, str]) -> None:
    """A normal program's trivial jits compile under ARTSTORE_MIN_COMPILE_SECS and are
    never stored; this host's tier keeps them, so a warm process answers every compile
    (compiling none) without importing SQLAlchemy, psycopg or boto3."""
    env = dict(any_env, ARTSTORE_MIN_COMPILE_SECS="1", JOB_SLOW_COMPILE_SECS="1.2",
               JOB_SMALL_JITS="1")  # fmt: skip
    a = run_program("job.py", env)
    small = [m for m in a["xla_compiles"] if "mlp" not in m and "loss_and_grad" not in m]
    assert small and a["store"]["stored"] == 2
    b = run_program("job.py", env)
    assert b["results"] == a["results"]
    assert b["store"]["tier_hits"] == 2 and b["store"]["quick_loads"] == len(small)
    assert b["xla_compiles"] == [] and not b["store"].get("quick_compiles")
    assert b["imported"] == [], b["imported"]
    assert "artifactstore" not in b["_stderr"]
    # The tier's below-threshold hits never become misses in the index's counters.
    stats = json.loads(artstore("stats", "--json", env=env).stdout)
    assert stats["lookups_missed"] == len(a["xla_compiles"]) and stats["misses"] == 2


def test_a_key_once_quick_then_stored_is_looked_up_again(team_env: dict[str, str]) -> None:
    """A key the tier remembered as too quick to store, which a later process compiled
    slowly and stored, is looked up again once the tier's copy is gone (evicted, or another
    host stored it): before, the stale "quick" made processes compile a stored key.

    Slow: three fresh JAX processes on a team store, one with compiles slowed by 1.2 s.
    """
    env = dict(team_env, ARTSTORE_MIN_COMPILE_SECS="1")
    quick = run_program("job.py", env)
    assert quick["store"].get("stored", 0) == 0
    assert quick["store"]["quick_compiles"] == len(quick["xla_compiles"])
    # Another host (without this one's quick compiles) compiles them slowly: stored.
    shutil.rmtree(_quick_tier_dir(env))
    slow = run_program("job.py", dict(env, JOB_SLOW_COMPILE_SECS="1.2"))
    assert slow["store"]["stored"] == 2, slow["store"]
    for path in _tier_objects(env):  # the tier's copies gone; its memory of keys stays
        path.unlink()
    again = run_program("job.py", env)
    main = [m for m in again["xla_compiles"] if "mlp" in m or "loss_and_grad" in m]
    assert main == [] and again["store"]["store_hits"] == 2, again["store"]
    assert again["results"] == quick["results"]


def test_tier_hits_reach_the_index_once(team_env: dict[str, str]) -> None:
    a = run_program("job.py", team_env)
    n = len(a["xla_compiles"])
    b = run_program("job.py", team_env)
    assert b["store"]["tier_hits"] == n
    # b's exit reported its tier hits as a hit journal in the bucket (issue 38.5).
    assert artstore("fold", env=team_env).returncode == 0
    first = json.loads(artstore("ls", "--json", env=team_env).stdout)
    assert sorted(e["hits"] for e in first) == [1] * n  # folded from the journal
    assert artstore("fold", env=team_env).returncode == 0
    again = json.loads(artstore("ls", "--json", env=team_env).stdout)
    assert [e["hits"] for e in again] == [e["hits"] for e in first]  # folded once only


def test_damaged_tier_copy_is_refetched_not_loaded(team_env: dict[str, str]) -> None:
    a = run_program("job.py", team_env)
    objects = _tier_objects(team_env)
    assert len(objects) == len(a["xla_compiles"])
    for path in objects:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    b = run_program("job.py", team_env)
    assert b["results"] == a["results"]
    assert b["xla_compiles"] == []  # fetched from the object store instead
    assert b["store"].get("tier_hits", 0) == 0
    repaired = _tier_objects(team_env)
    assert all(codec.digest_of(p.read_bytes()) == p.name for p in repaired)
    c = run_program("job.py", team_env)
    assert c["store"]["tier_hits"] == len(a["xla_compiles"])


def test_removed_entries_are_not_served_by_the_tier(store_env: dict[str, str]) -> None:
    a = run_program("job.py", store_env)
    rm = artstore("rm", "--all", "--yes", env=store_env)
    assert rm.returncode == 0, rm.stderr
    b = run_program("job.py", store_env)
    assert len(b["xla_compiles"]) == len(a["xla_compiles"])
    assert b["store"].get("hits", 0) == 0


def test_tier_can_be_turned_off(team_env: dict[str, str]) -> None:
    env = dict(team_env, ARTSTORE_LOCAL_TIER="off")
    run_program("job.py", env)
    b = run_program("job.py", env)
    assert b["xla_compiles"] == []
    assert "tier_hits" not in b["store"]
    assert not _any_tier_for(env)


def _any_tier_for(env: dict[str, str]) -> bool:
    tier = open_tier(resolve(environ=dict(env, ARTSTORE_LOCAL_TIER="")))
    return tier is not None and tier.base.exists()


# -- the tier on its own -------------------------------------------------------
def _tier(tmp_path: Path, max_bytes: int | None = None) -> LocalTier:
    return LocalTier(LocalBlobStore(tmp_path, "ns"), owns_objects=True, max_bytes=max_bytes)


def _remember(tier: LocalTier, key: str, payload: bytes, fp: str = FP_A) -> str:
    enc = codec.encode(payload, fp)
    tier.remember(key, TierEntry(enc.digest, fp, 1.5), enc.data)
    return enc.digest


def test_tier_verifies_fingerprint_and_digest(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    digest = _remember(tier, KEY, b"executable")
    hit = tier.get(KEY, FP_A)
    assert hit is not None and hit.payload == b"executable" and hit.entry.compile_secs == 1.5
    assert tier.get(KEY, FP_B) is None  # another platform's key file never matches
    # A forged key file claiming our fingerprint for a foreign object: refused.
    forged = codec.encode(b"foreign", FP_B)
    tier.blobs.put(forged.digest, forged.data)
    key2 = "f" * 64
    tier.remember(key2, TierEntry(forged.digest, FP_A, 1.0), forged.data)
    assert tier.get(key2, FP_A) is None
    # A damaged copy: refused and dropped.
    path = tier.blobs._path(digest)
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    assert tier.get(KEY, FP_A) is None
    assert not path.exists() and tier.lookup(KEY) is None


def test_tier_journal_is_claimed_once(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    _remember(tier, KEY, b"x")
    assert tier.get(KEY, FP_A) is not None
    assert tier.get(KEY, FP_A) is not None
    tier.write_journal()
    tier.write_journal()  # nothing new: no empty journal
    assert len(list(tier.journal.glob("*.json"))) == 1
    drained = list(tier.drain_journals())
    assert len(drained) == 1 and drained[0][KEY][0] == 2
    assert list(tier.drain_journals()) == []


def test_tier_is_bounded_lru(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    digests = [_remember(tier, f"{i:064x}", bytes([i]) * 4000) for i in range(10)]
    sizes = {p.name: p.stat().st_size for p in tier.blobs.objects.rglob("*") if p.is_file()}
    assert tier.get(f"{0:064x}", FP_A) is not None  # most recently used now
    import os
    import time

    old = time.time() - 1000
    for d in digests[1:]:
        os.utime(tier.blobs._path(d), (old, old))
    limit = sum(sizes.values()) // 2
    removed = tier.prune(limit)
    left = [p.name for p in tier.blobs.objects.rglob("*") if p.is_file()]
    assert removed > 0 and digests[0] in left
    assert sum(sizes[d] for d in left) <= limit * 0.9


def test_invalidate_forgets_every_key(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    _remember(tier, KEY, b"x")
    tier.invalidate()
    assert tier.lookup(KEY) is None and not tier.has_entries()


@pytest.mark.parametrize("value", ["off", "0", "no"])
def test_tier_off_settings(value: str) -> None:
    env = clean_env(ARTSTORE_URL="s3://bucket-x/p", ARTSTORE_INDEX="postgresql://u@h/db",
                    ARTSTORE_LOCAL_TIER=value)  # fmt: skip
    assert open_tier(resolve(environ=env)) is None


def test_bad_tier_size_is_one_line_error() -> None:
    env = clean_env(ARTSTORE_LOCAL_TIER_SIZE="10Q", ARTSTORE_URL="s3://bucket-x/p",
                    ARTSTORE_INDEX="postgresql://u@h/db")  # fmt: skip
    proc = artstore("stats", env=env)
    assert proc.returncode != 0 and "invalid size '10Q'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gc_evictions_are_not_served_by_the_tier(store_env: dict[str, str]) -> None:
    a = run_program("job.py", store_env)
    gc = artstore("gc", "--max-size", "0", env=store_env)  # objects stay: grace period
    assert gc.returncode == 0, gc.stderr
    b = run_program("job.py", store_env)
    assert len(b["xla_compiles"]) == len(a["xla_compiles"])


def test_a_tier_named_by_the_previous_release_is_renamed_not_lost(tmp_path: Path) -> None:
    """0.3 named a tier by bucket, index URL and namespace; now by bucket and namespace (so
    `artstore pull` needs no index). The old tier is renamed on first use, copies intact."""
    import hashlib

    env = {"ARTSTORE_URL": "s3://bucket/prefix", "ARTSTORE_LOCAL_TIER": str(tmp_path),
           "ARTSTORE_INDEX": "postgresql+psycopg://u@db:5432/artstore"}  # fmt: skip
    settings = resolve(environ=env)
    identity = f"{settings.blobs.describe()}|{settings.index_url}|{settings.namespace}"
    old = tmp_path / hashlib.sha256(identity.encode()).hexdigest()[:24]
    (old / "keys").mkdir(parents=True)
    (old / "keys" / "copy").write_bytes(b"kept")
    tier = open_tier(settings)
    assert tier is not None and not old.exists()
    assert (tier.base / "keys" / "copy").read_bytes() == b"kept"
    no_index = {k: v for k, v in env.items() if k != "ARTSTORE_INDEX"}
    pulling = open_tier(resolve(environ=no_index, need_index=False))
    assert pulling is not None and pulling.base == tier.base  # pull fills the same tier
