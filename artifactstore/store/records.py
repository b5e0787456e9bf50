"""A store's records, without its objects or its index: the part that code keeping one
kind of record (working sets, quick keys, removal records) or listing the manifests gets.

Code outside store/ that reads or writes records needs nothing else; handed the Store, or
its object store, it could read and delete executables and open the index (issue 39, item
6). Writes pass the store's write gate: a writer whose bucket and index are not one store
writes no record there either (the gate said so once, in one line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from artifactstore.blobstores.base import BlobStore, RecordKind


class Records:
    """Get, put and list records of a store (and read or list its manifests)."""

    def __init__(self, blobs: BlobStore, admits: Callable[[], bool]) -> None:
        self._blobs = blobs
        self._admits = admits

    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        return self._blobs.get_record(kind, name)

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> bool:
        """Stored, or False where the write gate refuses this writer."""
        if not self._admits():
            return False
        self._blobs.put_record(kind, name, data)
        return True

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        return self._blobs.iter_records(kind, prefix=prefix)

    def get_manifest(self, key: str) -> bytes | None:
        return self._blobs.get_manifest(key)

    def iter_manifest_keys(self) -> Iterator[str]:
        return self._blobs.iter_manifest_keys()
