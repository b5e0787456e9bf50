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

Who may remove: where signatures are required (ARTSTORE_TRUSTED_KEYS, the team
default), only a record signed by a trusted key refuses (`formats.named.Removal`); any
other is ignored by readers and writers alike, who say so once (`Ignored`), so that a
bucket writer without the key cannot make a version unstorable or unloadable. `artstore
ls --removed` and `artstore verify` list the records; `artstore rm --removal` (the gc
role) withdraws one. A record is created only where none is (`leave`; the writer policy
denies replacing one): else a bucket writer could replace a signed record with junk,
which is ignored, and roll the version back. Without signatures a record's presence
refuses, whatever it holds.

What it cannot do (docs/security.md): an attacker who also deletes the removal record
restores that version exactly as it was signed (never another version's code); and a
writer that finds no record (deleted, or an old client) may store the version again,
which new readers still refuse while the record is there. Tier copies are this host's
own and are not re-checked (no round trip on a warm hit).

Cost: one small GET per named entry verified from the store (a tier hit pays nothing).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from artifactstore.blobstores.base import BlobStore, RecordKind
from artifactstore.errors import ArtstoreError
from artifactstore.formats import codec
from artifactstore.formats import named as _named
from artifactstore.store.records import Records

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

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
IGNORED = (
    "ignoring the removal record of %s (%s): where signatures are required only a trusted "
    "key's removal counts; see `artstore ls --removed`, and withdraw it with `artstore rm "
    "--removal` (the gc role)"
)


class RemovedVersion(codec.SignatureRefused):
    """A verified entry of a named version that `artstore rm --name` removed: refused (a
    miss), never quarantined (the bytes are intact; the version is withdrawn)."""

    reason = "named_removed"


class Ignored(Exception):
    """A removal record that this process does not obey: `why` (one line)."""

    def __init__(self, ref: str, why: str) -> None:
        super().__init__(IGNORED % (ref, why))
        self.why = why


def removal(
    records: BlobStore | Records,
    name: str,
    version: str,
    trusted: TrustedKeys | None,
    namespace: str,
) -> bytes | None:
    """NAME@VERSION's removal record as stored where it is obeyed, or None if there is
    none; `Ignored` (its message one line) where `trusted` requires a trusted signature
    that it lacks. Without `trusted`, any bytes there refuse."""
    record = _named.removed_name(name, version)
    data = records.get_record(REMOVED, record)
    if data is None or trusted is None:
        return data
    why = _named.decode_removed(record, data).refusal(trusted, namespace)
    if why is not None:
        raise Ignored(f"{name[:128]}@{version[:64]}", why)
    return data


def check(blobs: BlobStore, data: bytes, trusted: TrustedKeys | None, namespace: str) -> str | None:
    """Raise RemovedVersion if the verified object `data` is an entry of a removed named
    version (its module name is in its signed metadata); other objects cost nothing.
    What it ignored and why (one line, for the caller to say once), else None."""
    meta = codec.read_meta(data)
    parsed = None if meta is None else _named.split_module(meta.module_name)
    if parsed is None:
        return None
    try:
        record = removal(blobs, *parsed, trusted, namespace)
    except Ignored as exc:
        return str(exc)
    if record is not None:
        raise RemovedVersion(f"{describe(*parsed, record)}; not loading it")
    return None


def describe(name: str, version: str, record: bytes) -> str:
    at = _named.removed_at(record)
    when = time.strftime(" on %Y-%m-%d %H:%M UTC", time.gmtime(at)) if at is not None else ""
    return f"{name[:128]}@{version[:64]} was removed from this store{when} (artstore rm --name)"


def leave(
    blobs: BlobStore,
    name: str,
    version: str,
    signer: SigningKey | None,
    trusted: TrustedKeys | None,
    namespace: str,
) -> None:
    """Record that NAME@VERSION was removed (before its manifests are withdrawn, so that
    no moment exists in which planted-back copies would be loaded), signed by `signer`.
    Created only where none is: a record is never replaced (the writer policy denies
    it, else a bucket writer could replace a signed one with junk, which is ignored).
    One this store obeys already is kept; ArtstoreError for one it does not obey."""
    data = _named.encode_removed(name, version, int(time.time()), signer, namespace)
    if blobs.create_record(REMOVED, _named.removed_name(name, version), data):
        return
    try:
        removal(blobs, name, version, trusted, namespace)
    except Ignored as exc:
        ref = f"{name[:128]}@{version[:64]}"
        raise ArtstoreError(
            f"a removal record of {ref} is there already, not one this store obeys "
            f"({exc.why}): withdraw it with `artstore rm "
            f"--removal {ref} --yes` (the gc role), then remove the version again; nothing "
            "was removed"
        ) from None


def withdraw(blobs: BlobStore, record: str) -> None:
    """Delete the removal record `record` (the gc role's: writers' policy denies it)."""
    blobs.delete_records(REMOVED, [_named.check_removed_name(record)])


def listing(blobs: BlobStore) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every removal record: one listing of the manifests' folder."""
    for name in blobs.iter_records(REMOVED):
        try:
            _named.check_removed_name(name)
        except ValueError:  # a manifest, or not ours
            continue
        data = blobs.get_record(REMOVED, name)
        if data is not None:  # withdrawn since the listing
            yield name, data
