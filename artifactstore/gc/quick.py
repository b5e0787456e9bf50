"""gc's pass over quick-key records (artifactstore.formats.quick): those of stored keys go.

Why: a key some writer found too quick to store may compile slower elsewhere (another
host, new flags) and be stored. `artstore pull` already leaves out a quick key that has a
manifest, so a stale record costs nothing there; deleting it keeps the folder to the
keys that are quick still. One listing, one index query per batch, deletes in batches.
"""

from __future__ import annotations

from artifactstore.blobstores.base import QUICK
from artifactstore.formats.quick import split_quick_name
from artifactstore.gc.run import GcRun

BATCH = 1000  # records per index query and per delete request


def drop_stored_quick_keys(run: GcRun) -> None:
    """Delete (dry run: count) the quick-key records whose key has an entry."""
    batch: list[tuple[str, str]] = []
    for name in run.parts.blobs.iter_records(QUICK):
        try:
            batch.append((name, split_quick_name(name)[1]))
        except ValueError:  # not one of ours: never deleted
            continue
        if len(batch) >= BATCH:
            _drop(run, batch)
            batch = []
    _drop(run, batch)


def _drop(run: GcRun, batch: list[tuple[str, str]]) -> None:
    stored = run.ix.stored_keys([key for _, key in batch])
    names = [name for name, key in batch if key in stored]
    if names and not run.policy.dry_run:
        run.parts.blobs.delete_records(QUICK, names)
    run.report.quick_records_removed += len(names)
