"""Removed named versions: no rollback through a bucket write (issue 38).

A named entry's key is sha256(name, version, fingerprint): nothing in it changes when a
version is removed and built again, and every object ever signed for that key verifies
for it forever. So after `artstore rm --name t/step@1`, anyone who kept the old signed
objects and manifests and may write the bucket could put them back, and trusted readers
would run the old code (measured: after a rebuild of t/step@1 as another function too).
Signatures prove authorship, not freshness, and a reader has no other trusted state.

The design: **versions are immutable once published, and a removal is final.**
`rm --name` leaves a removal record per NAME@VERSION (`formats.named`); the read path
refuses every entry of a removed version that it verified from the store
(`RemovedVersion`: a miss, counted `named_removed`, one log line), and writers do not
store a removed version again (`artifactstore.named` builds it, runs it, and says to
bump the version). Why not a signed "current generation" readers check: a reader cannot
tell an old signed generation record from the current one, so whoever may write the
bucket replays the old record with the old objects; refusing to give a version a second
content leaves an attacker nothing older to roll back to than the version itself.

What it cannot do (docs/security.md): an attacker who also deletes the removal record
restores that version exactly as it was signed (never another version's code); and a
writer that finds no record (deleted, or an old client) may store the version again,
which new readers still refuse while the record is there. Tier copies are this host's
own and are not re-checked (no round trip on a warm hit).

Cost: one small GET per named entry verified from the store (a tier hit pays nothing).
"""

from __future__ import annotations

import time

from artifactstore.blobstores.base import BlobStore, RecordKind
from artifactstore.formats import codec
from artifactstore.formats import named as _named
from artifactstore.store.records import Records

# Beside the manifests (S3 `keys/`, a local store's `manifests/`): every role's policy
# already allows what it does here, and a manifest listing never shows these names.
REMOVED = RecordKind(
    "removal record",
    "keys",
    _named.MAX_REMOVED_BYTES,
    _named.check_removed_name,
    sharded=True,
    local_folder="manifests",
    joiner=".",
)


class RemovedVersion(codec.SignatureRefused):
    """A verified entry of a named version that `artstore rm --name` removed: refused (a
    miss), never quarantined (the bytes are intact; the version is withdrawn)."""

    reason = "named_removed"


def removal(records: BlobStore | Records, name: str, version: str) -> bytes | None:
    """NAME@VERSION's removal record as stored (any bytes: presence refuses), or None."""
    return records.get_record(REMOVED, _named.removed_name(name, version))


def check(blobs: BlobStore, data: bytes) -> None:
    """Raise RemovedVersion if the verified object `data` is an entry of a removed named
    version (its module name is in its signed metadata); other objects cost nothing."""
    meta = codec.read_meta(data)
    parsed = None if meta is None else _named.split_module(meta.module_name)
    if parsed is None:
        return
    record = removal(blobs, *parsed)
    if record is not None:
        raise RemovedVersion(f"{describe(*parsed, record)}; not loading it")


def describe(name: str, version: str, record: bytes) -> str:
    at = _named.removed_at(record)
    when = time.strftime(" on %Y-%m-%d %H:%M UTC", time.gmtime(at)) if at is not None else ""
    return f"{name[:128]}@{version[:64]} was removed from this store{when} (artstore rm --name)"


def leave(blobs: BlobStore, name: str, version: str) -> None:
    """Record that NAME@VERSION was removed (before its manifests are withdrawn, so that
    no moment exists in which planted-back copies would be loaded)."""
    data = _named.encode_removed(name, version, int(time.time()))
    blobs.put_record(REMOVED, _named.removed_name(name, version), data)
