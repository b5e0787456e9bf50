"""The `artstore` group: global options, its commands, and how every failure ends.

Every failure a person can cause (bad URL, unknown command, unreachable
database, schema mismatch) ends as one line on stderr and a non-zero exit,
never a traceback; set ARTSTORE_DEBUG=1 to see one anyway. Ctrl-C (SIGINT) and
SIGTERM unwind every command through its cleanup (`artifactstore.interrupts`) and
end as `artstore: interrupted` (exit 130) or `artstore: terminated` (exit 143). A reader
that stops reading (`artstore ls | head`) is no failure: the command ends quietly, exit 0.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import click

from artifactstore import interrupts
from artifactstore.cli import (
    bundle_cmd,
    entries,
    gc_cmd,
    metrics_cmd,
    native_cmd,
    pull_cmd,
    run_cmd,
    setup_cmd,
    sign_cmd,
    verify_cmd,
    warm_cmd,
)
from artifactstore.cli.context import EXIT_USAGE, Ctx, fail
from artifactstore.config import help_text, typo_lines
from artifactstore.errors import ArtstoreError, StoreUnavailable, one_line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", help=help_text("url", "Object store: a directory, file:///path or s3://bucket/prefix")
)
@click.option("--index", help=help_text("index", "Index database URL"))
@click.option("--namespace", "-n", help=help_text("namespace", "Namespace"))
@click.version_option(package_name="artifactstore", prog_name="artstore")
@click.pass_context
def cli(ctx: click.Context, url: str | None, index: str | None, namespace: str | None) -> None:
    """artifactstore: a shared store for compiled JAX executables."""
    if ctx.invoked_subcommand != "doctor":  # doctor says it in a row of its own
        for line in typo_lines():  # a warning, not an error: the command still runs
            click.echo(f"artstore: warning: {line}", err=True)
    ctx.obj = Ctx({"url": url, "index": index, "namespace": namespace})


for _command in (
    entries.ls_cmd,
    entries.stats_cmd,
    verify_cmd.verify_cmd,
    entries.rm_cmd,
    sign_cmd.keygen_cmd,
    sign_cmd.sign_cmd,
    gc_cmd.gc_cmd,
    gc_cmd.fold_cmd,
    gc_cmd.quota_group,
    metrics_cmd.metrics_cmd,
    setup_cmd.fingerprint_cmd,
    warm_cmd.warm_cmd,
    run_cmd.run_cmd,
    pull_cmd.pull_cmd,
    native_cmd.native_group,
    bundle_cmd.export_cmd,
    bundle_cmd.import_cmd,
    setup_cmd.db_group,
    setup_cmd.demo_cmd,
    setup_cmd.doctor_cmd,
):
    cli.add_command(_command)


def _dispatch_errors(fn: Callable[[], None], index_url: Callable[[], str] = str) -> None:
    """Run `fn`, ending each failure as one line; an index failure says what it is
    (unreachable, permission, corrupt, missing grant: `index.diagnosis.diagnose`) and
    the command that fixes it. `index_url`: the command's index, for that."""
    from artifactstore.index.errors import DatabaseFailure

    try:
        fn()
    except StoreUnavailable as exc:
        cause = exc.__context__  # a driver's error, raised `from None` but kept
        if isinstance(cause, DatabaseFailure | PermissionError):
            fail(f"index database error: {_diagnosis(cause, index_url)}")
        fail(str(exc))
    except ArtstoreError as exc:
        fail(str(exc))
    except DatabaseFailure as exc:
        fail(f"index database error: {_diagnosis(exc, index_url)}")
    except PermissionError as exc:  # a store directory or index file this user may not read
        fail(_diagnosis(exc, index_url))
    except KeyboardInterrupt:
        _interrupted(signal.SIGINT)
    except interrupts.Terminated:
        _interrupted(signal.SIGTERM)
    except BrokenPipeError:
        raise  # `main` decides: the reader of stdout went away, or a real failure
    except click.exceptions.Abort:
        fail("aborted")
    except click.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        fail(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except Exception as exc:
        if os.environ.get("ARTSTORE_DEBUG"):
            raise
        fail(f"{one_line(exc)} (set ARTSTORE_DEBUG=1 for a traceback)")


def _diagnosis(exc: BaseException, index_url: Callable[[], str]) -> str:
    from artifactstore.index.diagnosis import diagnose

    try:
        url = index_url()
    except Exception:  # the configuration itself is what failed: no URL to name
        url = ""
    return str(diagnose(exc, url))


_stopping = threading.Event()


def _interrupted(signum: int) -> NoReturn:
    """The one line and exit code of an interrupt. A second signal while exiting (threads
    finishing what they hold) is ignored, and threads that fail meanwhile are silent."""
    for other in interrupts.SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    _stopping.set()
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    click.echo(f"artstore: {word}", err=True)
    sys.exit(interrupts.EXIT_CODES[signum])


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """No traceback from a thread cut short by an interrupt's cleanup."""
    if _stopping.is_set() and not os.environ.get("ARTSTORE_DEBUG"):
        return
    _default_excepthook(args)


_default_excepthook = threading.excepthook


def main() -> None:
    # ARTSTORE_URL in the environment activates the store in every Python process that
    # imports JAX (artifactstore_startup); this one's JAX (fingerprint, doctor, the specs
    # of `warm`) is the store's tool, not a program to route through it.
    startup = sys.modules.get("artifactstore_startup")
    if startup is not None:
        startup.disable()

    interrupts.install()
    threading.excepthook = _thread_failed

    opened: list[click.Context] = []

    def run() -> None:
        # As click's `main`, less its handling of Ctrl-C (a blank line and "Aborted!").
        try:
            with cli.make_context("artstore", sys.argv[1:]) as ctx:
                opened.append(ctx)
                cli.invoke(ctx)
        except click.exceptions.Exit as exc:
            if exc.exit_code:
                sys.exit(exc.exit_code)

    def index_url() -> str:
        obj = opened[0].obj if opened else None
        return obj.settings().index_url if isinstance(obj, Ctx) else ""

    try:
        _dispatch_errors(run, index_url)
        sys.stdout.flush()  # here, where a closed pipe is still ours to handle
    except BrokenPipeError as exc:
        if not _stdout_closed():
            fail(f"{one_line(exc)} (set ARTSTORE_DEBUG=1 for a traceback)")
        _reader_gone()


def _stdout_closed() -> bool:
    """Whether nobody reads stdout any more (a pipe whose reader exited, as `head` does)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _reader_gone() -> NoReturn:
    """End quietly, exit 0: `cmd | head` asked for part of the output, and in a `pipefail`
    script a 141 (SIGPIPE) would fail the pipeline. stdout goes to /dev/null first, so
    the interpreter's own flush at exit finds nothing to complain about."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(0)
