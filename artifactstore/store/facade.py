"""The Store: get / put of executables by key over a blob store and an index.

It works on bytes and metadata only (no JAX): the JAX adapter above it turns
compiles into `get`/`put` calls. It owns the invariants: bytes are verified
(digest, envelope, fingerprint) before anyone sees them, an index row is
committed only after its object is durable, bad objects are quarantined, and
read-only stores never write.

A lookup reads the entry's manifest from the object store, never a database
server: a cluster of any size costs the index nothing (issue 16). The index is
opened lazily, by the first write (or by commands that query it); hits go to a
hit journal in the object store (artifactstore.formats.journal) that gc folds in. A
SQLite index, a file with no connection limit, is still asked for entries
without a manifest (stored by 0.2 clients) and takes hits directly.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
from collections import Counter as _Counts
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError

from artifactstore.blobstores import BlobStore, describe_blobstore, open_blobstore, safedir
from artifactstore.blobstores.absent import AbsentBlobStore
from artifactstore.blobstores.base import JOURNALS
from artifactstore.config import Settings, default_cache_dir
from artifactstore.errors import (
    ArtstoreError,
    CorruptObject,
    OverLimit,
    PrivilegeRefused,
    ReadOnlyError,
    StoreUnavailable,
    one_line,
)
from artifactstore.formats import codec
from artifactstore.formats import usage as _usage
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.journal import MAX_JOURNAL_KEYS, Journal, new_name
from artifactstore.formats.manifest import Manifest
from artifactstore.index import db
from artifactstore.index.accesses import clean_touches
from artifactstore.index.models import utcnow
from artifactstore.index.repo import EntryIndex, EntryInfo, NewEntry
from artifactstore.redact import redact
from artifactstore.store import identity
from artifactstore.store.background import Worker, call_with_timeout
from artifactstore.store.flight import SingleFlight, enabled
from artifactstore.store.tier import (
    Accesses,
    LocalTier,
    _warn_once,
    open_tier,
)

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey

log = logging.getLogger("artifactstore")

# Keys of recent misses remembered for `Store.compiled_below_threshold` (a compile
# follows its miss at once; the bound only keeps a long-lived process small).
MISSED_KEYS = 4096
NO_TRUSTED_KEYS = (
    "this store requires signatures and no key is trusted: loading nothing, compiling. "
    "Set ARTSTORE_TRUSTED_KEYS to your writers' .pub files (`artstore keygen`), or "
    "ARTSTORE_REQUIRE_SIGNATURES=0 to let every writer of the bucket decide what runs"
)
UNSIGNED_WRITE = (
    "storing unsigned entries in a store that requires signatures: readers will not load "
    "them; set ARTSTORE_SIGNING_KEY to a key from `artstore keygen` (readers list its .pub)"
)


@dataclass(frozen=True)
class Hit:
    payload: bytes
    entry: EntryInfo | Manifest  # what led to the object: its manifest, or its index row


@dataclass
class ProcessCounters:
    """What this process saw; `artstore stats` shows the persistent totals.

    `add(name, value)` counts for `process_stats()`. Counters of `usage.TOTALS` are
    also kept pending for the index's namespace totals (`counters`), and those of
    `usage.FIELDS` for its usage rows, per UTC day and fingerprint (`fingerprint=`;
    "" where the caller has none). The store writes both in its access flush, or
    in its hit journal: no counter costs a database round trip of its own.
    """

    counts: _Counts[str] = field(default_factory=_Counts)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Told every event too (a session's metrics: artifactstore.metrics.Recorder.counted).
    observer: Callable[[str, int], None] | None = None
    pending: _Counts[str] = field(default_factory=_Counts)
    usage: _usage.Usage = field(default_factory=dict)

    def add(self, name: str, value: int = 1, *, fingerprint: str | None = None) -> None:
        with self.lock:
            self.counts[name] += value
            if name in _usage.TOTALS:
                self.pending[name] += value
            if name in _usage.FIELDS:
                _usage.add(self.usage, (_usage.today(), fingerprint or ""), {name: value})
        if self.observer is not None:
            self.observer(name, value)

    def hit(self, fingerprint: str, *, size: int, compile_secs: float) -> None:
        """One load from the store: a hit, its bytes and the compile time it saved."""
        with self.lock:
            self.counts["hits"] += 1
            self.counts["bytes_fetched"] += size
            values = {"hits": 1, "bytes_fetched": size, "compile_secs_saved": compile_secs}
            _usage.add(self.usage, (_usage.today(), fingerprint), values)
        if self.observer is not None:
            self.observer("hits", 1)
            self.observer("bytes_fetched", size)

    def add_usage(self, key: _usage.Key, values: dict[str, float]) -> None:
        """Usage rows only (hits served elsewhere: the tier's journals)."""
        with self.lock:
            _usage.add(self.usage, key, values)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)

    def has_pending(self) -> bool:
        with self.lock:
            return any(self.pending.values()) or bool(self.usage)

    def take(self) -> tuple[_Counts[str], _usage.Usage]:
        """The pending totals and usage rows, for one flush or journal."""
        with self.lock:
            counts, self.pending = self.pending, _Counts()
            usage, self.usage = self.usage, {}
        return counts, usage

    def requeue(self, counts: _Counts[str], usage: _usage.Usage) -> None:
        """Put what a flush could not write back into the next one."""
        with self.lock:
            self.pending.update(counts)
            _usage.merge(self.usage, usage)


class Store:
    def __init__(
        self,
        settings: Settings,
        blobs: BlobStore,
        engine: Engine | None = None,
        *,
        worker: Worker | None = None,
        tier: LocalTier | None = None,
    ) -> None:
        """`engine`: the index, or None to open it on first use (`open_index`)."""
        self.settings = settings
        self.namespace = settings.namespace
        self.read_only = settings.read_only
        self.blobs = blobs
        self._engine = engine
        self._index = EntryIndex(engine, settings.namespace) if engine is not None else None
        self._engine_lock = threading.Lock()
        self._last_journal = time.monotonic()
        self.counters = ProcessCounters()
        self._touch_lock = threading.Lock()
        self._touches: dict[str, tuple[int, datetime]] = {}
        # Keys this process just missed, so that a compile of one found below the
        # store threshold counts as `misses_below_threshold` (see compiled_below_threshold).
        self._missed: dict[str, str] = {}  # recent misses: key -> why (`misses`: absent)
        self._warned: set[str] = set()
        # Keys whose entry this process refused for its signature: a writer that then
        # compiles them replaces the entry with one it signs (see `put`).
        self._refused: dict[str, str] = {}
        self._uploads_paused_until = 0.0  # monotonic: see submit_put
        self._upload_failures = 0  # consecutive, for that pause
        self.worker = worker or Worker("artifactstore-writer", on_tick=self._tick)
        self.tier = tier
        # Called (on the writing thread) after each entry this process creates;
        # layers above subscribe here (the opt-in quota pass) without the store
        # importing them.
        self.on_stored: list[Callable[[], None]] = []
        # Told which backend a lookup turns to, so that a caller timing the lookup out
        # knows which one hung (the session's per-backend circuit breakers).
        self.using: Callable[[str], None] = _ignore
        self._flight: SingleFlight | bool | None = False  # False: not decided yet
        self._identity_checked = False  # see artifactstore.store.identity: first write binds

    @property
    def engine(self) -> Engine:
        """The index's engine, opened (and its schema checked) on first use."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self.using("index")
                    try:
                        self._engine = open_index(self.settings)
                    except (ArtstoreError, ImportError):  # their one line names the fix
                        raise
                    except Exception as exc:  # a driver's error: say which backend failed
                        raise StoreUnavailable(f"index unavailable ({one_line(exc)})") from None
        return self._engine

    @property
    def index(self) -> EntryIndex:
        if self._index is None:
            self._index = EntryIndex(self.engine, self.namespace)
        return self._index

    @property
    def flight(self) -> SingleFlight | None:
        """This store's compile leases, or None where single-flight is off here."""
        if self._flight is False:
            self._flight = SingleFlight(self) if enabled(self.settings)[0] else None
        assert self._flight is not True
        return self._flight

    @property
    def journals_hits(self) -> bool:
        """Whether hits go to a hit journal in the object store: on a database server
        that this process has not opened (a reader, or a writer that only read so far)."""
        return self.settings.index_is_server and self._engine is None

    @property
    def index_opened(self) -> bool:
        """Whether this process has opened the index (a reader never does)."""
        return self._engine is not None

    # -- opening ------------------------------------------------------------
    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        tier: LocalTier | None = None,
        check_blobs: bool = True,
        using: Callable[[str], None] | None = None,
        lazy_index: bool = False,
        objects: bool = True,
    ) -> Store:
        """Open blob store and index; the embedded default migrates itself.

        `tier`: this host's tier when the caller already holds it (a session),
        so one process never has two; otherwise the store opens it.
        `check_blobs=False`: for callers that only read the index (`ls`, `stats`,
        quotas), which must work while the object store is down; nothing is sent
        to the object store until a blob is asked for.
        `using`: told "index" or "object store" as each is turned to (see `Store.using`).
        `lazy_index`: open the index only when first needed (a program's session: a
        process that only reads never connects to it).
        `objects=False`: do not open the object store at all (`ls`, `stats`, `quota`:
        nothing imported or sent; any use fails with one line: blobstores.absent).
        """
        using = using or _ignore
        using("index")
        secure_local_dirs(settings)
        engine = None if lazy_index else open_index(settings)
        using("object store")
        if objects:
            blobs = open_blobstore(settings)
        else:
            blobs = AbsentBlobStore(describe_blobstore(settings), read_only=settings.read_only)
        if check_blobs and objects:
            blobs.check()
        store = cls(settings, blobs, engine, tier=tier or _open_tier(settings))
        store.using = using
        if lazy_index:  # a program's first miss waits for nothing it does not need
            store.worker.submit("fold tier journals", store.fold_tier_journals)
        else:
            store.fold_tier_journals()
        return store

    def _tick(self) -> None:
        """The background writer's periodic work: hits to the index (or to a hit journal,
        at most every ARTSTORE_JOURNAL_SECS), then idle database connections closed (a
        process that only trains holds none)."""
        try:
            due = time.monotonic() - self._last_journal >= self.settings.journal_secs
            if due or not self.journals_hits:
                self.flush_access()
        finally:
            if self._engine is not None:
                db.release_idle(self._engine, self.settings.db_idle_secs)

    def fold_tier_journals(self) -> None:
        """Count hits that processes served from this host's tier, so LRU sees them."""
        if self.tier is None:
            return
        folded = False
        try:
            for accesses in self.tier.drain_journals():
                self.add_accesses(accesses)
                folded = True
            if folded:
                self.flush_access()
        except Exception as exc:
            log.debug("artifactstore: could not fold tier access journals: %s", one_line(exc))

    def entries_removed(self) -> None:
        """Called after entries were deleted: this host's tier must not serve them again."""
        if self.tier is not None:
            self.tier.invalidate()

    def add_accesses(self, accesses: Accesses) -> None:
        """Merge hits served elsewhere (the tier's journals) into the next access flush,
        checked and clamped (journals are files: see `clean_touches`). Their usage rows
        (day, fingerprint, bytes, compile time saved) come from this host's tier's key
        files, read here once per key, never per hit."""
        touches = clean_touches(accesses)
        for key, (n, when) in touches.items():
            found = None
            if self.tier is not None:
                try:
                    found = self.tier.lookup(key)
                except Exception:  # a key map this process cannot read: hits only
                    found = None
            values: dict[str, float] = {"hits": n}
            fingerprint = ""
            if found is not None:
                fingerprint = found.fingerprint
                values["compile_secs_saved"] = n * found.compile_secs
                if found.size is not None:
                    values["bytes_fetched"] = n * found.size
            self.counters.add_usage((when.date(), fingerprint), values)
        self._merge_touches(touches)

    def _merge_touches(self, touches: dict[str, tuple[int, datetime]]) -> None:
        """Add hit counts into the pending batch, keeping each key's latest access time."""
        with self._touch_lock:
            for key, (n, when) in touches.items():
                old_n, old_t = self._touches.get(key, (0, when))
                self._touches[key] = (old_n + n, max(when, old_t))

    def describe(self) -> str:
        return redact(f"{self.blobs.describe()} + {self.settings.index_url}")

    def _warn_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning("artifactstore: " + message, *args)

    # -- read ---------------------------------------------------------------
    def get(self, key: str, fingerprint_digest: str, *, callbacks: int | None = None) -> Hit | None:
        """Verified payload for `key` built for this fingerprint, or None (a miss).

        `callbacks`: the number of host callbacks the caller will bind on load; an
        executable stored for another number is a miss (`callback_mismatch`).
        """
        entry = self._find(key)
        miss = functools.partial(self._miss, key=key, fingerprint=fingerprint_digest)
        if entry is None:
            return miss("misses")
        if self.settings.trusted_keys is not None and not self.settings.trusted_keys.keys:
            # Signatures required, no key trusted: nothing here may run, so fetch nothing.
            _warn_once("untrusted_key", NO_TRUSTED_KEYS)
            self._refused[key] = "untrusted_key"
            return miss("untrusted_key")
        if entry.fingerprint != fingerprint_digest:
            # Keys include the fingerprint, so this means a damaged or forged row.
            self._warn_once(
                "fingerprint",
                "entry %s was built for another platform; ignoring it",
                key[:12],
            )
            return miss("fingerprint_mismatch")
        try:
            data = self.fetch_object(entry)
        except OverLimit as exc:
            return self._over_limit(exc, miss)
        if data is None:
            self._warn_once(
                "missing",
                "entry %s points at object %s, which is gone (removed by gc or by hand); compiling",
                key[:12],
                entry.digest[:12],
            )
            self._drop_entry(entry)
            return miss("missing_object")
        try:
            payload = self.verify(entry, data, fingerprint_digest, callbacks=callbacks)
        except codec.SignatureRefused as exc:
            # Intact bytes this reader will not run (unsigned, unknown key, bad
            # signature): a miss, never quarantined (another reader may trust the key).
            _warn_once(
                exc.reason, "refusing executable: %s (ARTSTORE_TRUSTED_KEYS); compiling", exc
            )
            self._refused[key] = exc.reason
            return miss(exc.reason)
        except codec.FingerprintMismatch as exc:
            self._warn_once("fingerprint", "refusing foreign executable: %s", exc)
            return miss("fingerprint_mismatch")
        except codec.WrongEntry as exc:
            # The object is intact; the index row pointing here is wrong (damaged or forged).
            self._warn_once("wrong-entry", "refusing executable of another entry: %s", exc)
            return miss("wrong_entry")
        except codec.CallbackMismatch as exc:
            # Bound to its key but not to this trace's callbacks: a damaged or forged
            # entry that would crash on execute. Refused, not quarantined (see codec).
            self._warn_once("callbacks", "refusing executable: %s; compiling", exc)
            return miss("callback_mismatch")
        except OverLimit as exc:  # bigger than this reader allows; another may load it
            return self._over_limit(exc, miss)
        except CorruptObject as exc:
            self._quarantine(entry, str(exc))
            return miss("corrupt")
        self._touch(key)
        self.counters.hit(entry.fingerprint, size=entry.size, compile_secs=entry.compile_secs)
        record = entry if isinstance(entry, Manifest) else Manifest.of(entry, callbacks=callbacks)
        self._remember(key, record, data)
        return Hit(payload, entry)

    def fetch_object(self, entry: EntryInfo | Manifest) -> bytes | None:
        """The bytes of `entry`'s object as stored, unverified (see `verify`), or None if
        it is gone; OverLimit for one bigger than ARTSTORE_MAX_OBJECT_SIZE (not downloaded)."""
        self.using("object store")
        return self.blobs.get(entry.digest, max_bytes=self.settings.max_object_bytes)

    def verify(
        self,
        entry: EntryInfo | Manifest,
        data: bytes,
        fingerprint_digest: str,
        *,
        callbacks: int | None = None,
    ) -> bytes:
        """The executable in `entry`'s object `data`, verified as every load is: digest,
        envelope, fingerprint, entry key, callback count (given `callbacks`), sizes, and
        the signature where this reader lists trusted keys. Raises what `codec.decode`
        raises (CorruptObject and its kinds, OverLimit); what a refusal costs is the
        caller's to decide (`get`: a miss; `artstore pull`: counted, not kept)."""
        return codec.decode(
            data,
            expected_digest=entry.digest,
            fingerprint_digest=fingerprint_digest,
            key=entry.key,
            callbacks=callbacks,
            expected_raw_size=entry.raw_size,
            max_raw_size=self.settings.max_executable_bytes,
            trusted=self.settings.trusted_keys,
            namespace=self.namespace,
        )

    def _find(self, key: str) -> EntryInfo | Manifest | None:
        """Where `key`'s object is: its manifest in the object store. A SQLite index (a
        file) is also asked for entries without one (stored by 0.2 clients, or whose
        publication failed); a database server never is: there, a missing manifest is
        a miss, and a writer that compiles the key publishes it (see `put`)."""
        self.using("object store")
        data = self.blobs.get_manifest(key)
        if data is not None:
            try:
                return Manifest.decode(data, key)
            except Exception as exc:  # untrusted bytes: a miss for this key, never the breaker
                self.counters.add("bad_manifest")
                self._warn_once("manifest", "ignoring a damaged manifest: %s", exc)
        if self.settings.index_is_server:
            return None
        self.using("index")
        return self.index.lookup(key)

    def publish(self, entry: EntryInfo | NewEntry, *, callbacks: int | None = None) -> bool:
        """Publish `entry`'s manifest, after its object and index row: readers find it
        without the database. False (counted, logged once) if the object store refused;
        the entry is stored all the same, and `artstore verify --repair` publishes it."""
        try:
            self.blobs.put_manifest(entry.key, Manifest.of(entry, callbacks=callbacks).encode())
            return True
        except Exception as exc:
            self.counters.add("manifest_unpublished")
            self._warn_once(
                "publish",
                "manifest of %s not published (%s): readers find it through the index until "
                "`artstore verify --repair`",
                entry.key[:12],
                one_line(exc),
            )
            return False

    def _publish_checked(
        self, entry: EntryInfo | NewEntry, *, callbacks: int | None = None
    ) -> bool:
        """`publish`, then withdraw the manifest if a gc evicted the row meanwhile.

        A gc that deletes the row between the writer reading (or inserting) it and its
        manifest finds no manifest to withdraw, and may delete the object at once
        (`--grace 0`): the manifest would lead readers to nothing. Checked after
        publishing, either this finds the row gone or gc's own withdrawal comes after the
        manifest. A row for other bytes (another writer's, after the eviction) is left as
        it is: a reader that follows this manifest to a deleted object drops only the
        manifest, and the next writer of the key republishes the row's."""
        if not self.publish(entry, callbacks=callbacks):
            return False
        try:
            if self.index.lookup(entry.key) is None:
                self.blobs.delete_manifests([entry.key])
                self.counters.add("manifest_withdrawn")
                return False
        except Exception as exc:  # a manifest without entry costs misses; verify repairs it
            log.debug("artifactstore: re-check of %s's row failed: %s", entry.key[:12], exc)
        return True

    def _published(self, entry: EntryInfo) -> bool:
        """Whether `entry`'s manifest is published and leads to its object."""
        data = self.blobs.get_manifest(entry.key)
        try:
            return data is not None and Manifest.decode(data, entry.key).digest == entry.digest
        except CorruptObject:
            return False

    def withdraw(self, keys: list[str]) -> None:
        """Withdraw the manifests of entries being removed (before or just after their
        rows go; their objects outlive both by gc's grace period). Refused, with the
        index's one line, where the index may not be written: removal needs both."""
        why = db.read_only_reason(self.engine)
        if why is not None:
            raise ReadOnlyError(why)
        if keys:
            self.blobs.delete_manifests(keys)

    def refused(self, key: str) -> str | None:
        """Why this process refused `key`'s entry for its signature (`unsigned`,
        `untrusted_key`, `bad_signature`), or None."""
        return self._refused.get(key)

    def _remember(self, key: str, record: Manifest, data: bytes) -> None:
        if self.tier is None:
            return
        try:
            self.tier.remember(key, record, data)
        except Exception as exc:  # a full or read-only disk costs the tier, nothing else
            self._warn_once("tier", "local tier not updated: %s", one_line(exc))

    def _over_limit(self, exc: OverLimit, miss: Callable[[str], Hit | None]) -> Hit | None:
        self._warn_once("over-limit", "executable not loaded: %s; compiling", exc)
        return miss("over_limit")

    def _miss(self, reason: str, *, key: str, fingerprint: str) -> Hit | None:
        """Count a miss (and why, if not simply absent): `misses` and the reasons in
        usage.TOTALS reach the index's counters."""
        self.counters.add("misses", fingerprint=fingerprint)
        if reason != "misses":
            self.counters.add(reason)
        with self._touch_lock:
            self._missed[key] = reason
            if len(self._missed) > MISSED_KEYS:
                del self._missed[next(iter(self._missed))]
        return None

    def found_nothing(self, key: str) -> bool:
        """Whether this process's last lookup of `key` found no entry at all (rather than
        one it could not use here: another platform, a refused signature, over a limit)."""
        with self._touch_lock:
            return self._missed.get(key) == "misses"

    def compiled_below_threshold(self, key: str, fingerprint: str) -> None:
        """The caller compiled `key` faster than ARTSTORE_MIN_COMPILE_SECS: it will not be
        stored, so a miss this process counted for it was not an eligible miss
        (`misses_below_threshold`); every such compile counts as `below_threshold`."""
        with self._touch_lock:
            missed = key in self._missed
            self._missed.pop(key, None)
        if missed:
            self.counters.add("misses_below_threshold", fingerprint=fingerprint)
        self.counters.add("below_threshold", fingerprint=fingerprint)

    def _quarantine(self, entry: EntryInfo | Manifest, why: str) -> None:
        if self.read_only:  # a reader moves nothing: say so, and leave it to a writer
            self._warn_once(
                "corrupt",
                "corrupt object %s ignored (%s); read-only, so not quarantined: "
                "run `artstore verify --repair` as a writer",
                entry.digest[:12],
                why,
            )
            return
        self._warn_once("corrupt", "corrupt object ignored and quarantined (%s)", why)
        try:
            self.blobs.quarantine(entry.digest)
            self.index.forget_objects([entry.digest])
            self._drop_entry(entry)
        except Exception as exc:
            log.debug("artifactstore: quarantine of %s failed: %s", entry.digest[:12], exc)

    def _drop_entry(self, entry: EntryInfo | Manifest) -> None:
        """Remove an entry whose object is gone, so the next compile can store it again."""
        if not self.read_only:
            try:
                self.withdraw([entry.key])
                self.index.delete_entry(entry.key, digest=entry.digest)
            except ReadOnlyError:  # a store this user may only read: leave it to a writer
                pass

    def _touch(self, key: str) -> None:
        self._merge_touches({key: (1, utcnow())})

    def flush_access(self) -> None:
        """Write batched hit counts, access times and counters to the index, or to a
        hit journal where the index is a database server."""
        if self.journals_hits:
            self._write_journal()
            return
        with self._touch_lock:
            touches, self._touches = self._touches, {}
        counts, usage = self.counters.take()
        try:
            if self.read_only:
                # Readers may only append to `accesses` (never write entries);
                # `artstore gc` folds those rows in, so LRU reflects the cluster.
                self.index.record_reader_access(touches)
            else:
                self.index.record_access(touches)
                self.index.add_counters(dict(counts), usage)
        except PrivilegeRefused as exc:  # the login's grants: asking again will not help
            self._warn_once("access-rows", "hit counts of %s not recorded: %s", self.namespace, exc)
        except ReadOnlyError as exc:  # an index this process may not write (a read-only file)
            log.debug("artifactstore: hits not recorded: %s", exc)
        except (DataError, IntegrityError, OverflowError) as exc:
            # These rows will never go in: keeping them would fail every later flush.
            self._warn_once("access-rows", "hit counts dropped (%s)", one_line(exc))
        except Exception:
            if self.read_only:
                counts, usage = _Counts(), {}  # readers never write counters
            self._requeue(touches, counts, usage)  # the database is down: kept for the next
            raise

    def _write_journal(self) -> None:
        """One hit journal object with the pending hits and miss counts (at most
        MAX_JOURNAL_KEYS of them: the rest wait for the next); kept pending if the
        object store refuses it, so the next flush tries again."""
        self._last_journal = time.monotonic()
        with self._touch_lock:
            if not self._touches and not self.counters.has_pending():
                return
            keys = list(self._touches)[:MAX_JOURNAL_KEYS]
            touches = {k: self._touches.pop(k) for k in keys}
        counts, usage = self.counters.take()
        accesses = {k: (n, when.timestamp()) for k, (n, when) in touches.items()}
        try:
            journal = Journal(accesses, dict(counts), usage)
            self.blobs.put_record(JOURNALS, new_name(), journal.encode())
        except Exception:
            self._requeue(touches, counts, usage)
            raise

    def _requeue(
        self,
        touches: dict[str, tuple[int, datetime]],
        counts: _Counts[str],
        usage: _usage.Usage,
    ) -> None:
        """Put a batch that could not be written back into the next one."""
        self._merge_touches(touches)
        self.counters.requeue(counts, usage)

    # -- write --------------------------------------------------------------
    def put(
        self,
        key: str,
        payload: bytes,
        *,
        fingerprint: Fingerprint,
        module_name: str,
        compile_secs: float,
        callbacks: int | None = None,
    ) -> bool:
        """Store synchronously; True if this call created the entry.

        `callbacks`: how many host callbacks the executable calls (recorded in the
        object, checked on load); None where the caller does not know."""
        admitted, existing = self._admit(key)
        if not admitted:
            return False
        encoded = encode_entry(
            key,
            payload,
            fingerprint=fingerprint,
            module_name=module_name,
            compile_secs=compile_secs,
            callbacks=callbacks,
            signing_key=self.settings.signing_key,
            namespace=self.namespace,
        )
        return self._commit(
            key,
            encoded,
            existing,
            fingerprint=fingerprint,
            module_name=module_name,
            compile_secs=compile_secs,
            callbacks=callbacks,
            producer_host=socket.gethostname(),
        )

    def put_encoded(
        self,
        key: str,
        encoded: codec.Encoded,
        *,
        fingerprint: Fingerprint,
        module_name: str,
        compile_secs: float,
        callbacks: int | None = None,
        producer_host: str,
    ) -> bool:
        """Store an object that is already encoded (and signed) as it will be kept, as
        `put` stores a fresh one: same checks, row, manifest and tier. True if this call
        created the entry. The caller has verified `encoded` against `key` and
        `fingerprint` (`verify`): it is stored byte for byte, never re-encoded, so its
        signature stays the writer's (bundles imported from another store)."""
        admitted, existing = self._admit(key)
        if not admitted:
            return False
        return self._commit(
            key,
            encoded,
            existing,
            fingerprint=fingerprint,
            module_name=module_name,
            compile_secs=compile_secs,
            callbacks=callbacks,
            producer_host=producer_host,
        )

    def _admit(self, key: str) -> tuple[bool, EntryInfo | None]:
        """(whether a put of `key` goes on, the entry it replaces): no on a read-only
        store or where the key is stored already (counted), except an entry this process
        refused for its signature, which a writer that can sign replaces."""
        if self.read_only:
            self.counters.add("skipped_read_only")
            return False, None
        existing = self.index.lookup(key)
        replace = existing is not None and key in self._refused
        if replace and self.settings.signing_key is None:
            # Present, but this process refused it for its signature (and cannot sign):
            # the entry stays as it is; its readers compile, as this process did.
            self.counters.add("refused_present")
            return False, None
        if existing is not None and not replace:  # another process stored it first
            self.counters.add("already_present")
            if self.settings.index_is_server and not self._published(existing):
                # Stored by a 0.2 client, its publication failed, or its manifest was
                # damaged: readers miss it until it is published (this process did too).
                if self._publish_checked(existing):
                    self.counters.add("manifest_republished")
            return False, None
        return True, existing

    def _commit(
        self,
        key: str,
        encoded: codec.Encoded,
        existing: EntryInfo | None,
        *,
        fingerprint: Fingerprint,
        module_name: str,
        compile_secs: float,
        callbacks: int | None,
        producer_host: str,
    ) -> bool:
        """The write path every put ends in: object durable, then index row (or the
        replacement of a refused entry), then tier and manifest; True if created."""
        uploaded = self.blobs.put(encoded.digest, encoded.data)
        if uploaded:
            self.counters.add("bytes_uploaded", len(encoded.data))
        entry = NewEntry.for_object(
            key=key,
            digest=encoded.digest,
            size=len(encoded.data),
            raw_size=encoded.raw_size,
            module_name=module_name,
            fingerprint=fingerprint,
            compile_secs=compile_secs,
            producer_host=producer_host[:255],
            signer=encoded.signer,
            signature=encoded.signature,
        )
        if existing is not None:
            # This process refused the entry's object for its signature (unsigned, an
            # untrusted key, a bad signature) and just compiled the key itself: replace
            # it with its own, signed object, so readers that trust this key load it.
            created = self.index.repoint(
                key,
                old_digest=existing.digest,
                new_digest=encoded.digest,
                size=len(encoded.data),
                signer=encoded.signer,
                signature=encoded.signature,
                entry=entry,
            )
            if created:
                self.index.add_entry(entry, fingerprint.to_json())  # its fingerprint row
                self._refused.pop(key, None)
                self.counters.add("replaced_refused")
                if not self.index.keys_for_digest(existing.digest):
                    self.blobs.delete(existing.digest)
                    self.index.forget_objects([existing.digest])
        else:
            created = self.index.add_entry(entry, fingerprint.to_json())
        self.counters.add("stored" if created else "already_present")
        if created:
            self._remember(key, Manifest.of(entry, callbacks=callbacks), encoded.data)
        if created and not self.blobs.exists(encoded.digest):
            # A gc deleted the object between our existence check and our commit (the
            # race is explained in artifactstore/gc/__init__.py): put it back, so the
            # entry points at a missing object for no longer than this one operation.
            self.blobs.put(encoded.digest, encoded.data)
        if not created and uploaded and not self.index.keys_for_digest(encoded.digest):
            # Lost a race on the key with different bytes (XLA output is not
            # byte-identical across processes): drop our now-unreferenced copy.
            self.blobs.delete(encoded.digest)
            self.index.forget_objects([encoded.digest])
        if created:
            if encoded.signer is None and self.settings.require_signatures:
                self._warn_once("unsigned-write", UNSIGNED_WRITE)
            self._publish_checked(entry, callbacks=callbacks)
            if not self._identity_checked:
                self._identity_checked = True
                identity.bind_after_write(self)
            for listener in self.on_stored:
                listener()
        return created

    def submit_put(
        self,
        key: str,
        payload: bytes,
        *,
        fingerprint: Fingerprint,
        module_name: str,
        compile_secs: float,
        callbacks: int | None = None,
        then: Callable[[bool], None] | None = None,
    ) -> None:
        """Queue a put on the background writer; the program does not wait for it.

        `then`: called on the writer with whether the entry is now published (stored
        by this or another process), however the put ended."""
        finished = then or (lambda _published: None)
        if self.read_only:
            self.counters.add("skipped_read_only")
            finished(False)
            return

        def keep() -> None:
            """A backend is down: this host's tier keeps the executable (see keep_in_tier)."""
            if self.tier is not None and keep_in_tier(
                self.settings, self.tier, key, payload, fingerprint=fingerprint,
                module_name=module_name, compile_secs=compile_secs, callbacks=callbacks,
            ):  # fmt: skip
                self.counters.add("kept_in_tier")

        def job() -> None:
            published = False
            try:
                published = upload()
            finally:
                finished(published)

        def upload() -> bool:
            if time.monotonic() < self._uploads_paused_until:
                # A backend just failed an upload: drop this one (counted) instead of
                # paying the timeout again for every queued compile and the exit flush.
                self.counters.add("put_skipped")
                keep()
                return False
            try:
                self.put(
                    key,
                    payload,
                    fingerprint=fingerprint,
                    module_name=module_name,
                    compile_secs=compile_secs,
                    callbacks=callbacks,
                )
                self._upload_failures = 0
                return True
            except Exception as exc:
                self.counters.add("put_errors")
                cause = one_line(exc)
                if isinstance(exc, (OperationalError, InterfaceError)):  # the driver's words
                    cause = f"index unavailable ({cause})"
                paused = ""
                if isinstance(exc, (StoreUnavailable, OperationalError, InterfaceError)):
                    # A backend unavailable: like the breakers (ARTSTORE_BREAKER_*).
                    keep()
                    self._upload_failures += 1
                    if self._upload_failures >= self.settings.breaker_failures:
                        cooldown = self.settings.breaker_cooldown_secs
                        self._uploads_paused_until = time.monotonic() + cooldown
                        paused = f"; not uploading for {cooldown:g} s"
                # Once per kind of cause, not once per process: a later, different
                # failure (the bucket now denies writes) must not hide behind the first.
                kind = re.sub(r"[0-9a-f]{12,}", "…", f"{type(exc).__name__}: {cause}")
                self._warn_once(
                    f"put {kind}", "could not store %s: %s%s", module_name, cause, paused
                )
                raise

        self.worker.submit(f"put {module_name}", job)

    def flush(self, timeout: float | None = None) -> bool:
        """Finish queued uploads and access records within `timeout` seconds."""
        bound = self.settings.flush_secs if timeout is None else timeout
        deadline = time.monotonic() + bound
        done = self.worker.drain(bound)
        if isinstance(self._flight, SingleFlight):  # leases released: waiters go on
            self._flight.drain(min(max(deadline - time.monotonic(), 0), self.settings.timeout_secs))
        late = [] if done else [f"{self.worker.pending()} upload(s)"]
        # Hit counts too, within what is left of the same bound: a database that stops
        # answering must not hold the program at exit.
        with self._touch_lock:
            writes_counts = not self.read_only or self.journals_hits
            counts = writes_counts and self.counters.has_pending()
            accesses = bool(self._touches or counts)
        # The hit counts are one store operation: bounded by ARTSTORE_TIMEOUT as any other.
        hits_bound = min(deadline - time.monotonic(), self.settings.timeout_secs)
        try:
            if accesses and hits_bound <= 0:
                raise TimeoutError(f"no time left of the {bound:g} s flush bound")
            if accesses:
                call_with_timeout(self.flush_access, hits_bound)
        except TimeoutError:
            late.append("hit counts")
        except Exception as exc:
            log.debug("artifactstore: final access flush failed: %s", exc)
        if late:  # one line for both: one flush, one incident
            self._warn_once(
                "flush",
                "%s not finished within %.0f s; they were not stored",
                " and ".join(late),
                bound if not done else max(hits_bound, 0),
            )
        return done

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def open_index(settings: Settings) -> Engine:
    """The index's engine, its schema checked; the embedded default migrates itself."""
    engine = db.open_engine(
        settings.index_url,
        timeout_secs=settings.timeout_secs,
        read_only=settings.read_only,
        pool_size=settings.db_pool_size,
    )
    status = db.schema_status(engine)
    if status.state is not db.SchemaState.CURRENT:
        writable = db.read_only_reason(engine) is None  # also False where the FS says so
        if writable and migrates_on_open(settings, engine.dialect.name, status.state):
            status = db.upgrade(engine)
        status.require_current()
    return engine


def migrates_on_open(settings: Settings, dialect: str, state: db.SchemaState) -> bool:
    """Whether `Store.open` brings an index in `state` to head itself.

    The embedded default and SQLite indexes do (when writable), so a single user
    never runs migrations; a shared index waits for its admin's `artstore db upgrade`.
    """
    auto = settings.embedded or dialect == "sqlite"
    return (
        auto and not settings.read_only and state in (db.SchemaState.EMPTY, db.SchemaState.BEHIND)
    )


def keep_in_tier(
    settings: Settings,
    tier: LocalTier,
    key: str,
    payload: bytes,
    *,
    fingerprint: Fingerprint,
    module_name: str,
    compile_secs: float,
    callbacks: int | None = None,
) -> bool:
    """Keep a writer's executable in this host's tier while the store cannot take it, so
    later processes here load it; True if kept. It is not uploaded later (a process that
    finds it in the tier never misses). Only a tier holding its own objects, of a writer."""
    if settings.read_only or not tier.owns_objects:
        return False
    encoded = encode_entry(
        key,
        payload,
        fingerprint=fingerprint,
        module_name=module_name,
        compile_secs=compile_secs,
        callbacks=callbacks,
        signing_key=settings.signing_key,
        namespace=settings.namespace,
    )
    try:
        record = Manifest(key, encoded.digest, fingerprint.digest, float(compile_secs),
                          encoded.raw_size, len(encoded.data), module_name[:255], callbacks,
                          encoded.signer)  # fmt: skip
        tier.remember(key, record, encoded.data)
    except Exception as exc:  # a full disk costs the copy, nothing else
        _warn_once("tier-keep", "local tier not updated: %s", one_line(exc))
        return False
    return True


def encode_entry(
    key: str,
    payload: bytes,
    *,
    fingerprint: Fingerprint,
    module_name: str,
    compile_secs: float,
    callbacks: int | None = None,
    signing_key: SigningKey | None = None,
    namespace: str | None = None,
) -> codec.Encoded:
    """The object an entry is stored as: its payload, fingerprint and metadata, signed
    with `signing_key` for `namespace` when given (ARTSTORE_SIGNING_KEY)."""
    meta = codec.ObjectMeta(
        key=key,
        module_name=module_name[:255],
        compile_secs=float(compile_secs),
        raw_size=len(payload),
        producer_host=socket.gethostname()[:255],
        fingerprint=fingerprint.to_dict(),
        callbacks=callbacks,
    )
    return codec.encode(payload, fingerprint.digest, meta, signer=signing_key, namespace=namespace)


def _ignore(_backend: str) -> None:
    pass


def _open_tier(settings: Settings) -> LocalTier | None:
    try:
        return open_tier(settings)
    except Exception as exc:
        log.debug("artifactstore: no local tier: %s", one_line(exc))
        return None


def secure_local_dirs(settings: Settings) -> None:
    """Check a local store's directory and a SQLite index's, creating them for a writer.

    A writer's must be its own and writable by no one else (created 0700, or 0750
    with ARTSTORE_GROUP_READABLE); a store read without ARTSTORE_READ_ONLY may also
    be root's, and with it anyone's: the setting says its owner is trusted. Either
    way no one but the owner may be able to write it (safedir). Raises
    UnsafeDirectory (one line, with the fix), so the store is not used.
    """
    from artifactstore.index import health

    trust: safedir.Trust = "any" if settings.read_only else "mine_or_root"
    create = not settings.read_only
    modes = safedir.store_modes(settings.group_readable)
    # The embedded default lives in the user's cache directory, which must be theirs.
    cache = Path(os.path.realpath(default_cache_dir())) if settings.embedded else None
    index = health.sqlite_path(settings.index_url)
    dirs = [Path(settings.blobs.path)] if settings.blobs.scheme == "file" else []
    if index is not None and index.is_absolute():
        dirs.append(index.parent)
    for path in dict.fromkeys(Path(os.path.realpath(d)) for d in dirs):
        top = cache if cache is not None and cache in (path, *path.parents) else path
        safedir.secure_dir(path, top=top, modes=modes, create=create, trust=trust,
                           setting="ARTSTORE_URL")  # fmt: skip
