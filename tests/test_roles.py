"""Least-privilege roles (infra/policies/) through real logins, and clamped access folding.

One PostgreSQL database for the module: `postgres-roles.sql` applied with psql, the
schema migrated by artstore_admin, the file applied again (as infra/README.md says),
then logins made members of the group roles and granted namespaces with
`grant-namespace.sql`. Roles are cluster-wide, so logins and namespaces are unique per
run and dropped at the end; the group roles are created idempotently and stay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import OpenStore, artstore, clean_env
from sqlalchemy import Engine, create_engine, func, insert, select, text
from sqlalchemy.exc import DBAPIError

from artifactstore import gc
from artifactstore.blobstores.base import JOURNALS
from artifactstore.config import host
from artifactstore.errors import ObjectUnreadable, PrivilegeRefused, StoreUnavailable
from artifactstore.formats import fingerprint
from artifactstore.formats.put import Put
from artifactstore.gc.quota_pass import QuotaPass
from artifactstore.index import db
from artifactstore.index.accesses import BIGINT_MAX, ROW_HITS_MAX, fold_accesses
from artifactstore.index.models import Access, Entry
from artifactstore.index.quotas import remove_quota, set_quota
from artifactstore.store import Store

POLICIES = Path(__file__).resolve().parents[1] / "infra" / "policies"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
YEAR_9999 = datetime(9999, 12, 31, tzinfo=UTC)

# A refusal as SQLAlchemy reports it (plain engines) or as the store's engines do (one line).
REFUSED = (DBAPIError, PrivilegeRefused)


def _fp() -> fingerprint.Fingerprint:
    return host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version="0.4")  # fmt: skip


def _key(i: int) -> str:
    return f"{i:064x}"


def _psql(dbname: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-h", devstack.HOST, "-p", str(devstack.PG_PORT), "-U", "postgres",
         "-v", "ON_ERROR_STOP=1", "-d", dbname, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def _apply(dbname: str, *args: str) -> None:
    proc = _psql(dbname, *args)
    assert proc.returncode == 0, proc.stderr


@dataclass(frozen=True)
class RolesDb:
    name: str
    ns_a: str  # granted to `reader` and `writer`
    ns_b: str  # granted to `writer_b` only
    logins: dict[str, str]  # reader, writer, writer_b, gc -> login name

    def url(self, login: str) -> str:
        return f"postgresql+psycopg://{self.logins[login]}@{devstack.HOST}:{devstack.PG_PORT}/{self.name}"

    @property
    def superuser_url(self) -> str:
        return devstack.database_url(self.name)


@pytest.fixture(scope="module")
def roles_db(postgres: None) -> Iterator[RolesDb]:
    tag = uuid.uuid4().hex[:10]
    name = f"artstore_roles_{tag}"
    devstack.create_database(name)
    logins = {kind: f"artstore_t{tag}_{kind}" for kind in ("reader", "writer", "writer_b", "gc")}
    rdb = RolesDb(name, f"ta-{tag}", f"tb-{tag}", logins)
    try:
        _apply(name, "-f", str(POLICIES / "postgres-roles.sql"))
        admin = db.open_engine(
            f"postgresql+psycopg://artstore_admin@{devstack.HOST}:{devstack.PG_PORT}/{name}"
        )
        try:
            db.upgrade(admin)  # the schema belongs to artstore_admin, as in production
        finally:
            admin.dispose()
        _apply(name, "-f", str(POLICIES / "postgres-roles.sql"))  # again, after the upgrade
        groups = {"reader": "artstore_reader", "writer": "artstore_writer",
                  "writer_b": "artstore_writer", "gc": "artstore_gc"}  # fmt: skip
        create = "".join(f'CREATE ROLE "{logins[k]}" LOGIN IN ROLE {g};' for k, g in groups.items())
        _apply(name, "-c", create)
        for ns, kind in ((rdb.ns_a, "reader"), (rdb.ns_a, "writer"), (rdb.ns_b, "writer_b")):
            grant = POLICIES / "grant-namespace.sql"
            _apply(name, "-v", f"namespace={ns}", "-v", f"role={logins[kind]}", "-f", str(grant))
        yield rdb
    finally:
        devstack.drop_database(name)
        drops = [*logins.values(), f"artstore_ns_{rdb.ns_a}", f"artstore_ns_{rdb.ns_b}"]
        _psql("postgres", "-c", "".join(f'DROP ROLE IF EXISTS "{r}";' for r in drops))


@pytest.fixture
def engines(roles_db: RolesDb) -> Iterator[dict[str, Engine]]:
    made = {k: create_engine(roles_db.url(k)) for k in roles_db.logins}
    made["postgres"] = create_engine(roles_db.superuser_url)
    yield made
    for engine in made.values():
        engine.dispose()


@pytest.fixture(scope="module")
def blobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One object store for the module, as the index (`roles_db`) is one: a writer
    refuses to write where the two are not one store (store identity, issue 38.4)."""
    return tmp_path_factory.mktemp("roles") / "blobs"


@pytest.fixture
def open_store(blobs_dir: Path, open_store: OpenStore) -> Callable[..., Store]:
    """A Store on a local blob directory per namespace and the given index URL."""

    def _open(index: str, namespace: str, **overrides: Any) -> Store:
        env = {"ARTSTORE_URL": str(blobs_dir), "ARTSTORE_INDEX": index,
               "ARTSTORE_NAMESPACE": namespace, "ARTSTORE_LOCAL_TIER": "off"}  # fmt: skip
        return open_store(env, **overrides)

    return _open


def _put(store: Store, i: int, size: int = 3000) -> int:
    assert store.put(
        Put(_key(i), os.urandom(size), fingerprint=_fp(), module_name=f"jit_f{i}", compile_secs=1.0)
    )
    store.parts.index.record_access({_key(i): (0, T0 + timedelta(minutes=i))})
    entry = store.parts.index.lookup(_key(i))
    assert entry is not None
    return entry.size


USAGE_ROW = "INSERT INTO usage VALUES (:ns, current_date, '', 1, 0, 0, 0, 0, 0, 0, 0)"


def _refused(engine: Engine, sql: str, match: str, **params: Any) -> None:
    with pytest.raises(REFUSED, match=match), engine.begin() as conn:
        conn.execute(text(sql), params)


def _count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def _keys(store: Store) -> set[str]:
    return {e.key for e in store.parts.index.iter_entries()}


# -- normal work under each role ------------------------------------------------
def test_writer_reader_and_gc_work_through_their_logins(
    roles_db: RolesDb, open_store: Any, engines: dict[str, Engine]
) -> None:
    ns = roles_db.ns_a
    writer = open_store(roles_db.url("writer"), ns)
    sizes = [_put(writer, i) for i in range(3)]
    reader = open_store(roles_db.url("reader"), ns, read_only=True, lazy_index=True)
    hit = reader.get(_key(0), _fp().digest)
    assert hit is not None
    reader.parts.accounts.flush()  # a hit journal in the object store: the reader never connects
    assert not reader.parts.backends.index_opened
    assert len(list(reader.parts.blobs.iter_records(JOURNALS))) == 1
    # A reader of another namespace sees nothing there (a miss, not an error).
    assert open_store(roles_db.url("reader"), roles_db.ns_b, read_only=True).get(
        _key(0), _fp().digest) is None  # fmt: skip

    # The writer's opt-in quota pass: reads the quota the gc role set, takes its own
    # namespace's lease, folds the reader's hits, evicts within its namespace.
    set_quota(engines["gc"], ns, sizes[0] + sizes[2])
    report = QuotaPass(writer).run()
    assert report is not None and report.accesses_folded == 1
    assert _keys(writer) == {_key(0), _key(2)}  # key 1: least recently used once 0 was read

    operator = open_store(roles_db.url("gc"), ns)
    out = gc.collect(operator, gc.Policy(max_bytes=sizes[0], grace_secs=0))
    assert out.entries_removed == 1 and _keys(writer) == {_key(0)}
    assert remove_quota(engines["gc"], ns)  # the namespace is shared with the other tests


# -- the reader -----------------------------------------------------------------
def test_reader_cannot_pin_break_gc_or_write_elsewhere(
    roles_db: RolesDb, open_store: Any, engines: dict[str, Engine]
) -> None:
    ns, reader = roles_db.ns_a, engines["reader"]
    writer = open_store(roles_db.url("writer"), ns)
    base = 100
    sizes = [_put(writer, base + i) for i in range(2)]
    hostile = "INSERT INTO accesses (namespace, key, hits, last_access) VALUES (:ns, :k, :n, :t)"
    with reader.begin() as conn:  # accepted, but clamped by the trigger
        for n, t in ((BIGINT_MAX, YEAR_9999), (-7, T0), (BIGINT_MAX, "infinity")):
            conn.execute(text(hostile), {"ns": ns, "k": _key(base), "n": n, "t": t})
    with engines["postgres"].connect() as conn:
        rows = conn.execute(select(Access.hits, Access.last_access).where(
            Access.namespace == ns, Access.key == _key(base))).all()  # fmt: skip
    assert sorted(n for n, _ in rows) == [0, ROW_HITS_MAX, ROW_HITS_MAX]
    assert all(t <= datetime.now(UTC) for _, t in rows)
    # Another namespace, entries, the fold's delete, quotas: refused.
    _refused(reader, hostile, "row-level security", ns=roles_db.ns_b, k=_key(base), n=1, t=T0)
    _refused(reader, "UPDATE entries SET hits = 0", "permission denied")
    _refused(reader, "DELETE FROM accesses", "permission denied")
    _refused(reader, USAGE_ROW, "permission denied", ns=ns)
    _refused(reader, "INSERT INTO quotas VALUES (:ns, 1, now())", "permission denied", ns=ns)
    _refused(reader, "UPDATE alembic_version SET version_num = '9999'", "permission denied")

    # An entry already at the top of BIGINT (pinned before this fix): folding saturates.
    with engines["postgres"].begin() as conn:
        conn.execute(text("UPDATE entries SET hits = :n WHERE key = :k"),
                     {"n": BIGINT_MAX - 5, "k": _key(base)})  # fmt: skip
    operator = open_store(roles_db.url("gc"), ns)
    first = gc.collect(operator, gc.Policy(grace_secs=0))
    assert first.accesses_folded == 3
    pinned = writer.parts.index.lookup(_key(base))
    assert pinned is not None and pinned.hits == BIGINT_MAX
    assert pinned.last_access <= datetime.now(UTC)  # 'now' at most, never year 9999
    # Not pinned: used once, at the fold; a later use of the other entry makes it the
    # least recently used, and LRU evicts it.
    writer.parts.index.record_access(
        {_key(base + 1): (1, datetime.now(UTC) + timedelta(seconds=1))}
    )
    out = gc.collect(operator, gc.Policy(max_bytes=sizes[1], grace_secs=0))
    assert out.entries_removed >= 1
    assert _key(base + 1) in _keys(writer) and _key(base) not in _keys(writer)


# -- the writer -----------------------------------------------------------------
def test_writer_cannot_touch_quotas_schema_or_other_namespaces(
    roles_db: RolesDb, open_store: Any, engines: dict[str, Engine]
) -> None:
    writer, ns_b = engines["writer"], roles_db.ns_b
    other = open_store(roles_db.url("writer_b"), ns_b)  # team B's own writer
    _put(other, 200)
    set_quota(engines["gc"], ns_b, 10**9)
    with pytest.raises(REFUSED, match="permission denied"):
        set_quota(writer, roles_db.ns_a, 10**12)
    _refused(writer, "UPDATE quotas SET max_bytes = 1", "permission denied")
    _refused(writer, "DELETE FROM quotas", "permission denied")
    _refused(writer, "UPDATE alembic_version SET version_num = '9999'", "permission denied")
    _refused(writer, "DROP TABLE entries", "must be owner")
    # Team B's rows are invisible: deleting them deletes nothing.
    with writer.begin() as conn:
        assert conn.execute(text("DELETE FROM entries WHERE namespace = :ns"), {"ns": ns_b}
                            ).rowcount == 0  # fmt: skip
        assert conn.execute(text("DELETE FROM objects WHERE namespace = :ns"), {"ns": ns_b}
                            ).rowcount == 0  # fmt: skip
    # Moving a row into team B, writing there, taking its gc lease: refused.
    mine = open_store(roles_db.url("writer"), roles_db.ns_a)
    _put(mine, 201)
    # Its counters and usage rows (`artstore stats`) in its namespaces, not in team B's.
    mine.parts.counters.add("lookups_missed", fingerprint=_fp().digest)  # `misses` in the index
    mine.parts.accounts.flush()
    assert _count(engines["postgres"], "SELECT sum(misses) FROM usage WHERE namespace = :ns",
                  ns=roles_db.ns_a) == 1  # fmt: skip
    _refused(writer, USAGE_ROW, "row-level security", ns=ns_b)
    _refused(writer, "UPDATE entries SET namespace = :ns", "row-level security", ns=ns_b)
    _refused(writer, "INSERT INTO leases VALUES (:n, 'x', 'x', now())", "row-level security",
             n=f"gc:{ns_b}")  # fmt: skip
    intruder = open_store(roles_db.url("writer"), ns_b)
    with pytest.raises(REFUSED, match="is not granted namespace"):  # row-level security
        _put(intruder, 202)
    # A fingerprint row must be under its own digest (they are shared by all namespaces).
    _refused(writer, "INSERT INTO fingerprints VALUES (:d, '{}', now())", "row-level security",
             d="0" * 64)  # fmt: skip
    assert _count(engines["postgres"], "SELECT count(*) FROM entries WHERE namespace = :ns",
                  ns=ns_b) == 1  # fmt: skip
    with engines["postgres"].connect() as conn:
        assert conn.scalar(select(func.max(Entry.hits)).where(Entry.namespace == ns_b)) == 0
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == (
            db.SCHEMA_HEAD
        )


def test_grant_refuses_bad_namespaces_and_unknown_logins(roles_db: RolesDb) -> None:
    grant = str(POLICIES / "grant-namespace.sql")
    too_long = _psql(roles_db.name, "-v", "namespace=" + "n" * 52, "-v",
                     f"role={roles_db.logins['reader']}", "-f", grant)  # fmt: skip
    assert too_long.returncode != 0 and "invalid namespace" in too_long.stderr
    unknown = _psql(roles_db.name, "-v", f"namespace={roles_db.ns_a}", "-v",
                    "role=artstore_no_such_login", "-f", grant)  # fmt: skip
    assert unknown.returncode != 0 and "no role" in unknown.stderr


@pytest.mark.parametrize("given", ["namespace", "role", "neither"])
def test_grant_without_its_variables_fails_saying_which(given: str, roles_db: RolesDb) -> None:
    """Measured before: without `-v role=...` psql printed the usage and exited 0, so a
    script went on as if the login had been granted. Run as the docs show it (the file
    sets ON_ERROR_STOP itself; without -v ON_ERROR_STOP=1 too)."""
    values = {"namespace": roles_db.ns_a, "role": roles_db.logins["reader"]}
    args = [a for k, v in values.items() if k == given for a in ("-v", f"{k}={v}")]
    grant = str(POLICIES / "grant-namespace.sql")
    server = ["-h", devstack.HOST, "-p", str(devstack.PG_PORT), "-U", "postgres"]
    command = ["psql", "-X", "-q", *server, "-d", roles_db.name, *args, "-f", grant]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    missing = [k for k in values if k != given]
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, proc.stderr
    needs, _, usage = errors[0].partition(": usage: psql")
    assert usage and [k for k in values if f"-v {k}=" in needs] == missing, errors


def test_quota_set_as_the_writer_names_the_gc_role(roles_db: RolesDb, blobs_dir: Path) -> None:
    """Measured before: "... a superuser runs `psql ... postgres-roles.sql`": re-running it
    changes nothing, as it gives writers no quota writes by design; the gc role sets them."""
    writer = {"ARTSTORE_INDEX": roles_db.url("writer"), "ARTSTORE_NAMESPACE": roles_db.ns_a}
    env = clean_env(ARTSTORE_URL=str(blobs_dir), **writer)
    for args in (["set", roles_db.ns_a, "10G"], ["rm", roles_db.ns_a]):
        proc = artstore("quota", *args, env=env)
        assert proc.returncode == 1, proc.stdout
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "postgres-roles.sql" not in lines[0], lines[0]
        assert "artstore_gc" in lines[0] and "quota" in lines[0], lines[0]


# -- folding, without roles: SQLite and PostgreSQL -------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_hostile_access_rows_neither_pin_nor_break_gc(
    backend: str, roles_db: RolesDb, open_store: Any, engines: dict[str, Engine], tmp_path: Path
) -> None:
    """Rows inserted past every check (SQLite has no roles; PostgreSQL with triggers
    off): gc clamps them when folding, and evicts by LRU as usual."""
    if backend == "sqlite":
        index, ns = f"sqlite:///{tmp_path / 'index.db'}", "default"
        raw = create_engine(index)
    else:
        index, ns = roles_db.superuser_url, f"fold-{uuid.uuid4().hex[:8]}"
        raw = engines["postgres"]
    store = open_store(index, ns)  # a SQLite index migrates itself
    sizes = [_put(store, i) for i in range(2)]  # key 0 is the least recently used
    huge = [(BIGINT_MAX, YEAR_9999), (BIGINT_MAX, YEAR_9999), (-5, T0)]
    rows = [{"namespace": ns, "key": _key(0), "hits": n, "last_access": t} for n, t in huge]
    rows.append({"namespace": ns, "key": _key(1), "hits": BIGINT_MAX, "last_access": T0})
    odd = "INSERT INTO accesses (namespace, key, hits, last_access) VALUES (:ns, :k, 1, :t)"
    with raw.begin() as conn:
        if backend == "postgresql":
            conn.execute(text("SET LOCAL session_replication_role = replica"))  # no trigger
            for t in ("infinity", "-infinity"):  # no Python datetime for either
                conn.execute(text(odd), {"ns": ns, "k": _key(0), "t": t})
        conn.execute(text("UPDATE entries SET hits = :n WHERE namespace = :ns AND key = :k"),
                     {"n": BIGINT_MAX - 1, "ns": ns, "k": _key(1)})  # fmt: skip
        conn.execute(insert(Access), rows)
    before = datetime.now(UTC)
    extra = 2 if backend == "postgresql" else 0
    assert fold_accesses(store.parts.engine, ns) == 4 + extra
    first, second = store.parts.index.lookup(_key(0)), store.parts.index.lookup(_key(1))
    assert first is not None and second is not None
    assert first.hits == 2 * ROW_HITS_MAX + extra
    assert before <= first.last_access <= datetime.now(UTC)  # year 9999 counts as 'now'
    assert second.hits == BIGINT_MAX  # saturated, not 'bigint out of range'
    # Not pinned: the other entry used later is kept, this one goes.
    store.parts.index.record_access({_key(1): (1, datetime.now(UTC) + timedelta(seconds=1))})
    out = gc.collect(store, gc.Policy(max_bytes=sizes[1], grace_secs=0))
    assert out.entries_removed == 1 and _keys(store) == {_key(1)}


# -- the files themselves ---------------------------------------------------------
def test_sql_clamps_match_the_fold() -> None:
    sql = (POLICIES / "postgres-roles.sql").read_text()
    assert f"LEAST(GREATEST(NEW.hits, 0), {ROW_HITS_MAX})" in sql
    assert f"hits BETWEEN 0 AND {ROW_HITS_MAX}" in sql
    assert "PASSWORD '" not in sql and "\\getenv" in sql  # passwords only from the environment


@pytest.mark.parametrize("kind", ["reader", "writer", "gc"])
def test_s3_policies_are_scoped_to_their_prefix(kind: str) -> None:
    policy = json.loads((POLICIES / f"s3-{kind}.json").read_text())
    scope = "PREFIX/*" if kind == "gc" else "PREFIX/NAMESPACE/"
    actions: set[str] = set()
    for statement in policy["Statement"]:
        # Deny only narrows what an Allow grants (a writer may not delete a removal record).
        assert statement["Effect"] in ("Allow", "Deny")
        if statement["Effect"] == "Allow":
            actions.update(statement["Action"])
        for resource in statement["Resource"]:
            if resource == "arn:aws:s3:::BUCKET":  # bucket-level: listing, by prefix only
                assert statement["Action"] == ["s3:ListBucket"]
                prefixes = statement["Condition"]["StringLike"]["s3:prefix"]
                assert prefixes and all(p.startswith(scope.rstrip("*")) for p in prefixes)
            else:
                assert resource.startswith(f"arn:aws:s3:::BUCKET/{scope.rstrip('*')}")
                # The one condition on objects: a put only with If-None-Match (created once).
                condition = statement.get("Condition", {"Null": {"s3:if-none-match": ""}})
                assert list(condition) == ["Null"] and list(condition["Null"]) == [
                    "s3:if-none-match"
                ]
        assert not any(re.search(r"\*$", a) for a in statement["Action"])  # no s3:*
    if kind == "reader":
        # Reads, and puts its hit journals (artifactstore.formats.journal): nothing else.
        assert actions == {"s3:GetObject", "s3:ListBucket", "s3:PutObject"}
        puts = [s for s in policy["Statement"] if "s3:PutObject" in s["Action"]]
        assert puts and all(s["Action"] == ["s3:PutObject"] for s in puts)
        assert all(r.endswith("/NAMESPACE/journals/*") for s in puts for r in s["Resource"])
    else:
        assert {"s3:PutObject", "s3:DeleteObject"} <= actions
    assert "s3:ListBucketMultipartUploads" not in actions  # lists the whole bucket


class _PrefixScopedS3:
    """A client with the permissions of s3-reader.json as AWS applies them: no
    HeadBucket (an unconditioned ListBucket), 403 for a missing key, listings only
    under the namespace's prefix."""

    def __init__(self, scope: str, keys: set[str]) -> None:
        self.scope, self.keys, self.listed = scope, keys, list[str]()
        self.refused: set[str] = set()  # present, but this client may not read them

    def _denied(self, op: str) -> Exception:
        from botocore.exceptions import ClientError

        return ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, op)

    def head_bucket(self, **_: Any) -> None:
        raise self._denied("HeadBucket")

    def head_object(self, *, Key: str, **_: Any) -> dict[str, Any]:
        if Key in self.keys and Key not in self.refused:
            return {}
        raise self._denied("HeadObject")

    def get_object(self, *, Key: str, **kw: Any) -> dict[str, Any]:
        self.head_object(Key=Key)
        raise AssertionError("not reached: only missing keys are asked for")

    def list_objects_v2(self, *, Prefix: str, **_: Any) -> dict[str, Any]:
        if not Prefix.startswith(self.scope):
            raise self._denied("ListObjectsV2")
        self.listed.append(Prefix)
        return {"Contents": [{"Key": k} for k in sorted(self.keys) if k.startswith(Prefix)]}


def test_s3_namespace_policy_misses_are_misses_not_failures() -> None:
    """Under s3-reader.json a missing object answers 403 and HeadBucket is refused: the
    store still opens, a miss is a miss, an object listed but refused is a miss for it
    alone, and a prefix the login may not list is still reported as denied."""
    from artifactstore.blobstores.s3 import S3BlobStore

    store = S3BlobStore("bucket", "cache", "team-a", None, 5.0)
    present = store.key("ab" * 32)
    fake = _PrefixScopedS3("cache/team-a/objects/", {present})
    store._client = fake
    store.check()  # by listing its own prefix instead of HeadBucket
    assert store.get("cd" * 32) is None
    assert store.exists("cd" * 32) is False
    assert store.exists("ab" * 32) is True
    assert all(p.startswith("cache/team-a/objects/") for p in fake.listed)
    fake.keys.add(store.key("ef" * 32))  # listed, yet its GET is refused: that object's
    fake.refused.add(store.key("ef" * 32))  # ACL or KMS key, a miss for it alone
    with pytest.raises(ObjectUnreadable, match=r"\(AccessDenied\): a miss for that object only"):
        store.exists("ef" * 32)
    other = S3BlobStore("bucket", "cache", "team-b", None, 5.0)
    other._client = fake
    with pytest.raises(StoreUnavailable, match="access denied"):
        other.check()  # another namespace's prefix may not even be listed


def test_warm_through_a_login_that_may_not_write_names_the_role(
    roles_db: RolesDb, open_store: Any, blobs_dir: Path, tmp_path: Path
) -> None:
    """Slow: `artstore warm` with the reader's login (and not read-only, as a CI job with
    the wrong secret): the pair is bound, so the gate lets it run; the index refuses each
    entry's row, and warm says they were not stored for the role, exit 1."""
    import sys

    from conftest import PROGRAMS, artstore_warm

    ns = roles_db.ns_a
    open_store(
        roles_db.url("writer"), ns
    ).parts.writes.gate.require()  # as the team's first writer did
    env = clean_env(ARTSTORE_URL=str(blobs_dir), ARTSTORE_INDEX=roles_db.url("reader"),
                    ARTSTORE_NAMESPACE=ns, ARTSTORE_LOCAL_TIER="off")  # fmt: skip
    command = ("--", sys.executable, str(PROGRAMS / "warm_script.py"), "--variant", "3")
    code, report, output = artstore_warm(*command, env=env, tmp_path=tmp_path)
    assert code == 1, output
    ran = json.loads(output.splitlines()[0])
    compiled = len(ran["xla_compiles"])
    assert compiled >= 1 and report["not_stored"] == {"role": compiled}, report
    [line] = [p for p in report["problems"] if "compiled but not stored" in p]
    assert "the writer's role may not write them" in line, line
