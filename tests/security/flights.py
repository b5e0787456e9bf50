"""Single-flight as the compile hook drives it, without JAX: shared by the role tests."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from artifactstore.config import host
from artifactstore.formats import fingerprint
from artifactstore.formats.put import Put
from artifactstore.store import Found, Store
from artifactstore.store.flight import Held


def fp() -> fingerprint.Fingerprint:
    return host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version="0.4")  # fmt: skip


def key(i: int) -> str:
    return f"{i:064x}"


def turn(store: Store, k: str) -> tuple[Found | None, Held | None]:
    """As the compile hook: a lookup that misses, then the key's lease or a wait for it."""
    assert store.get(k, fp().digest) is None
    flight = store.flight
    assert flight is not None
    return flight.turn(k, lambda: store.get(k, fp().digest))


def waiting(store: Store, k: str) -> tuple[threading.Thread, list[Any]]:
    """`store` misses `k` in a thread (as a second process would) and waits for its holder."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(turn(store, k)))
    thread.start()
    deadline = time.monotonic() + 30
    while store.parts.counters.snapshot().get("lease_waits", 0) < 1:
        assert time.monotonic() < deadline and thread.is_alive(), "it never waited"
        time.sleep(0.05)
    return thread, out


def loaded(thread: threading.Thread, out: list[Any]) -> Found:
    """What a waiter of `waiting` got once the holder published: a load, not a compile."""
    thread.join(30)
    assert not thread.is_alive() and len(out) == 1
    hit, held = out[0]
    assert held is None and isinstance(hit, Found), out
    return hit


def put(store: Store, k: str, size: int = 3000) -> None:
    assert store.put(Put(k, os.urandom(size), fp(), "jit_f", 2.0))


def publish(store: Store, k: str, held: Held) -> None:
    """What the compile hook does once it compiled: store the entry, release the lease."""
    put(store, k)
    held.release(stored=True)
    flight = store.flight
    assert flight is not None
    flight.drain(10)
