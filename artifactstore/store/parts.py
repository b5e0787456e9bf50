"""The narrow parts of a store that maintenance code (gc/, bundles/, cli/) works on.

Code outside store/ that walks the index and the object store directly (gc, verify,
rebuild, fold) takes `StoreParts`, not the `Store`: it then sees only the index, the
object store and the settings, never the read and write paths, and no code reaches
through a Store to find them (issue 39, item 6). `Store` satisfies it as it is, so
the index stays opened on first use (a reader that folds nothing never opens it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from artifactstore.blobstores.base import BlobStore
    from artifactstore.config import Settings
    from artifactstore.index.repo import EntryIndex


class StoreParts(Protocol):
    """A store's settings, object store and index (and the index's engine and namespace)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def namespace(self) -> str: ...

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def index(self) -> EntryIndex: ...
