"""The process's one warn-once registry: a problem is said once, never per key.

One registry, so that what the user sees as one problem is one line: a tier copy
refused for its signature and the store's object refused for the same reason share
a topic. A store's backends scope their topics by the store they belong to, so two
stores in one process (an operator's copy between stores) each say theirs.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("artifactstore")

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(topic: str, message: str, *args: object) -> None:
    """Log `message` (%-style with `args`) at warning level the first time `topic` is seen."""
    with _lock:
        if topic in _warned:
            return
        _warned.add(topic)
    log.warning("artifactstore: " + message, *args)
