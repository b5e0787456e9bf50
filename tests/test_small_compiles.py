"""Compiles under the store threshold (ARTSTORE_MIN_COMPILE_SECS, 0.1 s by default): kept
in this host's own tier, never in the team's bucket or index, loaded by the next process
here; counted; and reported through JAX's monitoring events as JAX's own cache reports
its compiles (a miss only where something was written).

Slow: fresh JAX processes, two per deployment, two more for JAX's own cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TEAM_KEY, TEAM_PUB, artstore, bucket_of, clean_env, run_program, s3_client

from artifactstore.config import keyfiles, resolve
from artifactstore.config.host import compute
from artifactstore.formats.put import Put
from artifactstore.runtime.session import Session
from artifactstore.runtime.summary import Summary
from artifactstore.store.chain import Request

SMALL = 24  # trivial jits, each compiling in milliseconds
EVENTS = ("compile_requests_use_cache", "cache_hits", "cache_misses")


def _at_defaults(env: dict[str, str]) -> dict[str, str]:
    """`env` at the default store threshold, the two main functions slowed past it (so
    that they are stored), and SMALL trivial jits besides."""
    env = {k: v for k, v in env.items() if k != "ARTSTORE_MIN_COMPILE_SECS"}
    return dict(env, JOB_SLOW_COMPILE_SECS="0.3", JOB_MANY_SMALL=str(SMALL))


def _events(run: dict[str, object]) -> dict[str, int]:
    events = run["events"]
    assert isinstance(events, dict)
    return {name: events.get(f"/jax/compilation_cache/{name}", 0) for name in EVENTS}


def _bucket_objects(env: dict[str, str]) -> list[str]:
    """The objects (executables) the store holds: the bucket's, or the local store's."""
    if env["ARTSTORE_URL"].startswith("s3://"):
        bucket, prefix = bucket_of(env)
        listed = s3_client(env).list_objects_v2(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", []) if "/objects/" in f"/{o['Key']}"]
    root = Path(env["ARTSTORE_URL"])
    return [str(p) for p in root.rglob("*") if p.is_file() and "/objects/" in str(p)]


@pytest.mark.slow
def test_small_compiles_are_kept_on_this_host_and_loaded_by_the_next_process(
    any_env: dict[str, str],
) -> None:
    """Both deployments, at the default threshold: a second process on this host compiles
    nothing, JAX's events say what was written, and the team's store holds the stored
    entries alone. Slow: two fresh JAX processes, two compiles slowed by 0.3 s each."""
    env = _at_defaults(any_env)
    a = run_program("job.py", env)
    compiled = len(a["xla_compiles"])
    stats = a["store"]
    # The two main functions are stored, and what a loaded machine compiled past the
    # threshold; every quick compile is kept in this host's tier, never stored.
    stored, quick = stats["stored"], stats["quick_compiles"]
    assert stored >= 2 and quick >= 1 and stored + quick == compiled >= SMALL + 2, stats
    assert stats["quick_kept"] == quick, stats
    # JAX's events as its cache (thresholds 0) fires them: a miss for each write.
    assert _events(a) == {
        "compile_requests_use_cache": compiled,
        "cache_hits": 0,
        "cache_misses": compiled,
    }

    # Nothing small in the team's store: the stored entries, their objects only.
    entries = json.loads(artstore("ls", "--json", env=env).stdout)
    assert len(entries) == stored, entries
    assert len(_bucket_objects(env)) == stored
    from artifactstore.store.tiers import open_quick_tier

    quick_tier = open_quick_tier(resolve(environ=env))
    assert quick_tier is not None
    assert 1 <= len(quick_tier.key_names()) <= quick

    b = run_program("job.py", env)
    assert b["results"] == a["results"]
    assert b["xla_compiles"] == []  # the quick ones too: loaded from this host's tier
    warm = b["store"]
    assert warm["quick_loads"] == quick, warm
    assert warm["hits"] == warm["loads"] == compiled, warm
    assert not warm.get("quick_compiles") and not warm.get("misses"), warm
    # A warm process wrote nothing, so JAX's listeners hear of no miss.
    assert _events(b) == {
        "compile_requests_use_cache": compiled,
        "cache_hits": compiled,
        "cache_misses": 0,
    }
    summary = Summary.of([warm])
    assert (summary.hits, summary.compiles, summary.quick_loads) == (compiled, 0, quick)
    assert f"{quick} of the hits quick compiles kept on this host" in summary.render()
    # The team's store still holds nothing small, and its stats count the quick compiles.
    assert len(json.loads(artstore("ls", "--json", env=env).stdout)) == stored
    report = json.loads(artstore("stats", "--json", env=env).stdout)
    assert report["quick_compiles"] == quick and report["entries"] == stored, report


@pytest.mark.slow
def test_store_events_match_jaxs_own_cache(tmp_path: Path) -> None:
    """The same program, cold then warm, under JAX's own persistent cache (thresholds 0)
    and under the store at its defaults: the same monitoring events, in both runs.
    Slow: four fresh JAX processes."""
    jax_env = clean_env(JOB_NO_STORE="1", JOB_JAX_CACHE=str(tmp_path / "jax-cache"))
    jax_env = _at_defaults(jax_env)
    store_env = _at_defaults(clean_env(ARTSTORE_URL=str(tmp_path / "store")))
    for run in ("cold", "warm"):
        theirs = run_program("job.py", jax_env)
        ours = run_program("job.py", store_env)
        assert _events(ours) == _events(theirs), run
        assert ours["results"] == theirs["results"]


@pytest.mark.parametrize("case", ["signs", "listed", "required"])
def test_a_process_that_requires_signatures_keeps_only_what_it_can_load(
    tmp_path: Path, case: str
) -> None:
    """Signatures required (trusted keys listed, or required with none listed): a process
    with a signing key keeps its quick compiles signed (and the next process loads them,
    verified); one without keeps nothing, since it would refuse its own unsigned copies."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    if case == "required":
        env["ARTSTORE_REQUIRE_SIGNATURES"] = "1"
    else:
        env["ARTSTORE_TRUSTED_KEYS"] = str(TEAM_PUB)
    signs = case == "signs"
    if signs:
        env["ARTSTORE_SIGNING_KEY"] = str(TEAM_KEY)
    fp = compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    key = "k" + "0" * 63
    writer = Session(resolve(environ=env))
    made: list[Put] = []

    def make() -> Put:
        made.append(Put(key, b"executable", fp, "jit_small", 0.01))
        return made[-1]

    writer.keep_below_threshold(make)
    assert writer.flush(30)
    assert writer.stats().get("quick_kept", 0) == int(signs) == len(made)
    writer.close()

    reader = Session(resolve(environ=env))
    found = reader.chain.get(Request(key, fp.digest, 0))
    assert (found is not None) == signs
    if found is not None:
        assert found.payload == b"executable" and found.below_threshold
        stats = reader.stats()
        assert stats["quick_loads"] == stats["hits"] == 1 and not stats.get("tier_hits")
    assert not [k for k in reader.stats() if k.startswith("tier_")]  # nothing refused
    reader.close()
    if signs:  # another trust on the same host: this host's copy is a quiet miss
        _, other_pub = keyfiles.generate("other", tmp_path)
        other = Session(resolve(environ=dict(env, ARTSTORE_TRUSTED_KEYS=str(other_pub),
                                             ARTSTORE_SIGNING_KEY="")))  # fmt: skip
        assert other.chain.get(Request(key, fp.digest, 0)) is None
        assert not [k for k in other.stats() if k.startswith("tier_")], other.stats()
        other.close()
