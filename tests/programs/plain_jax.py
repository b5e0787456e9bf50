"""A JAX program that knows nothing of artifactstore, for activation without code.

Prints one JSON line: its result, the XLA compiles it ran (xla_probe), JAX's cache-hit
events (our hook reports loads through them, as JAX's own cache would) and whether the
store was activated in it (its adapter is imported only then). PLAIN_SPAWN=1: also runs
`work` in a multiprocessing spawn worker and a plain subprocess (`artstore run` tests).
PLAIN_SCALE: the constant `work` multiplies by (2.0): another value, another program (key).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
from xla_probe import count_compiles

events: collections.Counter[str] = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
compiled = count_compiles()


def work(scale: float) -> float:
    f = jax.jit(lambda x: (jnp.tanh(x @ x.T) * scale).sum())
    return float(f(jnp.ones((32, 32))))


def report(**extra: object) -> dict[str, object]:
    return {
        "xla_compiles": len(compiled),
        "cache_hits": events["/jax/compilation_cache/cache_hits"],
        "activated": "artifactstore.jaxhook.api" in sys.modules,
        **extra,
    }


def spawned(scale: float, queue: object) -> None:
    compiled.clear()
    queue.put(report(result=work(scale)))  # type: ignore[attr-defined]


if __name__ == "__main__":
    result = work(float(os.environ.get("PLAIN_SCALE", "2.0")))
    out = report(result=result)
    if os.environ.get("PLAIN_SPAWN"):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=spawned, args=(3.0, queue))
        proc.start()
        out["spawned"] = queue.get(timeout=300)
        proc.join()
        child = subprocess.run(
            [sys.executable, __file__], env={**os.environ, "PLAIN_SPAWN": ""},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        out["subprocess"] = json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps(out))
