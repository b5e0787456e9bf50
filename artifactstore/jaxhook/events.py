"""What a load or compile reports through JAX's own cache events, as its cache would.

Apart from the compile wrapper so that a load ahead of the program's request
(`prefetch`) reports the same events and counts as a load on the wrapper's path.
JAX's meaning (jax._src.compiler and compilation_cache, 0.10.0 to 0.12.1): a use of
the cache for every compile it has a key for; a hit for every executable it loads;
`cache_misses` only as it writes an entry (a compile under its thresholds writes
nothing and fires nothing). Ours fires as an executable is written: an entry this
process stored, or one kept in this host's tier (`watch`), on the thread that wrote it.
"""

from __future__ import annotations

import time
import weakref

from artifactstore.process.counters import Counters
from artifactstore.runtime.session import Session

USE_CACHE = "/jax/compilation_cache/compile_requests_use_cache"
MISS = "/jax/compilation_cache/cache_misses"

# The counts (formats.counters) of an executable written: stored, or kept in this host's
# tier while the store was down, or below the store threshold.
WRITES = frozenset({"stored", "kept_in_tier", "quick_kept"})
_watched: weakref.WeakSet[Counters] = weakref.WeakSet()


def watch(session: Session) -> None:
    """Fire JAX's `cache_misses` for each executable `session` writes (once per session)."""
    if session.counters in _watched:
        return
    _watched.add(session.counters)

    def written(name: str, n: float, _fingerprint: str | None) -> None:
        if name in WRITES:
            for _ in range(int(n)):
                record_event(MISS)

    session.counters.observe(written)


def record_load(session: Session, compile_secs: float, started: float) -> None:
    """Count a load and report it through JAX's own cache events, as its cache would."""
    retrieval = time.monotonic() - started
    session.observe_load(retrieval, compile_secs)
    record_event("/jax/compilation_cache/cache_hits")
    record_duration("/jax/compilation_cache/compile_time_saved_sec", compile_secs - retrieval)
    record_duration("/jax/compilation_cache/cache_retrieval_time_sec", retrieval)


def record_event(name: str) -> None:
    try:
        from jax._src import monitoring

        monitoring.record_event(name)
    except Exception:
        pass


def record_duration(name: str, secs: float) -> None:
    try:
        from jax._src import monitoring

        monitoring.record_event_duration_secs(name, max(secs, 0.0))
    except Exception:
        pass
