"""What an index error means, and the command that fixes it: one classifier for doctor,
`db check` and every command's error line (no engine of its own: anything may use it)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import make_url

from artifactstore.errors import one_line


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite index URL; None for other databases and in-memory ones."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database.removeprefix("file:").split("?")[0])


# -- what an index error means, and the command that fixes it --------------------------
Kind = Literal[
    "unreachable",  # no answer: the server is down, the host or port wrong, a timeout
    "permission",  # the file system refuses this user the file or its directory
    "corrupt",  # a SQLite file that is not (or no longer) a database
    "auth",  # the server refuses the login: user, password, pg_hba
    "no_database",  # the server answers, the database does not exist
    "missing_grant",  # the role lacks a privilege on a table or the database
    "namespace",  # row-level security: the role is not granted this namespace
    "schema",  # the schema is older or newer than this version's
    "read_only",  # the index may not be written here
    "busy",  # another process holds a lock longer than ARTSTORE_TIMEOUT
    "config",  # the URL or a setting is invalid
    "other",
]
_POLICIES = "infra/policies"


@dataclass(frozen=True)
class Diagnosis:
    """One index failure: its kind, what is wrong, and the command that fixes it."""

    kind: Kind
    problem: str
    hint: str

    def __str__(self) -> str:
        return f"{self.problem}: {self.hint}"


def diagnose(
    exc: BaseException, url: str, *, namespace: str | None = None, write: bool | None = None
) -> Diagnosis:
    """What `exc`, raised opening or using the index at `url`, means (one place decides
    permission / unreachable / corrupt / missing grant / schema for doctor and every
    command). `write`: whether the statement wrote (None: unknown)."""
    from artifactstore.errors import ConfigError, PrivilegeRefused, ReadOnlyError, SchemaMismatch

    if isinstance(exc, TimeoutError):
        return _unreachable(url, "no answer in time")
    if isinstance(exc, SchemaMismatch):
        problem, _, hint = str(exc).rpartition(": ")
        return Diagnosis("schema", problem or str(exc), hint or "run `artstore db upgrade`")
    if isinstance(exc, ConfigError):
        return Diagnosis("config", str(exc), "fix ARTSTORE_INDEX (`artstore doctor` checks it)")
    if isinstance(exc, PrivilegeRefused | ReadOnlyError):
        cause = exc.__context__  # the driver's error (raised `from None`, still kept)
        if cause is not None and not isinstance(cause, ReadOnlyError):
            return diagnose(cause, url, namespace=namespace, write=write)
        if isinstance(exc, PrivilegeRefused):
            problem, _, hint = str(exc).rpartition(": ")
            return Diagnosis("missing_grant", problem or str(exc), hint)
        problem, _, hint = str(exc).rpartition(": ")
        return Diagnosis("read_only", problem or str(exc), hint)
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, PermissionError):
        where = orig.filename or sqlite_path(url) or url
        return _permission(Path(str(where)))
    path = sqlite_path(url)
    if path is None and type(orig).__module__ == "sqlite3":
        path = Path("(the SQLite index)")
    if path is not None:
        return _sqlite(orig, path)
    return _postgres(orig, url, namespace=namespace, write=write)


def _reason(exc: BaseException) -> str:
    return one_line(exc)


def _parts(url: str) -> tuple[str, int, str, str]:
    """(host, port, database, role) of a server's URL, placeholders where not known."""
    try:
        parsed = make_url(url)
    except Exception:
        return "HOST", 5432, "DATABASE", "ROLE"
    return (
        parsed.host or "localhost",
        parsed.port or 5432,
        parsed.database or "DATABASE",
        parsed.username or "ROLE",
    )


def _unreachable(url: str, why: str) -> Diagnosis:
    host, port, _, _ = _parts(url)
    return Diagnosis(
        "unreachable",
        f"the index database at {host}:{port} does not answer ({why})",
        f"start it or fix the host and port in ARTSTORE_INDEX; "
        f"`pg_isready -h {host} -p {port}` says when it answers",
    )


def _permission(path: Path) -> Diagnosis:
    """The nearest part of `path` this user may not use, its owner, and the fix."""
    path = Path(os.path.abspath(path))
    existing = _nearest_existing(path)
    if existing is not None and existing != path:
        return _cannot_create(path, existing)
    blocked = path
    for part in reversed([path, *path.parents]):
        try:
            os.stat(part)
        except PermissionError:
            blocked = part.parent
            break
        except OSError:
            break
        last = part == path  # the path itself is read; the directories above, traversed
        want = (os.R_OK if last else 0) | (os.X_OK if part.is_dir() else 0)
        if want and not os.access(part, want):
            blocked = part
            break
    try:
        owner = f"uid {blocked.stat().st_uid}"
    except OSError:
        owner = "its owner"
    return Diagnosis(
        "permission",
        f"permission denied: {blocked} may not be read by this user (uid {os.geteuid()})",
        f"run as {owner}, or have it run `chmod -R a+rX {blocked}`, or point "
        "ARTSTORE_URL / ARTSTORE_INDEX at a store this user may read",
    )


def _nearest_existing(path: Path) -> Path | None:
    """`path` or its nearest ancestor that exists; None where one cannot be looked at
    (a directory above may not be searched: the caller names that one)."""
    for part in [path, *path.parents]:
        try:
            os.stat(part)
            return part
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def _cannot_create(path: Path, existing: Path) -> Diagnosis:
    """`path` does not exist and this user may not make it in `existing`: chmod on `path`
    would name nothing; the fix is to create it where one may, or to choose another."""
    try:
        owner = f"uid {existing.stat().st_uid}"
    except OSError:
        owner = "its owner"
    return Diagnosis(
        "permission",
        f"cannot create {path}: {existing}, the nearest directory that exists, may not be "
        f"written by this user (uid {os.geteuid()})",
        f"create it as {owner} (`mkdir -p {path}`, then `chown` it to this user), or point "
        "ARTSTORE_URL / ARTSTORE_INDEX at a directory this user may write",
    )


def _sqlite(orig: BaseException, path: Path) -> Diagnosis:
    code = getattr(orig, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(orig).lower()
    if primary in (11, 26) or "not a database" in text or "malformed" in text:
        return Diagnosis(
            "corrupt",
            f"the index file {path} is corrupt ({_reason(orig)})",
            "`artstore db rebuild` moves it aside and recreates it from the objects",
        )
    if primary in (5, 6) or "locked" in text:
        return Diagnosis(
            "busy",
            f"the index file {path} is locked by another process ({_reason(orig)})",
            "retry when it is done, or raise ARTSTORE_TIMEOUT",
        )
    if primary in (8, 23) or "readonly" in text:
        return Diagnosis(
            "read_only",
            f"the index file {path} may not be written by this user",
            f"run as a writer (a user who may write {path.parent}), or set "
            "ARTSTORE_READ_ONLY=1 where this host only loads",
        )
    denied = _permission(path)
    if primary == 14 or isinstance(orig, OSError):
        if "may not be read" in denied.problem and not _readable(path):
            return denied
        if not path.parent.exists():
            return Diagnosis(
                "other",
                f"the index's directory {path.parent} does not exist",
                "fix ARTSTORE_INDEX, or run `artstore db upgrade` as a writer to create it",
            )
    return Diagnosis(
        "other",
        f"the index file {path} cannot be used ({_reason(orig)})",
        "`artstore db check` says whether `artstore db rebuild` would fix it",
    )


def _readable(path: Path) -> bool:
    try:
        if path.exists():
            return os.access(path, os.R_OK) and os.access(path.parent, os.R_OK | os.X_OK)
        return os.access(path.parent, os.X_OK)
    except OSError:
        return False


def _postgres(
    orig: BaseException, url: str, *, namespace: str | None, write: bool | None
) -> Diagnosis:
    host, _, database, role = _parts(url)
    state = getattr(orig, "sqlstate", None)
    text = str(orig)
    reason = _reason(orig)
    superuser = f"a superuser runs `psql -d {database} -f {_POLICIES}/postgres-roles.sql`"
    if state == "42501" or "permission denied" in text:
        if "row-level security" in text:  # the same words whichever table refused
            return namespace_not_granted(url, namespace)
        if "for database" in text or "CONNECT privilege" in text:
            return Diagnosis(
                "missing_grant",
                f"role {role} may not connect to database {database} ({reason})",
                f"{superuser}, and makes {role} a member of artstore_writer or artstore_reader",
            )
        table = re.search(r"for (?:table|relation|sequence) (\S+)", text)
        if table and table.group(1) == "quotas":  # readers and writers may only read them
            return Diagnosis(
                "missing_grant",
                f"role {role} may not change quotas ({reason})",
                "quotas are the gc role's to set (readers and writers only read them, by "
                "design): run `artstore quota` with ARTSTORE_INDEX naming a login of "
                f"artstore_gc, e.g. postgresql+psycopg://artstore_gc@{host}/{database}",
            )
        what = "write" if write else "read" if write is False else "use"
        privilege = {"write": "INSERT/UPDATE", "read": "SELECT"}.get(what, "a privilege")
        on = f" on table {table.group(1)}" if table else ""
        return Diagnosis(
            "missing_grant",
            f"role {role} lacks {privilege}{on}: the index refused this {what} ({reason})",
            f"{superuser} (again after every `artstore db upgrade`: it grants on new tables); "
            f"{role} must be a member of artstore_reader (reads) or artstore_writer (writes)",
        )
    if (
        state in ("28P01", "28000")
        or "authentication failed" in text
        or ("role" in text and "does not exist" in text)
    ):
        return Diagnosis(
            "auth",
            f"the index database refused login {role} ({reason})",
            "fix the user or password in ARTSTORE_INDEX, or create the login "
            f"(`CREATE ROLE {role} LOGIN IN ROLE artstore_writer`)",
        )
    if state == "3D000" or ("database" in text and "does not exist" in text):
        return Diagnosis(
            "no_database",
            f"the index database {database} does not exist",
            f"`createdb -h {host} {database}`, then `artstore db upgrade`",
        )
    if state in ("42P01", "42703"):
        return Diagnosis(
            "schema", f"the index lacks part of its schema ({reason})", "run `artstore db upgrade`"
        )
    if state == "25006":
        return Diagnosis(
            "read_only", "the index is read-only here", "unset ARTSTORE_READ_ONLY to write"
        )
    if state in ("55P03", "57014", "40P01"):
        return Diagnosis(
            "busy", f"the index is busy ({reason})", "retry, or raise ARTSTORE_TIMEOUT"
        )
    if state is None or state.startswith("08") or state.startswith("57P"):
        detail = "timeout" if "timeout" in text.lower() else reason
        return _unreachable(url, detail)
    return Diagnosis(
        "other", f"the index database failed ({reason})", "`artstore db check` names the fix"
    )


def namespace_not_granted(url: str, namespace: str | None, reason: str = "") -> Diagnosis:
    """Row-level security hides and refuses every row of a namespace the login was not
    granted (infra/policies/grant-namespace.sql)."""
    _, _, database, role = _parts(url)
    ns = namespace or "NAMESPACE"
    return Diagnosis(
        "namespace",
        f"role {role} is not granted namespace {ns}: it sees no entries there and "
        "every write is refused" + (f" ({reason})" if reason else ""),
        f"a superuser runs `psql -d {database} -v namespace={ns} -v role={role} "
        f"-f {_POLICIES}/grant-namespace.sql`",
    )
