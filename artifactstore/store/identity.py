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
deleted by hand, a bucket copied without it) after a person has checked them.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine

from artifactstore.blobstores.base import MAX_IDENTITY_BYTES, BlobStore
from artifactstore.config import Settings
from artifactstore.errors import ArtstoreError, one_line
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


FORMAT = "artifactstore-identity/1"
SAMPLE = 32  # newest entries whose objects decide whether an unbound pair is one store
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


def encode(store_id: str) -> bytes:
    return json.dumps({"format": FORMAT, "id": store_id}, sort_keys=True).encode()


def decode(data: bytes) -> str:
    """The id in an identity object; ValueError for anything else (it is bucket input)."""
    if len(data) > MAX_IDENTITY_BYTES:
        raise ValueError("identity object too large")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("identity object is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("identity object is not artifactstore's")
    store_id = doc.get("id")
    if not isinstance(store_id, str):
        raise ValueError("identity object holds no id")
    if not (8 <= len(store_id) <= 64 and store_id.isalnum()):
        raise ValueError("identity object holds an invalid id")
    return store_id


def _read_bucket(blobs: BlobStore) -> str | None:
    data = blobs.get_identity()
    return None if data is None else decode(data)


def _plausible(blobs: BlobStore, engine: Engine, namespace: str) -> str | None:
    """None if the index's entries of `namespace` may be this object store's (none, or
    at least half of the newest have their object here); else why not."""
    total = ix.entry_count(engine, namespace)
    if not total:
        return None
    digests = ix.newest_digests(engine, namespace, SAMPLE)
    found = sum(1 for d in digests if blobs.exists(d))
    if found * 2 >= len(digests) and found:
        return None
    return (
        f"the index is not bound yet and {found} of its {len(digests)} newest entries "
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


def require_bound(store: Pair) -> Binding:
    """For a command about to change the index or delete objects: bind the pair where
    the rule allows it, else raise StoreMismatch with one line naming both and the fix."""
    found = bind(store.blobs, store.engine, store.namespace, store.settings.index_url)
    if not found.ok:
        raise StoreMismatch(found.refusal())
    return found


def bind_after_write(store: Pair) -> None:
    """A writer's first stored entry binds an unbound pair; never fails the write (a
    mismatch is said once, in one line: the commands that change things refuse)."""
    try:
        found = bind(store.blobs, store.engine, store.namespace, store.settings.index_url)
    except Exception as exc:
        log.debug("artifactstore: store identity not checked: %s", one_line(exc))
        return
    if not found.ok:
        log.warning("artifactstore: %s", found.refusal())


def describe(settings: Settings) -> tuple[str, str]:
    """(state, one line) for `artstore doctor`: opens both, changes nothing."""
    from artifactstore.blobstores import open_blobstore
    from artifactstore.index import db

    engine = db.open_engine(settings.index_url, timeout_secs=settings.timeout_secs, read_only=True)
    try:
        found = check(open_blobstore(settings), engine, settings.namespace, settings.index_url)
    finally:
        engine.dispose()
    if found.state == BOUND:
        return BOUND, f"bound: object store and index are store {found.store_id}"
    if found.state == UNBOUND:
        return UNBOUND, "not yet bound: the first writer or `artstore db bind` binds them"
    return MISMATCH, f"MISMATCH: {found.why}: {FIX}"
