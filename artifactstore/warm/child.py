"""Inside a process that warms the store: write mode, and a record of what it stored.

Used by the startup hook (`artifactstore/startup`) in every Python process
under `artstore warm -- CMD`, and by the `MODULE:FUNCTION` worker processes.
The record exists so that the report is exact: which entries this process added
(with their compile time), which it loaded, what it compiled but did not store and
why, and for which fingerprint.
It is told through the hook of this process's own Store (`Store.record`), which
costs a program that does not warm one `None` test per lookup and put.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactstore.blobstores.local import write_atomic
from artifactstore.config import from_environment
from artifactstore.errors import ArtstoreError, ReadOnlyError, one_line
from artifactstore.formats.put import Put
from artifactstore.jaxhook import api as _ji
from artifactstore.warm import ENV_VAR, SUMMARY_FIELDS

if TYPE_CHECKING:
    from artifactstore.store import Found, Missed, Parts, Store

log = logging.getLogger("artifactstore")

# How long a warming process waits at exit for its uploads (unless
# ARTSTORE_FLUSH_TIMEOUT says otherwise): ten times config.defaults.DEFAULT_FLUSH_SECS,
# which bounds an ordinary program's exit, because here storing is the point.
WARM_FLUSH_SECS = 600.0


def summarize_fingerprint(source: Any) -> dict[str, Any]:
    """The facts a report shows about a fingerprint (a Fingerprint or an index entry)."""
    digest = getattr(source, "fingerprint", None) or getattr(source, "digest", "")
    summary: dict[str, Any] = {"digest": str(digest)}
    for name in SUMMARY_FIELDS:
        value = getattr(source, name, "")
        summary[name] = int(value or 0) if name == "device_count" else str(value)
    return summary


@dataclass
class Recorder:
    """What this process did with each executable, as it happened: `added` (compiled and
    stored here), `present` (loaded from the store and used), `concurrent` (compiled
    here while another process stored the same key), `unloadable` (found, but JAX could
    not load it) and `not_stored` (compiled, not stored, and `why`: a key of
    `warm.NOT_STORED`). Never what the index says exists: an entry counts once this
    process has loaded it or a put created it.

    With a journal, every event is also appended to it as one JSON line at once,
    so a process killed without running atexit (multiprocessing's
    Pool.terminate, SIGKILL) still leaves what it stored for the report.
    """

    journal: Path | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    unloadable: set[str] = field(default_factory=set)  # keys found but not loadable here
    lock: threading.Lock = field(default_factory=threading.Lock)
    parts: Parts | None = field(default=None, repr=False)  # those of the Store it records

    def mark(self) -> int:
        with self.lock:
            return len(self.events)

    def since(self, mark: int) -> list[dict[str, Any]]:
        with self.lock:
            return self.events[mark:]

    def _write(self, lines: list[dict[str, Any]]) -> None:
        if self.journal is not None:
            with self.journal.open("a") as out:
                out.write("".join(json.dumps(line) + "\n" for line in lines))

    def _note(self, kind: str, item: dict[str, Any], fp: Any) -> None:
        """`fp`: a Fingerprint or an index entry (its facts are recorded once), or a digest."""
        summary = {"digest": fp} if isinstance(fp, str) else summarize_fingerprint(fp)
        event = {"kind": kind, **item, "fingerprint": summary["digest"]}
        with self.lock:
            self.events.append(event)
            lines = [event]
            if len(summary) > 1 and summary["digest"] not in self.fingerprints:
                self.fingerprints[summary["digest"]] = summary
                lines.insert(0, {"kind": "fingerprint", **summary})
            self._write(lines)

    def attach(self, store: Store) -> None:
        """Record through `store`'s hook (Store.record): the lookup chain counts each hit
        there, once; its puts are made synchronous (see Store.record)."""
        self.parts = store.parts
        store.record(self)

    @property
    def _parts(self) -> Parts:
        assert self.parts is not None, "attach() a store first"
        return self.parts

    def counted(self, key: str, outcome: Found | Missed) -> None:
        """A hit the program used (`present`), or found but not loadable (`unloadable`)."""
        entry = getattr(outcome, "entry", None)  # a hit (a miss carries none)
        if entry is None:
            return
        if not hasattr(entry, "platform"):  # found by its manifest: the row has the facts
            entry = self._parts.index.lookup(key) or entry
        item = _item(key, entry.module_name, entry.compile_secs)
        if getattr(outcome, "unloadable", False):  # counted a hit, but compiled here
            with self.lock:
                self.unloadable.add(key)
            self._note("unloadable", item, entry)
        else:
            self._note("present", item, entry)

    def put(self, one: Put, store_put: Callable[[Put], bool]) -> bool:
        """`one` stored with `store_put`: `added`, `concurrent` or `not_stored` and why."""
        parts, key = self._parts, one.key
        item = _item(key, one.module_name, one.compile_secs)
        before = parts.counters.snapshot().get("bytes_uploaded", 0)
        try:
            created = bool(store_put(one))
            refused = parts.reads.refused.get(key) if not created else None
            if refused is not None:
                # Present, but not what readers that trust these keys load.
                raise ArtstoreError(
                    f"entry {key[:12]} is present but refused here ({refused}, "
                    "ARTSTORE_TRUSTED_KEYS): set ARTSTORE_SIGNING_KEY to replace it "
                    "with a signed one"
                )
        except Exception as exc:
            why = "signature" if key in parts.reads.refused else not_stored_why(exc)
            event = {**item, "why": why, "error": one_line(exc)}
            self._note("not_stored", event, one.fingerprint)
            raise
        item["bytes"] = parts.counters.snapshot().get("bytes_uploaded", 0) - before
        if created:
            self._note("added", item, one.fingerprint)
            return True
        reason = _why_not_created(parts, key, self.unloadable)
        if reason is None:  # another process stored the key meanwhile: it is in the store
            self._note("concurrent", item, one.fingerprint)
        else:
            self._note("not_stored", {**item, "why": reason}, one.fingerprint)
        return False

    def compiled_below_threshold(self, key: str, fingerprint: str, compile_secs: float) -> None:
        self._note("not_stored", {**_item(key, "", compile_secs), "why": "threshold"}, fingerprint)

    def submit(
        self, one: Put, then: Callable[[bool], None] | None, store_put: Callable[[Put], bool]
    ) -> None:
        """A queued put made now with `store_put` (recorded there, stored or not)."""
        published = False
        try:
            store_put(one)
            published = True
        except Exception as exc:  # as the background writer would: count, say once
            self._parts.counters.add("put_errors")
            log.warning("artifactstore: could not store %s: %s", one.module_name, one_line(exc))
        finally:
            if then is not None:  # a compile lease waits for this put (singleflight)
                then(published)


def _item(key: str, module: str, compile_secs: float) -> dict[str, Any]:
    """One executable's record (its `bytes` uploaded filled in by a put that stored it)."""
    return {"key": key, "module": module, "bytes": 0, "compile_secs": float(compile_secs)}


def not_stored_why(exc: BaseException) -> str:
    """Which `warm.NOT_STORED` reason a failed put is: the role, a quota, or the upload."""
    text = str(exc).lower()
    if isinstance(exc, ReadOnlyError) or "access denied" in text or "permission denied" in text:
        return "role"
    if "quota" in text:
        return "quota"
    return "upload"


def _why_not_created(parts: Parts, key: str, unloadable: set[str]) -> str | None:
    """Why a put that raised nothing created no entry, or None where the key is stored
    (by another process, between this one's lookup and its put)."""
    if parts.writes.gate.refused:
        return "write gate"
    if parts.read_only:
        return "read-only"
    if not parts.writes.signs:
        return "unsigned"
    if key in unloadable:  # the stored entry stays, and it does not load here
        return "unloadable"
    return None


def configure_for_warming(journal: Path | None = None) -> Recorder | None:
    """Configure the store for writing everything compiled; None if it is unusable here."""
    flush_secs = None if from_environment("flush_secs") else WARM_FLUSH_SECS
    options: dict[str, Any] = {"min_compile_secs": 0.0}
    if flush_secs is not None:
        options["flush_secs"] = flush_secs
    if _ji.configure(read_only=False, **options) is None:
        return None
    store = _ji.active_store()  # waits for the open, so no compile escapes the record
    if store is None:
        return None
    recorder = Recorder(journal)
    recorder.attach(store)
    return recorder


def flush_secs() -> float:
    store = _ji.active_store()
    return store.parts.settings.flush_secs if store is not None else WARM_FLUSH_SECS


def activate() -> None:
    """Called by the startup hook once `jax` is imported; never raises into the program."""
    report_dir = os.environ.get(ENV_VAR, "")
    if not report_dir:
        return
    if _read_only_here():
        # A leftover ARTSTORE_WARM (a shell that ran `artstore warm`, a copied job spec) must
        # not turn a reader into a writer: it loads as its environment says, stores nothing.
        log.warning(
            "artifactstore: %s is ignored: ARTSTORE_READ_ONLY says this process stores "
            "nothing (loading only)",
            ENV_VAR,
        )
        from artifactstore.jaxhook import environment

        environment.activate()
        return
    pid = os.getpid()
    try:
        records = Path(report_dir)
        started = {"pid": pid, "argv": sys.argv[:8]}
        # Atomic, so the parent never reads half a record; not durable: read within this run.
        write_atomic(records / f"{pid}.started", json.dumps(started).encode(), durable=False)
        recorder = configure_for_warming(records / f"{pid}.events")
        if recorder is not None:
            _follow_reconfiguration(recorder)
        atexit.register(_report_at_exit, records, started, recorder)
    except Exception as exc:
        print(
            f"artstore warm: could not activate the store in this process ({one_line(exc)})",
            file=sys.stderr,
        )


def _read_only_here() -> bool:
    """Whether the environment says read-only (a malformed value: the safe side, yes)."""
    from artifactstore.config.values import parse_bool
    from artifactstore.errors import ConfigError

    value = from_environment("read_only")
    try:
        return parse_bool("ARTSTORE_READ_ONLY", value)
    except ConfigError:
        return True


def _follow_reconfiguration(recorder: Recorder) -> None:
    """A CMD that calls `artifactstore.configure()` itself (as the README suggests) replaces
    the store we opened; keep recording, and storing synchronously, through the new one."""
    import artifactstore

    original = _ji.configure

    @functools.wraps(original)
    def configure(*args: Any, **kwargs: Any) -> Any:
        settings = original(*args, **kwargs)
        store = _ji.active_store()
        if store is not None:
            recorder.attach(store)
        return settings

    _ji.configure = configure  # type: ignore[assignment]
    artifactstore.configure = configure  # type: ignore[assignment]


def _report_at_exit(report_dir: Path, started: dict[str, Any], recorder: Recorder | None) -> None:
    """Finish uploads, then leave this process's record for the `artstore warm` parent."""
    flushed = _ji.flush(flush_secs()) if recorder is not None else True
    stats = _ji.process_stats()
    data = {
        **started,
        "active": recorder is not None and bool(stats.get("active", 0)),
        "flushed": flushed,
        "stats": stats,
    }
    record = report_dir / f"{started['pid']}.json"
    try:
        write_atomic(record, json.dumps(data).encode(), durable=False)
    except OSError as exc:
        print(
            f"artstore warm: could not write this process's report ({one_line(exc)})",
            file=sys.stderr,
        )
