"""Read-only wrapper: a reader's blob store refuses every write, whatever calls it,
but its hit journal (artifactstore.formats.journal), which gc folds into the index.

The Store also skips writes in reader mode (to count and log them); this wrapper
is the backstop, so that no code path, present or future, writes an object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from artifactstore.blobstores.base import BlobInfo, BlobStore, RecordKind
from artifactstore.errors import ReadOnlyError


class ReadOnlyBlobStore(BlobStore):
    read_only = True

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        return self.inner.get(digest, max_bytes=max_bytes)

    def exists(self, digest: str) -> bool:
        return self.inner.exists(digest)

    def put(self, digest: str, data: bytes) -> bool:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to write")

    def delete(self, digest: str) -> bool:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to delete")

    def delete_many(self, digests: Sequence[str]) -> None:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to delete")

    def quarantine(self, digest: str) -> None:
        raise ReadOnlyError("this store is read-only: cannot quarantine")

    def iter_blobs(self) -> Iterator[BlobInfo]:
        return self.inner.iter_blobs()

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        return self.inner.iter_quarantined()

    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        return self.inner.get_record(kind, name)

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        if not kind.readers_write:  # a reader's hit journal is its one write
            raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to write")
        self.inner.put_record(kind, name, data)

    def delete_records(self, kind: RecordKind, names: Sequence[str]) -> None:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to delete")

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        return self.inner.iter_records(kind, prefix=prefix)

    def list_records(self, kind: RecordKind) -> Iterator[BlobInfo]:
        return self.inner.list_records(kind)

    def get_identity(self) -> bytes | None:
        return self.inner.get_identity()

    def put_identity(self, data: bytes) -> bool:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to write")

    def delete_identity(self) -> None:
        raise ReadOnlyError("this store is read-only: unset ARTSTORE_READ_ONLY to write")

    def describe(self) -> str:
        return self.inner.describe() + " (read-only)"

    def check(self) -> None:
        self.inner.check()
