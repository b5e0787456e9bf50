"""Hit journals folded into the index: `artstore fold`, and the first step of every gc.

Readers' hits reach the index only through here (artifactstore.formats.journal says why):
each journal's rows are checked and clamped like any access row (and no access is later
than the journal object itself: a reader may say which entries it used, never that it
used them after it wrote the journal), appended to the
index's access rows with its miss counters and its usage rows (per day and
fingerprint: clamped by `usage.clean_usage`; journals of clients that wrote none
fold as before), and the journal is deleted after the commit. Then the access
rows are folded into the entries (index/accesses.py), so LRU, `ls` and `stats`
see the cluster's hits.

Bounded per run (FOLD_MAX_JOURNALS journals, FOLD_MAX_BYTES bytes read): a bucket
holding thousands of journals (a cluster after a gc outage, or junk) must not hold
one fold, or the gc that starts with it, for minutes. What is left is counted from
the listing alone (up to COUNT_LEFT_MAX) and said in the summary; the next run
takes it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from artifactstore.blobstores.base import JOURNALS
from artifactstore.errors import CorruptObject, one_line
from artifactstore.formats import usage as _usage
from artifactstore.formats.journal import Journal, check_journal_name
from artifactstore.index.accesses import ROW_HITS_MAX, append_accesses, clean_touches
from artifactstore.store import StoreParts

log = logging.getLogger("artifactstore")

# Journals read before their rows are committed and they are deleted: bounds memory
# and how much a fold killed midway counts twice.
BATCH = 200
# Most journals one run folds, and most bytes of journals it reads (documented in
# docs/operations.md); the rest waits for the next run.
FOLD_MAX_JOURNALS = 500
FOLD_MAX_BYTES = 8 * 1024 * 1024
# Journals left are counted from the listing up to this many ("at least" beyond).
COUNT_LEFT_MAX = 100_000


@dataclass
class JournalFold:
    journals: int = 0  # folded and deleted
    refused: int = 0  # malformed or oversized, whatever they made fail: deleted, counted here
    set_aside: int = 0  # not named as journals, or unreadable: left where they are, counted
    hits: int = 0  # hits they added (after clamping)
    left: int = 0  # journals left for the next run (the bound was reached), counted


# One journal's rows, checked and clamped as the index takes them.
_Rows = tuple[dict[str, tuple[int, datetime]], dict[str, int], _usage.Usage]


def fold_journals(
    parts: StoreParts,
    *,
    progress: Callable[[int], None] | None = None,
    max_journals: int | None = None,
    max_bytes: int | None = None,
) -> JournalFold:
    """Fold the store's namespace's hit journals into its access rows, at most
    `max_journals` of them and `max_bytes` read (FOLD_MAX_JOURNALS, FOLD_MAX_BYTES by
    default); the rest is counted in `left`.

    Journals are untrusted (readers and anyone else who may write the bucket put
    them there): whatever one of them makes fail, it is set aside and counted and
    the others fold. Only the object store itself failing stops the fold."""
    result = JournalFold()
    batch = _Batch()
    max_journals = FOLD_MAX_JOURNALS if max_journals is None else max_journals
    max_bytes = FOLD_MAX_BYTES if max_bytes is None else max_bytes
    read, gets = 0, 0  # bytes of the journals taken, journals asked for
    listing = parts.blobs.list_records(JOURNALS)
    names = (info.digest for info in listing)  # what is left after a break: counted
    for info in listing:
        name = info.digest
        if gets >= max_journals and _is_journal(name):
            result.left = _count_left(name, names)
            break
        try:
            check_journal_name(name)
        except ValueError:  # not one of ours: never read, never deleted
            result.set_aside += 1
            _warn(f"leaving {name[:40]!r} under journals/ alone: not named as a hit journal")
            continue
        gets += 1
        try:
            data = parts.blobs.get_record(JOURNALS, name)
        except Exception as exc:
            parts.blobs.check()  # the object store itself is down: that stops the fold
            result.set_aside += 1
            _warn(f"leaving hit journal {name} alone: it could not be read ({one_line(exc)})")
            continue
        if data is None:  # folded by a concurrent fold
            continue
        if read and read + len(data) > max_bytes:  # left as it is for the next run
            result.left = _count_left(name, names)
            break
        read += len(data)
        batch.names.append(name)
        try:
            rows = _rows(data, info.mtime)
        except Exception as exc:
            result.refused += 1
            log.warning("artifactstore: deleting hit journal %s: %s", name, _why(exc))
            continue
        result.journals += 1
        batch.add(rows)
        if len(batch.names) >= BATCH:
            batch.commit(parts, result, progress)
    batch.commit(parts, result, progress)
    return result


def _count_left(first: str, rest: Iterator[str]) -> int:
    """Journal names from `first` on, counted from the listing (nothing read)."""
    left = 1 if _is_journal(first) else 0
    for name in rest:
        if left >= COUNT_LEFT_MAX:
            break
        left += _is_journal(name)
    return left


def _is_journal(name: str) -> bool:
    try:
        check_journal_name(name)
    except ValueError:
        return False
    return True


def _rows(data: bytes, written: float) -> _Rows:
    """A journal's rows as the index takes them, no access later than when the store
    wrote it (`written`: S3's LastModified, which its writer cannot choose); raises
    whatever its bytes make fail."""
    journal = Journal.decode(data)
    counts = {c: min(max(int(v), 0), ROW_HITS_MAX) for c, v in journal.counts.items()}
    touches = clean_touches(journal.accesses, not_after=written)
    return touches, counts, _usage.clean_usage(journal.usage)


def _why(exc: Exception) -> str:
    return str(exc) if isinstance(exc, CorruptObject) else one_line(exc)


def _warn(message: str) -> None:
    log.warning("artifactstore: %s", message)


@dataclass
class _Batch:
    """The journals read since the last commit and what they hold, committed together."""

    names: list[str] = field(default_factory=list)
    touches: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    usage: _usage.Usage = field(default_factory=dict)

    def add(self, rows: _Rows) -> None:
        for key, (n, when) in rows[0].items():
            old_n, old_t = self.touches.get(key, (0, when))
            self.touches[key] = (min(old_n + n, ROW_HITS_MAX), max(when, old_t))
        self.counts.update(rows[1])
        _usage.merge(self.usage, rows[2])

    def commit(
        self, parts: StoreParts, result: JournalFold, progress: Callable[[int], None] | None
    ) -> None:
        """Rows first, then the journals: a fold killed between the two counts them twice
        (hit statistics), never loses them."""
        if not self.names:
            return
        append_accesses(parts.engine, parts.namespace, self.touches)
        if self.counts or self.usage:
            parts.index.add_counters(dict(self.counts), self.usage)
        parts.blobs.delete_records(JOURNALS, self.names)
        result.hits += sum(n for n, _ in self.touches.values())
        if progress is not None:
            progress(len(self.names))
        self.names.clear()
        self.touches.clear()
        self.counts.clear()
        self.usage.clear()


def fold_or_say_why(parts: StoreParts) -> tuple[JournalFold, str | None]:
    """`fold_journals`, or why it could not run (the object store is down: a dry-run
    gc and `artstore stats` still work from the index)."""
    try:
        return fold_journals(parts), None
    except Exception as exc:
        return JournalFold(), one_line(exc)
