"""Usage counts by dimension: what a process saw, per UTC day and platform fingerprint.

A process adds to these in memory (`store.ProcessCounters`) and writes them with its
other counters: into the index's `usage` table where it writes the index, or into its
hit journal (artifactstore.formats.journal) where the index is a database server. No event
costs a database round trip of its own.

The fields, all sums:

    hits                    loads from the store or this host's tier
    misses                  store lookups that found nothing usable (as `counters.misses`)
    misses_below_threshold  of those misses, the ones whose compile then took less than
                            ARTSTORE_MIN_COMPILE_SECS (never stored: not an eligible miss)
    below_threshold         every compile under the threshold that a store was told of,
                            including keys the tier already knew to be quick (no lookup)
    bytes_fetched           object bytes of the hits
    compile_secs_saved      the hit entries' compile seconds, summed over the hits
    lease_waits             waits for another process's compile lease
    lease_takeovers         expired compile leases taken over

Eligible misses (lookups that a stored entry would have answered) are
`misses - misses_below_threshold`; the hit rate is hits / (hits + eligible misses).
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime

FIELDS = (
    "hits",
    "misses",
    "misses_below_threshold",
    "below_threshold",
    "bytes_fetched",
    "compile_secs_saved",
    "lease_waits",
    "lease_takeovers",
)
# The counters that also go to the namespace totals (the `counters` table), which
# clients of every version add to. Hits, bytes and seconds saved are not among them:
# `artstore stats` totals those from `entries` (hits of every client end there).
TOTALS = frozenset(
    {
        "misses",
        "misses_below_threshold",
        "below_threshold",
        "lease_waits",
        "lease_takeovers",
        "corrupt",
        "unsigned",
        "untrusted_key",
        "bad_signature",
        # Compiles of a process warming the store (`artstore warm`, ARTSTORE_WARM): not
        # misses (nothing could have served them: filling the store is the point).
        "warm_compiles",
    }
)
# The most one journal row may add to a field (journals come from readers: see
# `clean_usage`); far above what a process counts between two journals.
ROW_MAX: dict[str, float] = {
    **dict.fromkeys(FIELDS, 1_000_000),
    "bytes_fetched": 2**50,
    "compile_secs_saved": 1e9,
}

# (UTC day, fingerprint digest or "") -> field -> sum
Key = tuple[date, str]
Usage = dict[Key, dict[str, float]]


def today() -> date:
    return datetime.now(UTC).date()


def add(usage: Usage, key: Key, values: dict[str, float]) -> None:
    """Add `values` (fields of FIELDS) into `usage[key]`."""
    row = usage.setdefault(key, {})
    for name, value in values.items():
        if value:
            row[name] = row.get(name, 0) + value


def merge(into: Usage, other: Usage) -> None:
    for key, values in other.items():
        add(into, key, values)


def check_fingerprint(value: object) -> str | None:
    """A fingerprint as a usage row takes it: "" or up to 64 hex digits, else None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    if value and not all(c in "0123456789abcdef" for c in value):
        return None
    return value


def clean_usage(usage: Usage) -> Usage:
    """Rows from a journal (anyone who may write journals wrote them) as the index takes
    them: fields known, finite and clamped to 0..ROW_MAX, days no later than today
    (an earlier day is fine: a journal folded late), fingerprints well formed."""
    now = today()
    out: Usage = {}
    for (day, fingerprint), values in usage.items():
        if check_fingerprint(fingerprint) is None or not isinstance(day, date):
            continue
        row: dict[str, float] = {}
        for name, value in values.items():
            if name not in ROW_MAX or not isinstance(value, (int, float)):
                continue
            if isinstance(value, bool) or not math.isfinite(value):
                continue
            clamped = min(max(value, 0), ROW_MAX[name])
            row[name] = clamped if name == "compile_secs_saved" else int(clamped)
        add(out, (min(day, now), fingerprint), row)
    return out
