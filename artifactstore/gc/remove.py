"""`artstore rm`: delete entries by key, then the objects no entry references any more.

Order: manifests withdrawn, rows deleted, objects deleted; what a crash between two
steps leaves, and its repair, is in artifactstore/gc/verify.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from artifactstore.store import Store


@dataclass
class RemoveReport:
    entries: int = 0
    objects: int = 0
    bytes: int = 0


def resolve_keys(store: Store, prefixes: Iterable[str]) -> tuple[list[str], list[str]]:
    """Expand key prefixes (as `ls` prints them) to full keys; also the unmatched ones."""
    keys: list[str] = []
    unknown: list[str] = []
    for prefix in prefixes:
        found = store.index.keys_with_prefix(prefix.lower())
        if found:
            keys.extend(found)
        else:
            unknown.append(prefix)
    return sorted(set(keys)), unknown


def remove(store: Store, keys: list[str] | None) -> RemoveReport:
    """Delete entries (all of the namespace if `keys` is None), then their orphaned objects."""
    report = RemoveReport()
    before = dict(store.index.referenced_digests())
    # Manifests first, so that no reader is sent to an entry being removed.
    store.withdraw(list(store.blobs.iter_manifest_keys()) if keys is None else keys)
    if keys is None:
        report.entries = store.index.delete_all_entries()
    else:
        report.entries = store.index.delete_entries(keys)
    if report.entries:
        store.entries_removed()
    still = dict(store.index.referenced_digests())
    orphans = [d for d in before if d not in still]
    for digest in orphans:
        if store.blobs.delete(digest):
            report.objects += 1
            report.bytes += before[digest]
    store.index.forget_objects(orphans)
    return report
