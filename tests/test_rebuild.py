"""The index recovered from the objects (issue 14 item 7), and objects bound to their keys.

Objects carry the entry they were stored for (`codec.ObjectMeta`): a lost or
corrupt index is rebuilt from them, gc refuses to run on an index that fails
`artstore db check` and restores lost rows instead of deleting their objects,
and a reader refuses an object stored for another key.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import tamper
import zstandard
from conftest import JobResults, artstore, clean_env, run_program

from artifactstore.formats import codec

FP = "ab" * 32
MAIN = ("jit_mlp", "jit_loss_and_grad")  # job.py's two main programs


def _env(tmp_path: Path) -> dict[str, str]:
    # No tier: every load below must come through the index being tested.
    return clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off")


def _keys(env: dict[str, str]) -> dict[str, str]:
    proc = artstore("ls", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {e["key"]: e["digest"] for e in json.loads(proc.stdout)}


def _one_line_error(proc: object, *needles: str) -> None:
    stderr = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode != 0, stderr  # type: ignore[attr-defined]
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in stderr, stderr


# -- the format ---------------------------------------------------------------
def test_metadata_frame_is_invisible_to_readers_that_predate_it() -> None:
    meta = codec.ObjectMeta("k" * 64, "jit_f", 1.25, 3000, "host-a", {"platform": "cpu"})
    enc = codec.encode(b"executable" * 300, FP, meta)
    # What artifactstore 0.1 readers do: one zstd frame after the 37-byte header.
    assert zstandard.ZstdDecompressor().decompress(enc.data[37:]) == b"executable" * 300
    assert codec.read_meta(enc.data) == meta
    old = codec.encode(b"old object", FP)  # as 0.1 wrote them
    assert codec.read_meta(old.data) is None
    assert codec.decode(old.data, digest=old.digest, fingerprint=FP, key="x")
    assert codec.decode(enc.data, digest=enc.digest, fingerprint=FP, key="k" * 64)
    try:
        codec.decode(enc.data, digest=enc.digest, fingerprint=FP, key="j" * 64)
        raise AssertionError("an object stored for another key was decoded")
    except codec.WrongEntry:
        pass


def test_swapped_index_rows_are_refused_not_loaded(tmp_path: Path, job_results: JobResults) -> None:
    """Swapping two entries' digests (a damaged or forged index) must not make a
    program load the other program: both are refused and compiled afresh."""
    env = _env(tmp_path)
    reference = job_results("0")
    run_program("job.py", env)
    entries = json.loads(artstore("ls", "--json", env=env).stdout)
    main = {e["module_name"]: e for e in entries if e["module_name"] in MAIN}
    (k1, d1), (k2, d2) = ((e["key"], e["digest"]) for e in main.values())
    tamper.point_in(tmp_path / "store", k1, d2)
    tamper.point_in(tmp_path / "store", k2, d1)
    job = run_program("job.py", env)
    assert job["results"] == reference
    assert len(job["xla_compiles"]) == 2, job["xla_compiles"]  # both refused, both compiled
    assert job["store"].get("wrong_entry") == 2, job["store"]
    lines = [line for line in job["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "another entry" in lines[0], job["_stderr"]


# -- losing the index ---------------------------------------------------------
def _age_objects(store: Path, secs: float = 600) -> None:
    old = time.time() - secs
    for path in store.rglob("objects/*/*"):
        os.utime(path, (old, old))


def test_an_empty_index_beside_a_put_in_flight_is_not_a_lost_one(tmp_path: Path) -> None:
    """An object minutes old with no row is a lost index; one seconds old may be a writer's
    put between its upload and its row (gc refused so once beside writers on a store it
    had just emptied): gc goes on, and keeps the object (its grace period). The index
    keeps its binding (an index bound to no store is another matter: see below)."""
    env = _env(tmp_path)
    run_program("job.py", env)
    objects = sorted((tmp_path / "store").rglob("objects/*/*"))
    with sqlite3.connect(tmp_path / "store" / "index.db") as conn:
        listed = "SELECT name FROM sqlite_master WHERE type = 'table'"
        for (table,) in conn.execute(listed).fetchall():
            if table not in ("identities", "alembic_version"):
                conn.execute(f"DELETE FROM {table}")
    gc = artstore("gc", "--json", env=env)
    assert gc.returncode == 0, gc.stderr
    assert sorted((tmp_path / "store").rglob("objects/*/*")) == objects
    _age_objects(tmp_path / "store")
    _one_line_error(artstore("gc", env=env), "refusing to gc", "artstore db rebuild")


def test_db_rebuild_after_deleting_the_sqlite_file_restores_every_entry(tmp_path: Path) -> None:
    env = _env(tmp_path)
    run_program("job.py", env)
    before = _keys(env)
    index = tmp_path / "store" / "index.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)

    check = artstore("db", "check", env=env)
    assert check.returncode == 1 and "missing" in check.stdout, check.stdout
    _age_objects(tmp_path / "store")  # older than a put in flight: the index was lost
    gc = artstore("gc", env=env)  # a fresh empty index over a full, bound object store
    _one_line_error(gc, "do not belong together", "artstore db rebuild")
    assert len(list((tmp_path / "store").rglob("objects/*/*"))) == len(before)  # nothing deleted

    rebuilt = artstore("db", "rebuild", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "index bound to the object store's identity" in rebuilt.stdout, rebuilt.stdout
    assert f"{len(before)} entries restored" in rebuilt.stdout, rebuilt.stdout
    assert _keys(env) == before
    assert artstore("db", "check", env=env).returncode == 0
    assert artstore("verify", env=env).returncode == 0
    job = run_program("job.py", env)
    assert job["xla_compiles"] == [], job["_stderr"]  # every entry loads again


def test_corrupt_sqlite_index_is_detected_survived_and_rebuilt(
    tmp_path: Path, job_results: JobResults
) -> None:
    env = _env(tmp_path)
    reference = job_results("0")
    run_program("job.py", env)
    before = _keys(env)
    index = tmp_path / "store" / "index.db"
    data = bytearray(index.read_bytes())
    data[100:4096] = os.urandom(3996)  # the header's tail and the schema page
    index.write_bytes(bytes(data))

    check = artstore("db", "check", env=env)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "Traceback" not in check.stderr
    job = run_program("job.py", env)  # the program never breaks
    assert job["results"] == reference
    assert job["xla_compiles"] == [], job["_stderr"]  # lookups need only the manifests
    lines = [line for line in job["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) <= 1, job["_stderr"]
    compiling = run_program("job.py", dict(env, JOB_VARIANT="0.5"))  # new keys: puts fail
    assert compiling["xla_compiles"] and compiling["store"].get("stored", 0) == 0
    lines = [line for line in compiling["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1, compiling["_stderr"]  # compiles, says so once
    _one_line_error(artstore("gc", env=env))

    rebuilt = artstore("db", "rebuild", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "moved aside" in rebuilt.stdout
    assert list(index.parent.glob("index.db.corrupt-*"))
    assert _keys(env) == before
    assert artstore("db", "check", env=env).returncode == 0
    assert run_program("job.py", env)["xla_compiles"] == []


def test_gc_restores_a_lost_row_instead_of_deleting_its_object(tmp_path: Path) -> None:
    env = _env(tmp_path)
    run_program("job.py", env)
    before = _keys(env)
    lost_key = sorted(before)[0]
    with sqlite3.connect(tmp_path / "store" / "index.db") as db:
        db.execute("DELETE FROM entries WHERE key=?", (lost_key,))
        db.execute("DELETE FROM objects WHERE digest=?", (before[lost_key],))
    old = time.time() - 7200  # older than gc's grace period: an orphan by every measure
    for path in (tmp_path / "store").rglob(before[lost_key]):
        os.utime(path, (old, old))
    dry = artstore("gc", "--dry-run", env=env)
    assert dry.returncode == 0 and "would restore 1 entry" in dry.stdout, dry.stdout
    assert lost_key not in _keys(env)
    gc = artstore("gc", env=env)
    assert gc.returncode == 0 and "restored 1 entry" in gc.stdout, gc.stdout
    assert _keys(env) == before
    assert artstore("verify", env=env).returncode == 0
