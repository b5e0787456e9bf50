"""The torch-xla adapter of one process: turned on once, before torch-xla's first compile.

Turned on by `enable()` (artifactstore.torch_xla) or, without code, when the program
imports torch_xla with ARTSTORE_URL set or under `artstore run` (artifactstore_startup).
Turning it on: the platform fingerprint (torch_xla.platform, read without the devices),
this process's private cache directory (cachedir), the fingerprint's stored files placed
in it (fill), then `torch_xla.runtime.initialize_cache(directory, readonly=...)`, read
only where the store is (ARTSTORE_READ_ONLY). A writer stores what torch-xla compiles
(newfiles) in the background and at exit. Nothing here stops the program: anything that
fails is one log line, and torch-xla then compiles as it would without the store.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from artifactstore import config as _config
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.runtime import summary
from artifactstore.runtime.session import Session, warn_once
from artifactstore.torch_xla.cachedir import CacheDir
from artifactstore.torch_xla.fill import fill
from artifactstore.torch_xla.newfiles import NewFiles, Samples, warn_not_ours

log = logging.getLogger("artifactstore")

# torch-xla's own counters of its persistent cache, as `stats()` names them.
TORCH_XLA_COUNTERS = {
    "PersistentCacheHit": "torch_xla_cache_hits",
    "PersistentCacheMiss": "torch_xla_cache_misses",
    "PersistentCacheDeserializeFailure": "torch_xla_cache_deserialize_failures",
}


class Adapter:
    """One process's use of the store for torch-xla: its session, fingerprint, directory."""

    def __init__(
        self, session: Session, fingerprint: Fingerprint, directory: CacheDir, placed: set[str]
    ) -> None:
        self.session = session
        self.fingerprint = fingerprint
        self.directory = directory
        self.placed = placed
        self.counts: Counter[str] = Counter()
        self.new_files: NewFiles | None = None
        self._closed = False

    def start_storing(self) -> None:
        """A writer: store what torch-xla writes, in the background and first thing at exit."""
        self.new_files = NewFiles(
            self.session,
            self.fingerprint,
            self.directory,
            placed=self.placed,
            compile_times=_compile_times,
        )
        self.new_files.start()
        self.session.on_finish.insert(0, self._store_the_rest)

    def _store_the_rest(self) -> None:
        path = os.environ.get("XLA_PERSISTENT_CACHE_PATH", "")
        if path != str(self.directory.path):
            warn_not_ours(path, str(self.directory.path))
        if self.new_files is not None:
            self.new_files.finish()

    def stats(self) -> dict[str, int]:
        """The session's counts, the files placed and stored, and torch-xla's own: in the
        summaries' terms, a placed file is a load and torch-xla's cache misses are misses
        (on the CPU a placed file still compiles: deserialize failures)."""
        out = dict(self.session.stats())
        out.update({f"torch_xla_{name}": n for name, n in self.counts.items() if n})
        if self.new_files is not None:
            out.update({name: n for name, n in self.new_files.counts.items() if n})
        torch = _torch_xla_counters()
        out.update(torch)
        out["loads"] = self.counts["placed"]
        out["misses"] = torch.get("torch_xla_cache_misses", 0)
        failed = torch.get("torch_xla_cache_deserialize_failures", 0)
        out["compiles"] = out["misses"] + failed
        return out

    def close(self) -> None:
        """At exit, or when replaced: what is left stored (bounded), the directory removed,
        and under `artstore run` this process's record for its summary."""
        if self._closed:
            return
        self._closed = True
        try:
            self.session.close()
        finally:
            self.directory.remove()
        records = os.environ.get(summary.ENV_VAR)
        if records:
            try:
                summary.write_record(Path(records), self.stats())
            except Exception as exc:
                log.debug("artifactstore: torch-xla summary record not written: %s", exc)


_lock = threading.RLock()
_current: Adapter | None = None
_explicit = 0  # enable() calls in progress: the import hook then leaves it to them
_exit_registered = False


def current() -> Adapter | None:
    return _current


def enable(options: dict[str, Any], *, explicit: bool) -> _config.Settings | None:
    """Turn the adapter on with `options` (configure()'s keywords) over the environment;
    the settings in force, or None where it could not be (said in one log line).
    `explicit`: the program's own call, whose mistakes (a bad option) raise."""
    global _explicit
    with _lock:
        if explicit:
            _explicit += 1
        elif _explicit or _current is not None:
            return None  # the program enables it itself (or did): it wins
    try:
        try:
            settings = _config.resolve(options)
        except ArtstoreError as exc:
            if explicit and any(v is not None for v in options.values()):
                raise
            warn_once("torch-xla-config", "%s; torch-xla compiles without the store", exc)
            return None
        try:
            return _install(settings)
        except Exception as exc:  # never the program's failure
            warn_once(
                "torch-xla", "torch-xla not using the store (%s); compiling as usual", one_line(exc)
            )
            return None
    finally:
        if explicit:
            with _lock:
                _explicit -= 1


def _install(settings: _config.Settings) -> _config.Settings | None:
    global _current, _exit_registered
    import torch_xla
    import torch_xla.runtime as xr

    from artifactstore.torch_xla.platform import fingerprint

    if torch_xla._XLAC._xla_computation_cache_is_initialized():
        warn_once(
            "torch-xla-late",
            "torch-xla compiled before the store was turned on, so its cache can no longer "
            "be set: call artifactstore.torch_xla.enable() before the first computation",
        )
        return None
    found = fingerprint()
    session = Session(settings)
    directory = CacheDir.make(settings, found.digest)
    try:
        counts, placed = fill(session, found.digest, directory)
        adapter = Adapter(session, found, directory, placed)
        adapter.counts.update(counts)
        xr.initialize_cache(str(directory.path), readonly=settings.read_only)
    except BaseException:  # nothing left behind: torch-xla goes on with its own settings
        session.close()
        directory.remove()
        raise
    if not settings.read_only:
        adapter.start_storing()
    with _lock:
        old, _current = _current, adapter
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_at_exit)
            _finish_in_multiprocessing_children()
    if old is not None:
        old.close()
    log.debug(
        "artifactstore: torch-xla cache %s: %d stored file(s) placed (fingerprint %s)",
        directory.path,
        counts["placed"],
        found.digest[:12],
    )
    return settings


def disable() -> None:
    """Stop: what torch-xla wrote is stored (bounded), the directory removed. torch-xla
    keeps the cache path it was given (it cannot be unset); new files are not stored."""
    global _current
    with _lock:
        old, _current = _current, None
    if old is not None:
        old.close()


def _at_exit() -> None:
    adapter = _current
    if adapter is not None:
        adapter.close()


def _finish_in_multiprocessing_children() -> None:
    """A multiprocessing child (xmp.spawn's workers) ends with os._exit, after its
    finalizers but without atexit: store its files there."""
    if "multiprocessing" in sys.modules:
        from multiprocessing import util

        util.Finalize(None, _at_exit, exitpriority=10)


def _compile_times() -> Samples:
    """torch-xla's timed compiles: (end, seconds) each, as its metrics keep them."""
    try:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return [(float(end), float(ns) / 1e9) for end, ns in (data[2] if data else ())]
    except Exception:
        return []


def _torch_xla_counters() -> dict[str, int]:
    try:
        import torch_xla.debug.metrics as met

        return {
            ours: int(met.counter_value(name) or 0) for name, ours in TORCH_XLA_COUNTERS.items()
        }
    except Exception:
        return {}
