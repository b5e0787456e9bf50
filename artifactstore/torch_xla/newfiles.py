"""What torch-xla compiled in this process, stored as entries: in the background and at exit.

torch-xla writes one file per compiled graph into its cache directory (not atomically: an
`ofstream`, while it holds its cache's lock). So a scan every SCAN_SECS takes a file only
once its size and time have not changed since the scan before, and the scan at exit takes
every file (no compile runs then). Each file becomes a `Put` (formats.put) keyed by its
name and the fingerprint (formats.torchxla), its payload the framed file, and goes the
store's one way: the background writer, compressed, signed where a key is set, published
last, flushed within ARTSTORE_FLUSH_TIMEOUT at exit. Files this process placed itself
(stored already) are not stored again, nor are those over ARTSTORE_MAX_EXECUTABLE_SIZE
or, where torch-xla's metrics time them, compiled faster than ARTSTORE_MIN_COMPILE_SECS.
Read-only processes never start this (torch-xla writes nothing for them either).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from artifactstore.errors import one_line
from artifactstore.formats.put import Put
from artifactstore.formats.torchxla import entry_key, frame, module_name
from artifactstore.process.background import Timer, executor
from artifactstore.process.notices import warn_once

if TYPE_CHECKING:
    from artifactstore.formats.fingerprint import Fingerprint
    from artifactstore.runtime.session import Session
    from artifactstore.torch_xla.cachedir import CacheDir, CacheFile

log = logging.getLogger("artifactstore")

SCAN_SECS = 5.0
# How far a compile's end (torch-xla's CompileTime sample) may be from its file's time.
MATCH_SECS = 2.0

# (end as seconds since the epoch, duration in seconds) of each compile torch-xla timed.
Samples = Sequence[tuple[float, float]]


class NewFiles:
    """The files torch-xla writes into `directory`, each stored once."""

    def __init__(
        self,
        session: Session,
        fingerprint: Fingerprint,
        directory: CacheDir,
        *,
        placed: set[str],
        compile_times: Callable[[], Samples] = lambda: (),
    ) -> None:
        self.session = session
        self.fingerprint = fingerprint
        self.directory = directory
        self.compile_times = compile_times
        self._done = set(placed)  # stored already (placed from the store), or taken
        self._seen: dict[str, tuple[int, int]] = {}  # name -> (size, mtime) at the last scan
        self._lock = threading.Lock()
        self._scans: Timer | None = None

    def start(self, every: float = SCAN_SECS) -> None:
        self._scans = executor().every(every, functools.partial(self.scan, final=False))

    def finish(self) -> None:
        """At exit (before the session's flush): stop scanning, store every file left."""
        if self._scans is not None:
            self._scans.cancel()
        self.scan(final=True)

    def scan(self, *, final: bool) -> int:
        """Queue a put for each file complete since the last scan (`final`: each file);
        how many were queued."""
        with self._lock:
            try:
                files = self.directory.files()
            except Exception as exc:  # the directory went away: nothing more to store
                log.debug("artifactstore: torch-xla cache not scanned: %s", one_line(exc))
                return 0
            ready = [f for f in files if f.name not in self._done and self._complete(f, final)]
            return sum(self._store(f) for f in ready)

    def _complete(self, found: CacheFile, final: bool) -> bool:
        now = (found.size, found.mtime_ns)
        before, self._seen[found.name] = self._seen.get(found.name), now
        return final or before == now

    def _store(self, found: CacheFile) -> bool:
        settings = self.session.settings
        if found.size > settings.max_executable_bytes:
            self._done.add(found.name)
            self.session.counters.add("torch_xla_over_limit")
            return False
        secs = compile_secs(found.mtime_ns / 1e9, self.compile_times())
        if secs is not None and secs < settings.min_compile_secs:
            self._done.add(found.name)
            self.session.counters.add("torch_xla_below_threshold")
            return False
        store = self.session.store()
        if store is None:  # unavailable (the breaker says why, once): the next scan retries
            return False
        try:
            data = self.directory.read(found.name)
        except OSError as exc:  # removed meanwhile (torch-xla replaces a file it cannot load)
            log.debug("artifactstore: torch-xla file %s not read: %s", found.name, exc)
            return False
        self._done.add(found.name)
        digest = self.fingerprint.digest
        store.submit(
            Put(
                key=entry_key(digest, found.name),
                payload=frame(found.name, data),
                fingerprint=self.fingerprint,
                module_name=module_name(found.name),
                compile_secs=secs or 0.0,
            )
        )
        self.session.counters.add("torch_xla_queued")
        return True


def compile_secs(written: float, samples: Samples) -> float | None:
    """How long the compile that wrote a file at `written` took: the timed compile that
    ended nearest to it (within MATCH_SECS), or None where none did."""
    near = [(abs(end - written), secs) for end, secs in samples if abs(end - written) <= MATCH_SECS]
    return min(near)[1] if near else None


def warn_not_ours(path: str, ours: str) -> None:
    """The program pointed torch-xla's cache elsewhere after activation: nothing to store."""
    warn_once(
        "torch-xla-path",
        "torch-xla's cache is %s, not the store's %s (the program called "
        "initialize_cache itself): its compiles are not stored",
        path,
        ours,
    )
