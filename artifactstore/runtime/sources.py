"""The session's levels of the lookup chain (store.chain): this host's tier, its quick
keys, then the store, each counting its own hits once.

Apart from the session so that what a hit costs and counts at each level reads in one
place: a tier hit is an access journaled on this host and a `tier_hits` count; a
compile kept below the store threshold is a `quick_loads` count, nothing journaled,
and a key known to compile that fast is a final miss (the store is not asked); a store
hit or miss is counted by the store's accounts; the store is opened on first use, its
calls bounded by ARTSTORE_TIMEOUT and fed to the session's breakers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from artifactstore.errors import ObjectUnreadable, one_line
from artifactstore.process.notices import warn_once
from artifactstore.store.chain import Found, Missed, Request

if TYPE_CHECKING:
    from artifactstore.config import Settings
    from artifactstore.process.counters import Counters
    from artifactstore.store import Store
    from artifactstore.store.tier import LocalTier

log = logging.getLogger("artifactstore")
T = TypeVar("T")


class SessionView(Protocol):
    """What the levels use of the session that holds them (`runtime.session.Session`),
    named here so that the session imports its levels and not the reverse."""

    settings: Settings
    tier: LocalTier | None
    quick_tier: LocalTier | None
    counters: Counters

    def tier_hit(self) -> None: ...

    def store(self) -> Store | None: ...

    def bounded(self, call: Callable[[], T]) -> T: ...


class TierSource:
    """This host's tier of the store's copies, read before any Store opens."""

    name = "tier"

    def __init__(self, session: SessionView) -> None:
        self.session = session

    def peek(self, request: Request) -> Found | None:
        return _peek_tier(self.session.tier, request)

    def count(self, request: Request, outcome: Found | Missed) -> None:
        """A tier hit, and an access for LRU (journaled, folded into the index later)."""
        if not isinstance(outcome, Found):
            return
        if self.session.tier is not None:
            self.session.tier.record_access(request.key)
        self.session.tier_hit()

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool:
        """A tier copy that does not load is forgotten; the next level is asked."""
        _forget(self.session.tier, request, exc)
        return True


class QuickSource:
    """What compiled under ARTSTORE_MIN_COMPILE_SECS on this host, never the store's: the
    executables it kept (`Session.quick_tier`), and the keys it knows to be that quick
    (`tier.quick`), which the store never holds: a final miss, the store not asked."""

    name = "quick"

    def __init__(self, session: SessionView) -> None:
        self.session = session

    def peek(self, request: Request) -> Found | Missed | None:
        hit = _peek_tier(self.session.quick_tier, request)
        if hit is not None:
            hit.below_threshold = True
            return hit
        return Missed("quick", final=True) if self.known_quick(request.key) else None

    def known_quick(self, key: str) -> bool:
        """This host's tier says `key` compiled faster than the store threshold."""
        session = self.session
        if session.tier is None or session.settings.min_compile_secs <= 0:
            return False
        secs = session.tier.quick.get(key)
        return secs is not None and secs < session.settings.min_compile_secs

    def count(self, request: Request, outcome: Found | Missed) -> None:
        """A kept compile is this host's alone: `quick_loads` only. A known-quick key's
        miss counts where it compiles (`quick_compiles`), not here."""
        if isinstance(outcome, Found):
            self.session.counters.add("quick_loads")

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool:
        """A kept copy that does not load is forgotten; the store is asked next unless
        the key is known to be quick (then it compiles)."""
        _forget(self.session.quick_tier, request, exc)
        return not self.known_quick(request.key)


def _peek_tier(tier: LocalTier | None, request: Request) -> Found | None:
    if tier is None:
        return None
    try:
        looked = tier.peek(request.key, request.fingerprint, callbacks=request.callbacks)
        return tier.settle(request.key, looked)  # the tier's price of what it found
    except Exception as exc:  # a tier that cannot be read is a miss
        log.debug("artifactstore: local tier read failed: %s", one_line(exc))
        return None


def _forget(tier: LocalTier | None, request: Request, exc: Exception) -> None:
    log.debug("artifactstore: tier copy of %s did not load: %s", request.key[:12], exc)
    if tier is not None:
        tier.forget(request.key)


class StoreSource:
    """The session's Store, opened on first use; None from `peek` while a breaker is open."""

    name = "store"

    def __init__(self, session: SessionView) -> None:
        self.session = session

    def peek(self, request: Request) -> Found | Missed | None:
        session = self.session
        store = request.store = session.store()
        if store is None:
            request.notes.append("the store is unavailable (see the log)")
            return None
        try:
            outcome = session.bounded(
                lambda: store.look(request.key, request.fingerprint, callbacks=request.callbacks)
            )
        except ObjectUnreadable as exc:  # a miss for that object: said once per process
            warn_once("object unreadable", "%s", one_line(exc))
            request.notes.append(f"an object was not served ({one_line(exc)})")
            return None
        except Exception as exc:  # counted by the session's breakers, logged once per outage
            request.notes.append(f"the store did not answer ({one_line(exc)})")
            return None
        if isinstance(outcome, Missed):
            reason = store.parts.reads.refused.get(request.key)
            if reason:
                request.notes.append(f"refused: {reason}")
        return outcome

    def count(self, request: Request, outcome: Found | Missed) -> None:
        if request.store is not None:  # the store `peek` asked
            request.store.count(request.key, request.fingerprint, outcome)

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool:
        """Verified bytes that did not deserialize: still the hit it was, and a load
        error; the caller compiles (a lower level has nothing better)."""
        self.count(request, found)
        store = request.store
        if store is not None:
            store.parts.counters.add("load_errors")
        warn_once("load", "stored executable did not load (%s); compiling", one_line(exc))
        return False


# The session's levels (store.chain.LEVELS places each; the load ahead adds its own).
LEVELS = (TierSource, QuickSource, StoreSource)
