"""What one Store's parts share: its settings, object store, index and tier.

Why one object: the read path, the write path, the accounts and single-flight all
turn to the same backends, and the index among them is opened only by the first
part that needs it (a process that only reads never connects: issue 16). Each part
holds this, never the facade, so no part calls back up into `Store`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from artifactstore.blobstores import BlobStore, safedir
from artifactstore.blobstores.store_trust import store_trust
from artifactstore.config import Settings, default_cache_dir
from artifactstore.errors import ArtstoreError, PrivilegeRefused, StoreUnavailable, one_line
from artifactstore.index import db
from artifactstore.index.repo import EntryIndex
from artifactstore.process import notices
from artifactstore.process.breaker import Breaker, per_backend
from artifactstore.store.tier import LocalTier
from artifactstore.store.tiers import open_tier

log = logging.getLogger("artifactstore")


def ignore(_backend: str) -> None:
    """The default `using`: nobody times this store's lookups out."""


class Backends:
    """One store's settings, object store, index (opened on first use) and tier."""

    def __init__(
        self,
        settings: Settings,
        blobs: BlobStore,
        engine: Engine | None = None,
        *,
        tier: LocalTier | None = None,
        breakers: dict[str, Breaker] | None = None,
    ) -> None:
        """`breakers`: the process's, one per backend (a session's), else the store's own."""
        self.settings = settings
        self.namespace = settings.namespace
        self.read_only = settings.read_only
        self.blobs = blobs
        self.tier = tier
        self._engine = engine
        self._index = EntryIndex(engine, settings.namespace) if engine is not None else None
        self._engine_lock = threading.Lock()
        # Told which backend a lookup turns to, so that a caller timing the lookup out
        # knows which one hung (the session's per-backend circuit breakers).
        self.using: Callable[[str], None] = ignore
        # Asked before each call to a backend by every part (process.breaker).
        self.breakers = breakers if breakers is not None else per_backend(settings)

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
    def index_opened(self) -> bool:
        """Whether this process has opened the index (a reader never does)."""
        return self._engine is not None

    @property
    def journals_hits(self) -> bool:
        """Whether hits go to a hit journal in the object store: on a database server
        that this process has not opened (a reader, or a writer that only read so far)."""
        return self.settings.index_is_server and self._engine is None

    def warn_once(self, topic: str, message: str, *args: object) -> None:
        """One line per topic for this store (a failing backend is said once, not per key):
        the process's registry, the topic scoped by this store."""
        notices.warn_once(
            f"{self.settings.blobs.describe()}|{self.settings.namespace}|{topic}", message, *args
        )

    def release_idle(self) -> None:
        """Close idle database connections (a process that only trains holds none)."""
        if self._engine is not None:
            db.release_idle(self._engine, self.settings.db_idle_secs)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def refused_topic(exc: PrivilegeRefused) -> str:
    """The `warn_once` topic of a refusal by the login's grants: one per diagnosis, so a
    lease, an upload and a hit flush refused alike say it once between them."""
    return f"refused: {exc}"


def unchecked_index(settings: Settings) -> Engine:
    """The index's engine as the settings name it, its schema not checked nor migrated:
    for the commands that diagnose or rebuild it."""
    return db.open_engine(
        settings.index_url,
        timeout_secs=settings.timeout_secs,
        read_only=settings.read_only,
        namespace=settings.namespace,
    )


def open_index(settings: Settings) -> Engine:
    """The index's engine, its schema checked; the embedded default migrates itself."""
    engine = db.open_engine(
        settings.index_url,
        timeout_secs=settings.timeout_secs,
        read_only=settings.read_only,
        pool_size=settings.db_pool_size,
        namespace=settings.namespace,
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


def open_tier_quietly(settings: Settings) -> LocalTier | None:
    """This host's tier, or None where it cannot be opened (the store works without)."""
    try:
        return open_tier(settings)
    except Exception as exc:
        log.debug("artifactstore: no local tier: %s", one_line(exc))
        return None


def secure_local_dirs(settings: Settings) -> None:
    """Check a local store's directory and a SQLite index's, creating them for a writer.

    A writer's must be its own and writable by no one else (created 0700, or 0750
    with ARTSTORE_GROUP_READABLE); a store read may also be root's, and anyone's
    only when read-only with signatures required and keys trusted (store_trust:
    then the files decide nothing). Either way no one but the owner may be able to
    write it (safedir). Raises UnsafeDirectory (one line, with the fix), so the
    store is not used.
    """
    from artifactstore.index.diagnosis import sqlite_path

    trust = store_trust(settings)
    create = not settings.read_only
    modes = safedir.store_modes(settings.group_readable)
    # The embedded default lives in the user's cache directory, which must be theirs.
    cache = Path(os.path.realpath(default_cache_dir())) if settings.embedded else None
    index = sqlite_path(settings.index_url)
    dirs = [Path(settings.blobs.path)] if settings.blobs.scheme == "file" else []
    if index is not None and index.is_absolute():
        dirs.append(index.parent)
    for path in dict.fromkeys(Path(os.path.realpath(d)) for d in dirs):
        top = cache if cache is not None and cache in (path, *path.parents) else path
        safedir.secure_dir(
            path, top=top, modes=modes, create=create, trust=trust, setting="ARTSTORE_URL"
        )
