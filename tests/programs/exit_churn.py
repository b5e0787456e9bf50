"""A program whose store work is still going at exit: a periodic task on the executor
(as the store's flush tick) that creates finalizers, as urllib3 does for each new
connection pool, while the interpreter runs `weakref.finalize`'s exit hook.

Before the executor went quiet at exit, Python printed "Exception ignored in
finalize._exitfunc ... dictionary changed size during iteration" (3 of 3 runs).
Prints {"ticks": n} first.
"""

from __future__ import annotations

import json
import time
import weakref

from artifactstore.process.background import executor


class Pool:
    pass


kept: list[Pool] = []


def churn() -> None:
    for _ in range(200):
        pool = Pool()
        kept.append(pool)
        weakref.finalize(pool, int)


for _ in range(1000):  # a long registry: its exit hook takes long enough to be raced
    churn()
ticks = executor().every(0.001, churn)
time.sleep(0.05)
print(json.dumps({"finalizers": len(kept)}), flush=True)
