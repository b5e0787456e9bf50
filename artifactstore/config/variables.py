"""The `ARTSTORE_*` variables that are not settings, and the typo check all of them allow.

A variable in neither table is a typo, warned about once, naming the nearest real one
(`typos`): an unknown name is otherwise ignored, so `READONLY=1` for `READ_ONLY` would
leave a process read-write, and `NAMESPCE` would write to `default`, without a word.
Programs warn at configure/activation, the CLI on stderr, `artstore doctor` in a row.
Where nothing turns the store on (`off_line`: no `ARTSTORE_URL`), a typo would otherwise
go unsaid, a mistyped `ARTSTORE_URL` above all: the start-up hook says it when the
program imports JAX, and doctor's verdict is "off". Known names never count there: every
setting is read without `ARTSTORE_URL` too (by `configure()` in a program, and by the
`artstore` commands).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from artifactstore.config.defaults import ENV_PREFIX
from artifactstore.config.rows import Var
from artifactstore.config.table import BY_KEYWORD, SETTINGS

_SECRET = "(read by infra/policies/postgres-roles.sql, never by artifactstore)"

# Read where they act (`keyword` None); `internal` ones are set by us for our children.
OTHERS: tuple[Var[None], ...] = (
    Var(
        "ACTIVATE",
        None,
        "1 or 0",
        None,
        "`1` turns the store on with the embedded default in every Python process of this "
        "environment that imports JAX (`ARTSTORE_URL` alone does too); `0` turns activation "
        "off for one process or a subtree of `artstore run`.",
    ),
    Var("DEBUG", None, "1", None, "`1`: a failing `artstore` command prints its traceback."),
    Var(
        "WARM",
        None,
        "directory",
        None,
        "Internal: set by `artstore warm` for the processes it starts.",
        internal=True,
    ),
    Var(
        "RUN",
        None,
        "directory",
        None,
        "Internal: set by `artstore run` (and `pytest --artstore`) for the processes it starts.",
        internal=True,
    ),
    Var("ADMIN_PASSWORD", None, "secret", None, f"The admin role's password {_SECRET}."),
    Var("WRITER_PASSWORD", None, "secret", None, f"The writer role's password {_SECRET}."),
    Var("READER_PASSWORD", None, "secret", None, f"The reader role's password {_SECRET}."),
    Var("GC_PASSWORD", None, "secret", None, f"The gc role's password {_SECRET}."),
    Var(
        "TEST_READERS",
        None,
        "count",
        None,
        "Internal: how many readers tests/test_readers_at_scale.py starts.",
        internal=True,
    ),
)

VARIABLES: tuple[Var[Any], ...] = SETTINGS + OTHERS
KNOWN: frozenset[str] = frozenset(row.env for row in VARIABLES)


def typos(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Each `ARTSTORE_*` variable set here that no row declares, with the nearest one
    that is (None: nothing close), sorted by name."""
    env = os.environ if environ is None else environ
    suffixes = [row.name for row in VARIABLES]
    found = []
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n not in KNOWN):
        # By suffix: the shared prefix would make every name look close to every other.
        near = difflib.get_close_matches(name[len(ENV_PREFIX) :], suffixes, n=1, cutoff=0.6)
        found.append((name, ENV_PREFIX + near[0] if near else None))
    return found


def typo_lines(environ: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per unknown variable, for a log line, stderr or a doctor row."""
    lines = []
    for name, near in typos(environ):
        hint = f"did you mean {near}?" if near else "see the configuration reference"
        lines.append(f"{name} is not an artifactstore variable and is ignored: {hint}")
    return lines


def off_line(environ: Mapping[str, str] | None = None) -> str | None:
    """One sentence for a process the environment does not turn the store on in, where
    `ARTSTORE_*` names that are none of ours are set (None where none is), each with the
    nearest real one: what was probably meant instead."""
    named = [
        f"{name} ({f'did you mean {near}?' if near else 'no such variable'})"
        for name, near in typos(environ)
    ]
    if not named:
        return None
    said = f"{named[0]} is" if len(named) == 1 else f"{', '.join(named)} are"
    return f"the store is off: {ENV_PREFIX}URL is not set, but {said} set"


def from_environment(keyword: str, environ: Mapping[str, str] | None = None) -> str:
    """A setting's variable as this environment sets it ("" when unset), for the few
    places that must know what the environment said rather than what a program chose."""
    env = os.environ if environ is None else environ
    return env.get(BY_KEYWORD[keyword].env, "")


def to_environment(overrides: Mapping[str, object]) -> dict[str, str]:
    """The variables that say what `overrides` (configure() keywords; others ignored)
    say, for a child process (`artstore run`, `warm`): booleans as 1/0."""
    env = {}
    for keyword, value in overrides.items():
        row = BY_KEYWORD.get(keyword)
        if row is not None and value is not None:
            env[row.env] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return env
