"""Publication and removal order under kill -9 (issue 16), on moto S3 + PostgreSQL.

A put writes object -> index row -> manifest; `artstore rm` withdraws manifest -> row ->
object. A real process is SIGKILLed right after each step (tests/programs/crash_at.py);
then a reader that trusts only the writer's key either misses or loads exactly the bytes
stored, never another entry's or an unsigned executable, and `artstore verify --repair`
brings manifests, rows and objects back to consistent. The readers' assertions hold
whether or not a lookup may fall back to the index: a missing manifest is allowed to be
a miss. The order and what each crash leaves are documented in artifactstore/gc/verify.py.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import PROGRAMS, OpenStore, artstore
from programs.crash_at import fingerprint, payload
from sqlalchemy import delete

from artifactstore.config import keyfiles
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.index.models import Entry, StoredObject
from artifactstore.store import Store, encode_entry

# Every list `verify --json` reports a problem in: all empty is "fully consistent".
PROBLEMS = ("corrupt", "entries_without_object", "manifests_missing",
            "manifests_without_entry", "manifests_without_object", "unsigned",
            "bad_signature", "untrusted_key")  # fmt: skip
REFUSALS = ("missing_object", "unsigned", "bad_signature", "untrusted_key", "wrong_entry",
            "fingerprint_mismatch", "corrupt", "bad_manifest")  # fmt: skip


@dataclass(frozen=True)
class Team:
    writer: dict[str, str]  # signs with `ci`'s key (and trusts it, so verify checks signatures)
    reader: dict[str, str]  # read-only, trusts only `ci`'s key
    keys: Path


@pytest.fixture
def team(team_env: dict[str, str], tmp_path: Path) -> Team:
    keys = tmp_path / "keys"
    keys.mkdir()
    secret, public = keyfiles.generate("ci", keys)
    # No local tier: every load below comes through the manifest (or row) under test.
    base = {**team_env, "ARTSTORE_LOCAL_TIER": "off", "ARTSTORE_TRUSTED_KEYS": str(public)}
    return Team({**base, "ARTSTORE_SIGNING_KEY": str(secret)},
                {**base, "ARTSTORE_READ_ONLY": "1"}, keys)  # fmt: skip


def _key(i: int) -> str:
    return f"{i:064x}"


def _crash(env: dict[str, str], *args: str) -> None:
    """Run crash_at.py; it must have been killed by the step, not have finished."""
    proc = subprocess.run([sys.executable, str(PROGRAMS / "crash_at.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def _read(open_store: OpenStore, team: Team, key: str) -> tuple[bytes | None, dict[str, int]]:
    """What a fresh reader loads for `key` (None: a miss), and its counters."""
    reader = open_store(team.reader)
    hit = reader.get(key, fingerprint().digest)
    return (None if hit is None else hit.payload), reader.parts.counters.snapshot()


def _expect(open_store: OpenStore, team: Team, key: str, byte: int, outcome: str) -> None:
    """A reader hits the right bytes ("hit"), misses plainly ("miss"), or either."""
    loaded, counts = _read(open_store, team, key)
    assert loaded is None or loaded == payload(byte), "loaded another executable"
    assert not set(counts) & set(REFUSALS), counts  # nothing wrong was even offered
    if outcome == "hit":
        assert loaded == payload(byte), counts
    elif outcome == "miss":
        assert loaded is None and counts.get("lookups_missed") == 1, counts


def _verify(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("verify", "--json", *args, env=env)
    if "--repair" in args:
        assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    report["_returncode"] = proc.returncode
    return report


def _found(report: dict[str, Any]) -> dict[str, list[str]]:
    return {name: report[name] for name in PROBLEMS if report[name]}


def _consistent(env: dict[str, str]) -> None:
    report = _verify(env)
    assert report["ok"] and not _found(report) and report["_returncode"] == 0, report


def _put(store: Store, key: str, byte: int) -> None:
    assert store.put(
        Put(key, payload(byte), fingerprint=fingerprint(), module_name="jit_f", compile_secs=1.0)
    )


# -- publication: object -> row -> manifest -------------------------------------
# step killed after -> (what a reader may see before the repair, what verify finds,
# whether the entry exists after the repair)
PUT = {
    "blobs.put": ("miss", {}, False),  # an object without row: gc's to restore or delete
    "index.add_entry": ("either", {"manifests_missing": 1}, True),
    "blobs.put_manifest": ("hit", {}, True),
}


@pytest.mark.parametrize("step", PUT)
def test_put_killed_after_each_step(step: str, team: Team, open_store: OpenStore) -> None:
    before, problems, survives = PUT[step]
    key, byte = _key(1), 7
    _crash(team.writer, "put", step, key, str(byte))
    _expect(open_store, team, key, byte, before)
    found = _found(_verify(team.writer, "--repair"))
    assert found == {name: [key] * n for name, n in problems.items()}, found
    _consistent(team.writer)
    _expect(open_store, team, key, byte, "hit" if survives else "miss")


def test_a_writer_killed_between_row_and_manifest_is_finished_by_gc(
    team: Team, open_store: OpenStore
) -> None:
    """A writer SIGKILLed after its index row, before its manifest: readers (who never
    ask the index) miss the entry and `verify` exits 1. Failed before: gc, which runs on
    a schedule, left it so until an operator ran `verify --repair` or a writer compiled
    that key again. Now the next gc publishes it from its row. Slow: a killed process, three
    gc runs and two verifies (about 60 s)."""
    key, byte = _key(14), 50
    _crash(team.writer, "put", "index.add_entry", key, str(byte))
    _expect(open_store, team, key, byte, "miss")
    assert _verify(team.writer)["manifests_missing"] == [key]
    dry = artstore("gc", "--dry-run", "--json", env=team.writer)
    assert dry.returncode == 0 and json.loads(dry.stdout)["summary"]["manifests_published"] == 1
    _expect(open_store, team, key, byte, "miss")  # a dry run publishes nothing
    ran = artstore("gc", env=team.writer)  # as cron runs it
    assert ran.returncode == 0, ran.stderr
    assert "published the manifests of 1 entry whose writer died" in ran.stdout, ran.stdout
    _expect(open_store, team, key, byte, "hit")
    _consistent(team.writer)
    again = artstore("gc", "--json", env=team.writer)
    assert json.loads(again.stdout)["summary"]["manifests_published"] == 0  # nothing left to finish


def test_a_writer_killed_between_row_and_manifest_is_finished_by_the_next_writer(
    team: Team, open_store: OpenStore
) -> None:
    """The next writer of the key (it missed as readers do, and compiled) finds the row
    and publishes its manifest instead of storing its own bytes (artifactstore/gc/verify.py's
    docstring said it stored nothing and left the miss). Slow: a killed process and a verify
    (about 15 s)."""
    key, byte = _key(15), 51
    _crash(team.writer, "put", "index.add_entry", key, str(byte))
    writer = open_store(team.writer)
    assert writer.get(key, fingerprint().digest) is None  # a miss for writers too
    assert not writer.put(
        Put(key, payload(byte + 1), fingerprint(), module_name="jit_f", compile_secs=1.0)
    )
    assert writer.parts.counters.snapshot()["manifest_republished"] == 1
    _expect(open_store, team, key, byte, "hit")  # the row's bytes, not the later compile's
    _consistent(team.writer)


# -- removal: manifest -> row -> object ------------------------------------------
RM = {
    "blobs.delete_manifests": ("either", {"manifests_missing": 1}, True),
    "index.delete_entries": ("miss", {}, False),  # an unreferenced object: gc deletes it
}


@pytest.mark.parametrize("step", RM)
def test_rm_killed_after_each_step(step: str, team: Team, open_store: OpenStore) -> None:
    before, problems, survives = RM[step]
    key, byte = _key(2), 9
    _put(open_store(team.writer), key, byte)
    _expect(open_store, team, key, byte, "hit")
    _crash(team.writer, "rm", step, key)
    _expect(open_store, team, key, byte, before)
    found = _found(_verify(team.writer, "--repair"))
    assert found == {name: [key] * n for name, n in problems.items()}, found
    _consistent(team.writer)
    _expect(open_store, team, key, byte, "hit" if survives else "miss")
    if survives:  # the repair published it again: removing it again completes
        assert artstore("rm", key, env=team.writer).returncode == 0
        _consistent(team.writer)
        _expect(open_store, team, key, byte, "miss")


# -- manifests that lead nowhere, or to what a reader must refuse -----------------
def test_manifests_naming_missing_objects_are_counted_misses_and_repaired(
    team: Team, open_store: OpenStore
) -> None:
    writer = open_store(team.writer)
    gone, rowless, forged = _key(3), _key(4), _key(5)
    for i, key in enumerate((gone, rowless, forged)):
        _put(writer, key, 20 + i)
    digest = {k: writer.parts.index.lookup(k).digest for k in (gone, rowless)}  # type: ignore[union-attr]
    writer.parts.blobs.delete(digest[gone])  # removed by hand, or by a gc that lost its row
    with writer.parts.engine.begin() as conn:  # gc's eviction killed between row and manifest
        conn.execute(delete(Entry).where(Entry.key == rowless))
    writer.parts.blobs.delete(digest[rowless])  # ... and its object past the grace period
    data = writer.parts.blobs.get_manifest(forged)
    assert data is not None
    writer.parts.blobs.put_manifest(
        forged, dataclasses.replace(Manifest.decode(data, forged), digest="0" * 64).encode()
    )

    reader = open_store(team.reader)
    for key in (gone, rowless, forged):
        assert reader.get(key, fingerprint().digest) is None
    assert reader.parts.counters.snapshot()["missing_object"] == 3

    report = _verify(team.writer)
    assert report["_returncode"] != 0 and not report["ok"]
    assert _found(report) == {
        "entries_without_object": [gone],
        "manifests_missing": [forged],  # it names another object than the row's
        "manifests_without_entry": [rowless],
        "manifests_without_object": sorted([gone, rowless, forged]),
    }
    _verify(team.writer, "--repair")
    _consistent(team.writer)
    assert list(writer.parts.blobs.iter_manifest_keys()) == [forged]  # republished from its row
    _expect(open_store, team, forged, 22, "hit")
    _expect(open_store, team, gone, 20, "miss")
    _expect(open_store, team, rowless, 21, "miss")


def test_a_manifest_leading_to_an_unsigned_or_forged_object_is_a_counted_miss(
    team: Team, team_env: dict[str, str], open_store: OpenStore
) -> None:
    unsigned, forged, genuine = _key(6), _key(7), _key(8)
    # A bucket writer without the key plants an unsigned entry (a writer that requires
    # signatures stores nothing unsigned: this one is told not to).
    keyless = {k: v for k, v in team_env.items() if k != "ARTSTORE_SIGNING_KEY"}
    keyless["ARTSTORE_REQUIRE_SIGNATURES"] = "0"
    _put(open_store({**keyless, "ARTSTORE_LOCAL_TIER": "off"}), unsigned, 30)
    (team.keys / "forger").mkdir()
    stolen_name, _ = keyfiles.generate("ci", team.keys / "forger")  # `ci`, but not its key
    _put(open_store({**team.writer, "ARTSTORE_SIGNING_KEY": str(stolen_name)}), forged, 31)
    _put(open_store(team.writer), genuine, 32)

    reader = open_store(team.reader)
    assert reader.get(unsigned, fingerprint().digest) is None
    assert reader.get(forged, fingerprint().digest) is None
    hit = reader.get(genuine, fingerprint().digest)
    assert hit is not None and hit.payload == payload(32) and isinstance(hit.entry, Manifest)
    counts = reader.parts.counters.snapshot()
    assert (counts["unsigned"], counts["bad_signature"], counts["hits"]) == (1, 1, 1), counts
    assert (
        reader.parts.reads.refused.get(unsigned) == "unsigned"
        and reader.parts.reads.refused.get(forged) == "bad_signature"
    )


# -- the index rebuilt from manifests --------------------------------------------
def test_db_rebuild_recovers_entries_from_manifests_then_objects(
    team: Team, open_store: OpenStore
) -> None:
    writer = open_store(team.writer)
    a, b, unpublished, resigned = (_key(i) for i in (10, 11, 12, 13))
    for i, key in enumerate((a, b, unpublished, resigned)):
        _put(writer, key, 40 + i)
    writer.parts.blobs.delete_manifests([unpublished])  # a put killed before publishing
    # An older object of `resigned` kept for the grace period (as `artstore sign` leaves
    # one): listed first, it is what a rebuild from objects alone would make the entry.
    current = writer.parts.index.lookup(resigned)
    assert current is not None
    older = next(
        enc
        for n in range(256)
        if (
            enc := encode_entry(
                Put(resigned, bytes([n]) * 64, fingerprint(), "jit_f", 1.0), writer.parts.settings
            )
        ).digest
        < current.digest
    )
    writer.parts.blobs.put(older.digest, older.data)
    with writer.parts.engine.begin() as conn:  # the index lost
        conn.execute(delete(Entry))
        conn.execute(delete(StoredObject))
    assert artstore("ls", "--json", env=team.writer).stdout.strip() == "[]"

    proc = artstore("db", "rebuild", "--json", env=team.writer)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["restored"], report["from_manifests"], report["from_objects"]) == (4, 3, 1)
    assert (report["superseded"], report["manifests"], report["objects"]) == (1, 3, 5), report
    listed = json.loads(artstore("ls", "--json", env=team.writer).stdout)
    assert {e["key"]: e["digest"] for e in listed}[resigned] == current.digest
    assert sorted(e["key"] for e in listed) == sorted([a, b, unpublished, resigned])
    for key, byte in ((a, 40), (b, 41), (resigned, 43)):
        _expect(open_store, team, key, byte, "hit")
    _expect(open_store, team, unpublished, 42, "either")
    found = _found(_verify(team.writer, "--repair"))
    assert found == {"manifests_missing": [unpublished]}, found
    _consistent(team.writer)
    _expect(open_store, team, unpublished, 42, "hit")
