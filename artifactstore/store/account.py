"""What one store owes its index: counts, hits and their access times; recent misses.

The counting itself is the process's (process.counters): a store observes it and keeps
what its index must hear (`Pending`). Why batched: a hit must cost no database round
trip of its own (a cluster of readers would load the index with every compile), so
hits and counters wait here
and go out together: to the index (`record_access`, `add_counters`), or where the
index is a database server this process has not opened, as one hit journal in
the object store (artifactstore.formats.journal) that gc folds in. Hits served
from this host's tier come in through its journals (`add_accesses`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as _Counts
from datetime import datetime

from artifactstore.blobstores.base import JOURNALS
from artifactstore.errors import PrivilegeRefused, ReadOnlyError, one_line
from artifactstore.formats import counters as _names
from artifactstore.formats import usage as _usage
from artifactstore.formats.journal import MAX_JOURNAL_KEYS, Journal, new_name
from artifactstore.index.accesses import clean_touches
from artifactstore.index.errors import ROW_REFUSED
from artifactstore.index.models import utcnow
from artifactstore.process.counters import Counters
from artifactstore.store.backends import Backends, refused_topic
from artifactstore.store.tier import Accesses

log = logging.getLogger("artifactstore")
# Hit rows the index will never take (values out of range): dropped, not kept for later.
_NEVER_GO_IN: tuple[type[Exception], ...] = (*ROW_REFUSED, OverflowError)

# Keys of recent misses remembered for `Store.compiled_below_threshold` (a compile
# follows its miss at once; the bound only keeps a long-lived process small).
MISSED_KEYS = 4096

Touches = dict[str, tuple[int, datetime]]


class Pending:
    """What a store has yet to write to its index: counters of `usage.TOTALS` for the
    namespace totals (the `counters` table), and those of `usage.FIELDS` as usage rows,
    per UTC day and fingerprint ("" where the caller had none), under their stored
    names (formats.counters). Fed by observing the process's counters (`counted`);
    the store writes both in its access flush, or in its hit journal: no counter costs
    a database round trip of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: _Counts[str] = _Counts()
        self.usage: _usage.Usage = {}

    def counted(self, name: str, n: float, fingerprint: str | None) -> None:
        """An event of the process's counters (`Counters.observe`)."""
        stored = _names.stored_name(name)
        if stored is None:
            return
        with self.lock:
            if stored in _usage.TOTALS:
                self.counts[stored] += int(n)
            if stored in _usage.FIELDS:
                _usage.add(self.usage, (_usage.today(), fingerprint or ""), {stored: n})

    def add_usage(self, key: _usage.Key, values: dict[str, float]) -> None:
        """Usage rows only (what no counter counts: compile time saved, hits served
        elsewhere: the tier's journals)."""
        with self.lock:
            _usage.add(self.usage, key, values)

    def has_pending(self) -> bool:
        with self.lock:
            return any(self.counts.values()) or bool(self.usage)

    def take(self) -> tuple[_Counts[str], _usage.Usage]:
        """The pending totals and usage rows, for one flush or journal."""
        with self.lock:
            counts, self.counts = self.counts, _Counts()
            usage, self.usage = self.usage, {}
        return counts, usage

    def requeue(self, counts: _Counts[str], usage: _usage.Usage) -> None:
        """Put what a flush could not write back into the next one."""
        with self.lock:
            self.counts.update(counts)
            _usage.merge(self.usage, usage)


class Accounts:
    """One store's pending hits (key -> count, latest access) and recent misses."""

    def __init__(self, backends: Backends, counters: Counters) -> None:
        self.backends = backends
        self.counters = counters  # the process's (or the store's own, opened alone)
        self.pending = Pending()
        counters.observe(self.pending.counted)
        self.lock = threading.Lock()
        self._touches: Touches = {}
        # Batches a flush is writing now, by id: an exit flush that ran out of time may
        # still hold one when the process ends (`park_in_tier` keeps those too).
        self._in_flight: dict[int, Touches] = {}
        # Keys this process just missed, so that a compile of one found below the
        # store threshold counts as `misses_below_threshold` (see compiled_below_threshold).
        # Recent misses: key -> (why: `misses` if absent, fingerprint).
        self._missed: dict[str, tuple[str, str]] = {}
        self._last_journal = time.monotonic()
        # A process warming the store (warm.child): its lookups that find nothing are
        # `warm_compiles`, not misses, so a freshly warmed store does not show 0% hits.
        self.warming = False

    # -- misses ---------------------------------------------------------------
    def miss(self, reason: str, *, key: str, fingerprint: str) -> None:
        """Count a miss (and why, if not simply absent): `misses` and the reasons in
        usage.TOTALS reach the index's counters (as `misses`). A warming process counts
        `warm_compiles`."""
        self.counters.add(self._miss_name, fingerprint=fingerprint)
        if reason != "misses":  # found nothing at all: only the lookup missed
            self.counters.add(reason)
        with self.lock:
            self._missed[key] = (reason, fingerprint)
            if len(self._missed) > MISSED_KEYS:
                del self._missed[next(iter(self._missed))]

    def found_nothing(self, key: str) -> bool:
        """Whether this process's last lookup of `key` found no entry at all (rather than
        one it could not use here: another platform, a refused signature, over a limit)."""
        with self.lock:
            return self._missed.get(key, ("", ""))[0] == "misses"

    def served(self, key: str) -> None:
        """This process's lookup of `key` found nothing, then it waited on another
        process's compile lease and loaded the entry it published: that load counted a
        hit, so the miss is taken back (a miss is a compile the store could have served).
        Taken back from the pending counts; if a flush already wrote it, a negative count
        follows to the index (a hit journal's fold clamps it to 0: that miss stays)."""
        with self.lock:
            reason, fingerprint = self._missed.pop(key, ("", ""))
        if reason == "misses":
            self.counters.add(self._miss_name, -1, fingerprint=fingerprint)

    @property
    def _miss_name(self) -> str:
        return "warm_compiles" if self.warming else "lookups_missed"

    def compiled_below_threshold(self, key: str, fingerprint: str) -> bool:
        """The caller compiled `key` faster than ARTSTORE_MIN_COMPILE_SECS: it will not be
        stored, so a miss this process counted for it was not an eligible miss
        (`misses_below_threshold`); every such compile counts as `quick_compiles`.
        True if this process's lookup of `key` found no entry at all (the store may
        then be told that the key is quick: Store.compiled_below_threshold)."""
        with self.lock:
            reason = self._missed.pop(key, ("", ""))[0] or None
        if reason is not None:
            self.counters.add("misses_below_threshold", fingerprint=fingerprint)
        self.counters.add("quick_compiles", fingerprint=fingerprint)
        return reason == "misses"

    # -- hits -----------------------------------------------------------------
    def hit(self, fingerprint: str, *, size: int, compile_secs: float) -> None:
        """One load from the store: a hit, its bytes and the compile time it saved."""
        self.counters.add("store_hits", fingerprint=fingerprint)
        self.counters.add("bytes_fetched", size, fingerprint=fingerprint)
        saved = {"compile_secs_saved": compile_secs}
        self.pending.add_usage((_usage.today(), fingerprint), saved)

    def touch(self, key: str) -> None:
        self.merge_touches({key: (1, utcnow())})

    def merge_touches(self, touches: Touches) -> None:
        """Add hit counts into the pending batch, keeping each key's latest access time."""
        with self.lock:
            for key, (n, when) in touches.items():
                old_n, old_t = self._touches.get(key, (0, when))
                self._touches[key] = (old_n + n, max(when, old_t))

    def add_accesses(self, accesses: Accesses) -> None:
        """Merge hits served elsewhere (the tier's journals) into the next access flush,
        checked and clamped (journals are files: see `clean_touches`). Their usage rows
        (day, fingerprint, bytes, compile time saved) come from this host's tier's key
        files, read here once per key, never per hit."""
        touches = clean_touches(accesses)
        tier = self.backends.tier
        for key, (n, when) in touches.items():
            found = None
            if tier is not None:
                try:
                    found = tier.lookup(key)
                except Exception:  # a key map this process cannot read: hits only
                    found = None
            values: dict[str, float] = {"hits": n}
            fingerprint = ""
            if found is not None:
                fingerprint = found.fingerprint
                values["compile_secs_saved"] = n * found.compile_secs
                if found.size is not None:
                    values["bytes_fetched"] = n * found.size
            self.pending.add_usage((when.date(), fingerprint), values)
        self.merge_touches(touches)

    def fold_tier_journals(self) -> None:
        """Count hits that processes served from this host's tier, so LRU sees them."""
        tier = self.backends.tier
        if tier is None:
            return
        folded = False
        try:
            for accesses in tier.drain_journals():
                self.add_accesses(accesses)
                folded = True
            if folded:
                self.flush()
        except Exception as exc:
            log.debug("artifactstore: could not fold tier access journals: %s", one_line(exc))

    def park_in_tier(self) -> None:
        """At exit: hits no flush could write (a backend down, the flush bound spent) go
        back to this host's tier journal, for a later process to report (runtime.hitreport)."""
        tier = self.backends.tier
        with self.lock:
            touches, self._touches = self._touches, {}
            # A batch still being written may yet arrive too: counted twice then (at least
            # once, as folding is), never lost with the process.
            for batch in self._in_flight.values():
                for key, (n, when) in batch.items():
                    old_n, old_t = touches.get(key, (0, when))
                    touches[key] = (old_n + n, max(when, old_t))
        if tier is not None and touches:
            tier.write_journal({k: (n, when.timestamp()) for k, (n, when) in touches.items()})

    # -- flushing -------------------------------------------------------------
    def tick(self) -> None:
        """The background writer's periodic flush: to the index at once, to a hit
        journal at most every ARTSTORE_JOURNAL_SECS. Hits this host's tier served since
        the last tick join it, so a long-running process reports them while it runs."""
        tier = self.backends.tier
        if tier is not None:
            served = tier.take_accesses()
            if served:
                self.add_accesses(served)
        due = time.monotonic() - self._last_journal >= self.backends.settings.journal_secs
        if due or not self.backends.journals_hits:
            self.flush()

    def has_pending(self) -> bool:
        """Whether a flush has anything to write (a reader's counters only to a journal)."""
        with self.lock:
            writes_counts = not self.backends.read_only or self.backends.journals_hits
            counts = writes_counts and self.pending.has_pending()
            return bool(self._touches or counts)

    def flush(self) -> None:
        """Write batched hit counts, access times and counters to the index, or to a
        hit journal where the index is a database server."""
        backends = self.backends
        if backends.journals_hits:
            self._write_journal()
            return
        with self.lock:
            touches, self._touches = self._touches, {}
            self._in_flight[id(touches)] = touches
        counts, usage = self.pending.take()
        try:
            if backends.read_only:
                # Readers may only append to `accesses` (never write entries);
                # `artstore gc` folds those rows in, so LRU reflects the cluster.
                backends.index.record_reader_access(touches)
            else:
                backends.index.record_access(touches)
                backends.index.add_counters(dict(counts), usage)
        except PrivilegeRefused as exc:  # the login's grants: asking again will not help
            backends.warn_once(
                refused_topic(exc), "hit counts of %s not recorded: %s", backends.namespace, exc
            )
        except ReadOnlyError as exc:  # an index this process may not write (a read-only file)
            log.debug("artifactstore: hits not recorded: %s", exc)
        except _NEVER_GO_IN as exc:
            # These rows will never go in: keeping them would fail every later flush.
            backends.warn_once("access-rows", "hit counts dropped (%s)", one_line(exc))
        except Exception:
            if backends.read_only:
                counts, usage = _Counts(), {}  # readers never write counters
            self._requeue(touches, counts, usage)  # the database is down: kept for the next
            raise
        finally:
            self._landed(touches)

    def _write_journal(self) -> None:
        """One hit journal object with the pending hits and miss counts (at most
        MAX_JOURNAL_KEYS of them: the rest wait for the next); kept pending if the
        object store refuses it, so the next flush tries again."""
        self._last_journal = time.monotonic()
        with self.lock:
            if not self._touches and not self.pending.has_pending():
                return
            keys = list(self._touches)[:MAX_JOURNAL_KEYS]
            touches = {k: self._touches.pop(k) for k in keys}
            self._in_flight[id(touches)] = touches
        counts, usage = self.pending.take()
        accesses = {k: (n, when.timestamp()) for k, (n, when) in touches.items()}
        try:
            journal = Journal(accesses, dict(counts), usage)
            self.backends.blobs.put_record(JOURNALS, new_name(), journal.encode())
        except Exception:
            self._requeue(touches, counts, usage)
            raise
        finally:
            self._landed(touches)

    def _landed(self, touches: Touches) -> None:
        """A flush of `touches` ended (written, dropped, or put back for the next)."""
        with self.lock:
            self._in_flight.pop(id(touches), None)

    def _requeue(self, touches: Touches, counts: _Counts[str], usage: _usage.Usage) -> None:
        """Put a batch that could not be written back into the next one."""
        self.merge_touches(touches)
        self.pending.requeue(counts, usage)
