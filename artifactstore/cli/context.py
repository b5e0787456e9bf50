"""What every command shares: the global options, the store they open, and how they fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click

from artifactstore import config as _config
from artifactstore.redact import redact

if TYPE_CHECKING:
    from artifactstore.index.repo import EntryIndex
    from artifactstore.store import Store

EXIT_USAGE = 2
EXIT_FAIL = 1


def fail(message: str, code: int = EXIT_FAIL) -> NoReturn:
    """One line on stderr, then exit: how every failure a person can cause ends
    (redacted here too: click's own messages and `str()` of any error end here)."""
    click.echo(f"artstore: error: {redact(message)}", err=True)
    sys.exit(code)


def confirm(
    yes: bool,
    question: str,
    what: str = "more than one entry",
    *,
    doing: str = "removing",
    verb: str = "remove",
) -> None:
    """A change that loses entries or objects takes a person's yes: without a terminal to
    ask (a script, `echo n |`), only --yes gives it."""
    if not yes and not sys.stdin.isatty():
        fail(
            f"not {doing} {what} without confirmation: no terminal to ask; "
            f"pass --yes to {verb} them",
            EXIT_USAGE,
        )
    if not yes and question:
        click.confirm(question, abort=True)


class Ctx:
    """The global options (`--url`, `--index`, `--namespace`), as config overrides."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides

    def settings(self, *, need_index: bool = True, **extra: Any) -> _config.Settings:
        merged = {**self.overrides, **{k: v for k, v in extra.items() if v is not None}}
        return _config.resolve(merged, need_index=need_index)

    @contextmanager
    def store(
        self,
        *,
        index_only: bool = False,
        objects: bool = True,
        changes: bool = False,
        **extra: Any,
    ) -> Iterator[Store]:
        """The store for one command; `index_only` commands work with the object store
        down (they may still try it, as `gc --dry-run` does); `objects=False` commands
        (`ls`, `stats`, `quota`) do not open it at all. `changes`: the command changes
        the index or deletes objects, so it refuses unless object store and index are
        one store (artifactstore.store.identity; a read-only store refuses by itself)."""
        from artifactstore.store import Store

        settings = self.settings(**extra)
        store = Store.open(settings, check_blobs=not index_only and objects, objects=objects)
        try:
            if changes and not settings.read_only:
                store.parts.writes.gate.require()
            yield store
        finally:
            store.close()

    @contextmanager
    def index(self, **extra: Any) -> Iterator[EntryIndex]:
        """The index alone, for commands that read or change nothing else (`ls`,
        `quota`): the object store is not opened, and the command gets the index (its
        `engine` for the index's functions), not the Store to reach through."""
        with self.store(index_only=True, objects=False, **extra) as store:
            yield store.parts.index


class PassThroughCommand(click.Command):
    """A command whose arguments after the first `--` are CMD, verbatim (its options are
    not ours), left in `ctx.meta["cmd"]`; `usage` is what help shows after the name."""

    usage: tuple[str, ...] = ("[OPTIONS]", "-- CMD [ARGS]...")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["cmd"] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return list(self.usage)
