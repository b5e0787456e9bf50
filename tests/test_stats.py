"""`artstore stats`: eligible misses, usage per fingerprint, day and module, and its sources.

A miss whose compile then took less than ARTSTORE_MIN_COMPILE_SECS is never stored,
so it is no eligible miss; usage rows (migration 0004) are written in the access
flush or carried by hit journals (still format version 1, with an optional table).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, OpenStore, artstore, clean_env, old_client, run_program
from faultproxy import FaultProxy

from artifactstore.blobstores.base import JOURNALS
from artifactstore.config import host
from artifactstore.formats.counters import DEPRECATED, REMOVED_IN
from artifactstore.formats.journal import Journal, new_name
from artifactstore.formats.put import Put
from artifactstore.formats.usage import today
from artifactstore.gc.journals import fold_journals
from artifactstore.index import db
from artifactstore.index.accesses import fold_accesses
from artifactstore.store import Store

FP1 = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-a",
                   device_count=1, jax_version="1", jaxlib_version="0.9.1")  # fmt: skip
FP2 = host.compute(platform_name="gpu", platform_version="v", device_kind="H200",
                   device_count=8, jax_version="1", jaxlib_version="0.10.2")  # fmt: skip
K1, K2, K3, K4, K5 = (f"{i:02x}" * 32 for i in range(1, 6))

# The last commit at schema 0003 (before usage rows): the previous client.
SCHEMA_0003_COMMIT = "d6bb097"


def _stats(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("stats", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _workload(store: Store) -> dict[str, int]:
    """A known workload: K1 (FP1, jit_a) hit 3 times, K2 (FP2, jit_b) once; K3 (FP1)
    missed, then compiled below the threshold; K4 (FP2) missed (eligible); K5 (FP1)
    compiled below the threshold without a lookup (the tier knew it); one lease wait
    (FP1) and one takeover (no fingerprint). Returns the objects' sizes."""
    assert store.put(Put(K1, b"a" * 3000, fingerprint=FP1, module_name="jit_a", compile_secs=2.0))
    assert store.put(Put(K2, b"b" * 1000, fingerprint=FP2, module_name="jit_b", compile_secs=5.0))
    for _ in range(3):
        assert store.get(K1, FP1.digest) is not None
    assert store.get(K2, FP2.digest) is not None
    assert store.get(K3, FP1.digest) is None
    store.compiled_below_threshold(K3, FP1.digest)
    assert store.get(K4, FP2.digest) is None
    store.compiled_below_threshold(K5, FP1.digest)
    store.parts.counters.add("lease_waits", fingerprint=FP1.digest)
    store.parts.counters.add("lease_takeovers")  # as callers without a fingerprint count
    sizes = {}
    for key in (K1, K2):
        entry = store.parts.index.lookup(key)
        assert entry is not None
        sizes[key] = entry.size
    return sizes


def test_known_workload_by_fingerprint_day_and_module(
    tmp_path: Path, open_store: OpenStore
) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    sizes = _workload(store)
    counts = store.parts.counters.snapshot()
    assert counts["lookups_missed"] == 2 and counts["quick_compiles"] == 2
    assert counts["misses_below_threshold"] == 1 and counts["hits"] == counts["store_hits"] == 4
    store.parts.accounts.flush()

    totals = _stats(env)
    fetched = 3 * sizes[K1] + sizes[K2]
    assert totals["hits"] == 4 and totals["lookups_missed"] == 2
    assert totals["misses_below_threshold"] == 1
    assert totals["misses"] == 1  # one meaning: compiles the store could have served
    assert totals["quick_compiles"] == 2
    assert totals["hit_rate"] == pytest.approx(4 / 5)
    assert totals["bytes_fetched"] == fetched
    assert totals["compile_secs_saved"] == pytest.approx(3 * 2.0 + 5.0)
    assert (totals["lease_waits"], totals["lease_takeovers"]) == (1, 1)
    assert (totals["eligible_misses"], totals["below_threshold"]) == (1, 2)  # 0.3's names

    counted = {
        "hits",
        "hit_rate",
        "misses",
        "misses_below_threshold",
        "bytes_fetched",
        "compile_secs_saved",
        "lease_waits",
        "lease_takeovers",
        "lookups_missed",
        "quick_compiles",
        *DEPRECATED,
    }
    assert set(totals) == counted | {"store", "namespace", "entries", "bytes", "objects",
                                     "object_bytes", "corrupt", "warm_compiles"}  # fmt: skip
    by_fp = _stats(env, "--by", "fingerprint")
    assert set(by_fp) == {"store", "namespace", "by", "days", "groups", "total"}
    assert by_fp["by"] == "fingerprint" and by_fp["days"] is None
    described = {"fingerprint", "platform", "device_kind", "jaxlib_version"}
    assert all(set(g) == counted | described for g in by_fp["groups"])
    assert set(by_fp["total"]) == counted | {"fingerprint"}
    rows = {g["fingerprint"]: g for g in by_fp["groups"]}
    assert set(rows) == {FP1.digest, FP2.digest, ""}
    one, two, none = rows[FP1.digest], rows[FP2.digest], rows[""]
    assert (one["hits"], one["lookups_missed"], one["misses_below_threshold"]) == (3, 1, 1)
    assert one["misses"] == 0 and one["hit_rate"] == 1.0
    assert one["quick_compiles"] == 2 and one["lease_waits"] == 1
    assert one["bytes_fetched"] == 3 * sizes[K1]
    assert one["compile_secs_saved"] == pytest.approx(6.0)
    assert (one["device_kind"], one["jaxlib_version"], one["platform"]) == (
        "cpu-a", "0.9.1", "cpu",
    )  # fmt: skip
    assert (two["hits"], two["misses"], two["hit_rate"]) == (1, 1, 0.5)
    assert two["device_kind"] == "H200" and two["bytes_fetched"] == sizes[K2]
    assert none["lease_takeovers"] == 1 and none["hits"] == 0 and none["device_kind"] is None
    assert by_fp["groups"][0]["fingerprint"] == FP1.digest  # most hits first
    total = by_fp["total"]
    assert (total["hits"], total["misses"], total["quick_compiles"]) == (4, 1, 2)
    assert total["hit_rate"] == pytest.approx(0.8) and total["bytes_fetched"] == fetched

    by_day = _stats(env, "--by", "day", "--days", "1")
    assert [g["day"] for g in by_day["groups"]] == [today().isoformat()]
    assert by_day["groups"][0]["hits"] == 4 and by_day["groups"][0]["lease_takeovers"] == 1

    by_module = _stats(env, "--by", "module")
    assert all(set(g) == counted | {"module", "entries", "bytes"} for g in by_module["groups"])
    modules = {g["module"]: g for g in by_module["groups"]}
    assert modules["jit_a"]["hits"] == 3 and modules["jit_b"]["hits"] == 1
    assert modules["jit_a"]["entries"] == 1 and modules["jit_a"]["bytes"] == sizes[K1]
    assert modules["jit_a"]["bytes_fetched"] == 3 * sizes[K1]
    assert modules["jit_b"]["compile_secs_saved"] == pytest.approx(5.0)
    # Not known per module: null, never a made-up zero.
    assert modules["jit_a"]["misses"] is None and modules["jit_a"]["hit_rate"] is None
    assert by_module["total"]["hits"] == 4 and by_module["total"]["lease_waits"] is None

    # The tables say the same.
    table = artstore("stats", "--by", "fingerprint", env=env)
    assert table.returncode == 0 and "H200/0.10.2" in table.stdout and "(none)" in table.stdout
    assert "HIT RATE" in artstore("stats", "--by", "module", env=env).stdout
    plain = artstore("stats", env=env).stdout
    assert "misses:" in plain and "80.0%" in plain, plain
    usage = artstore("stats", "--by", "module", "--days", "3", env=env)
    assert usage.returncode == 2 and "--days" in usage.stderr


def test_tier_hits_are_counted_by_fingerprint(tmp_path: Path, open_store: OpenStore) -> None:
    """Hits served by this host's tier reach the usage rows when its journals are folded,
    their fingerprint, bytes and compile time read from the tier's key files."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    assert store.parts.tier is not None
    assert store.put(Put(K1, b"a" * 3000, fingerprint=FP1, module_name="jit_a", compile_secs=2.0))
    entry = store.parts.index.lookup(K1)
    assert entry is not None
    for _ in range(2):
        assert store.parts.tier.get(K1, FP1.digest) is not None
    store.parts.tier.write_journal()  # as a process that never opened the store leaves them
    store.parts.accounts.fold_tier_journals()
    rows = {g["fingerprint"]: g for g in _stats(env, "--by", "fingerprint")["groups"]}
    assert set(rows) == {FP1.digest}
    assert rows[FP1.digest]["hits"] == 2 and rows[FP1.digest]["bytes_fetched"] == 2 * entry.size
    assert rows[FP1.digest]["compile_secs_saved"] == pytest.approx(4.0)
    assert _stats(env)["hits"] == 2


def test_days_and_day_order(tmp_path: Path, open_store: OpenStore) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    old, now = today() - timedelta(days=10), today()
    store.parts.index.add_counters(
        {},
        {(old, FP1.digest): {"hits": 5, "misses": 5}, (now, FP1.digest): {"hits": 1}},
    )
    store.parts.index.add_counters({}, {(now, FP1.digest): {"hits": 2, "compile_secs_saved": 1.5}})
    days = _stats(env, "--by", "day")["groups"]
    assert [(g["day"], g["hits"]) for g in days] == [(now.isoformat(), 3), (old.isoformat(), 5)]
    assert days[0]["compile_secs_saved"] == pytest.approx(1.5)
    recent = _stats(env, "--by", "fingerprint", "--days", "3")
    assert recent["days"] == 3 and recent["groups"][0]["hits"] == 3
    assert recent["groups"][0]["hit_rate"] == 1.0
    assert "no usage recorded" in artstore("stats", "--by", "day", env=clean_env(
        ARTSTORE_URL=str(tmp_path / "empty"))).stdout  # fmt: skip


# -- hit journals -----------------------------------------------------------------
def test_journal_usage_round_trip_and_clamps() -> None:
    usage = {(today(), FP1.digest): {"hits": 2, "compile_secs_saved": 1.5}}
    journal = Journal({K1: (2, time.time())}, {"misses": 1, "below_threshold": 3}, usage)
    back = Journal.decode(journal.encode())
    assert back.usage == usage and back.counts == {"misses": 1, "below_threshold": 3}
    assert json.loads(journal.encode())["v"] == 1  # still version 1
    # Without usage, the journal is what old clients write (no "u").
    assert "u" not in json.loads(Journal({K1: (1, 1.0)}).encode())
    from artifactstore.errors import CorruptObject

    for bad in ('{"v":1,"a":{},"u":{}}', '{"v":1,"a":{},"u":[["x","",{}]]}',
                '{"v":1,"a":{},"u":[["2026-01-01","",{"hits":"1"}]]}'):  # fmt: skip
        with pytest.raises(CorruptObject):
            Journal.decode(bad.encode())


def test_previous_folder_reads_new_journals(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold of the previous version (schema 0003) folds a journal with usage rows:
    hits and its counters, ignoring "u" (a version 2 journal it would delete unread)."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{SCHEMA_0003_COMMIT}:artifactstore/journal.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("old_journal")
    monkeypatch.setitem(sys.modules, "old_journal", module)  # for its dataclasses
    exec(compile(source, "old_journal.py", "exec"), module.__dict__)  # our own history
    old = module.__dict__
    usage = {(today(), FP1.digest): {"hits": 2}}
    data = Journal({K1: (2, 1000.0)}, {"misses": 4, "below_threshold": 1}, usage).encode()
    folded = old["Journal"].decode(data)
    assert folded.accesses == {K1: (2, 1000.0)} and folded.counts == {"misses": 4}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_v1_journals_and_usage_journals_fold(
    backend: str, tmp_path: Path, open_store: OpenStore, request: pytest.FixtureRequest
) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    if backend == "postgresql":
        env["ARTSTORE_INDEX"] = request.getfixturevalue("pg_url")
        assert artstore("db", "upgrade", env=env).returncode == 0
    store = open_store(env)
    assert store.put(Put(K1, b"a" * 500, fingerprint=FP1, module_name="jit_a", compile_secs=2.0))
    # A journal exactly as clients before usage rows write it.
    v1 = json.dumps({"v": 1, "a": {K1: [2, time.time()]}, "c": {"misses": 3, "corrupt": 1}})
    store.parts.blobs.put_record(JOURNALS, new_name(), v1.encode())
    # One with usage rows, one of them hostile: a future day, absurd counts, a bad digest.
    future = today() + timedelta(days=400)
    usage = {
        (today(), FP1.digest): {"hits": 1, "misses": 2, "misses_below_threshold": 2,
                                "below_threshold": 5, "bytes_fetched": 500},
        (future, FP1.digest): {"hits": 10**12, "compile_secs_saved": float(10**15)},
        (today(), "not-a-digest"): {"hits": 7},
    }  # fmt: skip
    counts = {"misses": 2, "misses_below_threshold": 2, "below_threshold": 5}
    journal = Journal({K1: (1, time.time())}, counts, usage)
    store.parts.blobs.put_record(JOURNALS, new_name(), journal.encode())
    result = fold_journals(store.parts)
    assert (result.journals, result.refused, result.hits) == (2, 0, 3)
    fold_accesses(store.parts.engine, store.parts.namespace)
    totals = store.parts.index.stats()
    assert totals.hits == 3 and totals.misses == 5 and totals.corrupt == 1
    assert totals.misses_below_threshold == 2 and totals.eligible_misses == 3
    assert totals.below_threshold == 5
    days = _stats(env, "--by", "day")["groups"]
    assert [g["day"] for g in days] == [today().isoformat()]  # the future day clamped
    assert days[0]["hits"] == 1 + 1_000_000 and days[0]["compile_secs_saved"] == 1e9
    assert days[0]["quick_compiles"] == 5 and days[0]["misses"] == 0
    assert {g["fingerprint"] for g in _stats(env, "--by", "fingerprint")["groups"]} == {FP1.digest}
    assert list(store.parts.blobs.iter_records(JOURNALS)) == []


def test_reader_journal_carries_usage(team_env: dict[str, str], open_store: OpenStore) -> None:
    """A process that never opens the database server (a reader) journals its usage;
    `artstore fold` brings it to the index."""
    writer = open_store(team_env)
    _workload(writer)
    writer.parts.accounts.flush()
    before = _stats(team_env, "--by", "fingerprint")["total"]
    reader = open_store(team_env, lazy_index=True, read_only=True)
    assert reader.get(K2, FP2.digest) is not None
    assert reader.get(K3, FP1.digest) is None
    reader.compiled_below_threshold(K3, FP1.digest)
    assert reader.parts.backends.journals_hits
    reader.flush()
    assert not reader.parts.backends.index_opened
    assert artstore("fold", env=team_env).returncode == 0
    after = _stats(team_env, "--by", "fingerprint")
    rows = {g["fingerprint"]: g for g in after["groups"]}
    assert after["total"]["hits"] == before["hits"] + 1
    assert rows[FP2.digest]["hits"] == 2 and rows[FP1.digest]["misses_below_threshold"] == 2
    assert after["total"]["misses"] == before["misses"]
    totals = _stats(team_env)
    assert totals["hits"] == 5 and totals["misses"] == 1


def test_concurrent_counter_flushes_never_deadlock(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A gc's journal fold and writers' exit flushes add to the same counter and usage
    rows at once, each from its own dict order; on PostgreSQL rows locked in opposite
    orders deadlock (a gc failed so in CI). Upserts lock in sorted order."""
    names = [f"counter_{i:02d}" for i in range(12)]
    days = [today() - timedelta(days=i) for i in range(6)]
    keys = [f"{i:02x}" * 32 for i in range(16, 28)]
    writer = open_store(team_env)
    for key in keys:
        assert writer.put(
            Put(key, key.encode(), fingerprint=FP1, module_name="m", compile_secs=2.0)
        )
    failures: list[BaseException] = []

    def flush(order: int) -> None:
        store = open_store(team_env)
        counts = dict.fromkeys(names[::order], 1)
        usage = {(day, FP1.digest): {"hits": 1.0} for day in days[::order]}
        touches = {key: (1, datetime.now(UTC)) for key in keys[::order]}
        try:
            for _ in range(60):
                store.parts.index.add_counters(counts, usage)
                store.parts.index.record_access(touches)
        except BaseException as exc:  # reported below, in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=flush, args=(o,)) for o in (1, -1, 1, -1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    total = _stats(team_env, "--by", "day")
    assert total["total"]["hits"] == 4 * 60 * len(days)
    for key in keys:
        entry = writer.parts.index.lookup(key)
        assert entry is not None and entry.hits == 4 * 60


# -- the CLI without the object store ---------------------------------------------
@pytest.mark.parametrize("mode", ["down", "freeze"])
def test_ls_stats_quota_need_only_the_index(
    mode: str, team_env: dict[str, str], open_store: OpenStore
) -> None:
    """An object store that refuses connections, and one that accepts and never answers:
    index-only commands neither fail on it nor ask it anything (counted by a proxy, so
    nothing can have waited for its timeout)."""
    store = open_store(team_env)
    _workload(store)
    store.parts.accounts.flush()
    moto_port = int(team_env["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    with FaultProxy(("127.0.0.1", moto_port)) as s3:
        s3.set_mode(mode)
        down = dict(team_env, AWS_ENDPOINT_URL_S3=s3.endpoint, ARTSTORE_TIMEOUT="30")
        commands = [["ls", "--json"], ["stats", "--json"], ["quota", "ls", "--json"],
                    ["stats", "--json", "--by", "fingerprint"], ["stats", "--json", "--by", "day"],
                    ["stats", "--json", "--by", "module"]]  # fmt: skip
        for command in commands:
            proc = artstore(*command, env=down)
            assert proc.returncode == 0, (command, proc.stderr)
            assert json.loads(proc.stdout) is not None
        assert _stats(down)["hits"] == 4
        assert s3.connections == 0


NO_BOTO3 = """
import atexit, sys
atexit.register(lambda: print("boto3" in sys.modules, file=sys.stderr))
sys.argv = ["artstore", *sys.argv[1:]]
from artifactstore.cli import main
main()
"""


def test_index_only_commands_do_not_open_the_object_store(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """Not even boto3 is imported: an operator's host needs neither it nor S3 credentials."""
    store = open_store(team_env)
    _workload(store)
    store.parts.accounts.flush()
    for command in (["ls"], ["stats"], ["stats", "--by", "day"], ["quota", "ls"]):
        proc = subprocess.run([sys.executable, "-c", NO_BOTO3, *command], env=team_env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, (command, proc.stderr)
        assert proc.stderr.split() == ["False"], (command, proc.stderr)
    # Described as the object store it did not open describes itself.
    assert _stats(team_env)["store"] == store.parts.describe()


# -- migration 0003 -> 0004, with data written by the previous client --------------
@pytest.fixture(scope="module")
def schema_0003_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifactstore-0003")
    return old_client(SCHEMA_0003_COMMIT, root, "artifactstore", "migrations", "pyproject.toml")


OLD_WORKLOAD = """
from artifactstore import config
from artifactstore import fingerprint  # the previous release's layout
from artifactstore.store import Store
fp = fingerprint.compute(platform_name="cpu", platform_version="v", device_kind="cpu-a",
                         device_count=1, jax_version="1", jaxlib_version="0.9.1")
store = Store.open(config.resolve({}))
store.put("01" * 32, b"a" * 3000, fingerprint=fp, module_name="jit_a", compile_secs=2.0)
assert store.get("01" * 32, fp.digest) is not None
assert store.get("01" * 32, fp.digest) is not None
assert store.get("03" * 32, fp.digest) is None
store.flush_access()
store.close()
import artifactstore.index.db as db
print(db.SCHEMA_HEAD)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0004_keeps_stats_written_at_0003(
    backend: str,
    schema_0003_client: Path,
    tmp_path: Path,
    open_store: OpenStore,
    request: pytest.FixtureRequest,
) -> None:
    """The previous client writes entries, hits and misses at schema 0003; `db upgrade`
    adds the usage table; the totals are unchanged, and usage rows start with this
    version's clients."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off")
    if backend == "postgresql":
        env["ARTSTORE_INDEX"] = request.getfixturevalue("pg_url")
    (tmp_path / "store").mkdir()
    old = {**env, "PYTHONPATH": str(schema_0003_client)}
    up = artstore("db", "upgrade", "0003", env=old)
    assert up.returncode == 0 and "0003" in up.stdout, up.stderr
    # (Not from the checkout: `-c` puts the working directory first on sys.path.)
    wrote = subprocess.run([sys.executable, "-c", OLD_WORKLOAD], env=old, capture_output=True,
                           text=True, check=False, cwd=tmp_path)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    assert wrote.stdout.split() == ["0003"]  # really the previous client
    refused = artstore("stats", "--json", env=env)  # this version needs 0004
    if backend == "postgresql":
        assert refused.returncode != 0 and "artstore db upgrade" in refused.stderr
    up = artstore("db", "upgrade", env=env)
    assert up.returncode == 0 and db.SCHEMA_HEAD in up.stdout, up.stderr
    totals = _stats(env)
    assert (totals["hits"], totals["misses"], totals["lookups_missed"]) == (2, 1, 1)
    assert totals["quick_compiles"] == 0 and totals["hit_rate"] == pytest.approx(2 / 3)
    assert _stats(env, "--by", "day")["groups"] == []  # the old client wrote no usage
    store = open_store(env)
    assert store.get(K1, FP1.digest) is not None
    store.parts.accounts.flush()
    totals = _stats(env)
    assert totals["hits"] == 3 and totals["misses"] == 1
    days = _stats(env, "--by", "day")["groups"]
    assert len(days) == 1 and days[0]["hits"] == 1 and days[0]["bytes_fetched"] > 0


def test_the_0_3_names_stay_one_release_no_more() -> None:
    """`stats --json` and process_stats() carry 0.3's names of renamed fields as
    deprecated aliases in the release after 0.3, no more: once pyproject's version
    reaches REMOVED_IN this fails until they are gone (formats.counters.DEPRECATED)."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    release = tuple(int(n) for n in version.split(".")[:2])
    assert DEPRECATED == {"eligible_misses": "misses", "below_threshold": "quick_compiles"}
    assert release < tuple(int(n) for n in REMOVED_IN.split(".")), (
        f"version {version}: drop the deprecated names {sorted(DEPRECATED)} "
        "(formats/counters.py, docs/operations.md)"
    )


# -- a real program: compiles below the threshold leave the hit rate alone -----------
def test_compiles_below_the_threshold_do_not_lower_the_hit_rate(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off",
                    ARTSTORE_MIN_COMPILE_SECS="1", JOB_SLOW_COMPILE_SECS="1.2",
                    JOB_SMALL_JITS="1")  # fmt: skip
    a = run_program("job.py", env)
    small = [m for m in a["xla_compiles"] if "mlp" not in m and "loss_and_grad" not in m]
    assert small and a["store"]["stored"] == 2
    assert a["store"]["quick_compiles"] == len(small)
    b = run_program("job.py", env)
    assert sorted(b["xla_compiles"]) == sorted(small)  # the tier is off: looked up, missed
    assert b["store"]["hits"] == 2 and b["store"]["misses_below_threshold"] == len(small)
    stats = _stats(env)
    assert stats["lookups_missed"] == 2 + 2 * len(small)  # every lookup that missed
    assert stats["misses"] == 2  # compiles the store could have served
    assert stats["misses_below_threshold"] == 2 * len(small)
    assert stats["quick_compiles"] == 2 * len(small)
    assert stats["hit_rate"] == pytest.approx(0.5)  # 2 hits / (2 hits + 2 first compiles)
