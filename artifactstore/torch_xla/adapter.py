"""The torch-xla adapter of one process: turned on once, before torch-xla's first compile.

Turned on by `enable()` (artifactstore.torch_xla) or, without code, when the program
imports torch_xla with ARTSTORE_URL set or under `artstore run` (artifactstore_startup).
Turning it on: the platform fingerprint (torch_xla.platform, read without the devices),
the process's one session (runtime.process: the JAX hook's where it has the same
settings, so one counting object and one `artstore run` record), a private cache
directory (cachedir), the fingerprint's stored files placed in it (fill), then
`torch_xla.runtime.initialize_cache(directory, readonly=...)`, read only where the store
is (ARTSTORE_READ_ONLY). A writer stores what torch-xla compiles (newfiles) in the
background and at exit. torch-xla's own counters are taken into the process's
(`take_counts`). Nothing here stops the program: anything that fails is one log line,
and torch-xla then compiles as it would without the store.
"""

from __future__ import annotations

import atexit
import contextlib
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
from artifactstore.runtime import process, summary
from artifactstore.runtime.session import Session, warn_once
from artifactstore.store.chain import Chain, Found
from artifactstore.torch_xla.cachedir import CacheDir
from artifactstore.torch_xla.fill import fill
from artifactstore.torch_xla.newfiles import NewFiles, Samples, warn_not_ours

log = logging.getLogger("artifactstore")

USER = "torch-xla"  # this adapter, among the users of the process's session (runtime.process)

# What `fill` reports -> the process's names for it (formats.counters).
FILLED = {
    "listed": "torch_xla_listed",
    "placed": "torch_xla_placed",
    "placed_bytes": "torch_xla_placed_bytes",
    "refused": "torch_xla_refused",
    "over_bound": "torch_xla_over_bound",
    "missing": "torch_xla_missing",
    "failed": "torch_xla_failed",
}
# torch-xla's own counters (its CompileTime metric's total, in ms) -> the process's names
# each adds to: a graph it loaded is a load (and a placed file claimed as a hit); one it
# found no file of, a miss (a lookup that found nothing usable, for the index's hit rate)
# and a compile; one whose file it could not load (on the CPU, every placed one), the same.
_MISSED = ("misses", "lookups_missed", "compiles")
TORCH_XLA_COUNTERS = {
    "PersistentCacheHit": ("torch_xla_cache_hits", "loads"),
    "PersistentCacheMiss": ("torch_xla_cache_misses", *_MISSED),
    "PersistentCacheDeserializeFailure": ("torch_xla_cache_deserialize_failures", *_MISSED),
    "CompileTime": ("compile_ms",),
}


class Adapter:
    """One process's use of the store for torch-xla: the process's session (shared with
    the JAX hook: runtime.process), the fingerprint, the cache directory."""

    def __init__(
        self,
        session: Session,
        fingerprint: Fingerprint,
        directory: CacheDir,
        placed: dict[str, Found],
    ) -> None:
        self.session = session
        self.fingerprint = fingerprint
        self.directory = directory
        self.placed = set(placed)
        # Placed files not yet claimed as hits, in the order placed, and how each was left
        # (a writer's torch-xla erases a file it could not load, then writes its own).
        self._unclaimed = list(placed.items())
        self._as_placed = {f.name: f for f in directory.files() if f.name in placed}
        self.new_files: NewFiles | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._seen = _torch_xla_counts()  # what torch-xla counted before: not ours
        self._attach(session)

    def _attach(self, session: Session) -> None:
        """Count into `session` and do this adapter's part of its finish, first thing."""
        session.counters.take_in(self.take_counts)
        session.on_finish.insert(0, self._at_finish)

    def count_filled(self, counts: Counter[str]) -> None:
        """The fill's report, under the process's names (every one mapped: a test)."""
        for name, n in counts.items():
            if n and name in FILLED:
                self.session.counters.add(FILLED[name], n, fingerprint=self.fingerprint.digest)

    def take_counts(self) -> None:
        """Count what torch-xla counted since the last time (it tells nobody as it
        counts): before each snapshot of the process's counters, and at exit. A placed
        file is a hit only once torch-xla has loaded one: one it could not deserialize
        is a miss, and saved no time."""
        now = _torch_xla_counts()
        with self._lock:
            grown = {
                k: v - self._seen.get(k, 0) for k, v in now.items() if v > self._seen.get(k, 0)
            }
            self._seen.update(now)
            failed = int(grown.get("PersistentCacheDeserializeFailure", 0))
            loaded = self._loaded(int(grown.get("PersistentCacheHit", 0)), failed)
        counters, digest = self.session.counters, self.fingerprint.digest
        for name, n in grown.items():
            for ours in TORCH_XLA_COUNTERS[name]:
                counters.add(ours, n, fingerprint=digest)
        for found in loaded:
            _claim(found)
        if failed:
            self._say_unloadable(failed)

    def _loaded(self, loads: int, failures: int) -> list[Found]:
        """The placed files to count as hits for `loads` new loads (torch-xla counts them,
        it does not name them): the unclaimed ones in the order placed, less those it
        erased after failing to load them (a writer's; a reader's stay as placed)."""
        if failures:
            now = {f.name: f for f in self.directory.files()}
            self._unclaimed = [
                (name, found)
                for name, found in self._unclaimed
                if now.get(name) == self._as_placed.get(name)
            ]
        taken, self._unclaimed = self._unclaimed[:loads], self._unclaimed[loads:]
        return [found for _, found in taken]

    def _say_unloadable(self, failed: int) -> None:
        """Once per process: placed files torch-xla found and could not load."""
        if self.fingerprint.platform_version.startswith("CPU;"):
            warn_once(
                "torch-xla-unloadable",
                "torch-xla's CPU client cannot deserialize a stored executable: each graph "
                "whose file the store placed compiles again, counted as a miss",
            )
        else:
            warn_once(
                "torch-xla-unloadable",
                "torch-xla could not load %d stored file(s) it found: compiled again, "
                "counted as misses",
                failed,
            )

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

    def _at_finish(self) -> None:
        """First thing in the session's finish (before its flush): torch-xla's counts
        taken in (for the index too), what it wrote stored."""
        self.take_counts()
        if self.new_files is None:
            return
        path = os.environ.get("XLA_PERSISTENT_CACHE_PATH", "")
        if path != str(self.directory.path):
            warn_not_ours(path, str(self.directory.path))
        self.new_files.finish()

    def move_to(self, session: Session) -> None:
        """A later `configure()` gave the process another session: store and count there."""
        old, self.session = self.session, session
        with contextlib.suppress(ValueError):
            old.on_finish.remove(self._at_finish)
        if self.new_files is not None:
            self.new_files.session = session
        self._attach(session)

    def stats(self) -> dict[str, int]:
        """process_stats(): the process's counts, torch-xla's included (formats.counters)."""
        return self.session.stats()

    def close(self, *, at_exit: bool = False) -> None:
        """At exit, or when turned off: what is left stored (bounded), the directory
        removed, the session closed unless the JAX hook still uses it, and under
        `artstore run` this process's record for its summary."""
        if self._closed:
            return
        self._closed = True
        session = self.session
        try:
            last = process.leave(USER)
            if last is not None:
                last.close()
            elif at_exit:
                session.finish()  # the whole process's, once: JAX's exit then finds it done
            else:  # turned off while JAX goes on: this adapter's part only
                with contextlib.suppress(ValueError):
                    session.on_finish.remove(self._at_finish)
                self._at_finish()
                session.flush(session.settings.flush_secs)
        finally:
            self.directory.remove()
        records = os.environ.get(summary.ENV_VAR)
        if records:
            try:
                summary.write_record(Path(records), session.stats())
            except Exception as exc:
                log.debug("artifactstore: torch-xla summary record not written: %s", exc)

    def retire(self) -> None:
        """Replaced by a newer adapter (its session closed by the one who replaced it)."""
        self._closed = True
        self.directory.remove()


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
    # The process's one session: the JAX hook's, where it made one with these settings
    # (both from the environment); else a new one, which the JAX hook follows.
    joined = process.use(USER, settings, move=_move)
    with _lock:
        old, _current = _current, None
    if joined.replaced is not None:  # its part of the finish: the old adapter's files stored
        joined.replaced.close()
    if old is not None:
        old.retire()
    session = joined.session
    directory: CacheDir | None = None
    try:
        directory = CacheDir.make(settings, found.digest)
        counts, placed = fill(session, found.digest, directory)
        adapter = Adapter(session, found, directory, placed)
        adapter.count_filled(counts)
        xr.initialize_cache(str(directory.path), readonly=settings.read_only)
    except BaseException:  # nothing left behind: torch-xla goes on with its own settings
        left = process.leave(USER)
        if left is not None:
            left.close()
        if directory is not None:
            directory.remove()
        raise
    if not settings.read_only:
        adapter.start_storing()
    with _lock:
        _current = adapter
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_at_exit)
            _finish_in_multiprocessing_children()
    log.debug(
        "artifactstore: torch-xla cache %s: %d stored file(s) placed (fingerprint %s)",
        directory.path,
        counts["placed"],
        found.digest[:12],
    )
    return settings


def _move(session: Session) -> None:
    adapter = _current
    if adapter is not None:
        adapter.move_to(session)


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
        adapter.close(at_exit=True)


def _finish_in_multiprocessing_children() -> None:
    """A multiprocessing child (xmp.spawn's workers) ends with os._exit, after its
    finalizers but without atexit: store its files there."""
    if "multiprocessing" in sys.modules:
        from multiprocessing import util

        util.Finalize(None, _at_exit, exitpriority=10)


def _claim(found: Found) -> None:
    """Count a placed file as the hit it was found as, now that torch-xla loaded it."""
    try:
        Chain.claim(found)
    except Exception as exc:
        log.debug("artifactstore: torch-xla hit not counted: %s", one_line(exc))


def _compile_times() -> Samples:
    """torch-xla's timed compiles: (end, seconds) each, as its metrics keep them."""
    try:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return [(float(end), float(ns) / 1e9) for end, ns in (data[2] if data else ())]
    except Exception:
        return []


def _torch_xla_counts() -> dict[str, float]:
    """torch-xla's counters of its persistent cache, and its compiles' total time (ms)."""
    try:
        import torch_xla.debug.metrics as met

        out: dict[str, float] = {
            name: float(met.counter_value(name) or 0)
            for name in TORCH_XLA_COUNTERS
            if name != "CompileTime"
        }
        data = met.metric_data("CompileTime")
        out["CompileTime"] = float(data[1]) / 1e6 if data else 0.0
        return out
    except Exception:
        return {}
