"""What a load or compile reports through JAX's own cache events, as its cache would.

Apart from the compile wrapper so that a load ahead of the program's request
(`prefetch`) reports the same events and counts as a load on the wrapper's path.
"""

from __future__ import annotations

import time

from artifactstore.runtime.session import Session

USE_CACHE = "/jax/compilation_cache/compile_requests_use_cache"
MISS = "/jax/compilation_cache/cache_misses"


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
