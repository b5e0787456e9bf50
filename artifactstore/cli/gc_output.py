"""How `artstore gc` shows its work: streamed JSON or text (progress: cli/progress.py).

Removals are written as they happen, so a dry run over millions of entries
prints them all without keeping them in memory: unlike the other commands'
`--json` (`render.print_json`), the document is streamed in pieces, never built.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import TextIO

from artifactstore.cli.render import safe
from artifactstore.formats.sizes import format_limit, format_seconds, format_size, plural
from artifactstore.gc.report import GcReport, Removal

# What gc's phases (gc/collect.py, gc/reconcile.py) are called on its progress display.
PHASES = {
    "jaxlib": "dropping old jaxlib entries",
    "lru": "evicting least recently used",
    "objects": "deleting unreferenced objects",
    "reconcile": "reconciling (prefixes)",
}
# The same phases in a dry run, which removes nothing: the labels must not say it does.
DRY_RUN_PHASES = {
    "jaxlib": "finding old jaxlib entries",
    "lru": "finding least recently used",
    "objects": "finding unreferenced objects",
    "reconcile": "reconciling prefixes (read only)",
}


class Output:
    """One JSON document (an object per namespace, a list for several) or text lines."""

    def __init__(self, *, as_json: bool, dry_run: bool, several: bool) -> None:
        self.as_json = as_json
        self.dry_run = dry_run
        self.several = several
        self.out: TextIO = sys.stdout
        self._namespaces = 0
        self._items = 0

    def _write(self, text: str) -> None:
        self.out.write(text)

    def begin(self) -> None:
        if self.as_json and self.several:
            self._write("[")

    def begin_namespace(self, namespace: str) -> None:
        self._items = 0
        if self.as_json:
            sep = ",\n" if self._namespaces else ""
            head = {"namespace": namespace, "dry_run": self.dry_run}
            self._write(f'{sep}{json.dumps(head)[:-1]}, "removed": [')
        self._namespaces += 1

    def item(self, removal: Removal) -> None:
        if self.as_json:
            self._write((",\n  " if self._items else "\n  ") + json.dumps(removal.to_json()))
        elif self.dry_run:
            label = removal.name[:12] if removal.kind == "entry" else removal.name[:16]
            extra = f"  {safe(removal.module[:40])}" if removal.module else ""
            self._write(
                f"would remove {removal.kind:<6} {label}  {format_size(removal.size):>10}"
                f"  ({removal.reason}){extra}\n"
            )
        self._items += 1

    def end_namespace(self, report: GcReport) -> None:
        if self.as_json:
            self._write(f'\n], "summary": {json.dumps(report.to_json())}}}')
            return
        verb = "would remove" if self.dry_run else "removed"
        dangling = (
            f"; {report.dangling_entries} of them had lost their object"
            if report.dangling_entries
            else ""
        )
        entries = plural(report.entries_removed, "entry", "entries")
        objects = plural(report.objects_removed, "object", "objects")
        self._write(
            f"namespace {report.namespace}{' (dry run)' if self.dry_run else ''}: {verb} "
            f"{entries} ({format_size(report.entry_bytes_removed)}) and {objects} "
            f"({format_size(report.object_bytes_freed)} freed){dangling}\n"
        )
        if report.objects_waiting:
            self._write(f"  {waiting_line(report)}\n")
        limit = ""
        if report.limit_bytes is not None:
            limit = f" (limit {format_limit(report.limit_bytes)})"
        left = "would reference" if self.dry_run else "reference"
        self._write(
            f"  the entries left {left} {format_size(report.bytes_after)} of objects{limit}\n"
        )
        if report.entries_restored:
            verb = "would restore" if self.dry_run else "restored"
            restored = plural(report.entries_restored, "entry", "entries")
            self._write(f"  {verb} {restored} the index had lost, from their objects' metadata\n")
        if report.manifests_published:
            verb = "would publish" if self.dry_run else "published"
            entries = plural(report.manifests_published, "entry", "entries")
            self._write(f"  {verb} the manifests of {entries} whose writer died before it did\n")
        folds = (report.journals_folded, report.journals_refused, report.journals_set_aside)
        if any(folds) or report.journals_left:
            line = fold_line(*folds, left=report.journals_left)
            self._write(f"  {line}\n")
        if report.quick_records_removed:
            verb = "would delete" if self.dry_run else "deleted"
            records = plural(report.quick_records_removed, "record", "records")
            self._write(f"  {verb} {records} of keys once too quick to store, stored since\n")
        if report.lease_rows_removed or report.lease_records_removed:
            verb = "would remove" if self.dry_run else "removed"
            stale = ("stale lease record", "stale lease records")
            records = plural(report.lease_records_removed, *stale)
            rows = plural(report.lease_rows_removed, "lease row", "lease rows")
            self._write(f"  {verb} {records} and {rows} of dead compile holders\n")
        if report.reconcile_skipped:
            self._write(f"  object store not cross-checked: {report.reconcile_skipped}\n")

    def finish(self) -> None:
        if self.as_json:
            self._write("]\n" if self.several else "\n")
        self.out.flush()


def waiting_line(report: GcReport) -> str:
    """The objects the grace period keeps, and from when a gc run deletes them."""
    objects = plural(report.objects_waiting, "object", "objects")
    kept = "would be kept" if report.dry_run else "kept"
    line = (
        f"{objects} ({format_size(report.object_bytes_waiting)}) no longer referenced "
        f"{kept} for the grace period ({format_seconds(report.grace_secs)})"
    )
    first, last = report.objects_waiting_from, report.objects_waiting_until
    if first is None or last is None:
        return line
    if _minute(first) == _minute(last):
        return f"{line}: a gc from {_minute(first)} deletes them"
    return f"{line}: a gc deletes the first from {_minute(first)}, all from {_minute(last)}"


def _minute(iso: str) -> str:
    """An ISO time (UTC) to the next whole minute: a run at the shown time finds it due."""
    when = datetime.fromisoformat(iso)
    if when.second or when.microsecond:
        when = when.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def fold_line(journals: int, refused: int, set_aside: int = 0, left: int = 0) -> str:
    """One line for folded hit journals, shared by gc and `artstore fold`; `left`: journals
    beyond this run's bound (gc.journals.FOLD_MAX_JOURNALS, FOLD_MAX_BYTES)."""
    line = f"folded {journals} hit journal{'s' if journals != 1 else ''} into the index"
    if refused:
        line += f"; deleted {refused} malformed or oversized one{'s' if refused != 1 else ''}"
    if set_aside:
        line += f"; set aside {set_aside} unreadable or not named as a journal (left in the bucket)"
    if left:
        from artifactstore.gc.journals import FOLD_MAX_BYTES, FOLD_MAX_JOURNALS

        bound = f"{FOLD_MAX_JOURNALS} journals or {format_size(FOLD_MAX_BYTES)}"
        line += f"; {left} left for the next run (a run folds at most {bound})"
    return line
