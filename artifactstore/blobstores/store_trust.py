"""Whose local store (directory, SQLite index) a process may read: its own, root's, or,
read-only and only when every entry must carry a trusted signature, anyone's.

Why not anyone's on ARTSTORE_READ_ONLY alone: on a shared host another user can create
the store's directory (or an index under a shared one) before its owner does; a reader
that trusted the directory's owner would run that user's executables. With signatures
required and keys listed, what the directory holds decides nothing: only the listed
writers' signed entries load, whoever owns the files.
"""

from __future__ import annotations

from artifactstore.blobstores import safedir
from artifactstore.config import Settings


def store_trust(settings: Settings) -> safedir.Trust:
    """`any` for a read-only process that loads signed entries only, else `mine_or_root`."""
    trusted = settings.trusted_keys
    signed = settings.require_signatures and trusted is not None and bool(trusted.keys)
    return "any" if settings.read_only and signed else "mine_or_root"
