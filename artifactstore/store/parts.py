"""The narrow parts of a store: what operators' commands (cli/, gc/, bundles/, warm/)
work on, apart from the small face programs get (`Store`: store.facade).

Code outside store/ that walks the index and the object store directly (gc, verify,
rebuild, fold) takes `StoreParts`: it then sees only the index, the object store and
the settings, never the read and write paths. Commands that need more take `Parts`
(`store.parts`) and use each part itself: `index`, `blobs`, `tier`, `records`, `reads`
(fetch, verify, refusals), `writes` (publish, withdraw, the write gate), `accounts`
(hits and their flush); no method here merely passes a call on. The index stays opened
on first use (a reader that folds nothing never opens it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from artifactstore.process.counters import Counters
from artifactstore.process.lanes import Lane, Tick
from artifactstore.redact import redact
from artifactstore.store.account import Accounts
from artifactstore.store.backends import Backends
from artifactstore.store.read import ReadPath
from artifactstore.store.records import Records
from artifactstore.store.uploads import Uploads
from artifactstore.store.write import WritePath

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from artifactstore.blobstores.base import BlobStore
    from artifactstore.config import Settings
    from artifactstore.index.repo import EntryIndex
    from artifactstore.process.breaker import Breaker
    from artifactstore.store.tier import LocalTier


class StoreParts(Protocol):
    """A store's settings, object store and index (and the index's engine and namespace)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def namespace(self) -> str: ...

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def index(self) -> EntryIndex: ...


class Parts:
    """One store's parts, composed once: the backends (settings, object store, index
    opened on first use, tier), the lookup (`reads`), the write path (`writes`), the
    process's counters and hits (`accounts`), queued uploads and their writer thread."""

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
        refused: dict[str, str] = {}  # keys whose entry this process refused: see `reads`
        self.writes = WritePath(self.backends, self.counters, refused)
        self.reads = ReadPath(self.backends, self.accounts, self.writes, refused)
        self.worker = worker or Lane("writer", tick=Tick(5.0, self._tick))
        self.uploads = Uploads(self.backends, self.writes, self.worker)
        # Called (on the writing thread) after each entry this process creates;
        # layers above subscribe here (the opt-in quota pass).
        self.on_stored: list[Callable[[], None]] = self.writes.on_stored

    # -- the backends (StoreParts) ---------------------------------------------
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
    def engine(self) -> Engine:
        """The index's engine, opened (and its schema checked) on first use."""
        return self.backends.engine

    @property
    def index(self) -> EntryIndex:
        return self.backends.index

    @property
    def records(self) -> Records:
        """The records alone (working sets, quick keys, removals, manifests), their
        writes through this writer's gate: see `records`."""
        return Records(self.backends.blobs, lambda: self.writes.gate.admits(quietly=True))

    def describe(self) -> str:
        return redact(f"{self.blobs.describe()} + {self.settings.index_url}")

    # -- removal: the write path's, and this host's tier serves them no more ----------
    def remove_entries(self, keys: list[str] | None) -> int:
        """Remove entries (all of the namespace's if None; see WritePath.remove_entries).
        How many rows went."""
        removed = self.writes.remove_entries(keys)
        if removed:
            self.entries_removed()
        return removed

    def remove_object(self, digest: str, *, quarantine: bool) -> int:
        """Remove the entries that lead to `digest` and forget the object (see
        WritePath.remove_object)."""
        removed = self.writes.remove_object(digest, quarantine=quarantine)
        if removed:
            self.entries_removed()
        return removed

    def entries_removed(self) -> None:
        """Called after entries were deleted: this host's tier must not serve them again."""
        if self.tier is not None:
            self.tier.invalidate()

    def _tick(self) -> None:
        """The background writer's periodic work: hits to the index (or to a hit journal,
        at most every ARTSTORE_JOURNAL_SECS), then idle database connections closed (a
        process that only trains holds none)."""
        try:
            self.accounts.tick()
        finally:
            self.backends.release_idle()
