"""The one narrow interface every object store backend implements.

Objects are immutable bytes named by their sha256 digest. Backends know
nothing about keys, entries or JAX; wrappers (read-only, tiers) compose around
any backend, as in sccache's storage layer.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from artifactstore.codec import check_digest

__all__ = ["BlobInfo", "BlobStore", "check_digest"]


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    mtime: float  # seconds since the epoch


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

    # -- manifests: each entry's record, beside the objects (artifactstore.manifest) --
    @abc.abstractmethod
    def get_manifest(self, key: str) -> bytes | None:
        """`key`'s manifest as stored, or None if none is published. Never verifies."""

    @abc.abstractmethod
    def put_manifest(self, key: str, data: bytes) -> None:
        """Publish `key`'s manifest atomically, replacing any other; durable on return."""

    @abc.abstractmethod
    def delete_manifests(self, keys: Sequence[str]) -> None:
        """Withdraw the manifests of `keys`, published or not."""

    @abc.abstractmethod
    def iter_manifest_keys(self) -> Iterator[str]:
        """The key of every published manifest (streamed)."""

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise StoreUnavailable if the backend cannot be reached."""
