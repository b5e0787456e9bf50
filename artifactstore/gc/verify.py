"""`artstore verify`: every object's digest and envelope, and the index cross-checked.

Streams over the blob store one prefix at a time (`reconcile.chunks`) rather
than loading the listing or the index, and reports plain data for the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from artifactstore import codec
from artifactstore.gc import reconcile
from artifactstore.gc.policy import DEFAULT_GRACE_SECS
from artifactstore.index.eviction import EvictionIndex
from artifactstore.store import Store

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

    @property
    def ok(self) -> bool:
        return not (self.corrupt or self.entries_without_object or self.objects_without_entry)

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
        }


def verify(
    store: Store,
    *,
    repair: bool = False,
    progress: CountProgress | None = None,
    grace_secs: float | None = None,
) -> VerifyReport:
    """Check the digest and envelope of every object and cross-check the index.

    The cross-check is gc's (`reconcile.chunks`), so both agree on what is an
    orphan: an object no entry references that is older than the grace period
    (a younger one may be a put in flight) or an entry whose object is gone.
    With `repair`, corrupt objects are quarantined and entries pointing at
    missing or corrupt objects are removed, so the next compile stores them
    anew; `artstore gc` deletes orphaned objects.
    """
    report = VerifyReport()
    grace = DEFAULT_GRACE_SECS if grace_secs is None else grace_secs
    cutoff = time.time() - grace
    missing: list[str] = []
    for chunk in reconcile.chunks(store.blobs, EvictionIndex(store.engine, store.namespace)):
        for info in chunk.blobs:
            data = store.blobs.get(info.digest)
            if data is None:  # deleted while we scanned
                continue
            report.objects_checked += 1
            report.bytes_checked += len(data)
            if codec.digest_of(data) != info.digest or codec.envelope_fingerprint(data) is None:
                report.corrupt.append(info.digest)
            elif info.digest not in chunk.referenced and info.mtime < cutoff:
                report.objects_without_entry.append(info.digest)
            if progress is not None:
                progress(1)
        missing += [d for d in chunk.unlisted() if not store.blobs.exists(d)]
    report.entries_without_object = sorted(
        key for digest in missing for key in store.index.keys_for_digest(digest)
    )
    report.quarantined = sorted(b.digest for b in store.blobs.iter_quarantined())
    if repair and not store.read_only:
        for digest in report.corrupt:
            store.blobs.quarantine(digest)
        bad = set(report.corrupt) | set(missing)
        for digest in bad:
            store.index.delete_entries(store.index.keys_for_digest(digest))
        store.index.forget_objects(bad)
        if bad:
            store.entries_removed()
        report.repaired = True
    return report
