"""`artstore run -- CMD`: CMD with the store active in every Python process it starts."""

from __future__ import annotations

import sys

import click

from artifactstore.cli.context import Ctx, PassThroughCommand
from artifactstore.config import help_text
from artifactstore.errors import ArtstoreError


@click.command("run", cls=PassThroughCommand)
@click.option("--read-only", is_flag=True, help="Load from the store, never write to it.")
@click.option("--namespace", "-n", help=help_text("namespace", "Use this namespace"))
@click.option("--quiet", "-q", is_flag=True, help="No summary line at the end.")
@click.pass_context
def run_cmd(ctx: click.Context, read_only: bool, namespace: str | None, quiet: bool) -> None:
    """Run CMD with the store active in it and in every Python process it starts.

    No change to CMD: each Python process that imports JAX uses the store as if it had
    called artifactstore.configure() with these settings (ARTSTORE_* variables for the
    rest: local tier, thresholds, timeouts). A store that is down or misconfigured never
    stops CMD; its processes compile as usual and say so once. Prints one summary line
    on stderr at the end (hits, compiles, compile seconds saved) and exits with CMD's
    exit code.
    """
    from artifactstore.runtime import run

    obj: Ctx = ctx.obj
    command: list[str] | None = ctx.meta.get("cmd")
    if command is None:
        raise click.UsageError("give the command after --: artstore run -- CMD [ARGS]...", ctx)
    if not command:
        raise click.UsageError("no command after --", ctx)
    overrides = {**obj.overrides, "read_only": True if read_only else None}
    if namespace is not None:
        overrides["namespace"] = namespace
    try:
        obj.settings(**{k: v for k, v in overrides.items() if v is not None})
    except ArtstoreError as exc:
        # CMD is the user's program: it runs all the same, compiling as usual.
        click.echo(f"artstore run: {exc}; running the command without the store", err=True)
        overrides["off"] = True
    code, summary = run.run_command(command, overrides)
    summary.exit_code = code  # a command that failed early: its own error says why
    if not quiet and not overrides.get("off"):
        click.echo(summary.render("artstore run"), err=True)
    if code:
        sys.exit(code)
