"""`artstore warm`: fill the store from CI, by running a command or compiling specs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from artifactstore.cli.context import EXIT_FAIL, Ctx, PassThroughCommand
from artifactstore.cli.progress import Progress
from artifactstore.errors import ConfigError


class _WarmCommand(PassThroughCommand):
    usage = ("[OPTIONS]", "(MODULE:FUNCTION | -- CMD [ARGS]...)")


@click.command("warm", cls=_WarmCommand)
@click.argument("target", required=False, metavar="MODULE:FUNCTION")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="MODULE:FUNCTION: compile in this many worker processes.",
)
@click.option(
    "--expect-fingerprint",
    metavar="FILE|JSON",
    help="Fail unless this host matches the target (`artstore fingerprint --json` "
    "output from a target node).",
)
@click.option(
    "--min-entries",
    type=click.IntRange(min=0),
    metavar="N",
    help="Exit 1 unless at least N distinct entries were stored or loaded from the store by "
    "this run (for CI: a job that stored nothing fails).",
)
@click.option(
    "--report-json",
    type=click.Path(dir_okay=False),
    help="Also write the report as JSON to this file.",
)
@click.pass_context
def warm_cmd(
    ctx: click.Context,
    target: str | None,
    jobs: int,
    expect_fingerprint: str | None,
    min_entries: int | None,
    report_json: str | None,
) -> None:
    """Fill the store for this host's target, from CI.

    `artstore warm -- CMD [ARGS]...` runs CMD with the store in write mode in every Python
    process it starts (no change to CMD) and exits with CMD's exit code.
    `artstore warm MODULE:FUNCTION` compiles, without running, the specializations FUNCTION
    returns: (jax.jit function, argument specs) pairs, specs being pytrees of
    jax.ShapeDtypeStruct, or artifactstore.NamedSpec(fn, *specs, name=, version=) items,
    which build named executables (native and portable) for artifactstore.load.
    The report counts what happened in those processes: entries compiled and stored,
    loaded from the store, and compiled but not stored (and why: the write gate, the
    writer's role, a quota, a failed upload). Exits 1 if any failed or anything compiled
    was not stored, one line per reason, or with fewer entries than --min-entries.
    """
    from artifactstore.warm.command import run_command
    from artifactstore.warm.preflight import check_store, load_expected
    from artifactstore.warm.specs import run_specs

    obj: Ctx = ctx.obj
    command: list[str] | None = ctx.meta.get("cmd")
    if (target is None) == (command is None):
        raise click.UsageError("give MODULE:FUNCTION or -- CMD [ARGS]... (one of them)", ctx)
    if command is not None and not command:
        raise click.UsageError("no command after --", ctx)
    if command is not None and jobs != 1:
        raise click.UsageError("-j applies to MODULE:FUNCTION, not to -- CMD", ctx)
    expected = load_expected(expect_fingerprint) if expect_fingerprint else None
    if obj.settings(need_index=False).read_only:  # never turned into a writer by warm
        raise ConfigError(
            "artstore warm stores entries, and ARTSTORE_READ_ONLY says this process stores "
            "nothing: unset it (warm with writer credentials) to fill the store"
        )
    check_store(obj.settings(read_only=False))
    if command is not None:
        report = run_command(command, obj.overrides, expected)
    else:
        assert target is not None
        with _SpecsProgress() as display:
            report = run_specs(target, jobs, obj.overrides, expected, display.start)
    report.conclude(min_entries)
    click.echo(report.render())
    if report_json:
        with open(report_json, "w") as out:
            json.dump(report.to_json(), out, indent=2)
    if report.exit_code:
        sys.exit(report.exit_code)
    if report.failed or report.problems:
        sys.exit(EXIT_FAIL)


class _SpecsProgress(Progress):
    """Each specialization compiled: a bar with the running counts on a terminal, else a
    line for each (one is seconds of compiling) saying how it went. Off a terminal too:
    these lines are warm's log of results (a CI job's), not a progress display."""

    def __init__(self) -> None:
        super().__init__(True, every_secs=0)
        self.hits = self.compiled = self.failed = 0
        self.compile_secs = 0.0

    def _counts(self) -> str:
        return (
            f"hits {self.hits}  compiled {self.compiled}  failed {self.failed}  "
            f"compile {self.compile_secs:.1f} s"
        )

    def start(self, total: int) -> Callable[[dict[str, Any], int, int], None]:
        """The callback of `warm.specs.run_specs`, once it knows how many there are."""
        self.update("warming", 0, total, item=self._counts())
        return self.result

    def result(self, res: dict[str, Any], _done: int, total: int) -> None:
        status = res["status"]
        if status == "present":
            self.hits += 1
        elif status == "compiled":
            self.compiled += 1
            self.compile_secs += res["compile_secs"]
        else:
            self.failed += 1
        item = self._counts()
        if not self.bar:
            secs = res["compile_secs"]
            texts = {"compiled": f"compiled in {secs:.2f} s", "present": f"saves {secs:.2f} s"}
            item = f"{status} {res['name']}  {texts.get(status, res['error'])}  ({item})"
        self.update("warming", 1, total, item=item)
