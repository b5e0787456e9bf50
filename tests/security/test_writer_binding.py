"""Issue 38.4: store identity for writer programs, `doctor`, `db bind --force`, `verify --repair`.

Measured on main (moto S3 + PostgreSQL): a writer program with a mistyped but existing
bucket and the team index got no warning and re-pointed 5 team index entries at objects
in the wrong bucket; every later gc refused and the documented `verify --repair` dropped
them (readers lost 5 of 7 entries). Its `doctor` said `binding FAIL` but exited 0.
`db bind --force` (which the mismatch error suggests) then `verify --repair` against an
empty bucket emptied the index, and `bind --force` wrote an identity into that bucket.
Each test here failed before the change; each negative one also shows its defence ran.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import pytest
from conftest import OpenStore, artstore, clean_env, run_program, s3_client
from sqlalchemy import create_engine, text

from artifactstore.config import host
from artifactstore.formats.put import Put
from artifactstore.runtime.summary import Summary

MISMATCH = "do not belong together"
FP = host.compute(
    platform_name="cpu",
    platform_version="v",
    device_kind="cpu-a",
    device_count=1,
    jax_version="1",
    jaxlib_version="0.9.1",
)


def _wrong_bucket(env: dict[str, str]) -> dict[str, str]:
    """`env` with ARTSTORE_URL mistyped: another bucket that exists, empty."""
    bucket = "artstore-wrong-" + uuid.uuid4().hex[:8]
    s3_client(env).create_bucket(Bucket=bucket)
    return {**env, "ARTSTORE_URL": f"s3://{bucket}/cache"}


def _listing(env: dict[str, str]) -> list[str]:
    bucket = env["ARTSTORE_URL"].split("/")[2]
    pages = s3_client(env).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _rows(env: dict[str, str]) -> list[tuple[str, str]]:
    """(key, digest) of every entry in the index: what readers are led to."""
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key, digest FROM entries ORDER BY key"))
            return [(str(k), str(d)) for k, d in rows]
    finally:
        engine.dispose()


def _fill(env: dict[str, str], open_store: OpenStore, n: int = 6) -> list[tuple[str, str]]:
    """`n` entries stored in `env`'s store by a writer in this process; its rows."""
    store = open_store(env)
    for i in range(n):
        key, payload = f"{i + 1:02x}" * 32, os.urandom(600 + i)
        assert store.put(Put(key, payload, fingerprint=FP, module_name=f"jit_{i}", compile_secs=1))
    return _rows(env)


def _index_shown(env: dict[str, str]) -> str:
    """The index as a line may name it: host and database, never the password."""
    return env["ARTSTORE_INDEX"].rsplit("@", 1)[1]


# -- (a) the measured case: a writer program on a second, existing bucket -------------
def test_writer_program_on_another_bucket_stores_nothing_and_says_so(
    team_env: dict[str, str],
) -> None:
    """Slow: five JAX processes (a writer, two on the wrong bucket, a reader) and gc."""
    first = run_program("job.py", team_env)
    assert first["store"]["stored"] >= 2
    before, bucket_before = _rows(team_env), _listing(team_env)
    assert before

    wrong = _wrong_bucket(team_env)
    # A new variant too: keys the index does not hold (a put), beside ones it does.
    for variant in ("0", "0.25"):
        out = run_program("job.py", {**wrong, "JOB_VARIANT": variant})
        assert out["_returncode"] == 0
        assert out["store"].get("stored", 0) == 0
        assert out["store"]["store_mismatch"] >= 1  # the defence ran: counted
        summary = Summary.of([out["store"]]).render()  # what `artstore run` would say
        assert "misses" in summary and "stored nothing" in summary, summary
        if variant == "0":
            assert out["results"] == first["results"]  # compiled, correct
        said = [line for line in out["_stderr"].splitlines() if MISMATCH in line]
        assert len(said) == 1, out["_stderr"]
        assert wrong["ARTSTORE_URL"] in said[0] and _index_shown(team_env) in said[0]
        assert "testing-secret" not in out["_stderr"] and "password" not in said[0]
    # Nothing re-pointed, nothing added; nothing written into the wrong bucket but its hit
    # journals (what a reader writes too): no compile lease either, for the team's writers
    # to wait on while this one compiles what it cannot store.
    assert _rows(team_env) == before
    assert not [k for k in _listing(wrong) if "/journals/" not in k]
    assert _listing(team_env) == bucket_before or all(
        "/journals/" in k for k in set(_listing(team_env)) - set(bucket_before)
    )
    # Readers still get every entry; gc and verify find nothing wrong.
    reader = run_program("job.py", {**team_env, "ARTSTORE_READ_ONLY": "1"})
    assert reader["xla_compiles"] == [] and reader["results"] == first["results"]
    gc = artstore("gc", env=team_env)
    assert gc.returncode == 0, gc.stderr
    verify = artstore("verify", "--json", env=team_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert _rows(team_env) == before


def test_a_refused_writer_holds_no_compile_lease(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """Once its write gate refused it (its bucket is not its index's), a writer takes no
    compile lease: the team's writers would wait on it for a result that never arrives,
    and its record would go into the wrong bucket. The gate decides at its first write,
    in the background, so the check never waits on the compile path."""
    _fill(team_env, open_store, n=1)  # the team's pair, bound
    wrong = _wrong_bucket(team_env)
    stray = open_store(wrong)
    first = Put("cd" * 32, b"x" * 600, fingerprint=FP, module_name="jit_a", compile_secs=1)
    assert stray.put(first) is False  # its first write: refused, the gate decided
    key = "ab" * 32
    assert stray.get(key, FP.digest) is None  # a miss: nothing stored under the key
    assert stray.flight is not None
    assert stray.flight.turn(key, lambda: None) == (None, None)  # compile, hold nothing
    team = open_store(team_env)
    assert team.flight is not None
    taken = team.flight.try_hold(key)  # the team's writer is not kept waiting
    assert taken is not None
    taken.release(stored=True)
    team.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k] == []


def test_a_lease_taken_before_the_refusal_is_let_go_and_its_record_deleted(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A lease a writer took (and announced, into its bucket) before its first write was
    refused is let go at its next renewal, and its record deleted, not left behind."""
    _fill(team_env, open_store, n=1)
    wrong = _wrong_bucket(team_env)
    stray = open_store(wrong)
    key = "ef" * 32
    assert stray.get(key, FP.digest) is None
    assert stray.flight is not None
    loaded, held = stray.flight.turn(key, lambda: None)  # the gate has not decided yet
    assert loaded is None and held is not None
    stray.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k]  # announced
    first = Put("cd" * 32, b"x" * 600, fingerprint=FP, module_name="jit_a", compile_secs=1)
    assert stray.put(first) is False  # refused: the gate decided
    stray.flight._beat()  # its next renewal
    assert [k for k in _listing(wrong) if "/leases/" in k] == []
    team = open_store(team_env)
    assert team.flight is not None
    taken = team.flight.try_hold(key)
    assert taken is not None
    taken.release(stored=True)
    team.flight.drain(30)
    held.release(stored=False)  # its compile ends: nothing more is written
    stray.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k] == []


# -- (b) doctor --------------------------------------------------------------------
def test_doctor_exits_nonzero_on_a_binding_failure(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    _fill(team_env, open_store, 1)
    wrong = _wrong_bucket(team_env)
    proc = artstore("doctor", "--json", env=wrong)
    assert proc.returncode != 0, proc.stdout
    report = json.loads(proc.stdout)
    assert report["checks"]["binding"]["state"] == "MISMATCH"
    assert not report["ok"]
    assert "writes are refused" in report["verdict"], report["verdict"]
    assert wrong["ARTSTORE_URL"] in report["verdict"]
    shown = artstore("doctor", env=wrong)
    assert shown.returncode != 0 and "writes are refused" in shown.stdout


# -- (c) db bind --force -----------------------------------------------------------
def test_bind_force_on_an_empty_bucket_refuses_without_allow_missing(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    n = len(_fill(team_env, open_store))
    wrong = _wrong_bucket(team_env)
    proc = artstore("db", "bind", "--force", env=wrong)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"0 of the newest {n} entries have their object in" in proc.stdout + proc.stderr
    assert "--allow-missing" in proc.stderr
    assert _listing(wrong) == []  # no identity written into the wrong bucket
    # The right bucket: the count says all, and it binds.
    right = artstore("db", "bind", "--force", env=team_env)
    assert right.returncode == 0, right.stderr
    assert f"{n} of the newest {n} entries have their object in" in right.stdout
    # With the flag, a person's decision: it says what binding orphans and asks first.
    asked = artstore("db", "bind", "--force", "--allow-missing", env=wrong)
    assert asked.returncode != 0 and f"orphans {n} entries of this index" in asked.stdout
    assert "--yes" in asked.stderr and not [k for k in _listing(wrong) if k.endswith("/identity")]
    forced = artstore("db", "bind", "--force", "--allow-missing", "--yes", env=wrong)
    assert forced.returncode == 0, forced.stderr
    assert f"0 of the newest {n}" in forced.stdout
    assert [k for k in _listing(wrong) if k.endswith("/identity")]


# -- (d) verify --repair -----------------------------------------------------------
def test_verify_repair_on_an_empty_bucket_keeps_the_index(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    before = _fill(team_env, open_store)  # 6 entries, as measured
    wrong = _wrong_bucket(team_env)
    # As measured: a person binds the wrong bucket (with the flag), then repairs.
    assert artstore("db", "bind", "--force", "--allow-missing", "--yes", env=wrong).returncode == 0
    proc = artstore("verify", "--repair", env=wrong)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "--allow-missing" in line and f"{len(before)} of {len(before)}" in line, line
    assert _rows(team_env) == before
    dropped = artstore("verify", "--repair", "--allow-missing", env=wrong)
    assert dropped.returncode == 0, dropped.stderr
    assert _rows(team_env) == []


# -- the same in a SQLite index, where a lookup also asks the index ------------------
def test_writer_on_another_directory_drops_and_stores_nothing(
    tmp_path: Path, open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A SQLite index answers lookups too: an entry whose object is "gone" in the wrong
    directory would be dropped from the real index by the first lookup; it is not."""
    index = f"sqlite:///{tmp_path / 'index.db'}"
    right = clean_env(
        ARTSTORE_URL=str(tmp_path / "right"), ARTSTORE_INDEX=index, ARTSTORE_LOCAL_TIER="off"
    )
    before = _fill(right, open_store, 3)
    (tmp_path / "wrong").mkdir()
    wrong = open_store({**right, "ARTSTORE_URL": str(tmp_path / "wrong")})
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert wrong.get(before[0][0], FP.digest) is None  # a miss: its object is not here
        assert not wrong.put(
            Put("ee" * 32, b"x" * 700, fingerprint=FP, module_name="jit_new", compile_secs=1)
        )
    counts = wrong.parts.counters.snapshot()
    assert counts["missing_object"] == 1 and counts["store_mismatch"] == 2, counts
    said = [r.getMessage() for r in caplog.records if MISMATCH in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "wrong") in said[0], said
    assert _rows(right) == before  # nothing dropped, nothing added
    assert not (tmp_path / "wrong" / "default" / "identity").exists()


# -- (e) one bucket, one index: a new index never binds itself to a bound bucket ------
def _store_id(env: dict[str, str]) -> str:
    bucket, prefix = env["ARTSTORE_URL"].removeprefix("s3://").split("/", 1)
    body = s3_client(env).get_object(Bucket=bucket, Key=f"{prefix}/default/identity")["Body"]
    return str(json.loads(body.read())["id"])


def _bound_id(env: dict[str, str]) -> str | None:
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.connect() as conn:
            found = conn.scalar(text("SELECT store_id FROM identities"))
            return None if found is None else str(found)
    finally:
        engine.dispose()


def _objects(env: dict[str, str]) -> list[str]:
    """The bucket's keys but its hit journals (which readers write too)."""
    return [k for k in _listing(env) if "/journals/" not in k]


def test_a_new_database_does_not_bind_itself_to_the_teams_bucket(
    team_env: dict[str, str], open_store: OpenStore, pg_url: str
) -> None:
    """Slow: a JAX writer program. As measured: a mistyped database name, created as
    doctor advises (createdb, `artstore db upgrade`), then the first writer program
    bound the empty index to the team's bucket (and stored 2 entries there)."""
    before = _fill(team_env, open_store, n=2)
    objects, store_id = _objects(team_env), _store_id(team_env)
    mistyped = {**team_env, "ARTSTORE_INDEX": pg_url}
    up = artstore("db", "upgrade", env=mistyped)
    assert up.returncode == 0, up.stderr
    out = run_program("job.py", mistyped)
    assert out["_returncode"] == 0
    assert out["store"].get("stored", 0) == 0
    assert out["store"]["store_mismatch"] >= 1  # the gate ran and refused
    said = [line for line in out["_stderr"].splitlines() if MISMATCH in line]
    assert len(said) == 1, out["_stderr"]
    assert f"already store {store_id}" in said[0], said[0]
    assert "ARTSTORE_INDEX" in said[0] and "`artstore db bind`" in said[0], said[0]
    assert _bound_id(mistyped) is None and _rows(mistyped) == []  # nothing bound, no rows
    assert _objects(team_env) == objects and _rows(team_env) == before
    # Commands refuse as well, in one line; doctor says so.
    gc = artstore("gc", env=mistyped)
    assert gc.returncode != 0 and f"already store {store_id}" in gc.stderr, gc.stderr
    doctor = json.loads(artstore("doctor", "--json", env=mistyped).stdout)
    assert doctor["checks"]["binding"]["state"] == "MISMATCH"
    assert f"already store {store_id}" in doctor["verdict"] and not doctor["ok"]


def test_doctor_names_a_missing_database_the_wrong_one_before_createdb(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    _fill(team_env, open_store, n=1)
    base, _ = team_env["ARTSTORE_INDEX"].rsplit("/", 1)
    missing = {**team_env, "ARTSTORE_INDEX": f"{base}/artstore_typo_{uuid.uuid4().hex[:8]}"}
    proc = artstore("doctor", "--json", env=missing)
    assert proc.returncode != 0
    verdict = json.loads(proc.stdout)["verdict"]
    assert f"already store {_store_id(team_env)}" in verdict, verdict
    assert "wrong database" in verdict and "createdb" in verdict
    assert verdict.index("wrong database") < verdict.index("createdb"), verdict


def test_of_two_new_indexes_over_a_pristine_bucket_one_is_bound(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    """Their first writers race; the bucket takes one id, the other index stays unbound
    (and refuses), while first writers of one index all agree."""
    from concurrent.futures import ThreadPoolExecutor

    from artifactstore.store.identity import bind

    envs = [team_env, team_env] + [
        {**team_env, "ARTSTORE_INDEX": f"sqlite:///{tmp_path / f'{n}.db'}"} for n in "ab"
    ]
    stores = [open_store(env) for env in envs]
    with ThreadPoolExecutor(len(stores)) as pool:
        found = list(
            pool.map(
                lambda s: bind(
                    s.parts.blobs, s.parts.engine, s.parts.namespace, s.parts.settings.index_url
                ),
                stores,
            )
        )
    assert {f.store_id for f in found if f.ok} == {_store_id(team_env)}, found
    assert found[0].ok == found[1].ok  # one index: both of its writers or neither
    assert [found[0].ok, found[2].ok, found[3].ok].count(True) == 1, found
    for env, f in zip(envs[1:], found[1:], strict=True):  # the others recorded nothing
        assert _bound_id(env) == (f.store_id if f.ok else None)


def test_db_bind_says_what_it_orphans_and_asks_first(
    team_env: dict[str, str], open_store: OpenStore, pg_url: str
) -> None:
    _fill(team_env, open_store, n=3)
    store_id = _store_id(team_env)
    # Another index with 2 entries of its own bucket, its binding gone (as an older
    # client's index): unbound, in front of the team's bucket.
    mine = {**_wrong_bucket(team_env), "ARTSTORE_INDEX": pg_url}
    assert artstore("db", "upgrade", env=mine).returncode == 0
    assert len(_fill(mine, open_store, n=2)) == 2
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM identities"))
    engine.dispose()
    there = {**mine, "ARTSTORE_URL": team_env["ARTSTORE_URL"]}
    asked = artstore("db", "bind", env=there)
    assert asked.returncode != 0 and "Traceback" not in asked.stderr
    said = "binding them orphans 2 entries of this index"
    assert said in asked.stdout and "and 3 objects in it" in asked.stdout, asked.stdout
    assert "gc would delete them" in asked.stdout
    assert "--yes" in asked.stderr and len(asked.stderr.strip().splitlines()) == 1
    assert _bound_id(there) is None  # nothing bound
    assert artstore("db", "bind", env=there, input="n\n").returncode != 0
    bound = artstore("db", "bind", "--yes", env=there)
    assert bound.returncode == 0, bound.stderr
    assert f"bound as store {store_id}" in bound.stdout and _bound_id(there) == store_id


def test_junk_in_the_buckets_identity_is_one_line_everywhere(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A hostile writer's identity object: refused in one line, never a traceback, until
    `db bind --force` (the fix the line names) replaces it after a yes. Measured before:
    `--force --yes` failed too ("it is never replaced"), a dead end."""
    bucket, prefix = team_env["ARTSTORE_URL"].removeprefix("s3://").split("/", 1)
    key = f"{prefix}/default/identity"
    s3_client(team_env).put_object(Bucket=bucket, Key=key, Body=b"\xff{not json")
    for args in (["db", "bind"], ["gc"]):
        proc = artstore(*args, env=team_env)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "identity object is not JSON" in proc.stderr, proc.stderr
        assert "db bind --force" in proc.stderr, proc.stderr  # the fix, named
    doctor = artstore("doctor", "--json", env=team_env)
    assert doctor.returncode != 0 and "Traceback" not in doctor.stderr
    put = Put("cd" * 32, b"x" * 600, fingerprint=FP, module_name="jit_a", compile_secs=1)
    assert open_store(team_env).put(put) is False
    assert _rows(team_env) == [] and _bound_id(team_env) is None

    # --force asks first, as every destructive command: no terminal, no --yes, no change.
    asked = artstore("db", "bind", "--force", env=team_env)
    assert asked.returncode != 0 and "Traceback" not in asked.stderr, asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1 and "--yes" in asked.stderr
    assert "identity object is not JSON: --force replaces it" in asked.stdout, asked.stdout
    raw = s3_client(team_env).get_object(Bucket=bucket, Key=key)["Body"].read()
    assert raw == b"\xff{not json"
    forced = artstore("db", "bind", "--force", "--yes", env=team_env)
    assert forced.returncode == 0, forced.stderr
    store_id = _store_id(team_env)
    assert f"bound as store {store_id}" in forced.stdout and _bound_id(team_env) == store_id
    assert open_store(team_env).put(put) is True  # writers write again
