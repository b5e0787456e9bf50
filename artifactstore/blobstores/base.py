"""The one narrow interface every object store backend implements.

Objects are immutable bytes named by their sha256 digest. Backends know
nothing about keys, entries or JAX; wrappers (read-only, tiers) compose around
any backend, as in sccache's storage layer.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from artifactstore.formats.identity import MAX_IDENTITY_BYTES
from artifactstore.formats.journal import MAX_JOURNAL_BYTES, check_journal_name
from artifactstore.formats.lease import MAX_LEASE_BYTES
from artifactstore.formats.manifest import MAX_MANIFEST_BYTES, check_key
from artifactstore.formats.quick import MAX_QUICK_BYTES, SEPARATOR, check_quick_name
from artifactstore.formats.workingset import MAX_WORKING_SET_BYTES, check_program_id

__all__ = [
    "IDENTITY",
    "JOURNALS",
    "LEASES",
    "MANIFESTS",
    "QUICK",
    "UNTRUSTED_KINDS",
    "WORKING_SETS",
    "BlobInfo",
    "BlobStore",
    "RecordKind",
    "UntrustedKind",
    "is_digest_name",
]


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    mtime: float  # seconds since the epoch


@dataclass(frozen=True)
class RecordKind:
    """A kind of small record kept beside the objects, under its own folder."""

    name: str  # in messages
    folder: str  # under the namespace: a directory, or an S3 key prefix
    max_bytes: int  # a bigger record is read only this far (+1), so its decode refuses it
    check_name: Callable[[str], str]  # ValueError for a name that is not one of ours
    sharded: bool = False  # local directories: in subdirectories by the name's first 2 chars
    readers_write: bool = False  # read-only processes may put (never delete) these
    local_folder: str = ""  # a local store's directory, where it is not `folder`
    joiner: str = ""  # one character names hold besides letters and digits, if any

    @property
    def directory(self) -> str:
        return self.local_folder or self.folder

    def listed(self, name: str) -> bool:
        """Whether a listing shows `name`: letters and digits (and `joiner`); anything
        else under the folder is not ours (a stray upload, a temporary file, a marker).
        Callers still check the names they act on (`check_name`)."""
        return (name.replace(self.joiner, "") if self.joiner else name).isalnum()


# Each entry's record (artifactstore.formats.manifest): S3 keeps the name readers' policies grant.
MANIFESTS = RecordKind(
    "manifest", "keys", MAX_MANIFEST_BYTES, check_key, sharded=True, local_folder="manifests"
)
# Hits of processes that do not write the index (artifactstore.formats.journal).
JOURNALS = RecordKind(
    "journal", "journals", MAX_JOURNAL_BYTES, check_journal_name, readers_write=True
)
# A compile lease's mirror, polled by processes waiting for its holder
# (artifactstore.formats.lease, artifactstore.store.flight).
LEASES = RecordKind("lease", "leases", MAX_LEASE_BYTES, check_key)
# What each program loaded last time, per platform, for the next run to load ahead
# (artifactstore.formats.workingset): written by writers at exit, read by every process.
WORKING_SETS = RecordKind("working set", "workingsets", MAX_WORKING_SET_BYTES, check_program_id)
# Keys too quick to store, published by writers for `artstore pull` (artifactstore.formats.quick).
QUICK = RecordKind("quick-key record", "quick", MAX_QUICK_BYTES, check_quick_name, joiner=SEPARATOR)


def is_digest_name(name: str) -> bool:
    """Whether a listing shows an object named `name` (a digest's length; the callers
    check the digests they act on)."""
    return len(name) == 64


# The store's identity (artifactstore.formats.identity, bound by artifactstore.store.identity):
# one small object beside the folders above, `{namespace}/identity`.
IDENTITY = "identity"


@dataclass(frozen=True)
class UntrustedKind:
    """A kind of bytes a process reads from a bucket, a tier or a bundle: untrusted input.

    Why a registry: each new kind re-opened the same hole (issue 38), so every kind is
    named here with its decoder, and tests/security/test_record_kinds.py fails when one
    has no hostile-record test or no row in docs/security.md's table. `decoder` is a
    "module:qualname" string (decoders live in formats/, the tier's own files' in store/)."""

    name: str  # as the table and the tests' `hostile_record` markers name it
    where: str  # where such bytes are read from
    decoder: str  # the function every such byte goes through first
    max_bytes: int | None  # read at most this far, where the kind has a bound


UNTRUSTED_KINDS: tuple[UntrustedKind, ...] = (
    UntrustedKind(
        "object", "bucket objects/, tier, bundle", "artifactstore.formats.codec:decode", None
    ),
    UntrustedKind(
        "manifest",
        "bucket keys/, local manifests/",
        "artifactstore.formats.manifest:Manifest.decode",
        MANIFESTS.max_bytes,
    ),
    UntrustedKind(
        "quick-key record",
        "bucket quick/",
        "artifactstore.formats.quick:split_quick_name",
        QUICK.max_bytes,
    ),
    UntrustedKind(
        "hit journal",
        "bucket journals/",
        "artifactstore.formats.journal:Journal.decode",
        JOURNALS.max_bytes,
    ),
    UntrustedKind(
        "working set",
        "bucket workingsets/, tier workingsets/",
        "artifactstore.formats.workingset:WorkingSet.decode",
        WORKING_SETS.max_bytes,
    ),
    UntrustedKind(
        "working set hint",
        "tier workingsets/",
        "artifactstore.formats.workingset:Hint.decode",
        1024,
    ),
    UntrustedKind(
        "lease record",
        "bucket leases/",
        "artifactstore.formats.lease:LeaseRecord.decode",
        LEASES.max_bytes,
    ),
    UntrustedKind(
        "identity",
        "bucket {namespace}/identity",
        "artifactstore.formats.identity:decode",
        MAX_IDENTITY_BYTES,
    ),
    UntrustedKind(
        "bundle member",
        "bundle (tar member names and headers)",
        "artifactstore.formats.bundle:member_digest",
        None,
    ),
    UntrustedKind(
        "bundle manifest",
        "bundle manifest.json",
        "artifactstore.formats.bundle:parse_manifest",
        None,
    ),
    UntrustedKind(
        "named payload header",
        "a verified object's payload",
        "artifactstore.formats.named:unframe",
        None,
    ),
    UntrustedKind(
        "named removal record",
        "bucket keys/ (`<sha256>.removed`), local manifests/",
        "artifactstore.formats.named:decode_removed",
        1024,
    ),
    UntrustedKind(
        "native module",
        "a verified object's payload (entries of platform iree-*)",
        "artifactstore.formats.native:unframe",
        None,
    ),
    UntrustedKind(
        "torch-xla file",
        "a verified object's payload, placed in torch-xla's cache directory",
        "artifactstore.formats.torchxla:unframe",
        None,
    ),
    UntrustedKind("tier key file", "tier keys/", "artifactstore.store.tier:LocalTier.record", None),
    UntrustedKind(
        "tier access journal",
        "tier access/",
        "artifactstore.store.tier:LocalTier.drain_journals",
        None,
    ),
    UntrustedKind(
        "tier quick keys",
        "tier below-threshold.json",
        "artifactstore.formats.quick:decode_below_threshold",
        None,
    ),
)


class BlobStore(abc.ABC):
    """Content-addressed bytes within one namespace."""

    read_only: bool = False

    @abc.abstractmethod
    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes, or None if absent. Never verifies: the caller does.

        `max_bytes`: raise `OverLimit` for a bigger object instead of reading it
        (backends learn the size before downloading the bytes)."""

    @abc.abstractmethod
    def put(self, digest: str, data: bytes) -> bool:
        """Store atomically; True if written, False if the digest already existed."""

    @abc.abstractmethod
    def exists(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, digest: str) -> bool:
        """Remove; True if something was removed."""

    def delete_many(self, digests: Sequence[str]) -> None:
        """Remove each of `digests`, present or not (gc deletes thousands at once;
        backends with a batch call override this)."""
        for digest in digests:
            self.delete(digest)

    @abc.abstractmethod
    def quarantine(self, digest: str) -> None:
        """Move a bad object aside so it is never served again but can be inspected."""

    @abc.abstractmethod
    def iter_blobs(self) -> Iterator[BlobInfo]:
        """Every stored object (streamed; never a full list in memory)."""

    @abc.abstractmethod
    def iter_quarantined(self) -> Iterator[BlobInfo]: ...

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the objects live, without secrets."""

    # -- records: manifests, journals, leases, quick keys, beside the objects -------
    @abc.abstractmethod
    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        """The record as stored (at most `kind.max_bytes` + 1 bytes), or None if absent.
        Never verifies: its decode does."""

    @abc.abstractmethod
    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        """Write the record atomically, replacing any other; durable on return."""

    def create_record(self, kind: RecordKind, name: str, data: bytes) -> bool:
        """Write the record only where none is (a removal record: a bucket writer may
        create one, never replace one); False, writing nothing, if one is there. Backends
        with a conditional write override this look-then-write."""
        if self.get_record(kind, name) is not None:
            return False
        self.put_record(kind, name, data)
        return True

    @abc.abstractmethod
    def delete_records(self, kind: RecordKind, names: Sequence[str]) -> None:
        """Remove the records `names`, present or not."""

    @abc.abstractmethod
    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        """The name of every record of `kind` (streamed), or of those whose names start
        with `prefix` (S3 lists only those)."""

    def list_records(self, kind: RecordKind) -> Iterator[BlobInfo]:
        """`iter_records`, each with its size and the time the store wrote it (S3's
        LastModified: what the record's writer cannot choose). This default, for stores
        that keep no time, gives the listing's time."""
        now = time.time()
        return (BlobInfo(name, 0, now) for name in self.iter_records(kind))

    # -- the store's identity: one object beside the folders (artifactstore.store.identity) --
    @abc.abstractmethod
    def get_identity(self) -> bytes | None:
        """The identity object as stored (at most MAX_IDENTITY_BYTES + 1), or None."""

    @abc.abstractmethod
    def put_identity(self, data: bytes) -> bool:
        """Create the identity object unless one exists (never replaced: two first
        writers must agree on one); True if this call created it."""

    def delete_identity(self) -> None:
        """Delete an identity object that is not one (`artstore db bind --force`, after a
        person said yes): the only way one is ever replaced. Stores that cannot refuse."""
        raise NotImplementedError(f"{self.describe()} cannot delete its identity object")

    def get_manifest(self, key: str) -> bytes | None:
        """`key`'s manifest as stored, or None if none is published."""
        return self.get_record(MANIFESTS, key)

    def put_manifest(self, key: str, data: bytes) -> None:
        """Publish `key`'s manifest, replacing any other; durable on return."""
        self.put_record(MANIFESTS, key, data)

    def delete_manifests(self, keys: Sequence[str]) -> None:
        """Withdraw the manifests of `keys`, published or not."""
        self.delete_records(MANIFESTS, keys)

    def iter_manifest_keys(self) -> Iterator[str]:
        """The key of every published manifest (streamed)."""
        return self.iter_records(MANIFESTS)

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise StoreUnavailable if the backend cannot be reached."""
