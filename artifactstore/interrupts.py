"""SIGINT and SIGTERM as exceptions, and steps that finish before one lands.

Python turns SIGINT into KeyboardInterrupt; `artstore` turns SIGTERM into
`Terminated` (`install`), so that both unwind through the commands' finally
blocks and context managers (temporary files removed, leases released) and end
as one line with exit 130 or 143. `held()` delays both over a few steps that must
not be cut in half: an entry's object, row and manifest; a range of rows and
their manifests. Signal handlers belong to the main thread: elsewhere both are
no-ops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(BaseException):
    """SIGTERM, raised where the main thread was (as KeyboardInterrupt is SIGINT)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """SIGTERM raises Terminated from now on (SIGINT raises KeyboardInterrupt)."""
    if _main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def deliver(signum: int) -> None:
    """Raise what signal `signum` raises under `install` (where it was caught and held)."""
    if signum == signal.SIGTERM:
        raise Terminated
    raise KeyboardInterrupt


@contextmanager
def held() -> Iterator[None]:
    """Run the block whole: SIGINT and SIGTERM that arrive meanwhile take effect after it
    (through the handlers that were in place). Keep the block short and bounded."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous: dict[int, Any] = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for held_signal in SIGNALS:
        signal.signal(held_signal, note)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(pending[0])
