"""`artstore rm`: delete entries by key, then the objects no entry references any more.

Order: manifests withdrawn, rows deleted, objects deleted; what a crash between two
steps leaves, and its repair, is in artifactstore/gc/verify.py. `rm --name` first
leaves each version's removal record (artifactstore/store/removed.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from artifactstore.formats.named import split_module
from artifactstore.store import Store, StoreParts, removed


@dataclass
class RemoveReport:
    entries: int = 0
    objects: int = 0
    bytes: int = 0
    versions: list[str] = field(default_factory=list)  # NAME@VERSION removed for good


def resolve_keys(parts: StoreParts, prefixes: Iterable[str]) -> tuple[list[str], list[str]]:
    """Expand key prefixes (as `ls` prints them) to full keys; also the unmatched ones."""
    keys: list[str] = []
    unknown: list[str] = []
    for prefix in prefixes:
        found = parts.index.keys_with_prefix(prefix.lower())
        if found:
            keys.extend(found)
        else:
            unknown.append(prefix)
    return sorted(set(keys)), unknown


def remove(store: Store, keys: list[str] | None) -> RemoveReport:
    """Delete entries (all of the namespace if `keys` is None), then their orphaned objects."""
    report = RemoveReport()
    before = _referenced(store.parts)
    report.entries = store.parts.remove_entries(keys)
    _delete_orphans(store.parts, before, report)
    return report


def _referenced(parts: StoreParts) -> dict[str, int]:
    """Each object an entry references: digest -> size."""
    return dict(parts.index.referenced_digests())


def _delete_orphans(parts: StoreParts, before: dict[str, int], report: RemoveReport) -> None:
    """Delete the objects of `before` (digest -> size) that no entry references now."""
    still = _referenced(parts)
    orphans = [d for d in before if d not in still]
    for digest in orphans:
        if parts.blobs.delete(digest):
            report.objects += 1
            report.bytes += before[digest]
    parts.index.forget_objects(orphans)


def remove_named(store: Store, modules: dict[str, str]) -> RemoveReport:
    """`rm --name`: the entries `modules` names (key -> module name, `named:NAME@VERSION`),
    after a removal record for each of their versions, so that no copy of them put back
    in the bucket is ever loaded again and the version is not stored again (issue 38).
    The records come first: a crash part way leaves a version refused, never half-alive."""
    versions = {v for v in map(split_module, modules.values()) if v is not None}
    _leave_records(store.parts, versions)
    report = remove(store, sorted(modules))
    report.versions = [f"{name}@{version}" for name, version in sorted(versions)]
    return report


def _leave_records(parts: StoreParts, versions: set[tuple[str, str]]) -> None:
    """A removal record for each NAME@VERSION, in order."""
    for name, version in sorted(versions):
        removed.leave(parts.blobs, name, version)
