"""A small JAX program the tests run in fresh processes.

It reports, as one JSON line: its results, JAX's own monitoring events, how
many times XLA actually compiled (by counting calls of JAX's compile entry
point), and the store's counters for this process.

Environment knobs (tests only):
  JOB_FAKE_CPU_FEATURES  comma list replacing the host CPU features in the fingerprint
  JOB_NO_STORE=1         do not configure artifactstore
  JOB_VARIANT            changes the program (a different module, so a different key)
  JOB_SKIP_FLUSH=1       leave queued uploads to the store's own exit flush
  JOB_SMALL_JITS=1       also run trivial jits (ones, arange, reshape), as real programs do
  JOB_MANY_SMALL=N       also run N distinct trivial jits (each compiles in milliseconds)
  JOB_JAX_CACHE=DIR      JAX's own persistent cache in DIR, its thresholds at 0 (with
                         JOB_NO_STORE=1: what the store is compared with)
  JOB_SLOW_COMPILE_SECS  the two main functions' compiles take this much longer
  JOB_EXIT_TIMES=1       print {"atexit_done": T} after every other exit handler (T:
                         time.monotonic(), as "printed_at" in the result line)
  JOB_WAIT_PREFETCH=N    initialize the backend (no compile), then wait (bounded) until N
                         executables were loaded ahead (artifactstore.jaxhook.prefetch)
  JOB_WAIT_COUNTER=C:N   as JOB_WAIT_PREFETCH, for the process counter C (a refusal's)
  JOB_WAIT_EARLY=N       before that, wait (bounded) until N were fetched while JAX had no
                         backend yet ("early": the count, and whether JAX had one then)
  JOB_LATE_PLATFORM=1    after configuring, wait, then report whether JAX has backends yet
                         ("backends_before_platform") and set jax_platforms to cpu
  JOB_PAUSE              comma list of points (open, exit) where the program prints a JSON
                         line {"paused": POINT} and waits for a line on stdin (tests/faults:
                         "open" once the store is open, "exit" after the result line)
  JOB_LOG_INFO=1         the store's info lines on stderr too (every lease wait, not only
                         the first: tests wait for a line instead of sleeping)
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
from xla_probe import count_compiles

events: collections.Counter[str] = collections.Counter()
durations: collections.Counter[str] = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: durations.update({name: secs})
)
slow_secs = float(os.environ.get("JOB_SLOW_COMPILE_SECS", "0"))
xla_compiles = count_compiles(("mlp", "loss_and_grad"), slow_secs)

if os.environ.get("JOB_FAKE_CPU_FEATURES"):
    from artifactstore.config import host

    fake = sorted(os.environ["JOB_FAKE_CPU_FEATURES"].split(","))
    host.register_provider(lambda fields: {**fields, "cpu_features": fake})

if os.environ.get("JOB_EXIT_TIMES"):  # registered first, so it runs after the store's
    atexit.register(lambda: print(json.dumps({"atexit_done": time.monotonic()}), flush=True))

if os.environ.get("JOB_LOG_INFO"):
    import logging

    logging.getLogger("artifactstore").setLevel(logging.INFO)
    logging.getLogger("artifactstore").addHandler(logging.StreamHandler(sys.stderr))

if os.environ.get("JOB_JAX_CACHE"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JOB_JAX_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

if not os.environ.get("JOB_NO_STORE"):
    import artifactstore

    artifactstore.configure()

backends_before_platform = None
if os.environ.get("JOB_LATE_PLATFORM"):
    from jax._src import xla_bridge

    time.sleep(0.5)  # the prefetch thread polls meanwhile
    backends_before_platform = bool(xla_bridge._backends)
    jax.config.update("jax_platforms", "cpu")


def wait_for_counter(name: str, at_least: int) -> int:
    """The store's process counter `name` once it reaches `at_least` (at most 60 s)."""
    import artifactstore

    deadline = time.monotonic() + 60
    while artifactstore.process_stats().get(name, 0) < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return int(artifactstore.process_stats().get(name, 0))


early = None
if os.environ.get("JOB_WAIT_EARLY"):
    from jax._src import xla_bridge

    count = wait_for_counter("prefetch_early", int(os.environ["JOB_WAIT_EARLY"]))
    early = {"fetched": count, "had_backend": bool(xla_bridge._backends)}
if os.environ.get("JOB_WAIT_PREFETCH"):
    jax.devices()  # the backend, as a program's first array would make it
    wait_for_counter("prefetched", int(os.environ["JOB_WAIT_PREFETCH"]))
if os.environ.get("JOB_WAIT_COUNTER"):
    jax.devices()
    counter, _, at_least = os.environ["JOB_WAIT_COUNTER"].partition(":")
    wait_for_counter(counter, int(at_least))

pause = set(filter(None, os.environ.get("JOB_PAUSE", "").split(",")))


def wait_for_test(point: str, **facts: object) -> None:
    if point in pause:
        print(json.dumps({"paused": point, **facts}), flush=True)
        sys.stdin.readline()


if "open" in pause:
    from artifactstore.jaxhook.api import active_store

    wait_for_test("open", store=active_store() is not None)

variant = float(os.environ.get("JOB_VARIANT", "0"))


@jax.jit
def mlp(x):  # type: ignore[no-untyped-def]
    for i in range(6):
        x = jnp.tanh(x @ x.T * (0.1 + 0.01 * i) + variant) @ x
    return x.sum(axis=0)


@jax.jit
def loss_and_grad(w, x):  # type: ignore[no-untyped-def]
    def loss(w):  # type: ignore[no-untyped-def]
        h = x
        for _ in range(4):
            h = jax.nn.relu(h @ w)
        return (h**2).mean()

    return jax.value_and_grad(loss)(w)


if os.environ.get("JOB_SMALL_JITS"):
    small = jnp.ones((8,)) + jnp.arange(8.0).reshape(2, 4).ravel()
    jax.block_until_ready(jnp.zeros((2, 2)).T + small[:2])
for i in range(int(os.environ.get("JOB_MANY_SMALL", "0"))):
    jax.block_until_ready(jax.jit(lambda a, i=i: a * (i + 2.0) + i)(jnp.float32(1.0)))
x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)
r1 = mlp(x)
value, grad = loss_and_grad(jnp.eye(8, dtype=jnp.float32) * 0.5, x)
jax.block_until_ready((r1, value, grad))
results = [repr(float(v)) for v in (*r1.tolist(), float(value), *grad.ravel().tolist())]

stats = {}
version = None
if not os.environ.get("JOB_NO_STORE"):
    import artifactstore

    version = artifactstore.__version__  # tests/test_rollout.py runs two versions

    if not os.environ.get("JOB_SKIP_FLUSH"):  # else: uploads finish in the exit flush
        artifactstore.flush()
    stats = artifactstore.process_stats()

print(
    json.dumps(
        {
            "results": results,
            "printed_at": time.monotonic(),
            "events": dict(events),
            "xla_compiles": xla_compiles,
            "store": stats,
            "version": version,
            "backends_before_platform": backends_before_platform,
            "early": early,
            "imported": sorted(m for m in ("sqlalchemy", "boto3", "psycopg") if m in sys.modules),
        }
    ),
    flush=True,
)
wait_for_test("exit")
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
