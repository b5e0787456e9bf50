"""gc's pass over manifests: an entry without one is published from its row.

Why: a put writes object -> index row -> manifest, and readers follow only manifests
(they never ask a database server). A writer killed between its row and its manifest
(SIGKILL, the OOM killer, a lost node) leaves an entry every reader misses; the next
writer of that key republishes it (`WritePath.admit`), but a key no writer compiles
again (a host answered by its own tier, a finished CI job) would stay missed until an
operator ran `artstore verify --repair`. gc runs on a schedule, so it finishes them.

Cost: one listing of the manifests' folder per run, compared with the index one key
prefix at a time (memory: one prefix's keys, about 1/256 of the entries), and a lookup
and an existence check per entry found without a manifest (crashes only). A row removed
while this runs is withdrawn again (`WritePath.publish_checked` re-checks it); one whose object is
gone is left to the reconcile pass, which drops it.
"""

from __future__ import annotations

from collections.abc import Callable

from artifactstore.gc.reconcile import PREFIXES
from artifactstore.gc.run import GcRun
from artifactstore.index.repo import EntryInfo

Publish = Callable[[EntryInfo], bool]


def publish_missing(run: GcRun, publish: Publish) -> None:
    """Publish (dry run: count) the manifest of every entry that has none."""
    listing = iter(run.parts.blobs.iter_manifest_keys())
    pending = next(listing, None)
    for i, prefix in enumerate(PREFIXES):
        published: set[str] = set()
        # Listed in order of key prefix (S3's order; a local store's shards): one out of
        # order costs an extra publication of the row's own manifest, nothing else.
        while pending is not None and pending[:2] <= prefix:
            published.add(pending)
            pending = next(listing, None)
        high = PREFIXES[i + 1] if i + 1 < len(PREFIXES) else None
        for key in sorted(run.ix.keys_between(prefix, high) - published):
            _finish(run, key, publish)
        run.keep_lease()


def _finish(run: GcRun, key: str, publish: Publish) -> None:
    entry = run.parts.index.lookup(key)
    if entry is None or not run.parts.blobs.exists(entry.digest):
        return  # removed meanwhile, or lost its object: the reconcile pass drops it
    if run.policy.dry_run or publish(entry):
        run.report.manifests_published += 1
