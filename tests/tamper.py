"""What an attacker with write access to the index and the object store can change:
where an entry's key leads. Tests forge every record a lookup may follow (the index
row, the manifest, this host's tier key file) and check that the object itself is
what decides whether anything loads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from sqlalchemy import update

from artifactstore import config
from artifactstore.formats.manifest import Manifest
from artifactstore.index.models import Entry
from artifactstore.store import Store


def point(store: Store, key: str, digest: str, **sizes: int) -> None:
    """Make `key` lead to `digest` (and claim `sizes`: size, raw_size) everywhere."""
    with store.parts.engine.begin() as conn:
        conn.execute(
            update(Entry)
            .where(Entry.namespace == store.parts.namespace, Entry.key == key)
            .values(digest=digest, **sizes)
        )
    data = store.parts.blobs.get_manifest(key)
    if data is not None:
        forged = dataclasses.replace(Manifest.decode(data, key), digest=digest, **sizes)
        store.parts.blobs.put_manifest(key, forged.encode())
    if store.parts.tier is not None:
        key_file = store.parts.tier._key_path(key)
        if key_file.exists():
            body = json.loads(key_file.read_text())
            body["d"] = digest
            key_file.write_text(json.dumps(body))


def point_in(path: Path, key: str, digest: str, **sizes: int) -> None:
    """`point` in the embedded store at `path` (a local directory with its SQLite index)."""
    store = Store.open(config.resolve({"url": str(path)}, {}))
    try:
        point(store, key, digest, **sizes)
    finally:
        store.close()
