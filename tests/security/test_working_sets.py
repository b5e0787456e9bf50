"""Issue 38.2: working sets under the trust rule; no byte of an unauthenticated working set
reaches XLA or chooses what a reader deserializes.

Measured before (team set-up: moto S3 + PostgreSQL, signatures required, read-only readers
trusting the CI key): a working set forged with S3 PutObject alone, with junk compile options,
aborted every reader with an empty tier and loading ahead (XLA CHECK `replica_count > 0`); a
forged one made readers deserialize other programs' executables, and `num_partitions=4`
stalled one until its breaker opened; `artstore pull` copied forged sets into tiers, and 1,000
junk names hid the genuine ones from it. Each negative test here checks that its defence ran
(a counter, a log line), so that it fails if the defence is removed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import (
    PROGRAMS,
    TEAM_PUB,
    _team,
    artstore,
    bucket_of,
    clean_env,
    old_client,
    s3_client,
)
from conftest import run_program as _run

from artifactstore.config import keyfiles
from artifactstore.formats.signing import TrustedKeys
from artifactstore.formats.workingset import WorkingEntry, WorkingSet, hint_id, program_id

JOB = str(PROGRAMS / "job.py")
REFUSED_LINE = "is not followed (nothing loaded ahead from it)"
# The commit before working sets were signed: the client a rollout still runs.
UNSIGNED_CLIENT = "6839070"


@dataclass
class Team:
    env: dict[str, str]  # a writer's: it holds the team key
    results: Any  # job.py's results, as every later run must give them
    name: str  # the genuine working set's name (job.py on this host)
    genuine: bytes  # as the writer stored it
    found: WorkingSet


def _folder(env: dict[str, str]) -> tuple[str, str]:
    bucket, prefix = bucket_of(env)
    return bucket, f"{prefix}/default/workingsets/"


def _plant(env: dict[str, str], name: str, data: bytes, s3: Any = None) -> None:
    """As an attacker with the writer policy's PutObject on workingsets/*: no key."""
    bucket, folder = _folder(env)
    (s3 or s3_client(env)).put_object(Bucket=bucket, Key=folder + name, Body=data)


def _bucket_sets(env: dict[str, str]) -> dict[str, bytes]:
    s3 = s3_client(env)
    bucket, folder = _folder(env)
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=folder).get("Contents", [])
    return {
        item["Key"].rsplit("/", 1)[1]: s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        for item in listing
    }


@pytest.fixture(scope="module")
def team(moto_endpoint: str, migrated_template: str) -> Iterator[Team]:
    """One signed team store, and job.py run once by a writer (loading ahead on)."""
    name = "artstore_t_" + uuid.uuid4().hex[:12]
    env = dict(_team(moto_endpoint, devstack.create_database(name, template=migrated_template)))
    env["ARTSTORE_PREFETCH"] = "1"
    try:
        first = _run("job.py", env)
        assert first["store"]["stored"] == 12, first["store"]
        sets = _bucket_sets(env)
        assert len(sets) == 1, sorted(sets)  # the writer's, signed (not a hint: tier only)
        ((set_name, genuine),) = sets.items()
        found = WorkingSet.decode(genuine, set_name)
        yield Team(env, first["results"], set_name, genuine, found)
    finally:
        devstack.drop_database(name)


def _reader(team: Team, tmp_path: Path, program: str | None = None, **extra: str) -> dict[str, str]:
    """A read-only reader of the default team set-up: no key of its own, trusting the CI
    key, loading ahead, its tier empty."""
    env = {k: v for k, v in team.env.items() if k != "ARTSTORE_SIGNING_KEY"}
    env.update(ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB), ARTSTORE_READ_ONLY="1")
    env.update(ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"), **extra)
    if program is not None:
        env["ARTSTORE_PROGRAM"] = program
    return env


def _forged_name(team: Team, program: str) -> str:
    return program_id(program, team.found.fingerprint)


def _with_options(found: WorkingSet, program: str, options: bytes) -> WorkingSet:
    entries = tuple(replace(e, options=options) for e in found.entries)
    return WorkingSet(program, found.fingerprint, entries)


def _tier_sets(tmp_path: Path) -> dict[str, bytes]:
    hints = {hint_id(JOB)} | {hint_id(f"victim-{k}") for k in ("unsigned", "other_key", "altered")}
    found = (tmp_path / "tier").rglob("workingsets/*")
    return {p.name: p.read_bytes() for p in found if p.name not in hints}


def test_a_writer_signs_its_working_set(team: Team) -> None:
    trusted = TrustedKeys((keyfiles.load_trusted_keys(str(TEAM_PUB)).keys[0],))
    assert team.found.signature is not None and team.found.signature.signer == "team-tests"
    assert team.found.refusal(trusted, "default") is None
    assert team.found.refusal(trusted, "other") is not None  # bound to its namespace


@pytest.mark.parametrize("forgery", ["unsigned", "other_key", "altered"])
def test_a_forged_set_with_junk_options_is_refused_whole(
    team: Team, tmp_path: Path, forgery: str
) -> None:
    """The measured case: junk compile options in a set planted with PutObject alone. The
    reader with an empty tier and loading ahead exits 0 with the right results, the set is
    refused before any entry is fetched (counted, one warning naming why)."""
    program = f"victim-{forgery}"
    name = _forged_name(team, program)
    junk = _with_options(team.found, name, b"junk")
    if forgery == "unsigned":
        data, why = junk.encode(), "unsigned"
    elif forgery == "other_key":
        attacker_key, _ = keyfiles.generate("team-tests", tmp_path)  # the same name: no help
        data = junk.encode(keyfiles.load_signing_key(str(attacker_key)), "default")
        why = "does not match"
    else:  # the genuine set, its signature kept, its options replaced
        raw = json.loads(team.genuine)
        raw["p"] = name
        for row in raw["e"]:
            row[1] = "anVuaw=="
        data, why = json.dumps(raw, separators=(",", ":")).encode(), "does not match"
    _plant(team.env, name, data)
    env = _reader(team, tmp_path, program, JOB_WAIT_COUNTER="prefetch_refused_set:1")
    out = _run("job.py", env, check=False)
    assert out["_returncode"] == 0, out["_stderr"][-2000:]
    assert out["results"] == team.results
    stats = out["store"]
    assert stats["prefetch_refused_set"] == 1 and "prefetched" not in stats, stats
    assert "prefetch_refused_options" not in stats  # refused whole, before any entry
    warnings = [line for line in out["_stderr"].splitlines() if REFUSED_LINE in line]
    assert len(warnings) == 1 and why in warnings[0], warnings  # a warning: shown by default
    assert "the store" in warnings[0]
    assert _tier_sets(tmp_path) == {}  # nothing unsigned kept: it would refuse it next run


def test_a_forged_set_naming_another_programs_entries_is_not_followed(
    team: Team, tmp_path: Path
) -> None:
    """The writer's signed executables, listed in an unsigned set of another program
    (job.py's variant, whose keys differ): never deserialized in that program's process."""
    name = _forged_name(team, "victim-b")
    _plant(team.env, name, WorkingSet(name, team.found.fingerprint, team.found.entries).encode())
    wait = "prefetch_refused_set:1"
    env = _reader(team, tmp_path, "victim-b", JOB_VARIANT="1", JOB_WAIT_COUNTER=wait)
    out = _run("job.py", env)
    stats = out["store"]
    assert stats["prefetch_refused_set"] == 1, stats
    assert "prefetched" not in stats and "prefetch_unused" not in stats
    assert any("mlp" in c for c in out["xla_compiles"])  # its own main function, compiled


def test_a_trusted_reader_follows_the_signed_set_and_keeps_it(team: Team, tmp_path: Path) -> None:
    """The control: the writer's signed set is followed by a reader trusting its key, who
    keeps that signed record in its tier (it writes no unsigned one of its own), so that
    its next run predicts from the tier."""
    env = _reader(team, tmp_path, JOB_WAIT_PREFETCH="12")
    first = _run("job.py", env)
    stats = first["store"]
    assert stats["prefetched"] == stats["prefetch_used"] == 12, stats
    assert "prefetch_refused_set" not in stats and REFUSED_LINE not in first["_stderr"]
    assert _tier_sets(tmp_path) == {team.name: team.genuine}
    again = _run("job.py", env)
    assert again["store"]["prefetched"] == again["store"]["tier_hits"] == 12
    assert _tier_sets(tmp_path) == {team.name: team.genuine}


def test_a_forged_tier_copy_is_refused(team: Team, tmp_path: Path) -> None:
    """Tier copies are checked on every read: a forged one (unsigned, junk options) in
    the tier of a reader whose tier has entries (it reads no store copy then) is refused
    whole (counted, said), and the program runs from its tier."""
    env = _reader(team, tmp_path)
    first = _run("job.py", env)
    assert first["store"]["hits"] == 12
    (tier_copy,) = (tmp_path / "tier").rglob(f"workingsets/{team.name}")
    tier_copy.write_bytes(_with_options(team.found, team.name, b"junk").encode())
    out = _run("job.py", dict(env, JOB_WAIT_COUNTER="prefetch_refused_set:1"))
    assert out["store"]["prefetch_refused_set"] == 1 and "prefetched" not in out["store"]
    assert "this host's tier" in out["_stderr"] and out["results"] == team.results
    assert out["store"]["tier_hits"] == 12


def test_pull_copies_only_trusted_sets_past_junk_names(team: Team, tmp_path: Path) -> None:
    """`artstore pull` copies only what parses and is signed by a trusted key, replacing
    the tier's copy: 1,000 junk names listed first do not hide the genuine set; forged
    sets in the bucket are counted as refused (in the report and its summary line) and
    never copied; a forged tier copy is replaced by the next pull.

    Slow: 1,000 PutObjects to moto over HTTP, and two pulls (fresh CLI processes).
    """
    env = {k: v for k, v in _reader(team, tmp_path).items() if k != "ARTSTORE_INDEX"}
    other = _forged_name(team, "victim-pull")
    _plant(team.env, other, _with_options(team.found, other, b"junk").encode())
    junk = [f"{'0' * 38}{i:04d}" for i in range(1000)]  # listed before any program id
    s3 = s3_client(team.env)  # one client (thread-safe), its connections pooled
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: _plant(team.env, n, b"{}", s3), junk))
    pulled = artstore("pull", "--json", env=env)
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["working_sets"] == 1, report
    assert report["working_sets_refused"] >= 1, report  # the forged ones
    assert _tier_sets(tmp_path) == {team.name: team.genuine}
    (tier_copy,) = (tmp_path / "tier").rglob(f"workingsets/{team.name}")
    tier_copy.write_bytes(_with_options(team.found, team.name, b"junk").encode())
    again = artstore("pull", env=env)
    assert again.returncode == 0 and "working sets refused" in again.stdout + again.stderr
    assert _tier_sets(tmp_path) == {team.name: team.genuine}


# -- a store without signatures: the options are checked against the backend --------------
def _edited_options(options: list[bytes], edit: str) -> list[bytes]:
    """Each of `options` (real requests') with `edit` applied, by JAX in a subprocess."""
    code = (
        "import sys; from jax._src.lib import xla_client as xc\n"
        "for h in sys.argv[1:]:\n"
        "    o = xc.CompileOptions.ParseFromString(bytes.fromhex(h))\n"
        f"    {edit}\n"
        "    print(o.SerializeAsString().hex())"
    )
    args = [sys.executable, "-c", code, *(o.hex() for o in options)]
    proc = subprocess.run(args, env=clean_env(), capture_output=True, check=True, timeout=120)
    return [bytes.fromhex(line) for line in proc.stdout.decode().split()]


@dataclass
class Embedded:
    store: Path  # an embedded store (local directory + SQLite) job.py ran on once
    results: Any


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Embedded:
    """The embedded default, written by one run of job.py (loading ahead on); each test
    forges a copy."""
    store = tmp_path_factory.mktemp("embedded") / "store"
    first = _run("job.py", clean_env(ARTSTORE_URL=str(store), ARTSTORE_PREFETCH="1"))
    assert first["store"]["stored"] == 12
    return Embedded(store, first["results"])


@pytest.mark.parametrize("forgery", ["junk", "partitions", "devices", "twice"])
def test_an_unsigned_store_refuses_options_that_do_not_fit(
    embedded: Embedded, tmp_path: Path, forgery: str
) -> None:
    """The embedded default trusts no key: a set is followed, but each entry's options and
    devices are checked against this backend before any deserialization. Junk options
    (the abort), num_partitions=4 (the stall), a device this host lacks, a device twice:
    each entry refused (counted), the program correct from its tier, nothing logged."""
    shutil.copytree(embedded.store, tmp_path / "store", symlinks=True)
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_PREFETCH="1")
    folder = tmp_path / "store" / "default" / "workingsets"
    (record,) = [p for p in folder.iterdir() if p.name != hint_id(JOB)]
    found = WorkingSet.decode(record.read_bytes(), record.name)
    edit, devices = {
        "junk": (None, None),
        "partitions": ("o.num_partitions = 4", None),
        "devices": ("pass", (7,)),
        "twice": ("o.num_replicas = 2", (0, 0)),
    }[forgery]
    edited = _edited_options([e.options for e in found.entries], edit) if edit else None
    forged = WorkingSet(
        found.program,
        found.fingerprint,
        tuple(
            replace(e, options=edited[i] if edited else b"junk", devices=devices or e.devices)
            for i, e in enumerate(found.entries)
        ),
    )
    record.write_bytes(forged.encode())
    n = len(found.entries)
    out = _run("job.py", dict(env, JOB_WAIT_COUNTER=f"prefetch_refused_options:{n}"), check=False)
    assert out["_returncode"] == 0, out["_stderr"][-2000:]
    stats = out["store"]
    assert stats["prefetch_refused_options"] == n and "prefetched" not in stats, stats
    assert out["results"] == embedded.results and out["xla_compiles"] == []
    assert stats["hits"] == stats["tier_hits"] == n
    assert "artifactstore" not in out["_stderr"]  # no warning, no breaker


@pytest.mark.parametrize(
    "edit",
    [
        "o.env_option_overrides = [('xla_dump_to', DUMP)]",
        "o.executable_build_options.debug_options.xla_dump_to = DUMP",
    ],
    ids=["env_option_overrides", "debug_options"],
)
def test_an_unsigned_store_never_applies_a_sets_debug_options(
    embedded: Embedded, tmp_path: Path, edit: str
) -> None:
    """Options that fit this backend but ask XLA to dump into a directory the set's writer
    chose (measured before: every entry loaded ahead wrote its HLO there): what reaches
    XLA is rebuilt from the checked fields, so the entries still load ahead and nothing
    is written there."""
    shutil.copytree(embedded.store, tmp_path / "store", symlinks=True)
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_PREFETCH="1")
    folder = tmp_path / "store" / "default" / "workingsets"
    (record,) = [p for p in folder.iterdir() if p.name != hint_id(JOB)]
    found = WorkingSet.decode(record.read_bytes(), record.name)
    dump = tmp_path / "chosen-by-the-bucket"
    edited = _edited_options(
        [e.options for e in found.entries], edit.replace("DUMP", repr(str(dump)))
    )
    forged = WorkingSet(
        found.program,
        found.fingerprint,
        tuple(replace(e, options=edited[i]) for i, e in enumerate(found.entries)),
    )
    record.write_bytes(forged.encode())
    n = len(found.entries)
    out = _run("job.py", dict(env, JOB_WAIT_COUNTER=f"prefetched:{n}"), check=False)
    assert out["_returncode"] == 0, out["_stderr"][-2000:]
    assert out["store"].get("prefetched") == n, out["store"]  # deserialized with options
    assert out["results"] == embedded.results and out["xla_compiles"] == []
    assert not dump.exists() or not any(dump.iterdir()), sorted(dump.iterdir())


# -- old and new clients during a rollout --------------------------------------------------
def test_an_unsigned_client_reads_a_signed_set(tmp_path: Path) -> None:
    """The field a signed set adds is ignored by the client before signatures (its own
    decoder, from this repository's history), which reads the same prediction."""
    root = tmp_path / "old"
    root.mkdir()
    old_client(UNSIGNED_CLIENT, root, "artifactstore")
    key, _ = keyfiles.generate("rollout", tmp_path)
    name = program_id("p", "ab" * 32)
    entries = (
        WorkingEntry("k" * 64, b"\x08\x01", (0,), 0),
        WorkingEntry("m" * 64, b"", (0,), 0, "named"),
    )
    for found in (WorkingSet(name, "ab" * 32, entries), WorkingSet(name, "ab" * 32, entries[:1])):
        data = found.encode(keyfiles.load_signing_key(str(key)), "default")
        assert b'"s":' in data
        code = (
            "import sys, json, artifactstore.formats.workingset as w; "
            "s = w.WorkingSet.decode(sys.stdin.buffer.read(), sys.argv[1]); "
            "assert 'old' in w.__file__, w.__file__; "
            "rows = [[e.key, e.options.hex(), list(e.devices), e.kind] for e in s.entries]; "
            "print(json.dumps(rows))"
        )
        env = clean_env(PYTHONPATH=str(root))
        args = [sys.executable, "-c", code, name]
        # From tmp_path: `-c` puts the working directory (maybe this checkout) first.
        proc = subprocess.run(
            args, input=data, capture_output=True, env=env, timeout=120, cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        got = json.loads(proc.stdout)
        assert got == [[e.key, e.options.hex(), list(e.devices), e.kind] for e in found.entries]
