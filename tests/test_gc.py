"""Eviction: LRU order, quotas, dry runs, leases, reconciliation, races; sizes and durations.

Entries are made with Store.put on synthetic payloads (fast); the concurrency
test runs real JAX programs in other processes while gc runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import forks
import pytest
from conftest import JobResults, OpenStore, artstore, clean_env, run_program, start_program

from artifactstore import gc
from artifactstore.config import host
from artifactstore.errors import ConfigError
from artifactstore.formats import codec, fingerprint, sizes
from artifactstore.formats.put import Put
from artifactstore.gc.quota_pass import QuotaPass
from artifactstore.index.eviction import EvictionIndex
from artifactstore.index.leases import Lease
from artifactstore.index.quotas import set_quota
from artifactstore.index.repo import NewEntry
from artifactstore.store import Store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _fp(jaxlib: str = "0.4.30") -> fingerprint.Fingerprint:
    return host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version=jaxlib)  # fmt: skip


def _key(i: int) -> str:
    return f"{i:064x}"


def _populate(
    store: Store, n: int, *, size: int = 2000, jaxlib: str = "0.4.30", start: int = 0
) -> dict[str, int]:
    """n entries with incompressible payloads, last used at T0 + i minutes; key -> bytes."""
    sizes_by_key = {}
    for i in range(start, start + n):
        key = _key(i)
        assert store.put(Put(key, os.urandom(size + 37 * i), _fp(jaxlib), f"jit_f{i}", 1.0))
        store.parts.index.record_access({key: (0, T0 + timedelta(minutes=i))})
        entry = store.parts.index.lookup(key)
        assert entry is not None
        sizes_by_key[key] = entry.size
    return sizes_by_key


def _gc(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("gc", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _keys(store: Store) -> set[str]:
    return {e.key for e in store.parts.index.iter_entries()}


def _removed(out: dict[str, Any], kind: str) -> set[str]:
    field = "key" if kind == "entry" else "digest"
    return {r[field] for r in out["removed"] if r["kind"] == kind}


# -- LRU --------------------------------------------------------------------
def test_lru_evicts_oldest_until_the_limit_holds_exactly(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    by_key = _populate(store, 12)
    # Hits make two of the oldest entries the most recently used.
    for i in (0, 2):
        assert store.get(_key(i), _fp().digest) is not None
    store.parts.accounts.flush()
    order = [_key(i) for i in (1, *range(3, 12), 0, 2)]  # least recently used first
    limit = sum(by_key[k] for k in order[6:]) + by_key[order[5]] - 1  # just too small for 7

    out = _gc(any_env, "--max-size", str(limit), "--grace", "0")
    assert _removed(out, "entry") == set(order[:6])
    assert _keys(store) == set(order[6:])
    assert out["summary"]["bytes_after"] == sum(by_key[k] for k in order[6:]) <= limit
    assert out["summary"]["bytes_after"] + by_key[order[5]] > limit  # no more than needed
    assert out["summary"]["bytes_before"] == sum(by_key.values())
    # Their objects went too (grace 0), and nothing else did.
    assert out["summary"]["objects_removed"] == 6
    for removal in out["removed"]:
        if removal["kind"] == "object":
            assert not store.parts.blobs.exists(removal["digest"])
    for key in order[6:]:
        entry = store.parts.index.lookup(key)
        assert entry is not None and store.parts.blobs.exists(entry.digest)
    assert json.loads(artstore("verify", "--json", env=any_env).stdout)["ok"] is True
    # Idempotent: the limit holds, a second run removes nothing.
    again = _gc(any_env, "--max-size", str(limit), "--grace", "0")
    assert again["removed"] == []
    assert again["summary"]["bytes_after"] == out["summary"]["bytes_after"]


def test_shared_objects_count_once_and_go_with_their_last_entry(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    """Two keys can resolve to one object (same executable and fingerprint): its bytes
    count once and are freed only with the most recently used of its entries, so
    gc evicts past an entry whose removal frees nothing."""
    store = open_store(any_env)
    by_key = _populate(store, 4)  # keys 0..3, used at T0 + 0..3 minutes
    loaded = store.get(_key(3), _fp().digest)
    shared = store.parts.index.lookup(_key(3))
    assert loaded is not None and shared is not None
    # Objects name their key since 0.2, so only entries written by 0.1 clients
    # (which deduplicated equal bytes across keys) share one: write one as they did.
    fields = {name: getattr(shared, name) for name in NewEntry.__dataclass_fields__}
    old_client = NewEntry(**{**fields, "key": _key(10), "module_name": "jit_f3"})
    assert store.parts.index.add_entry(old_client, _fp().to_json())
    store.parts.index.record_access({_key(10): (0, T0 - timedelta(minutes=1))})
    old = _populate(store, 1, jaxlib="0.4.1", start=20)  # dropped by --jaxlib-older-than
    index = {e.key: e for e in store.parts.index.iter_entries()}
    assert index[_key(10)].digest == index[_key(3)].digest
    # LRU order 10, 0, 1, 2, 3: removing 10 frees nothing while 3 holds its object.
    limit = by_key[_key(1)] + by_key[_key(2)] + by_key[_key(3)]
    args = ("--max-size", str(limit), "--jaxlib-older-than", "0.4.30", "--grace", "0")

    dry = _gc(any_env, "--dry-run", *args)
    real = _gc(any_env, *args)
    for kind in ("entry", "object"):
        assert _removed(dry, kind) == _removed(real, kind)
    assert dry["summary"]["bytes_after"] == real["summary"]["bytes_after"] == limit
    assert _removed(real, "entry") == {_key(10), _key(0), _key(20)}
    assert _removed(real, "object") == {index[_key(0)].digest, index[_key(20)].digest}
    assert real["summary"]["bytes_before"] == sum(by_key.values()) + sum(old.values())
    assert real["summary"]["reasons"] == {"jaxlib": 1, "size": 2, "unreferenced": 2}
    assert _keys(store) == {_key(1), _key(2), _key(3)}
    hit = store.get(_key(3), _fp().digest)
    assert hit is not None and hit.payload == loaded.payload


def test_objects_wait_for_the_grace_period(any_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(any_env)
    _populate(store, 3)
    out = _gc(any_env, "--max-size", "0")  # default grace: 1h
    assert len(_removed(out, "entry")) == 3 and _removed(out, "object") == set()
    assert sum(1 for _ in store.parts.blobs.iter_blobs()) == 3  # kept: maybe a put in flight
    assert json.loads(artstore("verify", "--json", env=any_env).stdout)["ok"] is True
    later = _gc(any_env, "--grace", "0")
    assert len(_removed(later, "object")) == 3
    assert list(store.parts.blobs.iter_blobs()) == []


def test_read_only_hits_count_for_lru(any_env: dict[str, str], open_store: OpenStore) -> None:
    writer = open_store(any_env)
    by_key = _populate(writer, 2)
    entries_before = [e.to_json() for e in writer.parts.index.iter_entries()]
    reader = open_store(any_env, read_only=True)
    assert reader.get(_key(0), _fp().digest) is not None  # the older one is read
    assert reader.get(_key(0), _fp().digest) is not None
    reader.parts.accounts.flush()
    assert [e.to_json() for e in writer.parts.index.iter_entries()] == entries_before  # untouched
    out = _gc(any_env, "--max-size", str(by_key[_key(0)]))
    assert out["summary"]["accesses_folded"] == 1
    assert _keys(writer) == {_key(0)}  # the reader's hits made it the most recent
    entry = writer.parts.index.lookup(_key(0))
    assert entry is not None and entry.hits == 2 and entry.last_access > T0 + timedelta(days=1)
    assert _gc(any_env)["summary"]["accesses_folded"] == 0  # folded exactly once


# -- other policies ---------------------------------------------------------
def test_older_than_and_old_jaxlib(any_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(any_env)
    versions = {0: "0.4.9", 1: "0.4.30", 2: "0.10.2", 3: "nightly"}
    for i, version in versions.items():
        _populate(store, 1, jaxlib=version, start=i)
        store.parts.index.record_access({_key(i): (0, datetime.now(UTC))})
    # 0.4.9 < 0.4.30 (a string comparison says otherwise); "nightly" is never guessed at.
    out = _gc(any_env, "--jaxlib-older-than", "0.4.30")
    assert _removed(out, "entry") == {_key(0)}
    assert out["summary"]["reasons"] == {"jaxlib": 1}
    store.parts.index.record_access({_key(1): (0, datetime.now(UTC) - timedelta(days=40))})
    out = _gc(any_env, "--older-than", "30d")
    assert _removed(out, "entry") == {_key(1)}
    assert _keys(store) == {_key(2), _key(3)}


def test_quotas_per_namespace(any_env: dict[str, str], open_store: OpenStore) -> None:
    a = open_store(any_env, namespace="team-a")
    b = open_store(any_env, namespace="team-b")
    sizes_a = _populate(a, 6)
    sizes_b = _populate(b, 6)
    quota = sum(sizes_a[_key(i)] for i in range(3, 6))
    ok = artstore("quota", "set", "team-a", str(quota), env=any_env)
    assert ok.returncode == 0, ok.stderr
    listed = json.loads(artstore("quota", "ls", "--json", env=any_env).stdout)
    assert listed == [{"namespace": "team-a", "max_bytes": quota, "bytes": sum(sizes_a.values())}]

    proc = artstore("gc", "--all-namespaces", "--json", env=any_env)
    assert proc.returncode == 0, proc.stderr
    runs = {r["namespace"]: r for r in json.loads(proc.stdout)}
    assert set(runs) == {"team-a", "team-b"}
    assert _keys(a) == {_key(i) for i in range(3, 6)}
    assert runs["team-a"]["summary"]["bytes_after"] == quota
    assert _keys(b) == set(sizes_b) and runs["team-b"]["removed"] == []
    # --max-size and the quota: the smaller one wins.
    out = _gc(dict(any_env, ARTSTORE_NAMESPACE="team-a"), "--max-size", "1T")
    assert out["removed"] == [] and out["summary"]["limit_bytes"] == quota
    assert artstore("quota", "rm", "team-a", env=any_env).returncode == 0
    assert json.loads(artstore("quota", "ls", "--json", env=any_env).stdout) == []
    assert "no quotas" in artstore("quota", "ls", env=any_env).stdout


# -- dry run and reconciliation ----------------------------------------------
def _plant_problems(store: Store) -> tuple[str, str]:
    """An object no entry references and an entry whose object is gone."""
    orphan = codec.encode(b"orphaned bytes", _fp().digest)
    store.parts.blobs.put(orphan.digest, orphan.data)
    dangling = store.parts.index.lookup(_key(7))
    assert dangling is not None
    store.parts.blobs.delete(dangling.digest)
    return orphan.digest, dangling.key


def _state(store: Store) -> tuple[list[Any], list[str]]:
    entries = sorted(
        json.dumps(e.to_json(), sort_keys=True) for e in store.parts.index.iter_entries()
    )
    return entries, sorted(b.digest for b in store.parts.blobs.iter_blobs())


def test_dry_run_reports_what_a_real_run_removes(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    by_key = _populate(store, 10)
    orphan, dangling = _plant_problems(store)
    report = json.loads(artstore("verify", "--json", "--grace", "0", env=any_env).stdout)
    assert report["objects_without_entry"] == [orphan]
    assert report["entries_without_object"] == [dangling]

    args = ("--max-size", str(sum(by_key[_key(i)] for i in range(5, 10))), "--grace", "0")
    before = _state(store)
    dry = _gc(any_env, "--dry-run", *args)
    assert _state(store) == before  # deleted nothing
    text_run = artstore("gc", "--dry-run", *args, env=any_env)
    assert text_run.stdout.count("would remove entry") == len(_removed(dry, "entry"))
    real = _gc(any_env, *args)
    assert dry["summary"]["dry_run"] and not real["summary"]["dry_run"]
    for kind in ("entry", "object"):
        assert _removed(dry, kind) == _removed(real, kind)
    assert _removed(real, "entry") == {_key(i) for i in range(5)} | {dangling}
    assert orphan in _removed(real, "object")
    assert {r["reason"] for r in real["removed"]} == {"size", "unreferenced", "orphan",
                                                      "missing-object"}  # fmt: skip
    assert real["summary"]["dangling_entries"] == 1
    assert json.loads(artstore("verify", "--json", "--grace", "0", env=any_env).stdout)["ok"]


def test_verify_ignores_young_orphans(store_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(store_env)
    orphan = codec.encode(b"a put in flight", _fp().digest)
    store.parts.blobs.put(orphan.digest, orphan.data)
    assert json.loads(artstore("verify", "--json", env=store_env).stdout)["ok"] is True
    assert _gc(store_env)["removed"] == []  # younger than the default grace
    path = Path(store_env["ARTSTORE_URL"]) / "default" / "objects" / orphan.digest[:2]
    old = time.time() - 2 * 3600
    os.utime(path / orphan.digest, (old, old))
    bad = artstore("verify", "--json", env=store_env)
    assert bad.returncode == 1 and json.loads(bad.stdout)["objects_without_entry"] == [
        orphan.digest
    ]
    assert _removed(_gc(store_env), "object") == {orphan.digest}


# -- safety under concurrency -----------------------------------------------
def test_second_gc_is_refused_or_waits(any_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(any_env)
    lease = Lease(store.parts.engine, "gc:default", holder="ci-host:4242")
    lease.acquire()
    proc = artstore("gc", "--max-size", "1G", env=any_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ci-host:4242" in lines[0] and "--wait" in lines[0]
    assert "Traceback" not in proc.stderr

    pipe = subprocess.PIPE
    waiting = forks.popen("cli", forks.CLI, ["gc", "--wait", "--json"],
                          any_env, stdout=pipe, stderr=pipe)  # fmt: skip
    time.sleep(3)
    assert waiting.poll() is None  # still waiting for the lease
    lease.release()
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert json.loads(out)["namespace"] == "default"

    # A holder that died: its lease expires and is taken over.
    dead = Lease(store.parts.engine, "gc:default", ttl_secs=0.0, holder="dead-host:1")
    dead.acquire()
    assert _gc(any_env)["summary"]["namespace"] == "default"
    with pytest.raises(Exception, match="lost gc:default"):
        dead.renew()

    # A holder on this host that exited without releasing (e.g. a gc that failed while the
    # database was down, found by bench/soak.py): taken over at once, not after its TTL.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    crashed = Lease(
        store.parts.engine, "gc:default", holder=f"{socket.gethostname()}:{gone.stdout.strip()}"
    )
    crashed.acquire()
    assert _gc(any_env)["summary"]["namespace"] == "default"
    with pytest.raises(Exception, match="lost gc:default"):
        crashed.renew()


def test_writer_restores_an_object_gc_deleted_under_it(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    """The one dangerous interleaving, forced: a writer finds the object present and
    skips the upload, gc deletes it (no entry yet), then the writer commits."""
    store = open_store(any_env)
    payload = b"an executable" * 100
    # The same bytes the writer below produces: an orphan from a crashed writer of this key.
    meta = codec.ObjectMeta(_key(1), "m", 1.0, len(payload), socket.gethostname(),
                            _fp().to_dict())  # fmt: skip
    encoded = codec.encode(payload, _fp().digest, meta, signer=store.parts.settings.signing_key,
                           namespace=store.parts.namespace)  # fmt: skip
    store.parts.blobs.put(encoded.digest, encoded.data)
    ix = EvictionIndex(store.parts.engine, store.parts.namespace)
    ix.adopt_objects([(encoded.digest, len(encoded.data), T0)])
    real_put = store.parts.blobs.put
    deleted: list[tuple[str, int]] = []

    def put_then_gc(digest: str, data: bytes) -> bool:
        uploaded = real_put(digest, data)
        if not deleted:
            deleted.extend(
                ix.delete_objects([digest], datetime.now(UTC), store.parts.blobs.delete_many)
            )
        return uploaded

    store.parts.blobs.put = put_then_gc  # type: ignore[method-assign]
    assert store.put(Put(_key(1), payload, _fp(), "m", 1.0))
    assert deleted == [(encoded.digest, len(encoded.data))]  # gc did delete it
    assert store.parts.blobs.exists(encoded.digest)  # and the writer put it back
    hit = store.get(_key(1), _fp().digest)
    assert hit is not None and hit.payload == payload


# -- the opt-in quota pass after writes ---------------------------------------
def test_quota_pass_runs_after_writes_throttled_and_at_finish(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    ix = EvictionIndex(store.parts.engine, store.parts.namespace)
    passes = QuotaPass.attach(store, interval_secs=3600)
    by_key = _populate(store, 4)  # the first put ran a pass: no quota, nothing to do
    assert passes.runs == 0 and len(_keys(store)) == 4
    by_key |= _populate(store, 1, start=4)  # within the interval: only marked as due
    assert len(_keys(store)) == 5
    limit = sum(by_key[_key(i)] for i in (2, 3, 4))
    set_quota(store.parts.engine, store.parts.namespace, limit)
    passes.finish()  # the exit pass: the two least recently used go
    assert passes.runs == 1
    assert _keys(store) == {_key(i) for i in (2, 3, 4)}
    assert ix.referenced_bytes() == limit
    passes.finish()  # nothing written since: no pass
    assert passes.runs == 1

    # Another gc holds the lease: the pass steps aside without an error.
    _populate(store, 2, start=5)
    other = Lease(store.parts.engine, "gc:default", holder="cron-host:1")
    other.acquire()
    assert passes.run() is None and ix.referenced_bytes() > limit
    other.release()
    report = passes.run()
    assert report is not None and report.entries_removed >= 1
    assert ix.referenced_bytes() <= limit


@pytest.mark.slow
def test_writer_with_enforce_quota_leaves_its_namespace_within_quota(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    ix = EvictionIndex(store.parts.engine, store.parts.namespace)
    first = run_program("job.py", _job_env(any_env))
    quota = ix.referenced_bytes()
    old_keys = _keys(store)
    assert artstore("quota", "set", "default", str(quota), env=any_env).returncode == 0

    enforced = run_program("job.py", _job_env(any_env, JOB_VARIANT="1", ARTSTORE_ENFORCE_QUOTA="1"))
    assert enforced["store"]["stored"] >= 1
    assert ix.referenced_bytes() <= quota
    assert not old_keys <= _keys(store)  # least recently used entries made room

    # The control: the same kind of write without the option overshoots the quota.
    plain = run_program("job.py", _job_env(any_env, JOB_VARIANT="2"))
    assert plain["store"]["stored"] >= 1
    assert ix.referenced_bytes() > quota
    assert first["results"] != enforced["results"] != plain["results"]


def _job_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    return dict(env, ARTSTORE_FLUSH_TIMEOUT="120", **extra)


@pytest.mark.slow
def test_readers_and_writers_in_other_processes_while_gc_runs(
    any_env: dict[str, str], open_store: OpenStore, job_results: JobResults
) -> None:
    """Slow: JAX readers and writers in other processes run through a whole gc."""
    expected = {v: job_results(v) for v in ("0", "1", "2")}
    run_program("job.py", _job_env(any_env))  # something for readers to hit
    jobs = [
        *(start_program("job.py", _job_env(any_env, JOB_VARIANT=v)) for v in ("1", "2")),
        *(start_program("job.py", _job_env(any_env, ARTSTORE_READ_ONLY="1")) for _ in range(2)),
        start_program("job.py", _job_env(any_env)),
    ]
    variants = ["1", "2", "0", "0", "0"]
    runs, evicted = 0, 0
    while any(j.poll() is None for j in jobs) or runs < 3:
        out = _gc(any_env, "--max-size", "1", "--grace", "0")  # evict nearly everything, at once
        evicted += len(_removed(out, "entry"))
        runs += 1
    assert evicted > 0
    for job, variant in zip(jobs, variants, strict=True):
        stdout, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
        assert "Traceback" not in stderr and "could not store" not in stderr
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["results"] == expected[variant]  # a miss compiles: never a wrong answer
    report = json.loads(artstore("verify", "--json", "--grace", "0", env=any_env).stdout)
    assert report["entries_without_object"] == [] and report["corrupt"] == []
    assert report["manifests_without_object"] == []  # none leads readers to nothing
    # Every committed entry can still be loaded.
    after = run_program("job.py", _job_env(any_env))
    assert after["results"] == expected["0"]
    assert after["store"].get("missing_object", 0) == 0


# -- parsing ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("1w", 604800), ("45s", 45),
     ("0s", 0), ("0", 0), ("1.5h", 5400), (" 2 D ", 172800)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert sizes.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "1y", "1.2.3h", "1e3s", "ten m",
                                  "1h30m", "nan", "inf"])  # fmt: skip
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid duration") as info:
        sizes.parse_duration(text)
    assert "\n" not in str(info.value) and "e.g. 30d" in str(info.value)


@pytest.mark.parametrize("text", ["500Q", "-1G", "1e3G", "nan", "inf", "1,5G", "5 G B",
                                  "0x10", "99999999999P", "1.5 TiBs"])  # fmt: skip
def test_parse_size_rejects_more(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid size") as info:
        sizes.parse_size(text)
    assert "\n" not in str(info.value)


def test_jaxlib_versions_compare_as_versions() -> None:
    present = ["0.4.9", "0.4.30", "0.4.30rc1", "0.10.0", "garbage"]
    assert gc.old_jaxlib_versions(present, "0.4.30") == ["0.4.30rc1", "0.4.9"]
    with pytest.raises(ConfigError, match="invalid jaxlib version"):
        gc.old_jaxlib_versions(present, "latest!")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["gc", "--max-size", "500Q"], "invalid size '500Q'"),
        (["gc", "--max-size", "-1G"], "invalid size '-1G'"),
        (["gc", "--max-size", ""], "invalid size ''"),
        (["gc", "--older-than", "30"], "invalid duration '30'"),
        (["gc", "--grace", "-1h"], "invalid duration '-1h'"),
        (["gc", "--jaxlib-older-than", "new!"], "invalid jaxlib version"),
        (["gc", "--namespace", "a", "--all-namespaces"], "not both"),
        (["gc", "--namespace", "bad ns!"], "invalid namespace"),
        (["gc", "--max-size"], "requires an argument"),
        (["quota", "set", "team", "10Q"], "invalid size '10Q'"),
        (["quota", "set", "bad ns!", "1G"], "invalid namespace"),
        (["quota", "set", "team"], "Missing argument 'SIZE'"),
        (["quota", "rm", "nobody"], "has no quota"),
    ],
)
def test_bad_gc_input_is_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    proc = artstore(*args, env=env)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("artstore: error: ") and needle in lines[0]
    assert proc.stdout == ""


def test_read_only_gc_and_quota_are_refused(store_env: dict[str, str]) -> None:
    artstore("stats", env=store_env)
    for args in (["gc"], ["quota", "set", "default", "1G"]):
        proc = artstore(*args, env=dict(store_env, ARTSTORE_READ_ONLY="1"))
        assert proc.returncode == 1 and "unset ARTSTORE_READ_ONLY" in proc.stderr


def test_text_summary_and_progress(store_env: dict[str, str], open_store: OpenStore) -> None:
    _populate(open_store(store_env), 3)
    proc = artstore("gc", "--max-size", "0", "--grace", "0", "--progress", env=store_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("namespace default: removed 3 entries")
    assert "the entries left reference 0 B of objects (limit 0 B)" in proc.stdout
    assert "evicting" in proc.stderr and "Traceback" not in proc.stderr
