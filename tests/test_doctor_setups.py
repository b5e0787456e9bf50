"""`artstore doctor` agrees with the program, in every set-up the docs prescribe (issue 39.7).

Each test runs a real JAX program (tests/programs/job.py) and `artstore doctor` (--json and
the table) side by side, in one environment, and compares: what the program did with the
store (its hits, what it stored) against doctor's `used`, verdict and exit code. Exit 1
only where programs would not use the store (or not as configured: a writer that stores
nothing). The team store is the docs' (docs/team-setup.md): moto S3 and PostgreSQL with the
roles of infra/policies, a writer login granted the namespace, readers as `artstore_reader`
(granted nothing: they never connect), filled once for the module by a writer process.

Set-ups: the writer; a reader (index reachable, unreachable, and a base install without
psycopg: `import psycopg` fails through a stub package on PYTHONPATH, not a second
virtualenv, which would cost a minute); a node that ran `artstore pull` and is now offline
(bucket and index on ports nothing listens on), and one that did not (the control: doctor
must say no there); the embedded default, and the same with its index file corrupt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import (
    FAKE_AWS,
    PROGRAMS,
    TEAM_KEY,
    TEAM_PUB,
    artstore,
    clean_env,
)
from test_doctor import human_verdict

from artifactstore import config
from artifactstore.cli import doctor_chain
from artifactstore.runtime.session import Session

POLICIES = Path(__file__).resolve().parents[1] / "infra" / "policies"
# Ports nothing listens on: an offline node's bucket and index.
DEAD_S3 = "http://127.0.0.1:9"
DEAD_INDEX = "postgresql+psycopg://artstore_reader@127.0.0.1:9/artstore"
# Rows a working reader must not see: they are about connecting to the index or writing.
FALSE_FOR_READERS = ("not granted namespace", "not yet bound", "writes unsigned entries")


@dataclass
class Outcome:
    """What a program did and what doctor said, in one environment."""

    program: dict[str, Any]  # job.py's result line; its "store": process_stats()
    code: int
    report: dict[str, Any]
    table: str  # the human output
    verdict: str

    @property
    def stats(self) -> dict[str, int]:
        """The program's process_stats(), every count present (absent ones are 0)."""
        return {"hits": 0, "tier_hits": 0, "stored": 0, **self.program["store"]}

    def program_used(self) -> str:
        """What the program did with the store: stored something (read-write), loaded
        something (read-only), or neither (no)."""
        if self.stats.get("stored", 0):
            return "read-write"
        return "read-only" if self.stats.get("hits", 0) else "no"


PSQL = ["psql", "-X", "-q", "-h", devstack.HOST, "-p", str(devstack.PG_PORT), "-U", "postgres"]


def _psql(dbname: str, *args: str, check: bool = True) -> None:
    """psql as the superuser on `dbname`, stopping at the first error."""
    argv = [*PSQL, "-v", "ON_ERROR_STOP=1", "-d", dbname, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0 or not check, proc.stderr


def side_by_side(env: dict[str, str], **program_env: str) -> Outcome:
    """job.py, then `artstore doctor` --json and the table (together), in `env`. Not all
    three at once: on a loaded machine the moto server then answers a program late."""
    job = subprocess.run(
        [sys.executable, str(PROGRAMS / "job.py")],
        env={**env, **program_env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    argv = [sys.executable, "-m", "artifactstore", "doctor"]
    doctors = [
        subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for args in ([*argv, "--json"], argv)
    ]
    (as_json, json_err), (table, table_err) = (p.communicate(timeout=300) for p in doctors)
    for proc, err in zip(doctors, (json_err, table_err), strict=True):
        assert proc.returncode in (0, 1) and "Traceback" not in err, err
    assert doctors[0].returncode == doctors[1].returncode, (as_json, table)
    report = json.loads(as_json)
    assert report["ok"] is (doctors[0].returncode == 0)
    program = json.loads(job.stdout.strip().splitlines()[-1])
    program["stderr"] = job.stderr
    return Outcome(program, doctors[0].returncode, report, table, human_verdict(table))


def agrees(seen: Outcome, *, as_configured: bool = True) -> None:
    """Doctor's `used` is what the program did; exit 0 exactly when it used the store
    (`as_configured`: the way its settings ask; a writer that stores nothing is not)."""
    used = seen.program_used()
    assert seen.report["used"] == used, (seen.stats, seen.verdict)
    assert (seen.code == 0) is (used != "no" and as_configured), (seen.stats, seen.verdict)
    if used == "no":
        assert "the store is not used" in seen.verdict
    else:
        assert "the store is not used" not in seen.verdict


# -- the team store of docs/team-setup.md, filled once by a writer ------------------------
@dataclass
class Team:
    writer: dict[str, str]  # docs §4: artstore_writer's login, signing and trusting
    reader: dict[str, str]  # docs §6: read-only, trusting, artstore_reader's login
    base: Path  # a directory for this module's caches
    filled: Outcome = field(init=False)  # the writer's first run, beside doctor

    def fresh(self, env: dict[str, str], **extra: str) -> dict[str, str]:
        """`env` with a cache directory (so a local tier) of its own: a new host."""
        cache = self.base / f"cache-{uuid.uuid4().hex[:8]}"
        cache.mkdir()
        return {**env, "XDG_CACHE_HOME": str(cache), **extra}


@pytest.fixture(scope="module")
def team(
    moto_endpoint: str, migrated_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Team]:
    tag = uuid.uuid4().hex[:10]
    name, namespace, login = f"artstore_setups_{tag}", f"setups-{tag}", f"artstore_t{tag}_w"
    devstack.create_database(name, template=migrated_template)
    bucket = f"artstore-{tag}"
    devstack.create_bucket(moto_endpoint, bucket)
    try:
        _psql(name, "-f", str(POLICIES / "postgres-roles.sql"))
        _psql(name, "-c", f'CREATE ROLE "{login}" LOGIN IN ROLE artstore_writer')
        grant = ["-v", f"namespace={namespace}", "-v", f"role={login}"]
        _psql(name, *grant, "-f", str(POLICIES / "grant-namespace.sql"))
        db = f"{devstack.HOST}:{devstack.PG_PORT}/{name}"
        common = clean_env(
            ARTSTORE_URL=f"s3://{bucket}/cache",
            ARTSTORE_NAMESPACE=namespace,
            AWS_ENDPOINT_URL_S3=moto_endpoint,
            ARTSTORE_TIMEOUT="30",  # loaded CI
            ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB),
            **FAKE_AWS,
        )
        writer = dict(
            common,
            ARTSTORE_INDEX=f"postgresql+psycopg://{login}@{db}",
            ARTSTORE_SIGNING_KEY=str(TEAM_KEY),
        )
        reader = dict(
            common,
            ARTSTORE_INDEX=f"postgresql+psycopg://artstore_reader@{db}",
            ARTSTORE_READ_ONLY="1",
        )
        base = tmp_path_factory.mktemp("setups")
        made = Team(writer, reader, base)
        made.filled = side_by_side(made.fresh(writer))
        yield made
    finally:
        devstack.drop_database(name)
        devstack.drop_roles(login, f"artstore_ns_{namespace}")


def _stored(team: Team) -> int:
    stored = team.filled.stats.get("stored", 0)
    assert stored > 0, (team.filled.stats, team.filled.program["stderr"], team.filled.verdict)
    return stored


def test_writer_stores_and_doctor_says_read_write(team: Team) -> None:
    seen = team.filled
    assert seen.stats["stored"] == len(seen.program["xla_compiles"]) > 0, seen.stats
    agrees(seen)
    assert seen.report["checks"]["access"]["stores"] is True


def _a_reader_loads_everything(seen: Outcome, team: Team) -> None:
    assert seen.stats["hits"] == _stored(team), (seen.stats, seen.program["stderr"])
    assert seen.program["xla_compiles"] == [], seen.stats
    agrees(seen)
    for wrong in FALSE_FOR_READERS:
        assert wrong not in seen.table, seen.table
    assert seen.report["checks"]["index"]["contacted"] is False  # as its programs


def test_reader_as_the_docs_set_it_up(team: Team) -> None:
    """docs §6: artstore_reader's login, granted no namespace (it never connects)."""
    seen = side_by_side(team.fresh(team.reader))
    _a_reader_loads_everything(seen, team)
    assert seen.verdict.endswith("(read-only)"), seen.verdict


def test_reader_whose_index_does_not_answer(team: Team) -> None:
    seen = side_by_side(team.fresh(team.reader, ARTSTORE_INDEX=DEAD_INDEX))
    _a_reader_loads_everything(seen, team)
    assert "psycopg" not in seen.program["imported"]


@pytest.fixture(scope="module")
def no_psycopg(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PYTHONPATH entry on which `import psycopg` fails as on a base install."""
    root = tmp_path_factory.mktemp("base-install")
    (root / "psycopg").mkdir()
    (root / "psycopg" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    return str(root)


def test_reader_on_a_base_install(team: Team, no_psycopg: str) -> None:
    """docs §1: readers need only the base package."""
    seen = side_by_side(team.fresh(team.reader, PYTHONPATH=no_psycopg))
    _a_reader_loads_everything(seen, team)


def test_writer_on_a_base_install_loads_and_stores_nothing(team: Team, no_psycopg: str) -> None:
    """A writer without the postgres extra (docs §1 asks for it): its programs load, and
    what they compile is not stored; doctor says so and names the extra."""
    seen = side_by_side(team.fresh(team.writer, PYTHONPATH=no_psycopg), JOB_SMALL_JITS="1")
    assert seen.stats["hits"] == _stored(team) and seen.program["xla_compiles"], seen.stats
    agrees(seen, as_configured=False)
    assert "artifactstore[postgres]" in seen.verdict


def test_pulled_node_offline(team: Team) -> None:
    """docs §7: `artstore pull`, then bucket and index unreachable: the tier answers."""
    node = team.fresh(team.reader)
    pulled = artstore("pull", env=node)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    seen = side_by_side(dict(node, AWS_ENDPOINT_URL_S3=DEAD_S3, ARTSTORE_INDEX=DEAD_INDEX))
    _a_reader_loads_everything(seen, team)
    assert seen.stats["tier_hits"] == _stored(team), seen.stats
    assert seen.report["checks"]["object_store"]["status"] != "ok"  # said, not hidden


def test_offline_node_never_pulled_is_not_used(team: Team) -> None:
    """The control: nothing answers and the tier is empty; programs compile everything."""
    node = team.fresh(team.reader, AWS_ENDPOINT_URL_S3=DEAD_S3, ARTSTORE_INDEX=DEAD_INDEX)
    seen = side_by_side(node)
    assert seen.stats["hits"] == 0 and len(seen.program["xla_compiles"]) == _stored(team)
    agrees(seen)


# -- the embedded default --------------------------------------------------------------
def test_embedded_default_and_its_index_corrupt(tmp_path: Path) -> None:
    """The default (a directory and a SQLite index in it): the first program stores. With
    the index file then corrupt, programs still load (the directory is their tier, and
    manifests need no index) and store nothing: degraded, never "not used"."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    first = side_by_side(env)
    assert first.stats["stored"] == len(first.program["xla_compiles"]) > 0, first.stats
    agrees(first)

    index = tmp_path / "store" / "index.db"
    for extra in ("-wal", "-shm"):
        Path(f"{index}{extra}").unlink(missing_ok=True)
    index.write_bytes(b"this is not a database " * 400)
    broken = side_by_side(env, JOB_SMALL_JITS="1")  # compiles that a working store would keep
    assert broken.stats["hits"] == first.stats["stored"] and broken.program["xla_compiles"]
    agrees(broken, as_configured=False)
    assert "corrupt" in broken.verdict and "`artstore db rebuild`" in broken.verdict


def test_doctor_judges_the_levels_in_the_order_programs_ask(tmp_path: Path) -> None:
    """doctor_chain's verdicts (the tier answers before the object store) hold only while
    a session's chain asks in that order."""
    session = Session(config.resolve({}, environ=clean_env(ARTSTORE_URL=str(tmp_path / "s"))))
    try:
        asked = [source.name for source in session.chain.sources]
        assert asked == [name for name in doctor_chain.LEVELS if name != "ahead"]
    finally:
        session.close()
