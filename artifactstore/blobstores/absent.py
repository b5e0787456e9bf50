"""The object store of a command that reads only the index (`ls`, `stats`, `quota`).

Such commands must work while the object store is down, unreachable or not
configured for this host (no boto3, no credentials): nothing is opened, imported
or sent, and any use is a bug that fails with one line rather than a network wait.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NoReturn

from artifactstore.blobstores.base import BlobInfo, BlobStore, RecordKind
from artifactstore.errors import StoreUnavailable


class AbsentBlobStore(BlobStore):
    """Describes where the objects live; refuses every operation on them."""

    def __init__(self, description: str, *, read_only: bool = False) -> None:
        self._description = description
        self.read_only = read_only

    def _refuse(self) -> NoReturn:
        raise StoreUnavailable("this command reads only the index: the object store is not opened")

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        self._refuse()

    def put(self, digest: str, data: bytes) -> bool:
        self._refuse()

    def exists(self, digest: str) -> bool:
        self._refuse()

    def delete(self, digest: str) -> bool:
        self._refuse()

    def quarantine(self, digest: str) -> None:
        self._refuse()

    def iter_blobs(self) -> Iterator[BlobInfo]:
        self._refuse()

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        self._refuse()

    def describe(self) -> str:
        return self._description

    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        self._refuse()

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        self._refuse()

    def delete_records(self, kind: RecordKind, names: Sequence[str]) -> None:
        self._refuse()

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        self._refuse()

    def get_identity(self) -> bytes | None:
        self._refuse()

    def put_identity(self, data: bytes) -> bool:
        self._refuse()

    def delete_identity(self) -> None:
        self._refuse()
