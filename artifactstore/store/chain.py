"""One lookup: the sources of executables, in order, behind one `get`.

Why one: the compile hook, named executables and the load ahead each used to walk
loaded-ahead -> tier -> store themselves and count hits by hand (sccache has one
`MultiLevelStorage` behind one `get`). Here each source verifies what it serves and
counts its own hits and misses, once: `get` counts what the caller uses at once;
`peek` counts nothing (a load ahead of the program's request), and `claim` counts
such a hit when the program asks for it. Sources are objects implementing `Source`:
the session registers this host's tier, its quick keys and the store
(runtime.sources), the JAX adapter what it loaded ahead (jaxhook.prefetch), so nothing
here imports upward; the order they are asked in is this module's (`LEVELS`), so
that whoever reasons about it (doctor) reads it here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("artifactstore")

# The levels, in the order they are asked: what was loaded ahead of the program's
# request (jaxhook.prefetch), this host's tier of the store's copies, the compiles
# under the store threshold this host keeps and the keys it knows to be that quick
# (a certain miss further down, so a final one: the store is not asked), the store.
# The tier comes before the quick level so that an entry stored since (a team's) is
# served, and counted for LRU, as the store's.
LEVELS = ("ahead", "tier", "quick", "store")


@dataclass
class Request:
    """One executable asked for: its key, built for `fingerprint`, to bind `callbacks`."""

    key: str
    fingerprint: str
    callbacks: int | None = None  # host callbacks bound on load; None: not checked
    kind: str = "jit"  # "jit" or "named": which loaded-ahead entries may answer
    caller: Any = None  # the caller's own request, for sources above the store (its options)
    store: Any = None  # the Store the chain asked, for the caller's put after a miss
    notes: list[str] = field(default_factory=list)  # why sources found nothing, for errors


@dataclass
class Found:
    """A verified hit, whichever level found it (a tier, the store, the chain): what
    led to it and what it is counted with. The one result of a lookup, with `Missed`."""

    entry: Any  # the manifest, index row or tier entry that led to the object
    payload: bytes | None = None  # verified bytes; None when the source hands `value` itself
    value: Any = None  # the loaded executable (the caller's `load`, or a source's own)
    source: Source | None = None  # the chain's level that found it (set as it is asked)
    started: float = 0.0  # when the source was asked (load times are measured from here)
    origin: Found | None = None  # a load ahead: the tier or store hit it was peeked as
    request: Request | None = None  # what it was found for (its count needs it)
    unloadable: bool = False  # verified, but the caller's `load` failed (counted all the same)
    # A compile under the store threshold that this host kept (runtime.sources): never
    # the store's, so never in a hit journal or a working set.
    below_threshold: bool = False

    @property
    def compile_secs(self) -> float:
        return float(getattr(self.entry, "compile_secs", 0.0) or 0.0)


@dataclass(frozen=True)
class Missed:
    """A source's counted miss and why (`misses`, `fingerprint_mismatch`, ...); `final`:
    no level below can hold it either, so none is asked (a key known to be quick)."""

    reason: str
    final: bool = False


class Source(Protocol):
    """One level of the chain. `peek` verifies and counts nothing; `count` counts the
    hit or the miss `peek` returned; `unusable`: the caller could not load a hit (True:
    ask the next source)."""

    name: str

    def peek(self, request: Request) -> Found | Missed | None: ...

    def count(self, request: Request, outcome: Found | Missed) -> None: ...

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool: ...


class Chain:
    """The ordered sources: each asked in its level's place in `order` (`LEVELS`)."""

    def __init__(self, sources: Sequence[Source] = (), *, order: Sequence[str] = LEVELS) -> None:
        self.order = tuple(order)
        self.sources: list[Source] = []
        for source in sources:
            self.add(source)

    def add(self, source: Source) -> None:
        """Register `source` in its level's place (replacing one of the same name);
        ValueError for a name that is not one of the chain's levels."""
        if source.name not in self.order:
            raise ValueError(f"{source.name!r} is not a level of the chain {self.order}")
        self.remove(source.name)
        self.sources.append(source)
        self.sources.sort(key=lambda s: self.order.index(s.name))

    def remove(self, name: str) -> None:
        self.sources = [s for s in self.sources if s.name != name]

    def get(
        self,
        request: Request,
        load: Callable[[bytes], Any] | None = None,
        *,
        names: Sequence[str] | None = None,
    ) -> Found | None:
        """The first source's verified hit, loaded with `load` (when it has a payload)
        and counted by that source; None (a miss, counted where it was found) else.
        `names`: ask only these sources."""
        for source, outcome in self._walk(request, names):
            if isinstance(outcome, Missed):
                source.count(request, outcome)
                if outcome.final:
                    return None
                continue
            if load is not None and outcome.payload is not None:
                try:
                    outcome.value = load(outcome.payload)
                except Exception as exc:
                    outcome.unloadable = True
                    if source.unusable(request, outcome, exc):
                        continue
                    return None
            source.count(request, outcome)
            return outcome
        return None

    def peek(self, request: Request, *, names: Sequence[str] | None = None) -> Found | None:
        """The first verified hit, counted nothing, not even a miss: `claim` counts it."""
        for _source, outcome in self._walk(request, names):
            if isinstance(outcome, Found):
                return outcome
            if outcome.final:
                return None
        return None

    @staticmethod
    def claim(found: Found) -> None:
        """Count `found`, got by `peek`, now that the program uses it."""
        if found.request is not None and found.source is not None:
            found.source.count(found.request, found)

    def _walk(
        self, request: Request, names: Sequence[str] | None
    ) -> Iterator[tuple[Source, Found | Missed]]:
        for source in list(self.sources):
            if names is not None and source.name not in names:
                continue
            started = time.monotonic()
            try:
                outcome = source.peek(request)
            except Exception as exc:  # a source that fails is a miss, never the program's
                log.debug("artifactstore: %s lookup failed: %s", source.name, exc)
                continue
            if outcome is None:
                continue
            if isinstance(outcome, Found):
                outcome.started, outcome.request, outcome.source = started, request, source
            yield source, outcome
