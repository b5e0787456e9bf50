"""Where this host's tiers are (the store's own directory, or a private, bounded one), and
what a process keeps in them without the store.

Apart from the tier itself (store.tier), which is what a tier does wherever it is; free
of the index's and the object store's imports, so that a process the tier answers, and
which keeps its quick compiles there, never imports SQLAlchemy or boto3.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import replace
from pathlib import Path
from socket import gethostname

from artifactstore.blobstores import safedir
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.config import Settings, default_cache_dir
from artifactstore.errors import one_line
from artifactstore.formats import codec
from artifactstore.formats.put import Put
from artifactstore.process.counters import Counters
from artifactstore.process.notices import warn_once
from artifactstore.store.tier import LocalTier, Reads


def open_tier(settings: Settings, counters: Counters | None = None) -> LocalTier | None:
    """This host's tier for the store `settings` name, or None when turned off.

    A writable local store is its own tier (key map and journal beside its
    objects); a remote or read-only store gets a private, bounded tier under
    the user's cache directory, named by a hash of the store's identity.
    """
    if settings.local_tier == "off":
        return None
    reads = _reads(settings)
    if settings.blobs.scheme == "file" and not settings.read_only:
        # Also read when the store is root's (published), as Store.open decides.
        modes = safedir.store_modes(settings.group_readable)
        own = LocalBlobStore(
            settings.blobs.path, settings.namespace, modes=modes, trust="mine_or_root"
        )
        return LocalTier(own, owns_objects=False, reads=reads, counters=counters)
    root, top, name = _private_place(settings)
    return LocalTier(
        LocalBlobStore(root, name, top=top, setting="ARTSTORE_LOCAL_TIER"),
        owns_objects=True,
        max_bytes=settings.local_tier_bytes,
        reads=reads,
        counters=counters,
    )


def open_quick_tier(settings: Settings, counters: Counters | None = None) -> LocalTier | None:
    """This host's tier for compiles under ARTSTORE_MIN_COMPILE_SECS, or None when turned
    off: `below-threshold/` in the private tier's directory (for a writable local store
    too, whose own directory is the team's), bounded by ARTSTORE_LOCAL_TIER_SIZE. Apart,
    so that nothing in it is ever taken for the store's: no hit journaled for the
    index, no working set, no manifest, no row."""
    if settings.local_tier == "off":
        return None
    root, top, name = _private_place(settings)
    return LocalTier(
        LocalBlobStore(root / name, "below-threshold", top=top, setting="ARTSTORE_LOCAL_TIER"),
        owns_objects=True,
        quiet=True,
        max_bytes=settings.local_tier_bytes,
        reads=_reads(settings),
        counters=counters,
    )


def _reads(settings: Settings) -> Reads:
    """What a tier of this process checks before it loads."""
    return Reads(
        trusted=settings.trusted_keys,
        namespace=settings.namespace,
        max_object_bytes=settings.max_object_bytes,
        max_executable_bytes=settings.max_executable_bytes,
    )


def _private_place(settings: Settings) -> tuple[Path, Path, str]:
    """(root, top, name) of this host's private tier of the store `settings` name."""
    # One resolution of symbolic links, here; none below `top` is followed (safedir).
    if settings.local_tier:
        root = top = Path(os.path.realpath(settings.local_tier))
    else:
        top = Path(os.path.realpath(default_cache_dir()))
        root = top / "tiers"
    # Named by the bucket and namespace alone, so `artstore pull` (which needs no index)
    # fills the tier that programs use. 0.3 also hashed the index URL: such a tier is
    # renamed on first use (atomic; a race leaves one of the two, both valid).
    name = _tier_name(f"{settings.blobs.describe()}|{settings.namespace}")
    if settings.index_url:
        old = root / _tier_name(
            f"{settings.blobs.describe()}|{settings.index_url}|{settings.namespace}"
        )
        with contextlib.suppress(OSError):
            if old.is_dir() and not (root / name).exists():
                os.rename(old, root / name)
    return root, top, name


def _tier_name(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def keep_in_tier(settings: Settings, tier: LocalTier, put: Put) -> bool:
    """Keep an executable in this host's tier, so later processes here load it; True if
    kept. It is not uploaded later (a process that finds it in the tier never misses): a
    writer's while the store cannot take it, or a compile too quick to store. Only a
    tier holding its own objects (never a local store's directory: the store's own)."""
    if not tier.owns_objects:
        return False
    encoded = encode_entry(put, settings)
    try:
        tier.remember(put.key, put.manifest(encoded), encoded.data)
    except Exception as exc:  # a full disk costs the copy, nothing else
        warn_once("tier-keep", "local tier not updated: %s", one_line(exc))
        return False
    return True


def stamped(put: Put) -> Put:
    """`put` naming the host that compiled it: this one, unless it names one (an import)."""
    return put if put.producer_host is not None else replace(put, producer_host=gethostname())


def encode_entry(put: Put, settings: Settings) -> codec.Encoded:
    """The object `put` is stored as: its payload, fingerprint and metadata, signed with
    ARTSTORE_SIGNING_KEY for the store's namespace when one is set."""
    return stamped(put).encoded(signer=settings.signing_key, namespace=settings.namespace)
