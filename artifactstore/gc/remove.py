"""`artstore rm`: delete entries by key, then the objects no entry references any more.

Order: manifests withdrawn, rows deleted, objects deleted; what a crash between two
steps leaves, and its repair, is in artifactstore/gc/verify.py. `rm --name` first
leaves each version's removal record (artifactstore/store/removed.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from artifactstore.errors import ConfigError
from artifactstore.formats.named import (
    REMOVED_SUFFIX,
    check_removed_name,
    decode_removed,
    removed_name,
    split_module,
)
from artifactstore.store import Store, StoreParts, removed

UNSIGNED_REMOVAL = (
    "rm --name leaves a removal record, and where signatures are required readers obey "
    "only a signed one: set ARTSTORE_SIGNING_KEY to the writers' key (nothing was removed)"
)


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
    settings = store.parts.settings
    if settings.signing_key is None and (
        settings.require_signatures or settings.trusted_keys is not None
    ):
        raise ConfigError(UNSIGNED_REMOVAL)
    _leave_records(store.parts, versions)
    report = remove(store, sorted(modules))
    report.versions = [f"{name}@{version}" for name, version in sorted(versions)]
    return report


def _leave_records(parts: StoreParts, versions: set[tuple[str, str]]) -> None:
    """A removal record for each NAME@VERSION, in order, signed where a key is set."""
    for name, version in sorted(versions):
        settings = parts.settings
        signer, trusted = settings.signing_key, settings.trusted_keys
        removed.leave(parts.blobs, name, version, signer, trusted, parts.namespace)


def withdraw_removal(parts: StoreParts, ref: str) -> str | None:
    """Withdraw the removal record of `ref` (NAME@VERSION, or a record's name as `ls
    --removed` shows it): the version may be stored and loaded again. The record's
    name, or None if there is none."""
    record = ref if ref.endswith(REMOVED_SUFFIX) else None
    if record is None:
        name, _, version = ref.rpartition("@")
        record = removed_name(name, version)
    if parts.blobs.get_record(removed.REMOVED, check_removed_name(record)) is None:
        return None
    removed.withdraw(parts.blobs, record)
    return record


def removal_rows(parts: StoreParts) -> list[dict[str, Any]]:
    """One row per removal record in the store: which version, when, who signed it, and
    whether this process obeys it (`why` it does not, where it does not)."""
    trusted, rows = parts.settings.trusted_keys, []
    for record, data in removed.listing(parts.blobs):
        found = decode_removed(record, data)
        why = None if trusted is None else found.refusal(trusted, parts.namespace)
        rows.append(
            {
                "ref": found.ref,
                "record": record,
                "name": found.name,
                "version": found.version,
                "removed_at": found.removed_at,
                "signer": None if found.signature is None else found.signature.signer,
                "obeyed": why is None,
                "why_ignored": why,
            }
        )
    return rows
