"""Eviction: `artstore gc` as a small function over the index and the blob store,
and the operator commands that share its cross-check (`verify`, `rm`).

Order of work (`collect`), under a lease (`gc:NAMESPACE`) so that two gc runs
never overlap:

1. fold read-only readers' accesses into entries, so LRU reflects the cluster;
2. drop entries built by jaxlib versions older than `jaxlib_older_than`;
3. find, in one query, the shortest least-recently-used prefix of entries (by
   (last_access, id)) whose removal takes every entry unused for `older_than`
   and brings the namespace within its limit (`max_bytes`, or the namespace
   quota if smaller), then delete that prefix by id ranges;
4. delete objects no entry references, once older than the grace period;
5. reconcile (one listing of the blob store): blobs with no row and no entry,
   older than the grace period, are deleted; entries whose object is gone
   are dropped;
6. publish the manifest of every entry that has none (one listing of the
   manifests: a writer killed between its row and its manifest; `gc.publish`).

Victims are predicates, not lists (`Victims`): gc never holds the entries in
memory, the database sorts and deletes them set-wise, and an entry hit while gc
runs moves past the cutoff and is kept.

The size of a namespace is the bytes of the distinct objects its entries
reference (entries sharing an object count it once, and it is freed with the
last of them). Index rows go first, objects after, so a reader racing gc finds
either a row and its object, or a row and no object (a miss: Store.get returns
None), or no row (a miss).

Why objects in flight survive: a writer PUTs the object before it commits the
entry. An uploaded blob is younger than the grace period (its mtime), and its
object row is created (or touched, which makes it young again) only in the
entry's own transaction, so neither path deletes it while the put is in
flight. The dangerous writer is the one that found the object present and
skipped the upload while gc deletes it: see `EvictionIndex._sweep` for why its
entry is either seen by gc or followed by a re-upload (an entry points at a
missing object for at most that one operation). `grace_secs=0` keeps that
guarantee but lets gc delete a blob whose writer has not committed yet; the
writer's re-check then restores it.

Dry runs take the same decisions without deleting, counting what they would
have removed as gone: they report exactly the set a real run would remove,
unless the store changes in between.
"""

from artifactstore.gc.collect import collect
from artifactstore.gc.policy import DEFAULT_GRACE_SECS, Policy, old_jaxlib_versions
from artifactstore.gc.report import GcReport, Removal

__all__ = ["DEFAULT_GRACE_SECS", "GcReport", "Policy", "Removal", "collect", "old_jaxlib_versions"]
