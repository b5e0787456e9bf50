"""Object store backends and wrappers; `open_blobstore` picks one from settings."""

from __future__ import annotations

from pathlib import Path

from artifactstore.blobstores import safedir
from artifactstore.blobstores.base import BlobInfo, BlobStore
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.blobstores.readonly import ReadOnlyBlobStore
from artifactstore.blobstores.store_trust import store_trust
from artifactstore.config import Settings, check_namespace

__all__ = [
    "BlobInfo",
    "BlobStore",
    "LocalBlobStore",
    "ReadOnlyBlobStore",
    "never_held",
    "open_blobstore",
]


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
        # Whose store may be read, as Store.open's check decides (secure_local_dirs).
        trust = store_trust(settings)
        store = LocalBlobStore(loc.path, settings.namespace, modes=modes, trust=trust)
    return ReadOnlyBlobStore(store) if settings.read_only else store


def describe_blobstore(settings: Settings) -> str:
    """What `open_blobstore(settings).describe()` says, opening nothing (for commands
    that read only the index: blobstores.absent)."""
    where = _where(settings)
    return where + " (read-only)" if settings.read_only else where


def _where(settings: Settings) -> str:
    loc = settings.blobs
    if loc.scheme == "s3":
        prefix = loc.path.strip("/")
        base = f"{prefix}/{settings.namespace}" if prefix else settings.namespace
        return f"s3://{loc.bucket}/{base}"
    return str(Path(loc.path) / check_namespace(settings.namespace))


def never_held(blobs: BlobStore, settings: Settings) -> str | None:
    """One line where the namespace of `blobs` (opened from `settings`) has never held an
    entry, else None: no identity object (a writer creates it before its first write) and
    no manifest (writers before identities published those). What a mistyped bucket or
    prefix that exists looks like to a reader, who would otherwise load nothing, silently.
    Two requests: the identity's GET and one page of the manifests' listing."""
    if blobs.get_identity() is not None or next(iter(blobs.iter_manifest_keys()), None) is not None:
        return None
    return (
        f"{_where(settings)} has never held an entry (no store identity, no manifests): "
        "check ARTSTORE_URL and ARTSTORE_NAMESPACE"
    )
