"""Issue 29, point 3: what anyone who can write the bucket puts there never stops anyone.

Attacks write straight into a real moto S3 bucket over HTTP with boto3 (and, for the gc
lease, into the PostgreSQL index as a writer could), then the store is driven as its
users drive it: `artstore gc` and `artstore fold` in fresh processes, a reader's session
with its circuit breakers, a reader waiting on a compile lease.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import OpenStore, artstore, bucket_of, s3_client
from sqlalchemy import create_engine, select, text

from artifactstore import config
from artifactstore.config.host import compute
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.index.leases import Lease, compile_lease_name
from artifactstore.index.models import Entry, LeaseRow
from artifactstore.runtime.session import Session
from artifactstore.store import Store
from artifactstore.store.flight import SingleFlight

KEY_A = "a" * 64
KEY_B = "b" * 64


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _bucket(env: dict[str, str]) -> tuple[Any, str, str]:
    """An S3 client as the attacker holds it, the bucket, and the namespace's prefix."""
    bucket, prefix = bucket_of(env)
    return s3_client(env), bucket, f"{prefix}/default"


def _plant(env: dict[str, str], folder: str, name: str, body: bytes) -> None:
    client, bucket, base = _bucket(env)
    client.put_object(Bucket=bucket, Key=f"{base}/{folder}/{name}", Body=body)


def _put(store: Store, key: str, payload: bytes) -> None:
    assert store.put(Put(key, payload, fingerprint=_fp(), module_name="m", compile_secs=1.0))


def _hits(env: dict[str, str], key: str) -> int:
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(Entry.hits).where(Entry.key == key)).scalar_one())
    finally:
        engine.dispose()


# -- hit journals (readers may write under journals/) ----------------------------------
def _nested(depth: int) -> bytes:
    return b'{"v":1,"a":{},"u":' + b"[" * depth + b"]" * depth + b"}"


JOURNAL_ATTACKS: dict[str, tuple[str, bytes]] = {
    # A name that is none of ours (readers' policies allow any name under journals/).
    "junk-name": ("notajournal", b"\x00\xffjunk"),
    "junk-bytes": (uuid.uuid4().hex, b"\x00\xff\xfe junk \x80" * 50),
    # Past the JSON parser's recursion limit: RecursionError, not ValueError.
    "nested-json": (uuid.uuid4().hex, _nested(200_000)),
    # Shallow enough for the parser, deeper than any journal is.
    "nested-shallow": (uuid.uuid4().hex, _nested(500)),
    "oversized": (uuid.uuid4().hex, b'{"v":1,"a":{' + b'"x":[1,1],' * 300_000 + b'"y":[1,1]}}'),
    "huge-number": (
        uuid.uuid4().hex,
        b'{"v":1,"a":{"' + b"c" * 64 + b'":[1' + b"0" * 400 + b",1]}}",
    ),
}


@pytest.mark.parametrize("command", ["gc", "fold"])
@pytest.mark.parametrize("attack", sorted(JOURNAL_ATTACKS))
def test_a_bad_journal_is_set_aside_and_the_others_fold(
    attack: str, command: str, team_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(team_env, local_tier="off")
    _put(store, KEY_A, b"x" * 100)
    before = _hits(team_env, KEY_A)
    good = {"v": 1, "a": {KEY_A: [3, time.time()]}, "c": {"misses": 1}}
    _plant(team_env, "journals", uuid.uuid4().hex, json.dumps(good).encode())
    name, body = JOURNAL_ATTACKS[attack]
    _plant(team_env, "journals", name, body)

    proc = artstore(command, "--json", env=team_env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    counts = out["summary"] if command == "gc" else out
    assert counts["journals_folded"] == 1
    assert counts.get("journals_refused", 0) + counts.get("journals_set_aside", 0) == 1
    if command == "fold":
        assert counts["hits"] == 3
    assert _hits(team_env, KEY_A) == before + 3  # the good journal's hits reached the entry
    # Text output says so too, and a second run still works.
    again = artstore(command, env=team_env)
    assert again.returncode == 0, again.stderr
    if attack == "junk-name":  # not ours: left where it is, counted on every run
        assert "set aside 1" in again.stdout


# -- manifests: a bad one is a miss for its key, never the breaker ----------------------
def _manifest_like(**change: object) -> bytes:
    body: dict[str, object] = {"v": 1, "d": "0" * 64, "f": _fp().digest, "c": 1.0, "k": KEY_A,
                               "r": 1, "s": 1, "m": "m", "cb": None, "sg": None}  # fmt: skip
    body.update(change)
    return json.dumps(body).encode()


MANIFEST_ATTACKS: dict[str, bytes] = {
    "nested": b"[" * 16_000,  # RecursionError in the JSON parser
    "nested-object": b'{"v":1,"k":' + b"[" * 5000 + b"]" * 5000 + b"}",
    "huge-number": _manifest_like(c=10**400),  # OverflowError converting to float
    "wrong-types": _manifest_like(k=["a"], r="1"),
    "missing-field": b'{"v":1}',
    "not-json": b"\xff\xfe\x00garbage",
    "list": b"[1,2,3]",
}


@pytest.mark.parametrize("attack", sorted(MANIFEST_ATTACKS))
def test_a_malformed_manifest_is_a_miss_for_its_key_only(
    attack: str, team_env: dict[str, str], open_store: OpenStore
) -> None:
    writer = open_store(team_env, local_tier="off")
    _put(writer, KEY_A, b"a" * 64)
    _put(writer, KEY_B, b"b" * 64)
    _plant(team_env, "keys", KEY_A, MANIFEST_ATTACKS[attack])

    settings = config.resolve(
        {"local_tier": "off", "read_only": True}, environ=dict(team_env, ARTSTORE_TIMEOUT="30")
    )
    session = Session(settings)
    try:
        for _ in range(2):  # after the bad key, the good one still hits
            store = session.store()
            assert store is not None, "a breaker opened"
            assert session.lookup(store, KEY_A, _fp().digest) is None
            store = session.store()
            assert store is not None, "a breaker opened"
            hit = session.lookup(store, KEY_B, _fp().digest)
            assert hit is not None and hit.payload == b"b" * 64
        assert all(b.closed and not b.opened for b in session.breakers.values())
        assert store.parts.counters.snapshot().get("bad_manifest", 0) == 2
    finally:
        session.close()


# -- compile lease records: the wait is the waiter's own ---------------------------------
def _reader(team_env: dict[str, str], open_store: OpenStore, **env: str) -> Store:
    reader = open_store(
        dict(team_env, ARTSTORE_READ_ONLY="1", **env), lazy_index=True, local_tier="off"
    )
    assert reader.get(KEY_A, _fp().digest) is None  # a miss: now it looks for a lease
    assert reader.flight is not None
    return reader


def _turn(flight: SingleFlight, limit: float) -> None:
    """`flight.turn` for KEY_A: no lease, nothing loaded (the reader compiles). Fails if
    it still waits after `limit` (a hang guard: how the wait ended, the counters say)."""
    turned: list[bool] = []

    def run() -> None:
        assert flight.turn(KEY_A, lambda: None) == (None, None)
        turned.append(True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"a reader still waits after {limit} s on a forged record"
    assert turned, "turn() failed"


def _forged(beat: int = 0) -> bytes:
    return json.dumps({"v": 1, "holder": "elsewhere:1", "beat": beat, "ttl": 3e300,
                       "state": "compiling", "hint": 1e300}).encode()  # fmt: skip


def test_a_forged_record_does_not_set_a_readers_wait(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A record that never beats: the reader's own TTL says its holder is gone."""
    _plant(team_env, "leases", KEY_A, _forged())
    reader = _reader(team_env, open_store, ARTSTORE_LEASE_TTL="1")
    assert reader.flight is not None
    _turn(reader.flight, 30)
    counts = reader.parts.counters.snapshot()  # it waited once, ended by its own TTL, not a bound
    assert counts.get("lease_waits", 0) == 1 and counts.get("lease_timeouts", 0) == 0


def test_a_beating_forged_record_is_waited_for_at_most_the_readers_bound(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A writer of the bucket that keeps beating its record: the reader waits its own
    maximum (ARTSTORE_LEASE_MAX_HOLD), never the record's 3e300 s."""
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.is_set():
            _plant(team_env, "leases", KEY_A, _forged(n))
            n += 1
            stop.wait(0.2)

    beater = threading.Thread(target=beat, daemon=True)
    _plant(team_env, "leases", KEY_A, _forged())
    beater.start()
    try:
        reader = _reader(team_env, open_store, ARTSTORE_LEASE_MAX_HOLD="3")
        assert reader.flight is not None
        _turn(reader.flight, 40)  # the record's 3e300 s would outlast the guard
        assert reader.parts.counters.snapshot().get("lease_timeouts", 0) == 1  # its own maximum
    finally:
        stop.set()
        beater.join()


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 1000,
        b'{"v":1,"holder":"h:1","beat":1e400,"ttl":1,"state":"compiling","hint":null}',
        b'{"v":1,"holder":"h:1","beat":1' + b"0" * 400 + b',"ttl":1,"state":"compiling"}',
        b'{"v":1,"holder":"h:1","beat":1,"ttl":1,"state":"compiling","hint":1' + b"0" * 400 + b"}",
    ],
    ids=["nested", "infinite-beat", "huge-beat", "huge-hint"],
)
def test_a_malformed_lease_record_is_no_lease(
    body: bytes, team_env: dict[str, str], open_store: OpenStore
) -> None:
    _plant(team_env, "leases", KEY_A, body)
    reader = _reader(team_env, open_store)
    assert reader.flight is not None
    _turn(reader.flight, 30)
    counts = reader.parts.counters.snapshot()
    assert counts.get("lease_errors", 0) == 0 and counts.get("lease_waits", 0) == 0
    assert counts.get("bad_lease_records", 0) == 1  # read and refused, not never read


# -- lease rows: none stands past the operator's maximum ---------------------------------
def _forge_row(env: dict[str, str], name: str, expires: datetime) -> None:
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM leases WHERE name = :n"), {"n": name})
            conn.execute(
                text(
                    "INSERT INTO leases (name, holder, token, expires_at) VALUES (:n, :h, :t, :e)"
                ),
                {"n": name, "h": "elsewhere:1", "t": "f" * 32, "e": expires},
            )
    finally:
        engine.dispose()


def test_a_gc_lease_held_until_year_9999_is_taken_over(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(team_env, local_tier="off")
    _put(store, KEY_A, b"x" * 100)
    # An honest holder, within the maximum: respected.
    _forge_row(team_env, "gc:default", datetime.now(UTC) + timedelta(seconds=120))
    held = artstore("gc", env=team_env)
    assert held.returncode != 0 and "held by elsewhere:1" in held.stderr
    # Past the operator's maximum (ARTSTORE_LEASE_MAX_HOLD): taken over.
    _forge_row(team_env, "gc:default", datetime(9999, 12, 31, tzinfo=UTC))
    gc = artstore("gc", env=team_env)
    assert gc.returncode == 0, gc.stderr
    _forge_row(team_env, "gc:default", datetime.now(UTC) + timedelta(seconds=120))
    lower = artstore("gc", env=dict(team_env, ARTSTORE_LEASE_MAX_HOLD="60"))
    assert lower.returncode == 0, lower.stderr


def test_a_compile_lease_held_until_year_9999_is_taken_over(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    writer = open_store(team_env, local_tier="off")
    assert writer.flight is not None
    _forge_row(
        team_env,
        compile_lease_name(writer.parts.namespace, KEY_A),
        datetime(9999, 12, 31, tzinfo=UTC),
    )
    held = writer.flight.try_hold(KEY_A)
    assert held is not None and held.lease.took_over
    held.release(stored=False)


def test_a_holder_never_renews_past_the_maximum(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(team_env, local_tier="off")
    lease = Lease(store.parts.engine, "gc:somewhere", ttl_secs=3000.0, max_hold_secs=60.0)
    assert lease.ttl_secs == 60.0

    def expiry() -> datetime:
        with store.parts.engine.connect() as conn:
            value: datetime = conn.execute(
                select(LeaseRow.expires_at).where(LeaseRow.name == "gc:somewhere")
            ).scalar_one()
        return value

    lease.acquire()
    assert expiry() <= datetime.now(UTC) + timedelta(seconds=61)
    lease.renew()
    assert expiry() <= datetime.now(UTC) + timedelta(seconds=61)
    lease.release()


def test_the_maximum_is_a_setting(tmp_path: Any) -> None:
    settings = config.resolve({"url": str(tmp_path)}, environ={})
    assert settings.lease_max_hold_secs == config.defaults.DEFAULT_LEASE_MAX_HOLD_SECS
    assert settings.lease_max_hold_secs >= 300  # gc's lease TTL fits under it
    mine = config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_LEASE_MAX_HOLD": "90"})
    assert mine.lease_max_hold_secs == 90.0
    bad: Callable[[], object] = lambda: config.resolve(  # noqa: E731
        {"url": str(tmp_path)}, environ={"ARTSTORE_LEASE_MAX_HOLD": "0"}
    )
    with pytest.raises(config.ConfigError, match="ARTSTORE_LEASE_MAX_HOLD"):
        bad()
