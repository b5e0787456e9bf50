"""Keys too quick to store, remembered by this host's tier so they are never looked up.

Trivial jits compile faster than ARTSTORE_MIN_COMPILE_SECS and are never stored, so a
lookup would be a certain miss (and, on a team store, a round trip). The tier keeps their
keys in one small JSON file (its format: formats.quick), merged by each process at exit.
A key that later compiles slower is stored, and forgotten here: a stale "quick" would
make processes compile a key the store has.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from artifactstore.errors import CorruptObject
from artifactstore.formats.quick import (
    BelowThreshold,
    decode_below_threshold,
    encode_below_threshold,
)

log = logging.getLogger("artifactstore")

# A week: long enough for every warm process of a project, short enough that a
# key whose compile grew past the threshold (new flags, a slower host) is
# looked up again soon; the bound keeps the file small to read at start.
BELOW_THRESHOLD_TTL_SECS = 7 * 86400.0
BELOW_THRESHOLD_MAX = 20_000


class QuickKeys:
    """The tier's below-threshold keys: read on first use, changes merged by `save`."""

    def __init__(
        self, name: str, read: Callable[[], bytes | None], write: Callable[[bytes], None]
    ) -> None:
        self.name = name  # the file, for messages
        self._read_file, self._write_file = read, write  # the tier's (LocalTier.read_file)
        self._lock = threading.Lock()
        self._known: BelowThreshold | None = None
        self._added: BelowThreshold = {}
        self._dropped: set[str] = set()

    def _loaded(self) -> BelowThreshold:
        if self._known is None:
            self._known = self._read()
        return self._known

    def get(self, key: str) -> float | None:
        """The compile seconds last seen for `key` if it was too quick to store, else None."""
        with self._lock:
            item = self._loaded().get(key)
        return item[0] if item is not None and item[1] > time.time() else None

    def remember(self, key: str, compile_secs: float) -> None:
        item = (compile_secs, time.time() + BELOW_THRESHOLD_TTL_SECS)
        with self._lock:
            self._added[key] = item
            if self._known is not None:
                self._known[key] = item
            self._dropped.discard(key)

    def forget(self, key: str) -> None:
        """`key` compiled above the threshold this time, so it is stored: look it up again."""
        with self._lock:
            if key not in self._loaded() and key not in self._added:
                return
            self._loaded().pop(key, None)
            self._added.pop(key, None)
            self._dropped.add(key)

    def save(self) -> None:
        """Merge this process's changes into the file (last writer wins on a race)."""
        with self._lock:
            added, self._added = self._added, {}
            dropped, self._dropped = self._dropped, set()
        if not added and not dropped:
            return
        now = time.time()
        merged = {
            k: v for k, v in {**self._read(), **added}.items() if v[1] > now and k not in dropped
        }
        if len(merged) > BELOW_THRESHOLD_MAX:
            newest = sorted(merged.items(), key=lambda kv: kv[1][1])[-BELOW_THRESHOLD_MAX:]
            merged = dict(newest)
        self._write_file(encode_below_threshold(merged))

    def _read(self) -> BelowThreshold:
        try:
            return decode_below_threshold(self._read_file() or b"{}")
        except (OSError, CorruptObject):
            log.debug("artifactstore: ignoring an unreadable %s", self.name)
            return {}
