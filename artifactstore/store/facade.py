"""The Store: get / put of executables by key over a blob store and an index.

It works on bytes and metadata only (no JAX): the JAX adapter above it turns
compiles into `get`/`put` calls. It owns the invariants: bytes are verified
(digest, envelope, fingerprint) before anyone sees them, an index row is
committed only after its object is durable, bad objects are quarantined, and
read-only stores never write.

This class only composes the parts, each of which takes what it needs and never
calls back up here: the backends (`backends`: settings, object store, index opened
on first use, tier), the lookup (`read`), the write path (`write`), the process's
counters and hits (`account`), queued uploads and the exit flush (`uploads`), and
single-flight compile leases (`flight`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from sqlalchemy import Engine

from artifactstore.blobstores import BlobStore, describe_blobstore, open_blobstore
from artifactstore.blobstores.absent import AbsentBlobStore
from artifactstore.config import Settings
from artifactstore.formats.codec import Encoded
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.index.repo import EntryIndex, EntryInfo, Filters, NewEntry
from artifactstore.index.totals import IndexStats
from artifactstore.process.breaker import Breaker
from artifactstore.process.counters import Counters
from artifactstore.process.lanes import Lane
from artifactstore.redact import redact
from artifactstore.store.account import Accounts
from artifactstore.store.backends import (
    Backends,
    ignore,
    open_index,
    open_tier_quietly,
    secure_local_dirs,
)
from artifactstore.store.chain import Found, Missed
from artifactstore.store.flight import SingleFlight
from artifactstore.store.lease import enabled
from artifactstore.store.read import Hit, ReadPath
from artifactstore.store.records import Records
from artifactstore.store.tier import Accesses, LocalTier
from artifactstore.store.uploads import Uploads
from artifactstore.store.verify import Refusal, Verified
from artifactstore.store.write import WritePath

__all__ = ["Hit", "Recorder", "Store"]


class Recorder(Protocol):
    """Told what a store does with each executable as it happens (`artstore warm`'s
    report: warm.child), through `Store.record`, so that the store's methods stay its
    own (never replaced on an instance)."""

    def counted(self, key: str, outcome: Hit | Found | Missed) -> None:
        """A lookup's hit or miss, counted now that the program uses it."""

    def put(self, put: Put, store: Callable[[Put], bool]) -> bool:
        """Store `put` with `store` (the store's own put), recording how it went."""

    def submit(
        self, put: Put, then: Callable[[bool], None] | None, store: Callable[[Put], bool]
    ) -> None:
        """A put the program queued, made here instead: `store` (the recorded put)."""

    def below_threshold(self, key: str, fingerprint: str, compile_secs: float) -> None:
        """`key` compiled under ARTSTORE_MIN_COMPILE_SECS: not stored."""


class Store:
    def __init__(
        self,
        settings: Settings,
        blobs: BlobStore,
        engine: Engine | None = None,
        *,
        worker: Lane | None = None,
        tier: LocalTier | None = None,
        counters: Counters | None = None,
        breakers: dict[str, Breaker] | None = None,
    ) -> None:
        """`engine`: the index, or None to open it on first use (`open_index`);
        `counters`: the process's (a session's), else the store counts on its own;
        `breakers`: the process's, one per backend (a session's), else its own."""
        self.settings = settings
        self.namespace = settings.namespace
        self.read_only = settings.read_only
        self.backends = Backends(settings, blobs, engine, tier=tier, breakers=breakers)
        self.counters = counters if counters is not None else Counters()
        self.accounts = Accounts(self.backends, self.counters)
        refused: dict[str, str] = {}  # keys whose entry this process refused: see `refused`
        self.writes = WritePath(self.backends, self.counters, refused)
        self.reads = ReadPath(self.backends, self.accounts, self.writes, refused)
        self.worker = worker or Lane("writer", on_tick=self._tick)
        self.uploads = Uploads(self.backends, self.writes, self.worker)
        # Called (on the writing thread) after each entry this process creates;
        # layers above subscribe here (the opt-in quota pass).
        self.on_stored: list[Callable[[], None]] = self.writes.on_stored
        self._flight: SingleFlight | bool | None = False  # False: not decided yet
        self._recorder: Recorder | None = None  # see `record`

    # -- the backends, shared by every part ----------------------------------
    @property
    def blobs(self) -> BlobStore:
        return self.backends.blobs

    @blobs.setter
    def blobs(self, blobs: BlobStore) -> None:
        self.backends.blobs = blobs

    @property
    def tier(self) -> LocalTier | None:
        return self.backends.tier

    @tier.setter
    def tier(self, tier: LocalTier | None) -> None:
        self.backends.tier = tier

    @property
    def using(self) -> Callable[[str], None]:
        """Told which backend a lookup turns to, so that a caller timing the lookup out
        knows which one hung (the session's per-backend circuit breakers)."""
        return self.backends.using

    @using.setter
    def using(self, using: Callable[[str], None]) -> None:
        self.backends.using = using

    @property
    def engine(self) -> Engine:
        """The index's engine, opened (and its schema checked) on first use."""
        return self.backends.engine

    @property
    def index(self) -> EntryIndex:
        return self.backends.index

    @property
    def flight(self) -> SingleFlight | None:
        """This store's compile leases, or None where single-flight is off here."""
        if self._flight is False:
            on = enabled(self.settings)[0]
            accounts = self.accounts
            gate = self.writes.gate
            self._flight = (
                SingleFlight(
                    self.backends,
                    self.counters,
                    accounts.found_nothing,
                    accounts.served,
                    may_write=lambda: not gate.refused,
                )
                if on
                else None
            )
        assert self._flight is not True
        return self._flight

    @property
    def writes_refused(self) -> bool:
        """Whether this writer's write gate refused it: object store and index are not
        one store, so it stores nothing (decided at its first write; False before)."""
        return self.writes.gate.refused

    @property
    def writes_unsigned(self) -> bool:
        """Whether this writer's entries are refused for want of a signing key (the store
        requires signatures and ARTSTORE_SIGNING_KEY is not set): it stores nothing."""
        return not self.writes.signs

    @property
    def journals_hits(self) -> bool:
        """Whether hits go to a hit journal in the object store: on a database server
        that this process has not opened (a reader, or a writer that only read so far)."""
        return self.backends.journals_hits

    @property
    def index_opened(self) -> bool:
        """Whether this process has opened the index (a reader never does)."""
        return self.backends.index_opened

    # -- what the layers above read, given the Store (never its parts) ---------
    @property
    def records(self) -> Records:
        """The records alone (working sets, quick keys, removals, manifests), their
        writes through this writer's gate: see `records`."""
        return Records(self.backends.blobs, lambda: self.writes.gate.admits(quietly=True))

    def lookup(self, key: str) -> EntryInfo | None:
        """`key`'s index row, or None."""
        return self.backends.index.lookup(key)

    def iter_entries(self, filters: Filters | None = None) -> Iterator[EntryInfo]:
        """The index's entries, most recently used first."""
        return self.backends.index.iter_entries(filters)

    def stats(self) -> IndexStats:
        """The index's totals (entries, bytes, hits)."""
        return self.backends.index.stats()

    def require_writable_index(self) -> None:
        """ReadOnlyError, with the index's one line, where its role refuses writes."""
        self.writes.require_writable_index()

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
        counters: Counters | None = None,
        breakers: dict[str, Breaker] | None = None,
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
        `counters`: where the store counts (a session's: the process's one).
        `breakers`: asked before each call to a backend (a session's: the process's).
        """
        using = using or ignore
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
        tier = tier or open_tier_quietly(settings)
        store = cls(settings, blobs, engine, tier=tier, counters=counters, breakers=breakers)
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
            self.accounts.tick()
        finally:
            self.backends.release_idle()

    def describe(self) -> str:
        return redact(f"{self.blobs.describe()} + {self.settings.index_url}")

    # -- read (store.read) ----------------------------------------------------
    def get(self, key: str, fingerprint_digest: str, *, callbacks: int | None = None) -> Hit | None:
        """Verified payload for `key` built for this fingerprint, or None (a miss), counted.

        `callbacks`: the number of host callbacks the caller will bind on load; an
        executable stored for another number is a miss (`callback_mismatch`).
        """
        return self.reads.get(key, fingerprint_digest, callbacks=callbacks)

    def peek(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Hit | Missed:
        """As `get`, counted nothing: the lookup chain counts it (`count`) when used.
        The look reads only (ReadPath.peek); what it found costs what the store level
        charges (ReadPath.settle: remembered in the tier, withdrawn, quarantined)."""
        reads = self.reads
        return reads.settle(key, reads.peek(key, fingerprint_digest, callbacks=callbacks))

    def count(self, key: str, fingerprint_digest: str, outcome: Hit | Found | Missed) -> None:
        """Count the hit or miss `peek` returned, now that the program uses it."""
        self.reads.count(key, fingerprint_digest, outcome)
        if self._recorder is not None:
            self._recorder.counted(key, outcome)

    def record(self, recorder: Recorder) -> None:
        """Tell `recorder` of each counted lookup, put and compile under the threshold:
        a warming process (warm.child), whose compiles count as `warm_compiles`, not
        misses, and whose queued puts are made at once (storing is the point there, so a
        compile returns once its entry is stored; a process killed later loses nothing)."""
        self.accounts.warming = True
        self._recorder = recorder

    def fetch_object(self, entry: EntryInfo | Manifest) -> bytes | None:
        """`entry`'s object as stored, unverified, or None if gone (see ReadPath.fetch_object)."""
        return self.reads.fetch_object(entry)

    def verify(
        self,
        entry: EntryInfo | Manifest,
        data: bytes,
        fingerprint_digest: str,
        *,
        callbacks: int | None = None,
        with_metadata: bool = False,
    ) -> Verified | Refusal:
        """The payload in `data`, or why not, verified as every load is (see ReadPath.verify)."""
        return self.reads.verify(
            entry, data, fingerprint_digest, callbacks=callbacks, with_metadata=with_metadata
        )

    def refused(self, key: str) -> str | None:
        """Why this process refused `key`'s entry: its signature (`unsigned`,
        `untrusted_key`, `bad_signature`), a removed version (`named_removed`) or a
        payload not of its kind (`malformed`); None if it did not."""
        return self.reads.refused.get(key)

    # -- accounts (store.account) ---------------------------------------------
    def found_nothing(self, key: str) -> bool:
        """Whether this process's last lookup of `key` found no entry at all."""
        return self.accounts.found_nothing(key)

    def compiled_below_threshold(
        self, key: str, fingerprint: str, compile_secs: float = 0.0
    ) -> None:
        """`key` compiled below ARTSTORE_MIN_COMPILE_SECS: not stored (counted: see
        Accounts). If this process looked it up and found nothing, a writer publishes
        that it is quick, in the background (a pulled node then never looks it up)."""
        if self.accounts.compiled_below_threshold(key, fingerprint) and not self.read_only:
            self.uploads.submit_quick(key, fingerprint, compile_secs)
        if self._recorder is not None:
            self._recorder.below_threshold(key, fingerprint, compile_secs)

    def fold_tier_journals(self) -> None:
        """Count hits that processes served from this host's tier, so LRU sees them."""
        self.accounts.fold_tier_journals()

    def add_accesses(self, accesses: Accesses) -> None:
        """Merge hits served elsewhere (the tier's journals) into the next access flush."""
        self.accounts.add_accesses(accesses)

    def flush_access(self) -> None:
        """Write batched hit counts, access times and counters to the index, or to a
        hit journal where the index is a database server."""
        self.accounts.flush()

    # -- write (store.write, store.uploads) -----------------------------------
    def put(self, put: Put) -> bool:
        """Store `put` synchronously; True if this call created the entry.

        A put whose payload is an object encoded (and signed) already is stored as `put`
        stores a fresh one (same checks, row, manifest and tier), byte for byte, never
        re-encoded, so its signature stays the writer's (bundles imported from another
        store): the caller has verified it against its key and fingerprint (`verify`)."""
        if self._recorder is not None:
            return self._recorder.put(put, self.writes.put)
        return self.writes.put(put)

    def publish(self, entry: EntryInfo | NewEntry, *, callbacks: int | None = None) -> bool:
        """Publish `entry`'s manifest, withdrawn again if its row went meanwhile (see
        WritePath.publish_checked); False if the store refused or the row is gone."""
        return self.writes.publish_checked(entry, callbacks=callbacks)

    def require_bound(self) -> None:
        """For a command about to change the index or delete objects: StoreMismatch (one
        line naming both and the fix) unless object store and index are one store; its
        writes then ask no more (artifactstore.store.identity.WriteGate)."""
        self.writes.gate.require()

    def withdraw(self, keys: list[str]) -> None:
        """Withdraw the manifests of entries being removed (see WritePath.withdraw)."""
        self.writes.withdraw(keys)

    def remove_entries(self, keys: list[str] | None) -> int:
        """Remove entries (all of the namespace's if None; see WritePath.remove_entries);
        this host's tier serves them no more. How many rows went."""
        removed = self.writes.remove_entries(keys)
        if removed:
            self.entries_removed()
        return removed

    def replace_object(self, entry: EntryInfo, encoded: Encoded) -> tuple[bool, bool]:
        """Point `entry` at a new object (see WritePath.replace_object)."""
        return self.writes.replace_object(entry, encoded)

    def remove_object(self, digest: str, *, quarantine: bool) -> int:
        """Remove the entries that lead to `digest` and forget the object (see
        WritePath.remove_object); this host's tier serves them no more."""
        removed = self.writes.remove_object(digest, quarantine=quarantine)
        if removed:
            self.entries_removed()
        return removed

    def entries_removed(self) -> None:
        """Called after entries were deleted: this host's tier must not serve them again."""
        if self.tier is not None:
            self.tier.invalidate()

    def submit_put(self, put: Put, *, then: Callable[[bool], None] | None = None) -> None:
        """Queue a put on the background writer; the program does not wait for it.

        `then`: called on the writer with whether the entry is now published (stored
        by this or another process), however the put ended."""
        if self._recorder is not None and not self.read_only:
            self._recorder.submit(put, then, self.put)
            return
        self.uploads.submit(put, then)

    def flush(self, timeout: float | None = None) -> bool:
        """Finish queued uploads and access records within `timeout` seconds."""
        flight = self._flight if isinstance(self._flight, SingleFlight) else None
        return self.uploads.flush(self.accounts, flight, timeout)

    def close(self) -> None:
        self.worker.close()  # its periodic flush: nothing left to flush
        self.backends.close()
