"""A namespace's totals as `artstore stats` shows them (EntryIndex.stats reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IndexStats:
    """A namespace's totals. Hits, bytes fetched and compile time saved are summed over
    the entries the index holds (every client version adds its hits there); the
    counters come from `counters`, which every version adds its misses to, while
    `misses_below_threshold`, `below_threshold` and the lease counters are counted
    by this version on (so during a rollout, old clients' misses below the threshold
    still count as eligible, as they did)."""

    entries: int
    bytes: int
    hits: int
    misses: int
    corrupt: int
    compile_secs_saved: float
    objects: int
    object_bytes: int
    misses_below_threshold: int = 0
    below_threshold: int = 0
    bytes_fetched: int = 0
    lease_waits: int = 0
    lease_takeovers: int = 0
    # Compiles of processes warming the store (`artstore warm`): not misses, so they
    # are not in the hit rate (a freshly warmed store does not show 0%).
    warm_compiles: int = 0

    @property
    def eligible_misses(self) -> int:
        """Misses a stored entry would have answered: not those compiled below the
        store threshold (never stored, so never a hit)."""
        return max(self.misses - self.misses_below_threshold, 0)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.eligible_misses
        return self.hits / lookups if lookups else 0.0
