"""The process's one session, shared by the frameworks' adapters (jaxhook, torch_xla).

One, so that one counting object counts what the process did (process_stats(), the
`artstore run` record, the metrics), one tier, Store and exit flush serve both
frameworks, and a process using JAX and torch-xla leaves one record, not two. The
first adapter turned on makes it; the other joins it where its settings are the same
(both from the environment, as under `artstore run`). An adapter asking again, or
with other settings (an explicit `configure()` or `enable()`), gets a new one that
replaces it for the process: the other adapters move to it (`use`'s `move`), then the
caller closes the old one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from artifactstore.config import Settings
from artifactstore.runtime.session import Session

_lock = threading.RLock()
_session: Session | None = None
# The adapters using it ("jax", "torch-xla"), each with how it moves to a new session.
_users: dict[str, Callable[[Session], None]] = {}


@dataclass(frozen=True)
class Joined:
    session: Session
    new: bool  # made for this call (else joined: another adapter made it)
    replaced: Session | None  # the process's session before, for the caller to close


def current() -> Session | None:
    """The process's session, or None where no adapter is turned on."""
    return _session


def used_by(user: str) -> bool:
    return user in _users


def use(user: str, settings: Settings, move: Callable[[Session], None] = lambda _: None) -> Joined:
    """The process's session for adapter `user` turned on with `settings`: the one in
    use where another adapter made it with the same settings, else a new one that
    replaces it. `move(session)` is called if a later call replaces it for the process."""
    global _session
    with _lock:
        if _session is not None and _session.settings == settings and user not in _users:
            _users[user] = move
            return Joined(_session, new=False, replaced=None)
        old, _session = _session, Session(settings)
        others = [how for name, how in _users.items() if name != user]
        _users[user] = move
        session = _session
    for how in others:  # they follow, before the old one is closed
        how(session)
    return Joined(session, new=True, replaced=old)


def leave(user: str) -> Session | None:
    """Adapter `user` stops using the process's session: it, for the caller to close,
    where no other adapter uses it (then the process has none); else None."""
    global _session
    with _lock:
        if _users.pop(user, None) is None or _users:
            return None
        old, _session = _session, None
        return old
