"""Object store backends and wrappers; `open_blobstore` picks one from settings."""

from __future__ import annotations

from artifactstore import safedir
from artifactstore.blobstores.base import BlobInfo, BlobStore
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.blobstores.readonly import ReadOnlyBlobStore
from artifactstore.config import Settings

__all__ = ["BlobInfo", "BlobStore", "LocalBlobStore", "ReadOnlyBlobStore", "open_blobstore"]


def open_blobstore(settings: Settings) -> BlobStore:
    loc = settings.blobs
    store: BlobStore
    if loc.scheme == "s3":
        from artifactstore.blobstores.s3 import S3BlobStore

        store = S3BlobStore(
            bucket=loc.bucket,
            prefix=loc.path,
            namespace=settings.namespace,
            endpoint_url=settings.s3_endpoint_url,
            timeout_secs=settings.timeout_secs,
        )
    else:
        modes = safedir.store_modes(settings.group_readable)
        store = LocalBlobStore(loc.path, settings.namespace, modes=modes)
    return ReadOnlyBlobStore(store) if settings.read_only else store
