"""`artstore verify`: every object's digest and envelope, and the index cross-checked.

Streams over the blob store one prefix at a time (`reconcile.chunks`) rather
than loading the listing or the index, and reports plain data for the CLI.

Manifests, index rows and objects are reconciled three ways. The order each is
written in is what makes every crash leave a state that costs misses, never a
wrong load (a reader verifies the object a manifest names in full, signature
included, before loading it), and that `verify --repair` brings back to consistent:

Publication (`Store.put`): object durable -> index row -> manifest.
  - killed after the object: an object without row or manifest; readers miss.
    gc turns it into its entry after the grace period (`reconcile._restored`).
  - killed after the row: an entry without manifest (`manifests_missing`); readers
    miss until the first of: the next writer of the key (it finds the row when it
    stores its compile, and publishes the row's manifest: `WritePath.admit`), the next
    `artstore gc` (`gc.publish`), or `--repair`; each publishes it from the row.
  - killed after the manifest: nothing to repair.

Removal (`artstore rm`, `gc.remove`): manifest -> index row -> object.
  - killed after the manifest: an entry without manifest; readers miss, and
    `--repair` publishes it again (run the `rm` again to remove it).
  - killed after the row: an unreferenced object; readers miss, gc deletes it.
gc's eviction deletes rows first (it chooses its victims in the DELETE itself) and
withdraws their manifests just after; killed in between, it leaves manifests without
an entry whose objects outlive them by the grace period: readers load the right
executable or, once the object is gone, count a `missing_object` miss. `--repair`
withdraws manifests without an entry (`manifests_without_entry`), and reports those
that name an object that does not exist (`manifests_without_object`): republished
from the row where the row's object exists, withdrawn otherwise. `artstore db
rebuild` recovers rows from manifests (and objects) when the index is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from artifactstore import interrupts
from artifactstore.errors import ArtstoreError, CorruptObject
from artifactstore.formats import codec
from artifactstore.formats.manifest import Manifest
from artifactstore.gc import reconcile
from artifactstore.gc.policy import DEFAULT_GRACE_SECS
from artifactstore.gc.remove import removal_rows
from artifactstore.index.eviction import EvictionIndex
from artifactstore.index.identity import entry_count
from artifactstore.index.repo import EntryInfo
from artifactstore.store import Store, StoreParts

CountProgress = Callable[[int], None]  # objects checked since the last call


@dataclass
class VerifyReport:
    objects_checked: int = 0
    bytes_checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    entries_without_object: list[str] = field(default_factory=list)
    objects_without_entry: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    repaired: bool = False
    # Signatures (keys of the entries): `unsigned` always; `bad_signature` and
    # `untrusted_key` only where ARTSTORE_TRUSTED_KEYS is set (they are what its
    # readers refuse, so then they, and unsigned entries, are problems).
    signatures_checked: bool = False
    signers: dict[str, int] = field(default_factory=dict)  # key name -> entries
    unsigned: list[str] = field(default_factory=list)
    bad_signature: list[str] = field(default_factory=list)
    untrusted_key: list[str] = field(default_factory=list)
    # Manifests (keys): entries whose manifest is absent, damaged or names another object
    # (readers without the index miss them), manifests without an entry, and manifests
    # naming an object that does not exist (with or without an entry: readers that follow
    # them count a `missing_object` miss).
    manifests_missing: list[str] = field(default_factory=list)
    manifests_without_entry: list[str] = field(default_factory=list)
    manifests_without_object: list[str] = field(default_factory=list)
    # Removal records of named versions (gc.remove.removal_rows): those this store obeys,
    # and those it ignores (no trusted signature where one is required: planted by a
    # bucket writer without the key, or left by a client from before signed records).
    removals: list[str] = field(default_factory=list)
    removals_ignored: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        refused = self.signatures_checked and (
            self.unsigned or self.bad_signature or self.untrusted_key
        )
        return not (
            self.corrupt
            or self.entries_without_object
            or self.objects_without_entry
            or refused
            or self.manifests_missing
            or self.manifests_without_entry
            or self.manifests_without_object
            or self.removals_ignored
        )

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "objects_checked": self.objects_checked,
            "bytes_checked": self.bytes_checked,
            "corrupt": self.corrupt,
            "entries_without_object": self.entries_without_object,
            "objects_without_entry": self.objects_without_entry,
            "quarantined": self.quarantined,
            "repaired": self.repaired,
            "signatures_checked": self.signatures_checked,
            "signers": self.signers,
            "unsigned": self.unsigned,
            "bad_signature": self.bad_signature,
            "untrusted_key": self.untrusted_key,
            "manifests_missing": self.manifests_missing,
            "manifests_without_entry": self.manifests_without_entry,
            "manifests_without_object": self.manifests_without_object,
            "removals": self.removals,
            "removals_ignored": self.removals_ignored,
        }


def verify(
    store: Store,
    *,
    repair: bool = False,
    progress: CountProgress | None = None,
    grace_secs: float | None = None,
    allow_missing: bool = False,
) -> VerifyReport:
    """Check the digest and envelope of every object and cross-check the index.

    The cross-check is gc's (`reconcile.chunks`), so both agree on what is an
    orphan: an object no entry references that is older than the grace period
    (a younger one may be a put in flight) or an entry whose object is gone.
    With `repair`, corrupt objects are quarantined and entries pointing at
    missing or corrupt objects are removed, so the next compile stores them
    anew; `artstore gc` deletes orphaned objects. Like gc, a repair that would drop
    more than a small share of the entries refuses, changing nothing, unless
    `allow_missing` (a wrong or emptied bucket is not a store that lost them).
    """
    report = VerifyReport(signatures_checked=store.parts.settings.trusted_keys is not None)
    grace = DEFAULT_GRACE_SECS if grace_secs is None else grace_secs
    missing, stale = _check(store.parts, report, time.time() - grace, progress)
    if repair and not store.parts.read_only:
        _repair(store, report, missing, stale, allow_missing=allow_missing)
    return report


def _check(
    parts: StoreParts, report: VerifyReport, cutoff: float, progress: CountProgress | None
) -> tuple[list[str], list[EntryInfo]]:
    """The check, which only reads: fills `report`; returns the digests of the objects
    gone and the entries whose manifest is missing or stale."""
    missing: list[str] = []
    for chunk in reconcile.chunks(parts.blobs, EvictionIndex(parts.engine, parts.namespace)):
        for info in chunk.blobs:
            data = parts.blobs.get(info.digest)
            if data is None:  # deleted while we scanned
                continue
            report.objects_checked += 1
            report.bytes_checked += len(data)
            if codec.digest_of(data) != info.digest or codec.envelope_fingerprint(data) is None:
                report.corrupt.append(info.digest)
            elif info.digest not in chunk.referenced and info.mtime < cutoff:
                report.objects_without_entry.append(info.digest)
            elif info.digest in chunk.referenced:
                _check_signature(parts, data, info.digest, report)
            if progress is not None:
                progress(1)
        missing += [d for d in chunk.unlisted() if not parts.blobs.exists(d)]
    report.entries_without_object = sorted(
        key for digest in missing for key in parts.index.keys_for_digest(digest)
    )
    for names in (report.unsigned, report.bad_signature, report.untrusted_key):
        names.sort()
    report.quarantined = sorted(b.digest for b in parts.blobs.iter_quarantined())
    for row in removal_rows(parts):
        if row["obeyed"]:
            report.removals.append(row["ref"])
        else:
            report.removals_ignored.append(f"{row['ref']} ({row['why_ignored']})")
    return missing, _check_manifests(parts, report, set(missing))


def _repair(
    store: Store,
    report: VerifyReport,
    missing: list[str],
    stale: list[EntryInfo],
    *,
    allow_missing: bool,
) -> None:
    """Quarantine, drop and re-publish what `_check` found (see `verify`)."""
    bad = set(report.corrupt) | set(missing)
    if not allow_missing:
        _check_share(store.parts, bad)
    for digest in sorted(bad):
        with interrupts.held():  # manifests and rows go together
            store.parts.remove_object(digest, quarantine=digest in report.corrupt)
    store.parts.writes.withdraw(report.manifests_without_entry)
    for entry in stale:
        if entry.digest not in bad:
            store.parts.writes.publish_checked(entry)
    report.repaired = True


def _check_share(parts: StoreParts, bad: set[str]) -> None:
    """Refuse a repair that drops more entries than gc would (reconcile.missing_limit)."""
    dropped = sum(len(parts.index.keys_for_digest(digest)) for digest in bad)
    total = entry_count(parts.engine, parts.namespace)
    if dropped > reconcile.missing_limit(total):
        raise ArtstoreError(
            f"verify --repair refused: {dropped} of {total} entries of namespace "
            f"{parts.namespace} have no intact object in {parts.blobs.describe()} (more than "
            f"{reconcile.MISSING_SHARE:.0%}), so nothing was repaired: check ARTSTORE_URL and "
            "the namespace (`artstore doctor`), or pass --allow-missing to drop those entries"
        )


def _check_manifests(parts: StoreParts, report: VerifyReport, missing: set[str]) -> list[EntryInfo]:
    """Cross-check manifests with index rows and objects (`missing`: the digests rows
    name whose objects are gone); the entries whose manifest to (re)publish.

    The three-way rules, and what a crash at each step leaves, are in this module's
    docstring: a put or a removal in flight can show here for a moment, and repairing
    it publishes or withdraws what the writer or the remover was about to."""
    published = set(parts.blobs.iter_manifest_keys())
    stale: list[EntryInfo] = []
    without_object: list[str] = []
    for entry in parts.index.iter_entries():
        found = _read_manifest(parts, entry.key) if entry.key in published else None
        published.discard(entry.key)
        if found is None or found.digest != entry.digest or found.fingerprint != entry.fingerprint:
            stale.append(entry)
        if found is not None and (
            found.digest in missing
            if found.digest == entry.digest
            else not parts.blobs.exists(found.digest)
        ):
            without_object.append(entry.key)
    for key in published:  # no row: withdrawn by a repair; checked only to say why
        found = _read_manifest(parts, key)
        if found is not None and not parts.blobs.exists(found.digest):
            without_object.append(key)
    report.manifests_missing = sorted(e.key for e in stale)
    report.manifests_without_entry = sorted(published)
    report.manifests_without_object = sorted(without_object)
    return stale


def _read_manifest(parts: StoreParts, key: str) -> Manifest | None:
    """`key`'s manifest; None where it is absent or damaged (a repair replaces it)."""
    data = parts.blobs.get_manifest(key)
    try:
        return None if data is None else Manifest.decode(data, key)
    except CorruptObject:
        return None


def _check_signature(parts: StoreParts, data: bytes, digest: str, report: VerifyReport) -> None:
    """Sort the entries that reference this intact object by their signature."""
    keys = parts.index.keys_for_digest(digest)
    trusted = parts.settings.trusted_keys
    sig = codec.read_signature(data)
    if sig is None:
        report.unsigned += keys
        return
    report.signers[sig.signer] = report.signers.get(sig.signer, 0) + len(keys)
    if trusted is None:
        return
    for key in keys:
        try:
            codec.check_signature(data, trusted, parts.namespace, key=key)
        except codec.UntrustedKey:
            report.untrusted_key.append(key)
        except codec.CorruptObject:  # bad signature, or the object is another key's
            report.bad_signature.append(key)
