"""What a gc run tells its caller: each removal as it happens, and a summary at the end.

Kept apart from the run so that the output module depends on these records only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Removal:
    """One thing gc removes (or, in a dry run, would remove)."""

    kind: str  # "entry" | "object"
    name: str  # key or digest
    size: int
    reason: str  # jaxlib | older-than | size | unreferenced | orphan | missing-object
    module: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, self._id_field(): self.name, "size": self.size}
        data["reason"] = self.reason
        if self.module:
            data["module"] = self.module
        return data

    def _id_field(self) -> str:
        return "key" if self.kind == "entry" else "digest"


@dataclass
class GcReport:
    namespace: str
    dry_run: bool
    limit_bytes: int | None
    bytes_before: int = 0  # bytes of the objects the namespace's entries reference
    bytes_after: int = 0  # the same after the run: what the limit is held to
    journals_folded: int = 0  # readers' hit journals (artifactstore.formats.journal)
    journals_refused: int = 0  # malformed or oversized: deleted unread
    journals_set_aside: int = 0  # not named as journals, or unreadable: left alone
    journals_left: int = 0  # beyond this run's fold bound: the next run folds them
    accesses_folded: int = 0
    quick_records_removed: int = 0  # keys once too quick to store, stored since
    lease_rows_removed: int = 0  # compile leases of dead holders, in the index (gc/leases.py)
    lease_records_removed: int = 0  # their `leases/*` records in the object store
    entries_removed: int = 0
    entry_bytes_removed: int = 0
    objects_removed: int = 0
    object_bytes_freed: int = 0
    dangling_entries: int = 0
    # Unreferenced objects younger than the grace period: kept now, deleted by a gc run
    # from `objects_waiting_from` (the first) to `objects_waiting_until` (all; ISO, UTC).
    grace_secs: float = 0.0
    objects_waiting: int = 0
    object_bytes_waiting: int = 0
    objects_waiting_from: str | None = None
    objects_waiting_until: str | None = None
    entries_restored: int = 0  # orphans that carried an entry the index had lost
    manifests_published: int = 0  # entries whose writer died before publishing (gc/publish.py)
    reconcile_skipped: str | None = None  # why the object store was not cross-checked
    reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


OnRemove = Callable[[Removal], None]
PhaseProgress = Callable[[str, int, int | None], None]  # phase, advance, total (None: unknown)
