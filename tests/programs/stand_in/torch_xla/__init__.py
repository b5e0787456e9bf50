"""A stand-in torch_xla for tests that need none of torch (tests/programs/stand_in on
PYTHONPATH): what the adapter calls, and `compile(graph)`, which uses the persistent
cache as torch-xla does: a file named by the graph's hash (decimal) is loaded if there
and holds what this graph compiles to, else the graph is compiled (counted as torch-xla
counts: PersistentCacheHit, PersistentCacheMiss, PersistentCacheDeserializeFailure;
its time in CompileTime) and, unless the cache is read only, its file written.
FAKE_TORCH_XLA_COMPILED=1: it compiled already, so its cache can no longer be set.
FAKE_TORCH_XLA_NO_DESERIALIZE=1: a client that cannot deserialize (torch-xla's CPU
client): every file found fails to load and, unless the cache is read only, is erased
before the graph is compiled and its own file written, as torch-xla does.
"""

from __future__ import annotations

import hashlib
import os
import time
import types
from pathlib import Path

from torch_xla.debug import metrics

__version__ = "0.0+stand-in"

_XLAC = types.SimpleNamespace(
    _xla_computation_cache_is_initialized=lambda: os.environ.get("FAKE_TORCH_XLA_COMPILED") == "1"
)


def graph_hash(graph: str) -> str:
    return str(int.from_bytes(hashlib.sha256(graph.encode()).digest()[:16], "big"))


def executable(graph: str) -> bytes:
    return f"executable of {graph}\n".encode() * 64


def compile(graph: str) -> bytes:
    cache = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
    path = Path(cache) / graph_hash(graph) if cache else None
    read_only = os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY") == "1"
    if path is not None and path.is_file():
        loads = os.environ.get("FAKE_TORCH_XLA_NO_DESERIALIZE") != "1"
        if loads and path.read_bytes() == executable(graph):
            _count("PersistentCacheHit")
            return executable(graph)
        _count("PersistentCacheDeserializeFailure")
        if not read_only:
            path.unlink()
    elif path is not None:
        _count("PersistentCacheMiss")
    metrics.COMPILE_TIMES.append((time.time(), 250_000_000))  # a compile of 0.25 s
    if path is not None and not read_only and not path.exists():
        path.write_bytes(executable(graph))
    return executable(graph)


def _count(name: str) -> None:
    metrics.COUNTERS[name] = metrics.COUNTERS.get(name, 0) + 1
