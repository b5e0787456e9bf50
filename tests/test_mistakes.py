"""Ordinary mistakes, as a team's writers and readers make them, and what each gets told.

One row per mistake (MISTAKES): how it changes the settings of docs/team-setup.md (the team
store of test_doctor_setups: moto S3, PostgreSQL with the roles of infra/policies, a signed
writer, a trusting reader), and for each tool it applies to (a writer program turned on by the
environment, `artstore warm`, `artstore doctor`, `artstore pull` on a reader) the exit code and
a fragment of what it says. After every run, nothing in the team's store changed: the bucket's
objects (hit journals aside) and the index's entries, objects and identities are as before.

Each program runs a program of its own (PLAIN_SCALE): a key nobody stored, so a writer whose
mistake did not stop it would store, and the store would change. Outcomes that other branches
deliver are xfail(strict) naming the branch: flip them when it is merged.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import PROGRAMS, artstore, artstore_warm, bucket_of, program, s3_client
from test_activation import activated_env
from test_doctor_setups import POLICIES, PSQL, Team, _psql
from test_doctor_setups import team as docs_team  # noqa: F401  (the fixture, by this name)

from artifactstore.config import variables

Env = dict[str, str]


@dataclass(frozen=True)
class Said:
    """What a tool must do: its exit code and a fragment of its output."""

    code: int
    says: str
    fixed_on: str = ""  # the branch that makes it so, where that is not merged yet, or why none


@dataclass(frozen=True)
class Mistake:
    name: str
    change: Callable[[Team, Env], Env]  # the settings with the mistake in them (Team, Place)
    program: Said | None = None  # a writer program turned on by the environment
    warm: Said | None = None
    doctor: Said | None = None
    pull: Said | None = None  # on a reader: reader settings with the same mistake


def _set(base: str, **changes: str) -> Callable[[Team, Env], Env]:
    """The writer's (or reader's) settings with `changes`, each a format string of the
    settings and the module's places (`places`)."""

    def change(team: Team, places: Env) -> Env:
        env = dict(team.writer if base == "writer" else team.reader)
        bucket, prefix = bucket_of(env)
        for name, value in changes.items():
            env[name] = value.format(**env, **places, bucket=bucket, prefix=prefix)
        return env

    return change


def _renamed(old: str, new: str, base: str = "writer") -> Callable[[Team, Env], Env]:
    """The writer's (or reader's) settings with variable `old` spelt `new`."""

    def change(team: Team, places: Env) -> Env:
        env = dict(team.writer if base == "writer" else team.reader)
        env[new] = env.pop(old)
        return env

    return change


def _typo(name: str) -> str:
    """`name` as a hurried hand types it: its last two letters swapped."""
    return name[:-2] + name[-1] + name[-2]


# Open, on no branch yet (found by this catalogue; xfail names them, as for the branches):
# Each writer setting the team page exports, misspelt (the nearest real name is the fix).
WRITER_SETTINGS = ("ARTSTORE_INDEX", "ARTSTORE_NAMESPACE", "ARTSTORE_SIGNING_KEY",
                   "ARTSTORE_TRUSTED_KEYS")  # fmt: skip


def _url_typo(spelt: str) -> Mistake:
    """The switch misspelt in the writer's settings (the index and keys set)."""
    hint = f"{spelt} is not an artifactstore variable and is ignored: did you mean ARTSTORE_URL?"
    return Mistake(
        f"typo {spelt}",
        _renamed("ARTSTORE_URL", spelt),
        program=Said(0, f"the store is off: ARTSTORE_URL is not set, but {spelt} (did you mean "
                        "ARTSTORE_URL?) is set"),
        doctor=Said(1, hint),
    )  # fmt: skip


def _alone(team: Team, places: Env) -> Env:
    """The switch misspelt and nothing else set: a shell that meant to turn the store on."""
    env = {k: v for k, v in team.writer.items() if not k.startswith("ARTSTORE_")}
    return {**env, "ARTSTORE_UR": team.writer["ARTSTORE_URL"]}


def _setting_typo(name: str, base: str, open_defect: str = "") -> Mistake:
    """`name` misspelt: programs say so and go on, doctor says so and that the store is not
    used as configured."""
    spelt = _typo(name)
    hint = f"{spelt} is not an artifactstore variable and is ignored: did you mean {name}?"
    return Mistake(
        f"typo {spelt}" + (", on a reader" if base == "reader" else ""),
        _renamed(name, spelt, base),
        program=Said(0, hint, open_defect),
        doctor=Said(1, hint),
    )


def _on_writer(
    name: str,
    change: Callable[[Team, Env], Env],
    says: str,
    *,
    program: str = "",
    warm: str = "",
    doctor: str = "",
) -> Mistake:
    """A writer's mistake: its program goes on (exit 0) and warm and doctor exit 1, each
    saying `says`; `program`, `warm`, `doctor`: the branch that makes that tool's so."""
    return Mistake(
        name,
        change,
        program=Said(0, says, program),
        warm=Said(1, says, warm),
        doctor=Said(1, says, doctor),
    )


def _on_reader(
    name: str, change: Callable[[Team, Env], Env], says: str, *, fixed_on: str = ""
) -> Mistake:
    """A reader's mistake: doctor and pull exit 1 saying `says` (`fixed_on`: where so)."""
    return Mistake(name, change, doctor=Said(1, says, fixed_on), pull=Said(1, says, fixed_on))


MISTAKES = (
    _url_typo("ARTSTORE_UR"),
    _url_typo("ARTSTORE_URLS"),
    Mistake(
        "typo ARTSTORE_UR, nothing else set",
        _alone,
        program=Said(0, "did you mean ARTSTORE_URL?"),
        doctor=Said(1, "did you mean ARTSTORE_URL?"),
    ),
    _setting_typo("ARTSTORE_INDEX", "writer"),
    _setting_typo("ARTSTORE_NAMESPACE", "writer"),
    _setting_typo("ARTSTORE_SIGNING_KEY", "writer"),
    _setting_typo("ARTSTORE_TRUSTED_KEYS", "reader"),
    _on_writer(
        "bucket that does not exist",
        _set("writer", ARTSTORE_URL="s3://{bucket}-typo/{prefix}"),
        "does not exist",
    ),
    _on_reader(
        "bucket that does not exist, on a reader",
        _set("reader", ARTSTORE_URL="s3://{bucket}-typo/{prefix}"),
        "does not exist",
    ),
    _on_writer(
        "an existing bucket that is not the team's",
        _set("writer", ARTSTORE_URL="s3://{other}/{prefix}"),
        "do not belong together",
    ),
    _on_reader(
        "an existing bucket that is not the team's, on a reader",
        _set("reader", ARTSTORE_URL="s3://{other}/{prefix}"),
        "never",
    ),
    _on_writer(
        "signing key file missing",
        _set("writer", ARTSTORE_SIGNING_KEY="{ARTSTORE_SIGNING_KEY}.gone"),
        "ARTSTORE_SIGNING_KEY",
    ),
    _on_writer(
        "database that does not exist",
        _set("writer", ARTSTORE_INDEX="{ARTSTORE_INDEX}_typo"),
        "does not exist",
    ),
    _on_writer(
        "a wrong database, created and migrated as doctor advises",
        _set("writer", ARTSTORE_INDEX="{created}"),
        "do not belong together",
    ),
    _on_writer(
        "namespace not granted to the login",
        _set("writer", ARTSTORE_NAMESPACE="{ARTSTORE_NAMESPACE}-typo"),
        "not granted",
    ),
    _on_writer(
        "S3 credentials the server does not know",
        _set("writer", AWS_ENDPOINT_URL_S3="{keyed}"),
        "credentials rejected",
    ),
    _on_reader(
        "S3 credentials the server does not know, on a reader",
        _set("reader", AWS_ENDPOINT_URL_S3="{keyed}"),
        "credentials rejected",
    ),
    _on_writer(
        "database login that does not exist",
        _set("writer", ARTSTORE_INDEX="{login_typo}"),
        "does not exist",
    ),
)
TOOLS = ("program", "warm", "doctor", "pull")


def _cases() -> list[Any]:
    cases = []
    for mistake, tool in itertools.product(MISTAKES, TOOLS):
        said: Said | None = getattr(mistake, tool)
        if said is None:
            continue
        why = (
            said.fixed_on if said.fixed_on.startswith("no branch") else f"fixed on {said.fixed_on}"
        )
        marks = [pytest.mark.xfail(strict=True, reason=why)]
        cases.append(pytest.param(mistake, tool, id=f"{mistake.name}-{tool}",
                                  marks=marks if said.fixed_on else []))  # fmt: skip
    return cases


def test_every_mistake_says_something_somewhere() -> None:
    assert all(any(getattr(m, tool) for tool in TOOLS) for m in MISTAKES)
    assert len({m.name for m in MISTAKES}) == len(MISTAKES)
    for name in ("ARTSTORE_URL", *WRITER_SETTINGS):  # each a real variable, its typo none
        assert name in variables.KNOWN and _typo(name) not in variables.KNOWN


@pytest.fixture(scope="module")
def places(docs_team: Team, moto_endpoint: str, migrated_template: str) -> Iterator[Env]:  # noqa: F811
    """What the mistakes name: another team's bucket (it exists, empty), a wrong database
    created and migrated as doctor advises, the writer's login granted there, and an S3
    server that checks keys (moto with authentication on: it knows none of the team's, as a
    server would not know a mistyped or expired key; the team's moto accepts any)."""
    tag = uuid.uuid4().hex[:10]
    other, name = f"artstore-other-{tag}", f"artstore_wrongdb_{tag}"
    devstack.create_bucket(moto_endpoint, other)
    devstack.create_database(name, template=migrated_template)
    team = docs_team
    login, _, server = team.writer["ARTSTORE_INDEX"].removeprefix(INDEX).partition("@")
    host = server.rpartition("/")[0]
    keyed = _keyed_moto()
    try:
        _psql(name, "-f", str(POLICIES / "postgres-roles.sql"))
        grant = ["-v", f"namespace={team.writer['ARTSTORE_NAMESPACE']}", "-v", f"role={login}"]
        _psql(name, *grant, "-f", str(POLICIES / "grant-namespace.sql"))
        yield {
            "other": other,
            "created": f"{INDEX}{login}@{host}/{name}",
            "login_typo": f"{INDEX}{login}x@{server}",
            "keyed": keyed.endpoint,
        }
    finally:
        keyed.stop()
        devstack.drop_database(name)


def _keyed_moto() -> Any:
    """A moto server that checks the keys it is sent (INITIAL_NO_AUTH_ACTION_COUNT=0)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
        return devstack.start_moto()


INDEX = "postgresql+psycopg://"


TABLES = (("entries", "namespace, key, digest, signer"), ("objects", "namespace, digest"),
          ("identities", "*"))  # fmt: skip


def _snapshot(team: Team) -> dict[str, list[str]]:
    """The team's store: its bucket's objects (hit journals aside: reports of reads) and its
    index's entries, objects and identities (one psql for the three tables)."""
    bucket, _ = bucket_of(team.writer)
    listing = s3_client(team.writer).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    objects = [f"{o['Key']} {o['ETag']}" for page in listing for o in page.get("Contents", [])]
    database = team.writer["ARTSTORE_INDEX"].rpartition("/")[2]
    psql = [*PSQL, "-At", "-d", database]
    for table, columns in TABLES:
        psql += ["-c", f"SELECT '#{table}'", "-c", f"SELECT {columns} FROM {table} ORDER BY 1, 2"]
    out = subprocess.run(psql, capture_output=True, text=True, check=True).stdout
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("#") and line[1:] in dict(TABLES) and line[1:] not in rows:
            rows[line[1:]] = []
        else:
            rows[list(rows)[-1]].append(line)
    return {"bucket": sorted(k for k in objects if "/journals/" not in k), **rows}


@pytest.fixture(scope="module")
def as_it_was(docs_team: Team) -> dict[str, list[str]]:  # noqa: F811
    """The team's store before any mistake: every case must leave it so (a mistake never
    writes), so one snapshot is what each case compares with; a case that changed it fails
    there (and the cases after it with it)."""
    return _snapshot(docs_team)


def _run(tool: str, env: Env, tmp_path: Path) -> tuple[int, str]:
    """The tool's exit code and what it said (stdout and stderr), in `env`."""
    own = {"PLAIN_SCALE": f"3.{uuid.uuid4().int % 10**9}"}  # a key nobody stored
    if tool == "program":
        proc = program("plain_jax.py", activated_env(env, **own))
        return proc.returncode, proc.stdout + proc.stderr
    if tool == "warm":
        code, _, said = artstore_warm(
            "--", sys.executable, str(PROGRAMS / "plain_jax.py"),
            env={**env, **own}, tmp_path=tmp_path,
        )  # fmt: skip
        return code, said
    proc = artstore(tool, env=env)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(("mistake", "tool"), _cases())
def test_a_mistake_is_named_and_changes_nothing(
    mistake: Mistake,
    tool: str,
    docs_team: Team,  # noqa: F811
    places: Env,
    as_it_was: dict[str, list[str]],
    tmp_path: Path,
) -> None:
    """The tool exits as the row says, says what the row says, and the team's store is as
    it was: a mistake never writes into it.

    Slow: 10-35 s on 2 busy cores: a JAX program, or `artstore warm` running one, in fresh
    processes against moto and PostgreSQL; the module's team store is filled once (1-3 min).
    """
    team = docs_team
    env = team.fresh(mistake.change(team, places))
    code, said = _run(tool, env, tmp_path)
    expected: Said = getattr(mistake, tool)
    assert "Traceback" not in said, said
    # Tables wrap long lines (and words): the fragment, as said, less whitespace.
    found = "".join(expected.says.split()) in "".join(said.split())
    assert (code, found) == (expected.code, True), said[-3000:]
    assert _snapshot(team) == as_it_was


def test_a_typo_in_any_other_variable_is_named_by_doctor(
    docs_team: Team,  # noqa: F811
    as_it_was: dict[str, list[str]],
) -> None:
    """Every other `ARTSTORE_*` variable misspelt at once, on the writer: doctor names each
    with the variable meant, and still says the store is used (they are ignored)."""
    meant = sorted(row.env for row in variables.VARIABLES
                   if row.env not in ("ARTSTORE_URL", *WRITER_SETTINGS))  # fmt: skip
    team = docs_team
    env = team.fresh(team.writer, **{_typo(name): "1" for name in meant})
    proc = artstore("doctor", env=env)
    said = "".join(proc.stdout.split())
    line = "{}isnotanartifactstorevariableandisignored:didyoumean{}?"
    missed = [name for name in meant if line.format(_typo(name), name) not in said]
    assert (proc.returncode, missed) == (0, []), proc.stdout
    assert _snapshot(team) == as_it_was
