"""The process's one counting object: every part adds to it, every reader takes its snapshot.

A program's session makes one (`runtime.session`) and hands it to what it opens: its
tier, its Store, its breakers, the load ahead; each part counts its own events here
with `add`, never by changing another part's attributes. `snapshot()` is what
`process_stats()` returns and what the run and pytest summaries add up; observers
are told each event as it is counted (the Prometheus metrics; a Store's pending
totals for its index). The names and what they mean: `formats.counters`.

A Store or tier opened alone (the CLI, tests) makes its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from artifactstore.errors import one_line
from artifactstore.formats import counters as names

log = logging.getLogger("artifactstore")

# Told (name, n, fingerprint digest or None) for each event counted.
Observer = Callable[[str, float, "str | None"], None]


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}
        self._observers: list[Observer] = []
        self._states: dict[str, Callable[[], int]] = {}
        self._takes: list[Callable[[], None]] = []

    def add(self, name: str, n: float = 1, *, fingerprint: str | None = None) -> None:
        """Count `n` events of `name` (seen for `fingerprint`, where the caller knows it)."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n
        for observer in list(self._observers):
            try:
                observer(name, n, fingerprint)
            except Exception as exc:  # an observer never breaks the counting program
                log.debug("artifactstore: %s not observed: %s", name, one_line(exc))

    def observe(self, observer: Observer) -> None:
        """Tell `observer` every event counted from now on."""
        self._observers.append(observer)

    def state(self, name: str, read: Callable[[], int]) -> None:
        """Report `read()` as `name` in each snapshot (a state, such as `active`)."""
        self._states[name] = read

    def take_in(self, take: Callable[[], None]) -> None:
        """Call `take()` before each snapshot: it adds what another library counted since
        (torch-xla's own counters, which tell us nothing as they count)."""
        self._takes.append(take)

    def snapshot(self) -> dict[str, int]:
        """Every name counted so far, the sums and states (see formats.counters.snapshot)."""
        for take in list(self._takes):
            try:
                take()
            except Exception as exc:  # as an observer: never breaks the counting program
                log.debug("artifactstore: counts not taken in: %s", one_line(exc))
        with self._lock:
            counts = dict(self._counts)
        return names.snapshot(counts, {name: read() for name, read in self._states.items()})
