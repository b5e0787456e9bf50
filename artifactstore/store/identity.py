"""The store's identity: which object store and which index make one store.

A mistyped `ARTSTORE_URL` (another, empty bucket) pointed at the real index makes
every entry look as if its object were lost, and gc then deletes every entry. So
each namespace's object store holds a small identity object (`{namespace}/identity`:
JSON with a random id, created once and never replaced) and the index records the
same id for the namespace (table `identities`). Commands that change the index or
delete objects call `require_bound` first and refuse, in one line naming both, when
the two do not belong together.

When the two are bound (`bind`): the first writer of an entry or command of this
version binds a pair that has no binding yet, but only where they plausibly belong
together, so that an upgrade keeps stores written by older clients working:

- the object store has an identity and the index records the same id: bound;
- both have an identity, or only the index has one: MISMATCH (the object store is
  not the one the index was bound to; its identity object is never created then);
- the index has no id for the namespace (a new index, one written by an older
  client, one `artstore db rebuild` just created) and no entries in it: bound to
  the object store's id, created first where the object store has none;
- the index has no id but entries: bound only if at least half of its SAMPLE
  newest entries have their object in this object store, else MISMATCH.

`artstore db bind --force` binds a pair that the rule refuses (an identity object
deleted by hand, a bucket copied without it) after a person has checked them; it
says how many of the FORCE_SAMPLE newest entries have their object in that object
store and, where none do, refuses unless `--allow-missing` (issue 38.4).

Writers (programs and commands) ask their `WriteGate` before their first write: it
binds or checks the pair once per store (one identity GET and one index SELECT where
bound) and, on a mismatch, the writer stores nothing and says so in one line.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine

from artifactstore.blobstores.base import BlobStore
from artifactstore.config import Settings
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.formats.identity import decode, encode
from artifactstore.index import identity as ix
from artifactstore.redact import redact

log = logging.getLogger("artifactstore")


class Pair(Protocol):
    """An object store and an index of one namespace: a Store, or its parts' Backends."""

    @property
    def blobs(self) -> BlobStore: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def namespace(self) -> str: ...
    @property
    def settings(self) -> Settings: ...


SAMPLE = 32  # newest entries whose objects decide whether an unbound pair is one store
FORCE_SAMPLE = 100  # newest entries counted before `bind --force`
BOUND, UNBOUND, MISMATCH = "bound", "not yet bound", "MISMATCH"
FIX = (
    "check ARTSTORE_URL, ARTSTORE_INDEX and the namespace; if they are one store, "
    "`artstore db bind --force` binds them"
)


class StoreMismatch(ArtstoreError):
    """The object store and the index are not one store: nothing may be changed."""


@dataclass(frozen=True)
class Binding:
    state: str  # BOUND, UNBOUND or MISMATCH
    objects: str  # where the objects are (described, no secrets)
    index: str  # the index URL, redacted
    store_id: str | None = None  # the id both share, when bound
    why: str = ""  # for UNBOUND and MISMATCH

    @property
    def ok(self) -> bool:
        return self.state == BOUND

    def refusal(self) -> str:
        return (
            f"object store {self.objects} and index {self.index} do not belong together "
            f"({self.why}): {FIX}"
        )


def _read_bucket(blobs: BlobStore) -> str | None:
    data = blobs.get_identity()
    return None if data is None else decode(data)


def present(blobs: BlobStore, engine: Engine, namespace: str, limit: int) -> tuple[int, int, int]:
    """(how many of the `limit` newest entries have their object in `blobs`, how many
    were asked about, the namespace's entries): whether the index is this store's."""
    total = ix.entry_count(engine, namespace)
    if not total:
        return 0, 0, 0
    digests = ix.newest_digests(engine, namespace, limit)
    return sum(1 for d in digests if blobs.exists(d)), len(digests), total


def _plausible(blobs: BlobStore, engine: Engine, namespace: str) -> str | None:
    """None if the index's entries of `namespace` may be this object store's (none, or
    at least half of the newest have their object here); else why not."""
    found, asked, total = present(blobs, engine, namespace, SAMPLE)
    if not total or (found * 2 >= asked and found):
        return None
    return (
        f"the index is not bound yet and {found} of its {asked} newest entries "
        f"(of {total}) have their object in this object store"
    )


def check(blobs: BlobStore, engine: Engine, namespace: str, index_url: str) -> Binding:
    """Where the pair stands, changing nothing (`artstore doctor`)."""
    where = dict(objects=blobs.describe(), index=redact(index_url))
    try:
        bucket_id = _read_bucket(blobs)
    except ValueError as exc:
        return Binding(MISMATCH, **where, why=f"the object store's {exc}")
    index_id = ix.bound_id(engine, namespace)
    if index_id is not None:
        if bucket_id == index_id:
            return Binding(BOUND, **where, store_id=index_id)
        has = f"is store {bucket_id}" if bucket_id else "has no identity"
        return Binding(
            MISMATCH, **where, why=f"the index is bound to store {index_id}, the object store {has}"
        )
    why = _plausible(blobs, engine, namespace)
    if why is not None:
        return Binding(MISMATCH, **where, why=why)
    return Binding(UNBOUND, **where, store_id=bucket_id, why="bound by the first writer")


def bind(
    blobs: BlobStore, engine: Engine, namespace: str, index_url: str, *, force: bool = False
) -> Binding:
    """`check`, then bind an unbound pair (or, `force`, any pair) as the module says."""
    found = check(blobs, engine, namespace, index_url)
    if found.state == BOUND or (found.state == MISMATCH and not force):
        return found
    try:
        bucket_id = _read_bucket(blobs)
    except ValueError:
        if not force:
            raise
        bucket_id = None  # unreadable: a person asked to rebind; a fresh id below
    if bucket_id is None:
        blobs.put_identity(encode(uuid.uuid4().hex))
        bucket_id = _read_bucket(blobs)  # ours, or another first writer's
        if bucket_id is None:  # pragma: no cover - a store that lost what it just took
            raise StoreMismatch(f"object store {blobs.describe()} did not keep its identity")
    recorded = ix.bind(engine, namespace, bucket_id, replace=force)
    if recorded != bucket_id:  # another process bound the index meanwhile
        return check(blobs, engine, namespace, index_url)
    return Binding(BOUND, found.objects, found.index, store_id=bucket_id)


def force_bind(
    blobs: BlobStore, engine: Engine, namespace: str, index_url: str, *, allow_missing: bool
) -> tuple[Binding, str]:
    """`artstore db bind --force`: (the binding, the line counting the newest entries
    whose object is in `blobs`). Refuses (StoreMismatch, nothing written) where none
    of them is, unless `allow_missing`: a person checks before an empty or wrong
    bucket gets the index's identity (then `verify --repair` would drop every entry)."""
    found, asked, total = present(blobs, engine, namespace, FORCE_SAMPLE)
    counted = (
        f"{found} of the newest {asked} entries have their object in {blobs.describe()} "
        f"({total} in namespace {namespace} of index {redact(index_url)})"
    )
    if asked and not found and not allow_missing:
        raise StoreMismatch(
            f"{counted}: not bound, it holds none of the index's objects; check ARTSTORE_URL "
            "and the namespace, or pass --allow-missing to bind them anyway"
        )
    return bind(blobs, engine, namespace, index_url, force=True), counted


def require_bound(store: Pair) -> Binding:
    """For a command about to change the index or delete objects: bind the pair where
    the rule allows it, else raise StoreMismatch with one line naming both and the fix."""
    found = bind(store.blobs, store.engine, store.namespace, store.settings.index_url)
    if not found.ok:
        raise StoreMismatch(found.refusal())
    return found


class WriteGate:
    """Whether one store's writer may write: decided before its first write (object,
    index row, manifest, repoint, a dropped entry), once per store, so once per
    program (its session holds one Store). Where bound it costs one identity GET and
    one index SELECT; an unbound pair is bound here (see the module). A mismatch is
    said once, in one line naming both, and every later write is refused for free.
    A failed check (a backend down) is not kept: the write fails as any other would."""

    def __init__(self, pair: Pair, count: Callable[[str], object]) -> None:
        self._pair = pair
        self._count = count  # told `store_mismatch` for each write refused
        self._found: Binding | None = None
        self._lock = threading.Lock()

    def admits(self, *, quietly: bool = False) -> bool:
        """Whether this writer may write; a refusal is counted. `quietly`: for a repair
        on the read path, where a failed check refuses too (it never fails a lookup)."""
        try:
            if self.allows():
                return True
        except Exception as exc:
            if not quietly:
                raise
            log.debug("artifactstore: store identity not checked: %s", one_line(exc))
            return False
        self._count("store_mismatch")
        return False

    @property
    def refused(self) -> bool:
        """Decided already, and refused (what only tries to write asks, for free)."""
        return self._found is not None and not self._found.ok

    def allows(self) -> bool:
        if self._found is None:
            with self._lock:
                if self._found is None:
                    pair = self._pair
                    found = bind(pair.blobs, pair.engine, pair.namespace, pair.settings.index_url)
                    if not found.ok:
                        said = "%s; this process stores nothing there (it compiles as usual)"
                        log.warning("artifactstore: " + said, found.refusal())
                    self._found = found
        return self._found.ok

    def require(self) -> Binding:
        """For a command about to change the index or delete objects: StoreMismatch
        (one line naming both and the fix) unless bound; decided once, as `allows`."""
        with self._lock:
            if self._found is None or not self._found.ok:
                self._found = require_bound(self._pair)
            return self._found


def describe(settings: Settings) -> tuple[str, str, str]:
    """(state, one line, what a mismatch means here) for `artstore doctor`: opens both,
    changes nothing."""
    from artifactstore.blobstores import open_blobstore
    from artifactstore.index import db

    engine = db.open_engine(settings.index_url, timeout_secs=settings.timeout_secs, read_only=True)
    try:
        found = check(open_blobstore(settings), engine, settings.namespace, settings.index_url)
    finally:
        engine.dispose()
    if found.state == BOUND:
        return BOUND, f"bound: object store and index are store {found.store_id}", ""
    if found.state == UNBOUND:
        return UNBOUND, "not yet bound: the first writer or `artstore db bind` binds them", ""
    return MISMATCH, f"MISMATCH: {found.why}: {FIX}", found.refusal()
