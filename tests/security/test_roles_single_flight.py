"""Issue 29, point 4: single-flight under the least-privilege PostgreSQL roles.

Every store logs in as a real role of infra/policies/postgres-roles.sql (the module's
database is made as tests/test_roles.py makes it: the file applied, the schema migrated by
artstore_admin, the file applied again, logins granted namespaces by grant-namespace.sql),
with moto S3 over HTTP for the objects and the lease records. Before the fix the writer
role could take only `gc:NAMESPACE` leases: every compile lease was refused by row-level
security, single-flight was silently off (`lease_errors`) and every writer compiled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import OpenStore
from sqlalchemy import Engine, create_engine, text
from test_roles import REFUSED, RolesDb, roles_db

from artifactstore import gc
from artifactstore.blobstores.base import LEASES
from artifactstore.index.leases import compile_lease_name
from artifactstore.store import Store
from security.flights import key, loaded, publish, turn, waiting

__all__ = ["roles_db"]  # the module's role database (a fixture of tests/test_roles.py)


@pytest.fixture(scope="module")
def module_bucket() -> dict[str, str]:
    """One object store for the module, as the index (`roles_db`) is one: a writer refuses
    to write where the two are not one store (store identity, issue 38.4)."""
    return {}


@pytest.fixture
def open_as(
    roles_db: RolesDb,
    team_env: dict[str, str],
    open_store: OpenStore,
    module_bucket: dict[str, str],
) -> Callable[..., Store]:
    """A Store on the module's bucket whose index connection logs in as `login`."""
    url = module_bucket.setdefault("url", team_env["ARTSTORE_URL"])

    def _open(login: str, namespace: str, **overrides: Any) -> Store:
        env = {**team_env, "ARTSTORE_URL": url, "ARTSTORE_INDEX": roles_db.url(login),
               "ARTSTORE_NAMESPACE": namespace, "ARTSTORE_LOCAL_TIER": "off",
               "ARTSTORE_TIMEOUT": "30", "ARTSTORE_LEASE_WAIT": "60"}  # fmt: skip
        return open_store(env, **overrides)

    return _open


@pytest.fixture
def superuser(roles_db: RolesDb) -> Any:
    engine = create_engine(roles_db.superuser_url)
    yield engine
    engine.dispose()


def _lease_row(engine: Engine, name: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT holder, token, expires_at FROM leases WHERE name = :n"), {"n": name}
        ).first()


def test_writer_takes_renews_and_releases_a_compile_lease_and_another_waits(
    roles_db: RolesDb, open_as: Callable[..., Store], superuser: Engine
) -> None:
    ns, k = roles_db.ns_a, key(7001)
    first, second = open_as("writer", ns), open_as("writer", ns)
    got, held = turn(first, k)
    assert first.parts.counters.snapshot().get("lease_errors", 0) == 0  # 1 before the fix
    assert got is None and held is not None  # this writer compiles
    name = compile_lease_name(ns, k)
    row = _lease_row(superuser, name)
    assert row is not None and row.token == held.lease.token
    time.sleep(0.01)
    held.lease.renew()  # as the holder's beat does, through the writer's login
    renewed = _lease_row(superuser, name)
    assert renewed.token == row.token and renewed.expires_at > row.expires_at

    thread, out = waiting(second, k)  # a second writer waits instead of compiling
    assert thread.is_alive()
    publish(first, k, held)
    loaded(thread, out)  # not compiled
    counts = second.parts.counters.snapshot()
    assert counts.get("lease_loaded") == 1 and counts.get("lease_errors", 0) == 0
    assert _lease_row(superuser, name) is None  # released through the writer's login
    assert first.parts.blobs.get_record(LEASES, k) is None

    # The gc role still does gc's work beside the writers' compile leases.
    out_gc = gc.collect(open_as("gc", ns), gc.Policy(grace_secs=0))
    assert out_gc.entries_removed == 0


def test_a_read_only_reader_waits_for_a_writers_compile(
    roles_db: RolesDb, open_as: Callable[..., Store]
) -> None:
    ns, k = roles_db.ns_a, key(7002)
    writer = open_as("writer", ns)
    reader = open_as("reader", ns, read_only=True, lazy_index=True)
    _, held = turn(writer, k)
    assert held is not None
    flight = writer.flight
    assert flight is not None
    flight.drain(10)  # the lease record is in the bucket
    assert reader.parts.blobs.get_record(LEASES, k) is not None  # readers read lease records
    thread, out = waiting(reader, k)
    publish(writer, k, held)
    loaded(thread, out)
    counts = reader.parts.counters.snapshot()
    assert counts.get("lease_loaded") == 1 and counts.get("lease_errors", 0) == 0
    assert not reader.parts.backends.index_opened  # a reader never connects to the index


def test_writer_holds_compile_leases_only_in_its_namespaces(
    roles_db: RolesDb,
    open_as: Callable[..., Store],
    superuser: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    k = key(7003)
    theirs = compile_lease_name(roles_db.ns_b, k)
    team_b = open_as("writer_b", roles_db.ns_b)  # team B's own writer takes its lease
    _, held = turn(team_b, k)
    assert held is not None
    flight = team_b.flight
    assert flight is not None
    writer = create_engine(roles_db.url("writer"))  # granted team A only
    try:
        with pytest.raises(REFUSED, match="row-level security"), writer.begin() as conn:
            conn.execute(text("INSERT INTO leases VALUES (:n, 'x', 'x', now())"),
                         {"n": compile_lease_name(roles_db.ns_b, key(7004))})  # fmt: skip
        with writer.begin() as conn:  # team B's lease is invisible: neither stolen nor freed
            steal = "UPDATE leases SET token = 'mine', expires_at = now() - interval '1 day'"
            assert conn.execute(text(steal)).rowcount == 0
            assert conn.execute(text("DELETE FROM leases WHERE name = :n"), {"n": theirs}
                                ).rowcount == 0  # fmt: skip
        for bad in ("compile:x", f"compile:{k}:zz", f"other:{k}"):  # not a lease of ours
            with pytest.raises(REFUSED, match="row-level security"), writer.begin() as conn:
                conn.execute(text("INSERT INTO leases VALUES (:n, 'x', 'x', now())"), {"n": bad})
    finally:
        writer.dispose()
    assert _lease_row(superuser, theirs).token == held.lease.token
    # A writer opened on a namespace it was not granted degrades to compiling, counted.
    intruder = open_as("writer", roles_db.ns_b)
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert turn(intruder, key(7005)) == (None, None)
        assert turn(intruder, key(7006)) == (None, None)
    assert intruder.parts.counters.snapshot().get("lease_errors") == 2
    said = [r.getMessage() for r in caplog.records if "compile leases refused" in r.getMessage()]
    assert len(said) == 1 and "grant-namespace.sql" in said[0]  # once, naming the fix
    held.release(stored=False)
    flight.drain(10)
    assert _lease_row(superuser, theirs) is None
