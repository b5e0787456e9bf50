"""The Store: the small face a program gets; operators' commands use its parts.

It works on bytes and metadata only (no JAX): the JAX adapter above it turns
compiles into `look`/`count`/`submit` calls. Its parts (`store.parts`: see
store.parts.Parts) own the invariants: bytes are verified (digest, envelope,
fingerprint) before anyone sees them, an index row is committed only after its
object is durable, bad objects are quarantined, and read-only stores never write.
A program needs a lookup, its count, a put (at once or queued), the flush and close,
its compile leases and, for `artstore warm`, a recorder: nothing else is here, so
the face stays a dozen names (tests/test_store_face.py); operators' commands take
`store.parts` and use the part they need (`index`, `blobs`, `reads`, `writes`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from artifactstore.blobstores import describe_blobstore, open_blobstore
from artifactstore.blobstores.absent import AbsentBlobStore
from artifactstore.config import Settings
from artifactstore.formats.put import Put
from artifactstore.process.breaker import Breaker
from artifactstore.process.counters import Counters
from artifactstore.store.backends import ignore, open_index, open_tier_quietly, secure_local_dirs
from artifactstore.store.chain import Found, Missed
from artifactstore.store.flight import SingleFlight
from artifactstore.store.lease import enabled
from artifactstore.store.parts import Parts
from artifactstore.store.tier import LocalTier

__all__ = ["Recorder", "Store"]


class Recorder(Protocol):
    """Told what a store does with each executable as it happens (`artstore warm`'s
    report: warm.child), through `Store.record`, so that the store's methods stay its
    own (never replaced on an instance)."""

    def counted(self, key: str, outcome: Found | Missed) -> None:
        """A lookup's hit or miss, counted now that the program uses it."""

    def put(self, put: Put, store: Callable[[Put], bool]) -> bool:
        """Store `put` with `store` (the store's own put), recording how it went."""

    def submit(
        self, put: Put, then: Callable[[bool], None] | None, store: Callable[[Put], bool]
    ) -> None:
        """A put the program queued, made here instead: `store` (the recorded put)."""

    def compiled_below_threshold(self, key: str, fingerprint: str, compile_secs: float) -> None:
        """`key` compiled under ARTSTORE_MIN_COMPILE_SECS: not stored."""


class Store:
    def __init__(self, parts: Parts) -> None:
        """The face over `parts` (`Store.open` composes them: `Store(Parts(settings,
        blobs))` where the object store is at hand)."""
        self.parts = parts
        self._flight: SingleFlight | bool | None = False  # False: not decided yet
        self._recorder: Recorder | None = None  # see `record`

    @property
    def flight(self) -> SingleFlight | None:
        """This store's compile leases, or None where single-flight is off here."""
        if self._flight is False:
            parts = self.parts
            gate = parts.writes.gate
            self._flight = (
                SingleFlight(
                    parts.backends,
                    parts.counters,
                    parts.accounts.found_nothing,
                    parts.accounts.served,
                    may_write=lambda: not gate.refused,
                )
                if enabled(parts.settings)[0]
                else None
            )
        assert self._flight is not True
        return self._flight

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
        `using`: told "index" or "object store" as each is turned to, so that a caller
        timing a lookup out knows which one hung (the session's per-backend breakers).
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
        store = cls(Parts(settings, blobs, engine, tier=tier, counters=counters, breakers=breakers))
        parts = store.parts
        parts.backends.using = using
        if lazy_index:  # a program's first miss waits for nothing it does not need
            parts.worker.submit("fold tier journals", parts.accounts.fold_tier_journals)
        else:
            parts.accounts.fold_tier_journals()
        return store

    # -- read (store.read) ----------------------------------------------------
    def get(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | None:
        """Verified payload for `key` built for this fingerprint, or None (a miss), counted.

        `callbacks`: the number of host callbacks the caller will bind on load; an
        executable stored for another number is a miss (`callback_mismatch`).
        """
        outcome = self.look(key, fingerprint_digest, callbacks=callbacks)
        self.count(key, fingerprint_digest, outcome)
        return outcome if isinstance(outcome, Found) else None

    def look(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | Missed:
        """As `get`, counted nothing: the lookup chain counts it (`count`) when used.
        The look reads only (ReadPath.peek); what it found costs what the store level
        charges (ReadPath.settle: remembered in the tier, withdrawn, quarantined)."""
        reads = self.parts.reads
        return reads.settle(key, reads.peek(key, fingerprint_digest, callbacks=callbacks))

    def count(self, key: str, fingerprint_digest: str, outcome: Found | Missed) -> None:
        """Count the hit or miss `look` returned, now that the program uses it."""
        self.parts.reads.count(key, fingerprint_digest, outcome)
        if self._recorder is not None:
            self._recorder.counted(key, outcome)

    def compiled_below_threshold(
        self, key: str, fingerprint: str, compile_secs: float = 0.0
    ) -> None:
        """`key` compiled below ARTSTORE_MIN_COMPILE_SECS: not stored (counted: see
        Accounts). If this process looked it up and found nothing, a writer publishes
        that it is quick, in the background (a pulled node then never looks it up)."""
        parts = self.parts
        if parts.accounts.compiled_below_threshold(key, fingerprint) and not parts.read_only:
            parts.uploads.submit_quick(key, fingerprint, compile_secs)
        if self._recorder is not None:
            self._recorder.compiled_below_threshold(key, fingerprint, compile_secs)

    def record(self, recorder: Recorder) -> None:
        """Tell `recorder` of each counted lookup, put and compile under the threshold:
        a warming process (warm.child), whose compiles count as `warm_compiles`, not
        misses, and whose queued puts are made at once (storing is the point there, so a
        compile returns once its entry is stored; a process killed later loses nothing)."""
        self.parts.accounts.warming = True
        self._recorder = recorder

    # -- write (store.write, store.uploads) -----------------------------------
    def put(self, put: Put) -> bool:
        """Store `put` synchronously; True if this call created the entry.

        A put whose payload is an object encoded (and signed) already is stored as `put`
        stores a fresh one (same checks, row, manifest and tier), byte for byte, never
        re-encoded, so its signature stays the writer's (bundles imported from another
        store): the caller has verified it against its key and fingerprint
        (`parts.reads.verify`)."""
        if self._recorder is not None:
            return self._recorder.put(put, self.parts.writes.put)
        return self.parts.writes.put(put)

    def submit(self, put: Put, *, then: Callable[[bool], None] | None = None) -> None:
        """Queue a put on the background writer; the program does not wait for it.

        `then`: called on the writer with whether the entry is now published (stored
        by this or another process), however the put ended."""
        if self._recorder is not None and not self.parts.read_only:
            self._recorder.submit(put, then, self.put)
            return
        self.parts.uploads.submit(put, then)

    def flush(self, timeout: float | None = None) -> bool:
        """Finish queued uploads and access records within `timeout` seconds."""
        flight = self._flight if isinstance(self._flight, SingleFlight) else None
        return self.parts.uploads.flush(self.parts.accounts, flight, timeout)

    def close(self) -> None:
        self.parts.worker.close()  # its periodic flush: nothing left to flush
        self.parts.backends.close()
