"""One soak worker (`bench/soak.py` starts it): jitted calls in a loop until a deadline.

Each call clears JAX's in-memory caches, so every call is a compile request that goes
through the store (tier, then index and object store, then XLA). Shapes rotate over 30
(rows x cols) pairs and a variant constant baked into the program drifts with time, so
writers keep producing new keys while readers look up keys writers stored recently.
Every result is checked against NumPy (float64).

Writes JSON lines (appended with single `os.write` calls, so a SIGKILLed worker leaves
whole lines) to $SOAK_RECORDS:
  {"ev": "ready", ...}                             after imports and configure()
  {"ev": "call", "t0", "t1", "secs", "shape", "variant", "outcome", "ok", "error", "d",
   "active"}   outcome: tier | store (loaded) | compile | bypass (a breaker open: JAX
               compiled on its own path); d: the process_stats() counters that changed
  {"ev": "stored", "t", "key"}                     a put that created an index entry
  {"ev": "end", "t_loop_end", "flush_secs", "flushed", "stats"}

Environment: SOAK_RECORDS, SOAK_DEADLINE (time.time()), SOAK_EPOCH (start of the run,
for the variant drift), SOAK_SEED, SOAK_PAUSE (seconds between calls), SOAK_DRIFT_SECS,
SOAK_VARIANTS, plus the ARTSTORE_* settings.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import sys
import threading
import time
from typing import Any

T_START = time.time()
_fd = os.open(os.environ["SOAK_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_lock = threading.Lock()


def record(**fields: Any) -> None:
    line = (json.dumps(fields) + "\n").encode()
    with _lock:
        os.write(_fd, line)


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import artifactstore  # noqa: E402
import artifactstore.store.write as _write_mod  # noqa: E402
from artifactstore.formats.put import Put  # noqa: E402

# 30 shape classes: rows x cols of the input.
SHAPES = [(n, m) for n in (4, 8, 12, 16, 24, 32) for m in (3, 5, 7, 9, 11)]
LAYERS = 4


def body(xp: Any, x: Any, variant: int) -> Any:
    n, m = x.shape
    c = 1.0 / (n * m)
    for i in range(LAYERS):
        g = x.T @ x
        x = xp.tanh(x @ g * (c * (1 + 0.1 * i)) + 0.01 * variant)
    return x.sum(axis=0)


def watch_puts() -> None:
    """Record every put that created an entry: the keys 'reported stored' (a Store's
    puts, direct or queued, all go through its write path)."""
    real = _write_mod.WritePath.put

    def put(self: Any, one: Put) -> bool:
        created: bool = real(self, one)
        if created:
            record(ev="stored", t=time.time(), key=one.key)
        return created

    _write_mod.WritePath.put = put  # type: ignore[method-assign]


def outcome(d: dict[str, int]) -> str:
    if d.get("tier_hits"):
        return "tier"
    if d.get("loads"):
        return "store"
    if d.get("compiles"):
        return "compile"
    return "bypass"  # a breaker was open: JAX compiled on its own path, the store untouched


def main() -> int:
    faulthandler.enable()  # SIGABRT from soak.py (a hung worker): every thread's stack
    deadline = float(os.environ["SOAK_DEADLINE"])
    epoch = float(os.environ.get("SOAK_EPOCH", T_START))
    pause = float(os.environ.get("SOAK_PAUSE", "0.1"))
    drift = float(os.environ.get("SOAK_DRIFT_SECS", "60"))
    nvariants = int(os.environ.get("SOAK_VARIANTS", "3"))
    rng = random.Random(os.environ.get("SOAK_SEED", "0"))
    watch_puts()
    artifactstore.configure()
    record(ev="ready", t=time.time(), pid=os.getpid(), import_secs=time.time() - T_START)
    before = artifactstore.process_stats()
    while time.time() < deadline:
        n, m = rng.choice(SHAPES)
        base = int((time.time() - epoch) // drift)
        variant = base + rng.randrange(nvariants)
        x = np.asarray(
            np.random.default_rng(rng.randrange(1 << 30)).uniform(-1, 1, (n, m)), dtype=np.float32
        )
        want = body(np, x.astype(np.float64), variant)
        error, ok = None, False
        jax.clear_caches()  # every call asks the store (or compiles)
        faulthandler.dump_traceback_later(60, exit=False)  # a call this slow: say where
        t0, p0 = time.time(), time.perf_counter()
        try:
            got = np.asarray(jax.jit(lambda a, v=variant: body(jnp, a, v))(x))
            ok = bool(got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-3))
        except Exception as exc:  # the store must never break the program: counted
            error = f"{type(exc).__name__}: {exc}"[:500]
        secs = time.perf_counter() - p0
        faulthandler.cancel_dump_traceback_later()
        after = artifactstore.process_stats()
        d = {
            k: v - before.get(k, 0)
            for k, v in after.items()
            if isinstance(v, int) and k != "active" and v != before.get(k, 0)
        }
        before = after
        record(
            ev="call",
            t0=t0,
            t1=t0 + secs,
            secs=secs,
            shape=f"{n}x{m}",
            variant=variant,
            outcome=outcome(d),
            ok=ok and error is None,
            error=error,
            d=d,
            active=after.get("active", 1),
        )
        time.sleep(pause)
    t_end = time.time()
    bound = float(os.environ.get("ARTSTORE_FLUSH_TIMEOUT", "60"))
    p0 = time.perf_counter()
    flushed = artifactstore.flush(bound)
    record(
        ev="end",
        t_loop_end=t_end,
        flush_secs=time.perf_counter() - p0,
        flushed=flushed,
        stats=artifactstore.process_stats(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
