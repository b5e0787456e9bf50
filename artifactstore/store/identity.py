"""The store's identity: which object store and which index make one store.

A mistyped `ARTSTORE_URL` (another, empty bucket) pointed at the real index makes
every entry look as if its object were lost, and gc then deletes every entry. So
each namespace's object store holds a small identity object (`{namespace}/identity`:
JSON with a random id, created once and never replaced) and the index records the
same id for the namespace (table `identities`). Commands that change the index or
delete objects call `require_bound` first and refuse, in one line naming both, when
the two do not belong together.

When the two are bound (`bind`): the first writer of an entry or command of this
version binds a pair that has no binding yet, but only where neither is bound to
anything else (invariant 10: an index binds only to an object store with no identity,
or to its own) and they plausibly belong together, so that an upgrade keeps stores
written by older clients working:

- the object store has an identity and the index records the same id: bound;
- both have an identity, or only the index has one: MISMATCH (the object store is
  not the one the index was bound to; its identity object is never created then);
- only the object store has one: MISMATCH (it is another index's: a mistyped or new
  database in front of the team's bucket, whose gc would delete the team's objects).
  `artstore db bind` binds them deliberately, after saying what that orphans;
- neither has one, and the index has no entries of the namespace (a new index, one
  `artstore db rebuild` starts) or at least half of its SAMPLE newest entries have
  their object in this object store (one written by an older client): bound.
  The index records an id only where its own writer created the identity object (or
  a person asked: `db bind`, `db rebuild`); a first writer that finds the object just
  created by another waits up to CLAIM_WAIT_SECS for its index to record that id (the
  pair's other first writer, between its two writes) before it refuses, so first
  writers starting together agree, and of two indexes over one new object store only
  the one whose writer created its identity is bound.

`artstore db bind --force` binds a pair that the rule refuses (an identity object
deleted by hand, a bucket copied without it) after a person has checked them; it
says how many of the FORCE_SAMPLE newest entries have their object in that object
store and, where none do, refuses unless `--allow-missing` (issue 38.4). An identity
object that is not one (junk a bucket writer put there) is replaced by `--force` only,
after a person said yes (`replace`): the one way an identity is ever replaced, and one
the writer policy cannot take (it may only create the object; deleting it is the
operator's, `s3-gc.json`).

Writers (programs and commands) ask their `WriteGate` before their first write: it
binds or checks the pair once per store (one identity GET and one index SELECT where
bound) and, on a mismatch, the writer stores nothing and says so in one line.
"""

from __future__ import annotations

import logging
import threading
import time
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
# For the index row that follows another first writer's identity object: that writer's
# put may have been retried (its answer lost) within the default ARTSTORE_TIMEOUT before
# its index write; only an index bound to no store, in front of another's bucket, waits.
CLAIM_WAIT_SECS = 10.0
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
    other: str | None = None  # the object store's id where only it has one (see the module)

    @property
    def ok(self) -> bool:
        return self.state == BOUND

    @property
    def fix(self) -> str:
        if self.other is None:
            return FIX
        return (
            "ARTSTORE_INDEX most likely names the wrong database: point it at the one bound "
            "to that store (the team's); if that index is lost, `artstore db rebuild` "
            "rebuilds this one from the object store; only to make this index that store's "
            "deliberately, `artstore db bind` (it says what that orphans)"
        )

    def refusal(self) -> str:
        return (
            f"object store {self.objects} and index {self.index} do not belong together "
            f"({self.why}): {self.fix}"
        )


def elsewhere(store_id: str) -> str:
    """Why an unbound index does not bind to an object store that has an identity."""
    return f"the index is bound to no store and the object store is already store {store_id}"


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
    if bucket_id is not None:
        return Binding(MISMATCH, **where, why=elsewhere(bucket_id), other=bucket_id)
    why = _plausible(blobs, engine, namespace)
    if why is not None:
        return Binding(MISMATCH, **where, why=why)
    return Binding(UNBOUND, **where, why="bound by the first writer")


def bind(
    blobs: BlobStore,
    engine: Engine,
    namespace: str,
    index_url: str,
    *,
    force: bool = False,
    replace: bool = False,
) -> Binding:
    """`check`, then bind an unbound pair (or, `force`, any pair) as the module says;
    `replace` (with `force`): an identity object that is not one is replaced."""
    pair = (blobs, engine, namespace, index_url)
    found = check(*pair)
    if force and not found.ok:
        return _force(*pair, found, replace=replace)
    if found.state != UNBOUND and found.other is None:
        return found
    # Raises where the index refuses the namespace (a login never granted it, which sees
    # no identity row of it either): before an identity object is created, and rather
    # than calling the index another store's.
    ix.may_bind(engine, namespace)
    if found.other is not None:
        return _awaited(*pair, found)
    store_id = uuid.uuid4().hex
    if not blobs.put_identity(encode(store_id)):  # another first writer's, just created
        return _awaited(*pair, check(*pair))
    if ix.bind(engine, namespace, store_id) != store_id:  # another process bound the index
        return check(*pair)
    return Binding(BOUND, found.objects, found.index, store_id=store_id)


def _awaited(
    blobs: BlobStore, engine: Engine, namespace: str, index_url: str, found: Binding
) -> Binding:
    """`found` (an unbound index, an object store with an identity), unless the index
    records that identity within CLAIM_WAIT_SECS: then the identity was its other first
    writer's, created between that writer's two writes."""
    deadline = time.monotonic() + CLAIM_WAIT_SECS
    while found.other is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        recorded = ix.bound_id(engine, namespace)
        if recorded is not None:
            return check(blobs, engine, namespace, index_url)
    return found


def _force(
    blobs: BlobStore,
    engine: Engine,
    namespace: str,
    index_url: str,
    found: Binding,
    *,
    replace: bool,
) -> Binding:
    """`db bind --force`: the index takes the object store's id, created where it has
    none; an identity object that is not one is replaced where `replace` (a person said
    yes), else refused."""
    junk = unreadable(blobs)
    try:
        if junk is not None:
            if not replace:
                raise ValueError(junk)
            blobs.delete_identity()  # then created as where there is none
        bucket_id = _read_bucket(blobs)
        if bucket_id is None:
            blobs.put_identity(encode(uuid.uuid4().hex))
            bucket_id = _read_bucket(blobs)  # ours, or another first writer's
    except ValueError as exc:
        raise StoreMismatch(
            f"object store {found.objects}: its {exc}; `artstore db bind --force` "
            "replaces it (it asks first; --yes)"
        ) from None
    if bucket_id is None:  # pragma: no cover - a store that lost what it just took
        raise StoreMismatch(f"object store {blobs.describe()} did not keep its identity")
    recorded = ix.bind(engine, namespace, bucket_id, replace=True)
    if recorded != bucket_id:  # another process bound the index meanwhile
        return check(blobs, engine, namespace, index_url)
    return Binding(BOUND, found.objects, found.index, store_id=bucket_id)


def unreadable(blobs: BlobStore) -> str | None:
    """Why the object store's identity object is not one (junk, another format), or None
    (it is one, or there is none)."""
    try:
        _read_bucket(blobs)
    except ValueError as exc:
        return str(exc)
    return None


def adopt(blobs: BlobStore, engine: Engine, namespace: str, index_url: str) -> Binding:
    """`artstore db bind`, deliberately: an index bound to no store takes the id of an
    object store that has one (`check`'s `other`); any other pair as `bind` does."""
    found = check(blobs, engine, namespace, index_url)
    if found.other is None:
        return bind(blobs, engine, namespace, index_url)
    if ix.bind(engine, namespace, found.other) != found.other:  # another bound it meanwhile
        return check(blobs, engine, namespace, index_url)
    return Binding(BOUND, found.objects, found.index, store_id=found.other)


def force_count(
    blobs: BlobStore, engine: Engine, namespace: str, index_url: str, *, allow_missing: bool
) -> str:
    """Before `artstore db bind --force`: the line counting the FORCE_SAMPLE newest
    entries whose object is in `blobs`. Refuses (StoreMismatch) where none of them is,
    unless `allow_missing`: a person checks before an empty or wrong bucket gets the
    index's identity (then `verify --repair` would drop every entry)."""
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
    return counted


def rebuilding(store: Pair) -> str | None:
    """`artstore db rebuild`: an index bound to no store and holding no entries (lost,
    set aside, new) is rebuilt from this object store, so it takes the object store's id
    where it has one; that id, or None where nothing was bound here."""
    pair = (store.blobs, store.engine, store.namespace, store.settings.index_url)
    found = check(*pair)
    if found.other is None or ix.entry_count(store.engine, store.namespace):
        return None
    return adopt(*pair).store_id


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
    return MISMATCH, f"MISMATCH: {found.why}: {found.fix}", found.refusal()
