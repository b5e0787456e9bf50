"""`artstore doctor`'s rows about the store itself: object store, index, access, binding,
trust.

Each row says what a program here would do with it: use it read-write, use it
read-only (a store this user may only read is loaded from; nothing compiled is stored),
or not at all, and why. An index failure is classified once (`index.diagnosis.diagnose`:
unreachable, permission, corrupt, missing grant, namespace, schema) so that doctor and
every command name the same fix. Nothing is created, migrated or written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactstore import config as _config
from artifactstore.cli import doctor_chain
from artifactstore.cli.doctor_report import Check, Status
from artifactstore.errors import ArtstoreError, ConfigError, one_line
from artifactstore.index import diagnosis, grants, health
from artifactstore.process.background import call_with_timeout
from artifactstore.redact import redact

if TYPE_CHECKING:
    from artifactstore.index.db import SchemaStatus


def check_objects(settings: _config.Settings) -> Check:
    """The object store answers: a bounded HEAD of the bucket, or a usable directory
    (readable: used; writable too: used read-write)."""
    from artifactstore.blobstores import open_blobstore

    where = settings.blobs.describe()
    data: dict[str, Any] = {"url": where, "writable": None}
    if settings.blobs.scheme == "file":
        base = Path(settings.blobs.path) / settings.namespace
        problem, state = dir_state(base, write=not settings.read_only)
        if problem:
            return _dir_problem("object store", base, problem, data)
    try:
        blobs = open_blobstore(settings)
        call_with_timeout(blobs.check, settings.timeout_secs)
    except TimeoutError:
        return unanswered("object store", where, settings, data)
    except PermissionError as exc:
        found = diagnosis.diagnose(exc, "")
        return Check("object store", "fail", found.problem, verdict=str(found), data=data)
    except Exception as exc:
        why = str(exc) if isinstance(exc, ArtstoreError) else one_line(exc)
        fix = _s3_fix(settings, why) if settings.blobs.scheme == "s3" else ""
        return Check(
            "object store", "fail", why, data=data, verdict=f"object store unusable: {why}{fix}"
        )
    if settings.blobs.scheme == "s3":
        data["writable"] = not settings.read_only  # a bucket's write grant is not readable
        detail = f"{blobs.describe()}: answers"
    else:
        data["writable"] = state != "readable only"
        if state == "readable only" and not settings.read_only:
            detail = (
                f"{base}: readable, not writable by this user: programs load from it and "
                "store nothing"
            )
            return Check("object store", "warn", detail, data=data)
        detail = f"{blobs.describe()}: {state}"
    return _held(settings, blobs, detail, data)


def _held(settings: _config.Settings, blobs: Any, detail: str, data: dict[str, Any]) -> Check:
    """The row of an object store that answers, saying where its namespace never held an
    entry (`blobstores.never_held`): a reader there loads nothing (degraded: a wrong
    bucket or prefix, likely); a writer there is the first (it creates the identity)."""
    from artifactstore.blobstores import never_held

    try:
        never = call_with_timeout(lambda: never_held(blobs, settings), settings.timeout_secs)
    except Exception as exc:  # the listing or the identity refused: not known
        return Check("object store", "ok", f"{detail} (not listed: {one_line(exc)})", data=data)
    data["never_held"] = never
    if never is None:
        return Check("object store", "ok", detail, data=data)
    if settings.read_only:
        row = f"{detail}, but {never}"
        return Check("object store", "warn", row, never, data=data, degrades=True)
    first = "; it never held an entry: the first writer creates its identity"
    return Check("object store", "ok", detail + first, data=data)


def _s3_fix(settings: _config.Settings, why: str) -> str:
    bucket = settings.blobs.describe()
    if any(w in why for w in ("AccessDenied", "Forbidden", "403")):
        return (
            f": this host's credentials may not read it: grant infra/policies/"
            f"s3-reader.json or s3-writer.json (`aws s3 ls {bucket}` checks)"
        )
    if any(w in why for w in ("NoSuchBucket", "404", "Not Found")):
        return f": create it (`aws s3 mb s3://{settings.blobs.bucket}`)"
    return f": `aws s3 ls {bucket}` shows whether this host reaches it"


def _dir_problem(label: str, path: Path, problem: str, data: dict[str, Any]) -> Check:
    if problem == "permission denied":
        found = diagnosis.diagnose(PermissionError(13, "Permission denied", str(path)), "")
        return Check(label, "fail", found.problem, verdict=f"{label}: {found}", data=data)
    fix = (
        "run `artstore db upgrade` as a writer, or fix ARTSTORE_URL"
        if problem == "does not exist"
        else f"fix ARTSTORE_URL or the directory (`ls -ld {path}` shows its owner and mode)"
    )
    return Check(
        label, "fail", f"{path}: {problem}", data=data, verdict=f"{label} {path} {problem}: {fix}"
    )


def check_index(settings: _config.Settings) -> Check:
    """The index answers, this user may read (and write) it, and its schema is (or will
    by itself become) current. `data["writes"]`: why writes would be refused, or None."""
    shown = redact(settings.index_url)
    if not doctor_chain.index_contacted(settings):
        return doctor_chain.not_contacted(settings, shown)
    data: dict[str, Any] = {"url": shown, "writes": None, "kind": None}
    try:
        schema = call_with_timeout(lambda: _read_schema(settings, shown), settings.timeout_secs)
    except TimeoutError:
        return unanswered("index", shown, settings, data)
    except ConfigError as exc:
        return Check("index", "fail", str(exc), verdict=f"index: {exc}", data=data)
    except Exception as exc:
        found = (
            exc.found
            if isinstance(exc, _Found)
            else diagnosis.diagnose(
                exc, settings.index_url, namespace=settings.namespace, write=False
            )
        )
        data["kind"] = found.kind
        return Check(
            "index", "fail", f"{shown}: {found.problem}", data=data, verdict=f"index: {found}"
        )
    return _schema_check(settings, schema, shown, data)


@dataclass(frozen=True)
class _Schema:
    """What doctor read of the index: its schema, its dialect, and why this user's
    writes would be refused (None: they would not)."""

    status: SchemaStatus
    dialect: str
    refused: str | None


def _read_schema(settings: _config.Settings, shown: str) -> _Schema:
    """The index's schema and this user's access to it; a missing SQLite file is an empty
    schema (doctor does not create it). Raises what opening or asking it raised, or
    `_Found` where the index is damaged."""
    from artifactstore.index import db
    from artifactstore.store.backends import unchecked_index

    sqlite_file = diagnosis.sqlite_path(settings.index_url)
    if sqlite_file is not None and not sqlite_file.exists():
        return _Schema(db.SchemaStatus(db.SchemaState.EMPTY, None, db.SCHEMA_HEAD), "sqlite", None)
    engine = unchecked_index(settings)
    try:
        status = db.schema_status(engine)
        refused = None
        if not settings.read_only and db.read_only_reason(engine) is not None:
            refused = f"the index {sqlite_file or shown} is read-only for this user"
        if status.state is db.SchemaState.CURRENT:
            problem = health.integrity_problem(engine)
            if problem is not None:
                raise _Found(problem)
            if engine.dialect.name == "postgresql":
                refused = _pg_access(engine, settings) or refused
        return _Schema(status, engine.dialect.name, refused)
    finally:
        engine.dispose()


def _schema_check(
    settings: _config.Settings, schema: _Schema, shown: str, data: dict[str, Any]
) -> Check:
    """The verdict on a schema read: current, brought current on first use (where its
    directory lets it be created), or what to run."""
    from artifactstore.index import db
    from artifactstore.store import migrates_on_open

    status, refused = schema.status, schema.refused
    sqlite_file = diagnosis.sqlite_path(settings.index_url)
    data["writes"] = refused
    revision = status.current or "not created"
    auto = migrates_on_open(settings, schema.dialect, status.state) and refused is None
    data.update(
        revision=status.current,
        head=status.head,
        schema=status.state.value,
        needs_upgrade=status.state is not db.SchemaState.CURRENT and not auto,
    )
    if status.state is db.SchemaState.CURRENT:
        return Check("index", "ok", f"{shown}: schema {revision} (current)", data=data)
    if auto:
        if sqlite_file is not None and not sqlite_file.exists():
            problem, _ = dir_state(sqlite_file.parent, write=True)
            if problem:
                return _dir_problem("index", sqlite_file.parent, problem, data)
        return Check(
            "index",
            "ok",
            f"{shown}: schema {revision}, brought to {status.head} on first use",
            data=data,
        )
    if settings.read_only and status.state is db.SchemaState.EMPTY and sqlite_file is not None:
        verdict = (
            f"no index at {sqlite_file} yet: a reader (ARTSTORE_READ_ONLY) does not "
            "create one; run `artstore db upgrade` as a writer"
        )
    else:
        verdict = status.problem() or ""
    return Check(
        "index",
        "fail",
        f"{shown}: schema {revision} ({status.state.value})",
        verdict=verdict,
        data=data,
    )


class _Found(Exception):
    def __init__(self, found: diagnosis.Diagnosis) -> None:
        super().__init__(str(found))
        self.found = found


def _pg_access(engine: Any, settings: _config.Settings) -> str | None:
    """Why this role's writes (or, for a reader, reads) would be refused: a missing table
    privilege or an ungranted namespace (row-level security); None if they would not."""
    url = settings.index_url
    access = grants.login_access(engine, settings.namespace, write=not settings.read_only)
    if access.missing:
        role = engine.url.username or "(default)"
        denied = _Denied(f"permission denied for table {access.missing[0].split()[-1]}")
        found = diagnosis.diagnose(denied, url, write=not settings.read_only)
        return f"role {role} lacks {', '.join(access.missing)}: {found.hint}"
    if access.granted:
        return None
    return str(diagnosis.namespace_not_granted(url, settings.namespace))


class _Denied(Exception):
    sqlstate = "42501"


def check_binding(settings: _config.Settings, index: dict[str, Any]) -> Check:
    """Whether object store and index are one store (artifactstore.store.identity); only
    read. A mismatch degrades: programs here load, but every write is refused there."""
    from artifactstore.store.identity import MISMATCH, UNBOUND, describe

    refusal = ""
    try:
        if index.get("schema") == "empty" and (taken := _taken(settings)):
            state, detail = MISMATCH, f"MISMATCH: {taken}"
            refusal = f"a writer there refuses to write: {taken}"
        elif index.get("schema") != "current":  # not migrated yet: not opened
            state, detail = UNBOUND, "not yet bound: the index is not at this version's schema"
        else:
            found = call_with_timeout(lambda: describe(settings), settings.timeout_secs)
            state, detail, refusal = found
    except Exception as exc:
        state, detail = "unknown", f"not checked ({one_line(exc)})"
    status: Status = "fail" if state == MISMATCH else "ok" if state == "bound" else "warn"
    verdict = f"writes are refused here: {refusal}" if state == MISMATCH else ""
    mismatch = state == MISMATCH
    data = {"state": state}
    return Check("binding", status, detail, verdict, False, data, degrades=mismatch)


def wrong_database(settings: _config.Settings, index: Check) -> Check:
    """`index` as doctor shows it where the index does not exist yet (no database, no
    schema) but the object store already has an identity: then the index is most likely
    the wrong database, and the usual fix (createdb, `artstore db upgrade`) would make a
    second index over that store, which writers refuse (artifactstore.store.identity).
    So the verdict says that first."""
    if index.status != "fail" or not (
        index.data.get("kind") == "no_database" or index.data.get("schema") == "empty"
    ):
        return index
    try:
        taken = _taken(settings)
    except Exception:  # the object store's own row says why it does not answer
        return index
    if taken:
        index.verdict = f"index: {taken}; only for a store of its own: {index.verdict}"
    return index


def _taken(settings: _config.Settings) -> str:
    """Where the object store already has an identity (it is another index's): one line
    saying so and naming its store id where readable, with the fix; else ""."""
    from artifactstore.blobstores import open_blobstore
    from artifactstore.formats.identity import decode

    def read() -> bytes | None:
        return open_blobstore(settings).get_identity()

    data = call_with_timeout(read, settings.timeout_secs)
    if data is None:
        return ""
    try:
        named = f"store {decode(data)}"
    except ValueError as exc:
        named = f"a store's (its {exc})"
    return (
        f"the index does not exist yet and the object store {settings.blobs.describe()} is "
        f"already {named}, bound to another index: ARTSTORE_INDEX most likely names the "
        "wrong database; point it at that store's (the team's)"
    )


def check_signing(settings: _config.Settings) -> Check:
    """The trust mode: which key this process signs with, which it loads from (names,
    never key material), and whether signatures are required here. A set-up that loads
    nothing, or stores what nothing loads, is degraded."""
    signs = settings.signing_key.name if settings.signing_key is not None else None
    trusted = settings.trusted_keys
    trusts = trusted.names if trusted is not None else None
    required = settings.require_signatures
    unsigned = "stores nothing (signatures required, no signing key)"
    parts = [f"signs as {signs}" if signs else unsigned if required else "writes unsigned entries"]
    if settings.read_only:  # writes nothing: what it would sign with does not matter
        parts = []
    status: Status = "ok"
    verdict = ""
    if trusted is None:
        who = (
            "write access to the bucket decides what runs"
            if settings.blobs.scheme == "s3"
            else "the directory's permissions decide what runs"
        )
        parts.append(f"loads any intact entry (signatures not required: {who})")
    elif not trusted.keys:
        status = "warn"
        parts.append(
            "signatures required, no key trusted: LOADS NOTHING (set "
            "ARTSTORE_TRUSTED_KEYS to the writers' .pub files)"
        )
        verdict = (
            "signatures required but no key trusted: loads nothing; set "
            "ARTSTORE_TRUSTED_KEYS to the writers' public keys (`artstore keygen` "
            "makes a pair)"
        )
    else:
        mode = "signatures required" if required else "ARTSTORE_TRUSTED_KEYS set"
        parts.append(f"{mode}: loads only entries signed by " + ", ".join(trusts or []))
    if required and signs is None and not settings.read_only:
        status = "warn"
        parts.append("readers would load nothing unsigned (set ARTSTORE_SIGNING_KEY)")
        verdict = verdict or (
            "signatures required but this writer has no signing key: it stores "
            "nothing; `artstore keygen` makes one for ARTSTORE_SIGNING_KEY"
        )
    return Check(
        "signing",
        status,
        "; ".join(parts),
        blocking=False,
        degrades=bool(verdict),
        verdict=verdict,
        data={"signing_key": signs, "trusted_keys": trusts, "require_signatures": required},
    )


def unanswered(label: str, where: str, settings: _config.Settings, data: dict[str, Any]) -> Check:
    bound = f"{settings.timeout_secs:g} s"
    if label == "index":
        found = diagnosis.diagnose(TimeoutError(), settings.index_url)
        probe = found.hint.split("; ", 1)[-1]
    else:
        probe = f"`aws s3 ls {where}` shows whether this host reaches it"
    return Check(
        label,
        "fail",
        f"{where}: no answer within {bound}",
        data=data,
        verdict=f"{label} {where} did not answer within {bound}: check that it is "
        f"up and reachable from here, or raise ARTSTORE_TIMEOUT; {probe}",
    )


def dir_state(path: Path, *, write: bool) -> tuple[str, str]:
    """(problem, "") if `path` cannot serve as a store directory, else ("", its state):
    "writable", "readable only", "readable" (for a reader) or "created on first use".
    Never raises: a directory this user may not even look at is "permission denied"."""
    try:
        if path.exists():
            if not path.is_dir():
                return "is not a directory", ""
            if not os.access(path, os.R_OK | os.X_OK):
                return "permission denied", ""
            if not write:
                return "", "readable"
            return "", "writable" if os.access(path, os.W_OK) else "readable only"
        if not write:
            return "does not exist", ""
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    except PermissionError:
        return "permission denied", ""
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created ({parent} is not writable)", ""
    return "", "created on first use"
