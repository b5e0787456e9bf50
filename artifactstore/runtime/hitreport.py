"""Tier hits reach the index even where no process on this host opens the store.

Why: a warm node serves every compile from its tier, so its processes never open the
store, and their hits waited in the tier's journals for a Store.open that never came:
LRU and `stats` did not see the fleet's hottest entries, and gc could evict what every
warm node uses (issue 38). So at exit, a process that left its hits in the tier
reports them once the tier's last report is ARTSTORE_JOURNAL_SECS old: it opens the
store (bounded by ARTSTORE_TIMEOUT and ARTSTORE_FLUSH_TIMEOUT), whose open folds the tier's
journals into one hit journal in the object store (a record readers may write) or
into the index. The time is noted before trying, so an offline node pays that bound at
most once per ARTSTORE_JOURNAL_SECS; its hits stay in the tier until it is back. What
a flush at exit could not write goes back to the tier (`Accounts.park_in_tier`).
"""

from __future__ import annotations

# Imported now, not by boto3's transfer manager when the store opens at exit: its import
# registers an exit hook, which Python refuses once the interpreter is exiting.
import concurrent.futures.thread  # noqa: F401
import logging
import time
from typing import TYPE_CHECKING

from artifactstore.errors import one_line
from artifactstore.process.background import call_with_timeout

if TYPE_CHECKING:
    from artifactstore.config import Settings
    from artifactstore.store import Store
    from artifactstore.store.tier import LocalTier

log = logging.getLogger("artifactstore")

# The tier file holding when this host last reported its tier's hits (seconds since
# the epoch, as text).
REPORTED = "hits-reported"


def report_due(tier: LocalTier, every_secs: float) -> bool:
    """Whether this host's tier hits were last reported `every_secs` ago, or never."""
    try:
        data = tier.read_file(REPORTED)
        last = float(data.decode()) if data else None
    except (ValueError, UnicodeDecodeError):
        last = None  # unreadable: report now, then note a good time
    now = time.time()
    return last is None or not 0 <= now - last < every_secs


def report_tier_hits(tier: LocalTier | None, settings: Settings) -> None:
    """At exit, with no store open: report the tier's journals when due (see above).

    Quietly: the program never needed the store, so a store that cannot be reached
    now is no news to its user (a debug line); the hits wait in the tier."""
    if tier is None or not tier.owns_objects:
        return  # none, or the store's own directory: every Store.open folds its journals
    if not tier.has_journals() or not report_due(tier, settings.journal_secs):
        return  # nothing to report (a process with no tier hits opens nothing, writes nothing)
    from artifactstore.store import Store  # only now: the index's imports cost ~0.2 s

    tier.write_file(REPORTED, repr(time.time()).encode())
    bound = min(settings.timeout_secs, settings.flush_secs)
    try:  # its open folds the tier's journals, on its writer
        store = call_with_timeout(lambda: Store.open(settings, tier=tier, lazy_index=True), bound)
    except Exception as exc:
        log.debug("artifactstore: tier hits kept in the tier: %s", one_line(exc))
        return
    try:
        store.flush(bound)
    finally:
        park_unwritten(store)
        store.close()


def park_unwritten(store: Store) -> None:
    """After an exit flush: hits it could not write, kept in this host's tier (never
    lost); the report's time noted, so that warm processes that follow within
    ARTSTORE_JOURNAL_SECS contact nothing remote at exit either."""
    try:
        store.parts.accounts.park_in_tier()
        if store.parts.tier is not None:
            store.parts.tier.write_file(REPORTED, repr(time.time()).encode())
    except Exception as exc:
        log.debug("artifactstore: hits not kept in the tier: %s", one_line(exc))
