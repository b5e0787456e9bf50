"""Setting a store up here: `fingerprint`, `db`, `demo`, `doctor`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from artifactstore import config as _config
from artifactstore.cli.context import EXIT_FAIL, Ctx, fail
from artifactstore.cli.render import (
    fingerprint_fields,
    json_option,
    print_fields,
    print_json,
    print_table,
)
from artifactstore.errors import one_line

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@click.command("fingerprint")
@json_option("Print JSON (input for --expect-fingerprint).")
@click.option("--backend", help="JAX backend to describe (default: JAX's default).")
def fingerprint_cmd(as_json: bool, backend: str | None) -> None:
    """Print this host's platform fingerprint."""
    from artifactstore.jaxhook import host_fingerprint

    try:
        fp = host_fingerprint(backend)
    except RuntimeError as exc:
        fail(f"cannot open JAX backend {backend or 'default'!r}: {one_line(exc)}")
    if as_json:
        print_json({**fp.to_dict(), "digest": fp.digest}, sort_keys=True)
        return
    print_fields(fingerprint_fields(fp))


@click.group("db")
def db_group() -> None:
    """Index schema: show or apply migrations."""


def _engine(obj: Ctx) -> tuple[_config.Settings, Engine]:
    from artifactstore.index import db

    settings = obj.settings()
    return settings, db.open_engine(settings.index_url, timeout_secs=settings.timeout_secs)


@db_group.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(obj: Ctx, revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.upgrade(engine, revision)
    click.echo(f"index {_config.redact_url(settings.index_url)} at revision {status.current}")


@db_group.command("current")
@click.pass_obj
def db_current(obj: Ctx) -> None:
    """Show the schema revision and whether it matches this version."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.schema_status(engine)
    print_fields(
        [
            ("index", _config.redact_url(settings.index_url)),
            ("revision", status.current or "(none)"),
            ("head", status.head),
            ("state", status.state.value),
        ]
    )
    if status.state is not db.SchemaState.CURRENT:
        sys.exit(EXIT_FAIL)


@click.command("demo")
@click.option(
    "--layers",
    type=click.IntRange(1, 200),
    default=10,
    show_default=True,
    help="Model depth; more layers compile longer.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary store and print its path.")
def demo_cmd(layers: int, keep: bool) -> None:
    """Run a compile-heavy example twice in fresh processes: cold, then warm."""
    from artifactstore.cli import demo

    demo.run(layers=layers, keep=keep, echo=click.echo)


@click.command("doctor")
@json_option()
@click.pass_obj
def doctor_cmd(obj: Ctx, as_json: bool) -> None:
    """Say whether the store would be used here and, if not, why and what to do."""
    from artifactstore.cli import doctor

    report = doctor.gather(obj.overrides)
    if as_json:
        print_json(report.to_json())
    else:
        status = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "-"}
        rows = [[c.label, status[c.status], c.detail] for c in report.checks.values()]
        print_table(["CHECK", "STATUS", "DETAIL"], rows)
        click.echo(f"verdict: {report.verdict}")
    if not report.ok:
        sys.exit(EXIT_FAIL)
