"""Progress of a long command on stderr: the one display every command with progress uses.

Only on a terminal, by default: there it is click's progress bar, one per phase. Anywhere
else (a CI log, cron mail, a pipe, `--json` read by a program) nobody watches it, and
lines there would bury the one line a failure ends with; `--progress` asks for them anyway:
a plain line per phase every few seconds and one with the final count (a carriage-return
bar would leave a smear of half-lines). Always on stderr: `--json` output on stdout stays
parseable. The parts below the CLI (gc/, bundles/, warm/) only call back with counts;
what is shown is decided here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Mapping
from types import TracebackType
from typing import Any, Self, TextIO, TypeVar

import click

from artifactstore.formats.sizes import format_size

# Seconds between two plain lines of one phase (off a terminal).
LINE_SECS = 5.0

F = TypeVar("F", bound=Callable[..., Any])


def progress_option(fn: F) -> F:
    """`--progress/--no-progress`, the same on every command that shows progress; not
    given (None): a bar when stderr is a terminal, nothing otherwise."""
    return click.option(
        "--progress/--no-progress",
        default=None,
        help="Progress on stderr: a bar on a terminal; `--progress` off a terminal: a line "
        "every few seconds and the final count [default: only on a terminal].",
    )(fn)


class Progress:
    """Counts per phase, shown on `stream` (stderr): a bar on a terminal; lines elsewhere
    only when `show` is True (None, the default: only on a terminal; False: nothing).

    `update(phase, advance, total)` matches the callbacks of gc/ and bundles/; a new
    phase ends the one before. Use it as a context manager: a phase that ends by an
    exception gets no final line (the error's one line says what happened).
    """

    def __init__(
        self,
        show: bool | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        byte_phases: Collection[str] = (),
        every_secs: float = LINE_SECS,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        terminal = self.stream.isatty()
        self.show = terminal if show is None else show
        self.bar = self.show and terminal  # else plain lines
        self.labels = dict(labels or {})
        self.byte_phases = set(byte_phases)
        self.every_secs = every_secs
        self.clock = clock
        self.phase: str | None = None
        self.done = 0
        self.total: int | None = None
        self._bar: Any = None
        self._shown = 0  # the count of the last plain line
        self._last = 0.0  # when it was written

    def update(
        self, phase: str, advance: int = 1, total: int | None = None, *, item: str | None = None
    ) -> None:
        """`advance` more done in `phase` (of `total`, None: not known; 0 only starts
        it); `item`: a few words about this step, beside the bar or after its line."""
        if not self.show:
            return
        if phase != self.phase:
            self._end(completed=True)
            self._begin(phase, total)
        elif total is not None:
            self.total = total
        self.done += advance
        if self._bar is not None:
            self._bar.update(advance, item)
        elif self.done != self._shown and self.clock() - self._last >= self.every_secs:
            self._line(item)

    def counter(self, phase: str, total: int | None = None) -> Callable[[int], None]:
        """An `advance` callback for one phase (what verify, sign, rebuild, pull take)."""
        return lambda advance: self.update(phase, advance, total)

    def break_line(self) -> None:
        """End the bar's line, so that what is printed next (a question, a listing) starts
        on its own; the bar draws again below it on its next update."""
        if self._bar is not None:
            self.stream.write("\n")
            self.stream.flush()

    def close(self, completed: bool = True) -> None:
        """End the current phase: the bar's last state, or the final count's line."""
        self._end(completed)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(completed=exc_type is None)

    def _label(self, phase: str) -> str:
        return self.labels.get(phase, phase)

    def _begin(self, phase: str, total: int | None) -> None:
        self.phase, self.done, self.total = phase, 0, total
        self._shown, self._last = 0, self.clock()
        if not self.bar:
            return
        in_bytes = phase in self.byte_phases
        self._bar = click.progressbar(
            length=max(total, 1) if total is not None else None,
            iterable=None if total is not None else _unknown(),
            label=self._label(phase),
            file=self.stream,
            show_pos=not in_bytes,
            show_percent=total is not None,
            item_show_func=_as_is,
        )
        self._bar.__enter__()

    def _end(self, completed: bool) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)  # a newline: what follows is not on the bar
            self._bar = None
        elif completed and self.phase is not None and self.done != self._shown:
            self._line(None)
        self.phase = None

    def _line(self, item: str | None) -> None:
        """One plain line: `label: done/total (pct)`, then `item`."""
        size: Callable[[int], str] = format_size if self.phase in self.byte_phases else str
        text = f"{self._label(self.phase or '')}: {size(self.done)}"
        if self.total is not None and self.done <= self.total:
            pct = 100 * self.done // max(self.total, 1)
            text += f"/{size(self.total)} ({pct}%)"
        if item:
            text += f"  {item}"
        click.echo(text, file=self.stream)
        self._shown, self._last = self.done, self.clock()


def _unknown() -> Any:
    """An iterable without a length, so that click's bar counts instead of showing a fraction."""
    yield from ()


def _as_is(item: str | None) -> str | None:
    return item
