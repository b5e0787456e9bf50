"""`artstore doctor`: would the store be used here, and if not, why and what to do.

A program whose store is misconfigured, unreachable or unhookable still runs:
it compiles as usual, logs one line and is silently slower. This gathers every
fact that decides it in one report, without changing anything (no index or
directory is created, no migration applied), each network check bounded by
ARTSTORE_TIMEOUT, and never a secret in any message.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from artifactstore import config as _config
from artifactstore.errors import ArtstoreError, ConfigError, one_line
from artifactstore.jaxhook.compat import Probe, probe
from artifactstore.redact import redact
from artifactstore.store.background import call_with_timeout

Status = Literal["ok", "fail", "warn", "skip"]


@dataclass
class Check:
    """One row: a failed `blocking` check means the store would not be used."""

    label: str
    status: Status
    detail: str
    verdict: str = ""  # for a failure: what is wrong and what to do, for the verdict line
    blocking: bool = True
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    checks: dict[str, Check]
    ok: bool
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "checks": {
                name: {"label": c.label, "status": c.status, "detail": c.detail, **c.data}
                for name, c in self.checks.items()
            },
        }


def gather(overrides: dict[str, Any], device: bool | None = None) -> Report:
    """Run every check for the configuration `overrides` (CLI options) resolve to.
    `device`: open JAX's backend for the fingerprint (None: only where that holds no
    accelerator; see `doctor_device`)."""
    found = probe()
    checks: dict[str, Check] = {
        "python": Check(
            "python",
            "ok",
            f"{platform.python_version()} ({sys.executable})",
            blocking=False,
            data={"version": platform.python_version()},
        ),
        "jax": Check(
            "jax",
            "warn" if found.jax_version == "not installed" else "ok",
            f"jax {found.jax_version}, jaxlib {found.jaxlib_version}",
            blocking=False,
            data={"jax": found.jax_version, "jaxlib": found.jaxlib_version},
        ),
        "hook": _check_hook(found),
    }

    settings: _config.Settings | None = None
    try:
        settings = _config.resolve(overrides)
    except ConfigError as exc:
        checks["config"] = Check(
            "configuration", "fail", str(exc), verdict=f"configuration invalid: {exc}"
        )
        for name, label in (
            ("object_store", "object store"),
            ("index", "index"),
            ("local_tier", "local tier"),
        ):
            checks[name] = Check(
                label, "skip", "not checked: configuration invalid", blocking=name != "local_tier"
            )
    else:
        mode = "read-only" if settings.read_only else "read-write"
        origin = ", embedded default" if settings.embedded else ""
        checks["config"] = Check(
            "configuration",
            "ok",
            f"namespace {settings.namespace}, {mode}, timeout {settings.timeout_secs:g} s{origin}",
            data={
                "namespace": settings.namespace,
                "read_only": settings.read_only,
                "timeout_secs": settings.timeout_secs,
                "embedded": settings.embedded,
            },
        )
        checks["object_store"] = _check_objects(settings)
        checks["index"] = _check_index(settings)
        if checks["object_store"].status == checks["index"].status == "ok":
            checks["binding"] = _check_binding(settings, checks["index"].data)
        checks["local_tier"] = _check_tier(settings)
        checks["signing"] = _check_signing(settings)
        checks["single_flight"] = _check_single_flight(settings)
    checks["accelerator"] = _check_accelerator()
    checks["fingerprint"] = _check_fingerprint(device)
    checks["activation"] = _check_activation()

    failed = [
        c.verdict or f"{c.label}: {c.detail}"
        for c in checks.values()
        if c.blocking and c.status == "fail"
    ]
    ok = all(c.status == "ok" for c in checks.values() if c.blocking)
    if ok:
        where = f"{checks['object_store'].data['url']} + {checks['index'].data['url']}"
        mode = " (read-only)" if settings is not None and settings.read_only else ""
        verdict = f"the store would be used: {where}{mode}"
    else:
        verdict = "the store is not used: " + "; ".join(failed)
    for check in checks.values():
        check.detail, check.verdict = _scrub(check.detail), _scrub(check.verdict)
    return Report(checks, ok, _scrub(verdict))


def _check_hook(found: Probe) -> Check:
    """Whether configure() can wrap this JAX's compiler, naming what does not fit."""
    problems = "; ".join(found.problems)
    if found.hooks is not None:
        return Check("jax hook", "ok", f"yes ({found.hooks.style})", data={"problems": []})
    if found.jax_version == "not installed":
        fix = f"JAX is not importable ({problems}): install jax"
    else:
        fix = (
            f"JAX {found.jax_version} internals missing ({problems}): upgrade artifactstore "
            "or pin jax to a supported release (README, 'Supported JAX')"
        )
    return Check("jax hook", "fail", f"no: {problems}", fix, data={"problems": found.problems})


def _check_objects(settings: _config.Settings) -> Check:
    """The object store answers: a bounded HEAD of the bucket, or a usable directory."""
    from artifactstore.blobstores import open_blobstore

    where = settings.blobs.describe()
    data: dict[str, Any] = {"url": where}
    try:
        blobs = open_blobstore(settings)
        call_with_timeout(blobs.check, settings.timeout_secs)
    except TimeoutError:
        return _unanswered("object store", where, settings, data)
    except Exception as exc:
        why = str(exc) if isinstance(exc, ArtstoreError) else one_line(exc)
        return Check(
            "object store", "fail", why, verdict=f"object store unusable: {why}", data=data
        )
    if settings.blobs.scheme == "s3":
        return Check("object store", "ok", f"{blobs.describe()}: answers", data=data)
    base = Path(settings.blobs.path) / settings.namespace
    problem, state = _dir_state(base, write=not settings.read_only)
    if problem:
        return Check(
            "object store",
            "fail",
            f"{base}: {problem}",
            data=data,
            verdict=f"object store {base} {problem}: fix ARTSTORE_URL or the "
            "directory's permissions",
        )
    return Check("object store", "ok", f"{blobs.describe()}: {state}", data=data)


def _check_index(settings: _config.Settings) -> Check:
    """The index answers and its schema is (or will by itself become) current."""
    from artifactstore.index import db
    from artifactstore.store import migrates_on_open

    shown = redact(settings.index_url)
    data: dict[str, Any] = {"url": shown}
    sqlite_file = _sqlite_file(settings.index_url)

    def read_schema() -> tuple[db.SchemaStatus, str]:
        if sqlite_file is not None and not sqlite_file.exists():  # do not create it
            return db.SchemaStatus(db.SchemaState.EMPTY, None, db.SCHEMA_HEAD), "sqlite"
        engine = db.open_engine(
            settings.index_url, timeout_secs=settings.timeout_secs, read_only=settings.read_only
        )
        try:
            return db.schema_status(engine), engine.dialect.name
        finally:
            engine.dispose()

    try:
        status, dialect = call_with_timeout(read_schema, settings.timeout_secs)
    except TimeoutError:
        return _unanswered("index", shown, settings, data)
    except ConfigError as exc:
        return Check("index", "fail", str(exc), verdict=f"index URL invalid: {exc}", data=data)
    except Exception as exc:
        why = one_line(getattr(exc, "orig", None) or exc)
        return Check(
            "index",
            "fail",
            f"{shown}: unreachable ({why})",
            data=data,
            verdict=f"index unreachable ({why}): check ARTSTORE_INDEX and the database server",
        )
    revision = status.current or "not created"
    auto = migrates_on_open(settings, dialect, status.state)
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
            problem, _ = _dir_state(sqlite_file.parent, write=True)
            if problem:
                return Check(
                    "index",
                    "fail",
                    f"{sqlite_file.parent}: {problem}",
                    data=data,
                    verdict=f"index {sqlite_file} cannot be created: "
                    f"{sqlite_file.parent} {problem}",
                )
        return Check(
            "index",
            "ok",
            f"{shown}: schema {revision}, brought to {status.head} on first use",
            data=data,
        )
    return Check(
        "index",
        "fail",
        f"{shown}: schema {revision} ({status.state.value})",
        verdict=status.problem() or "",
        data=data,
    )


def _check_binding(settings: _config.Settings, index: dict[str, Any]) -> Check:
    """Whether object store and index are one store (artifactstore.store.identity); only read."""
    from artifactstore.store.identity import MISMATCH, UNBOUND, describe

    try:
        if index.get("schema") != "current":  # not created or not migrated yet: not opened
            state, detail = UNBOUND, "not yet bound: the index is not at this version's schema"
        else:
            state, detail = call_with_timeout(lambda: describe(settings), settings.timeout_secs)
    except Exception as exc:
        state, detail = "unknown", f"not checked ({one_line(exc)})"
    status: Status = "fail" if state == MISMATCH else "ok" if state == "bound" else "warn"
    return Check("binding", status, detail, blocking=False, data={"state": state})


def _check_tier(settings: _config.Settings) -> Check:
    """This host's copy: where it is and how much it holds (never blocks the store)."""
    from artifactstore.formats.sizes import format_size
    from artifactstore.store.tier import open_tier

    try:
        tier = open_tier(settings)
        if tier is None:
            return Check("local tier", "ok", "off", blocking=False, data={"path": None})
        tier.check()  # another user's, or writable by others: not used (creates nothing)
        keys = tier.key_count()
        size = sum(blob.size for blob in tier.blobs.iter_blobs())
    except Exception as exc:
        return Check("local tier", "warn", f"unusable: {one_line(exc)}", blocking=False)
    if tier.owns_objects and tier.max_bytes is not None:
        kind = f"private copies, bound {format_size(tier.max_bytes)}"
    else:
        kind = "the store's own directory"
    return Check(
        "local tier",
        "ok",
        f"{tier.base}: {keys} keys, {format_size(size)} ({kind})",
        blocking=False,
        data={"path": str(tier.base), "keys": keys, "bytes": size},
    )


def _check_signing(settings: _config.Settings) -> Check:
    """The trust mode: which key this process signs with, which it loads from (names,
    never key material), and whether signatures are required here."""
    signs = settings.signing_key.name if settings.signing_key is not None else None
    trusted = settings.trusted_keys
    trusts = trusted.names if trusted is not None else None
    required = settings.require_signatures
    parts = [f"signs as {signs}" if signs else "writes unsigned entries"]
    status: Status = "ok"
    if trusted is None:
        who = ("write access to the bucket decides what runs" if settings.blobs.scheme == "s3"
               else "the directory's permissions decide what runs")  # fmt: skip
        parts.append(f"loads any intact entry (signatures not required: {who})")
    elif not trusted.keys:
        status = "warn"
        parts.append("signatures required, no key trusted: LOADS NOTHING (set "
                     "ARTSTORE_TRUSTED_KEYS, or ARTSTORE_REQUIRE_SIGNATURES=0)")  # fmt: skip
    else:
        mode = "signatures required" if required else "ARTSTORE_TRUSTED_KEYS set"
        parts.append(f"{mode}: loads only entries signed by " + ", ".join(trusts or []))
    if required and signs is None and not settings.read_only:
        status = "warn"
        parts.append("readers will not load what it stores (set ARTSTORE_SIGNING_KEY)")
    return Check("signing", status, "; ".join(parts), blocking=False,
                 data={"signing_key": signs, "trusted_keys": trusts,
                       "require_signatures": required})  # fmt: skip


def _check_single_flight(settings: _config.Settings) -> Check:
    """Whether processes that miss one key at once wait for one compile (and why)."""
    from artifactstore.store.lease import enabled, wait_bound

    on, why = enabled(settings)
    if on and settings.read_only:
        why += "; read-only: waits for writers' compiles, never holds a lease"
    if on:
        bound = settings.lease_wait_secs
        why += (
            f"; waits at most {bound:g} s"
            if bound is not None
            else (
                "; waits at most 3x the key's last compile time, "
                f"else {wait_bound(settings, None):g} s"
            )
        )
    return Check("single-flight", "ok", why, blocking=False, data={"enabled": on})


def _check_activation() -> Check:
    """Whether programs that never call configure() use the store here (ARTSTORE_URL,
    ARTSTORE_ACTIVATE), and whether this Python has the .pth hook that makes them."""
    import site

    from artifactstore.runtime.run import startup_module

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    found = [Path(d) / "artifactstore_startup.pth" for d in dirs]
    hook = next((str(p) for p in found if p.is_file()), None)
    how = startup_module().mode(os.environ)
    data = {"hook": hook, "active": how is not None}
    if hook is None:
        detail = (
            "no startup hook in this Python's site-packages (reinstall artifactstore): "
            "only `artstore run` and `artstore warm` activate the store without code"
        )
        return Check("activation", "warn", detail, blocking=False, data=data)
    if how is None:
        detail = (
            "off: programs use the store only if they call artifactstore.configure() "
            "(ARTSTORE_URL or ARTSTORE_ACTIVATE=1 turns it on for every program)"
        )
    else:
        detail = (
            "on: every Python program here that imports JAX uses this store, "
            "without code (ARTSTORE_ACTIVATE=0 turns it off)"
        )
    return Check("activation", "ok", detail, blocking=False, data=data)


def _check_accelerator() -> Check:
    """Which backend JAX would open here, read without opening it."""
    from artifactstore.cli import doctor_device

    status, detail, data = doctor_device.check_backend()
    return Check("accelerator", status, detail, blocking=False, data=data)


def _check_fingerprint(device: bool | None) -> Check:
    """What this host's executables are keyed by (needs JAX's backend: opened only
    where asked, or where it holds no accelerator)."""
    from artifactstore.cli import doctor_device

    status, detail, data = doctor_device.check_fingerprint(device)
    return Check("fingerprint", status, detail, blocking=False, data=data)


def _unanswered(label: str, where: str, settings: _config.Settings, data: dict[str, Any]) -> Check:
    bound = f"{settings.timeout_secs:g} s"
    return Check(
        label,
        "fail",
        f"{where}: no answer within {bound}",
        data=data,
        verdict=f"{label} {where} did not answer within {bound}: check that it is "
        "up and reachable from here, or raise ARTSTORE_TIMEOUT",
    )


def _dir_state(path: Path, *, write: bool) -> tuple[str, str]:
    """(problem, "") if `path` cannot serve as a store directory, else ("", its state)."""
    if path.exists():
        if not path.is_dir():
            return "is not a directory", ""
        if not os.access(path, os.R_OK | os.X_OK | (os.W_OK if write else 0)):
            return ("is not readable and writable" if write else "is not readable"), ""
        return "", "writable" if write else "readable"
    if not write:
        return "does not exist", ""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created ({parent} is not writable)", ""
    return "", "created on first use"


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return None  # open_engine reports it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(str(parsed.database))


def _scrub(text: str) -> str:
    """A detail or verdict fit for the report: secrets masked, on one line."""
    return " ".join(redact(text).split())
