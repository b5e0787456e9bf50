"""`artstore`: the operator's command line.

Every failure a person can cause (bad URL, unknown command, unreachable
database, schema mismatch) ends as one line on stderr and a non-zero exit,
never a traceback; set ARTSTORE_DEBUG=1 to see one anyway.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from artifactstore import config as _config
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.sizes import format_seconds, format_size

EXIT_USAGE = 2
EXIT_FAIL = 1


def _fail(message: str, code: int = EXIT_FAIL) -> NoReturn:
    click.echo(f"artstore: error: {message}", err=True)
    sys.exit(code)


class _Ctx:
    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides

    def settings(self, **extra: Any) -> _config.Settings:
        merged = {**self.overrides, **{k: v for k, v in extra.items() if v is not None}}
        return _config.resolve(merged)

    @contextmanager
    def store(self, **extra: Any) -> Iterator[Any]:
        from artifactstore.store import Store

        store = Store.open(self.settings(**extra))
        try:
            yield store
        finally:
            store.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", help="Object store: a directory, file:///path or s3://bucket/prefix "
              "[env ARTSTORE_URL; default: user cache dir].")  # fmt: skip
@click.option("--index", help="Index database URL [env ARTSTORE_INDEX].")
@click.option("--namespace", "-n", help="Namespace [env ARTSTORE_NAMESPACE; default 'default'].")
@click.version_option(package_name="artifactstore", prog_name="artstore")
@click.pass_context
def cli(ctx: click.Context, url: str | None, index: str | None, namespace: str | None) -> None:
    """artifactstore: a shared store for compiled JAX executables."""
    ctx.obj = _Ctx({"url": url, "index": index, "namespace": namespace})


def _when(dt: datetime) -> str:
    delta = (datetime.now(UTC) - dt).total_seconds()
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    return dt.strftime("%Y-%m-%d")


def _table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right or set()
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]  # fmt: skip

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])


@cli.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--platform", help="Only entries for this backend (cpu, gpu, tpu).")
@click.option("--device-kind", help="Only entries for this device kind.")
@click.option("--jaxlib", help="Only entries built by this jaxlib version.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many entries.")
@click.pass_obj
def ls_cmd(
    obj: _Ctx, as_json: bool, platform: str | None, device_kind: str | None,
    jaxlib: str | None, limit: int | None,
) -> None:  # fmt: skip
    """List entries, most recently used first."""
    from artifactstore.index.repo import Filters

    filters = Filters(platform=platform, device_kind=device_kind, jaxlib_version=jaxlib)
    with obj.store() as store:
        entries = []
        for entry in store.index.iter_entries(filters):
            entries.append(entry)
            if limit is not None and len(entries) >= limit:
                break
    if as_json:
        click.echo(json.dumps([e.to_json() for e in entries], indent=2))
        return
    if not entries:
        click.echo("no entries")
        return
    rows = [
        [e.key[:12], e.module_name[:40], e.platform, e.device_kind[:24], e.jaxlib_version,
         format_size(e.size), str(e.hits), _when(e.last_access)]
        for e in entries
    ]  # fmt: skip
    headers = ["KEY", "MODULE", "PLATFORM", "DEVICE", "JAXLIB", "SIZE", "HITS", "LAST ACCESS"]
    click.echo(_table(headers, rows, right={5, 6}))


@cli.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def stats_cmd(obj: _Ctx, as_json: bool) -> None:
    """Entries, bytes, hits, misses and compile time saved."""
    with obj.store() as store:
        stats = store.index.stats()
        where = store.describe()
    data = {
        "store": where,
        "namespace": obj.settings().namespace,
        "entries": stats.entries,
        "bytes": stats.bytes,
        "objects": stats.objects,
        "object_bytes": stats.object_bytes,
        "hits": stats.hits,
        "misses": stats.misses,
        "corrupt": stats.corrupt,
        "hit_rate": stats.hits / (stats.hits + stats.misses) if stats.hits + stats.misses else 0.0,
        "compile_secs_saved": stats.compile_secs_saved,
    }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    lines = [
        ("store", where),
        ("namespace", str(data["namespace"])),
        ("entries", str(stats.entries)),
        ("stored", format_size(stats.bytes)),
        ("hits", str(stats.hits)),
        ("misses", str(stats.misses)),
        ("hit rate", f"{100 * float(data['hit_rate']):.1f}%"),  # type: ignore[arg-type]
        ("corrupt objects seen", str(stats.corrupt)),
        ("compile time saved", format_seconds(stats.compile_secs_saved)),
    ]
    for name, value in lines:
        click.echo(f"{name + ':':<22}{value}")


@cli.command("verify")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--repair", is_flag=True, help="Quarantine corrupt objects; drop dangling entries.")
@click.pass_obj
def verify_cmd(obj: _Ctx, as_json: bool, repair: bool) -> None:
    """Check every object's digest and cross-check objects against entries."""
    from artifactstore import maintenance

    with obj.store() as store:
        show = sys.stderr.isatty() and not as_json
        with click.progressbar(length=store.index.stats().objects or 1, label="verifying",
                               file=sys.stderr if show else io.StringIO()) as bar:  # fmt: skip
            report = maintenance.verify(store, repair=repair, progress=bar.update)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(
            f"checked {report.objects_checked} objects ({format_size(report.bytes_checked)})"
        )
        for title, items in (
            ("corrupt objects", report.corrupt),
            ("entries without object", report.entries_without_object),
            ("objects without entry", report.objects_without_entry),
            ("quarantined objects", report.quarantined),
        ):
            click.echo(f"{title}: {len(items)}")
            for item in items[:20]:
                click.echo(f"  {item}")
            if len(items) > 20:
                click.echo(f"  ... and {len(items) - 20} more")
        if report.repaired:
            click.echo("repaired: corrupt objects quarantined, dangling entries removed")
        click.echo("OK" if report.ok else "PROBLEMS FOUND")
    if not report.ok and not report.repaired:
        sys.exit(EXIT_FAIL)


@cli.command("rm")
@click.argument("keys", nargs=-1)
@click.option("--all", "remove_all", is_flag=True, help="Remove every entry of the namespace.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation with --all.")
@click.pass_obj
def rm_cmd(obj: _Ctx, keys: tuple[str, ...], remove_all: bool, yes: bool) -> None:
    """Remove entries by KEY (or a unique prefix of 8+ characters, as `ls` shows)."""
    from artifactstore import maintenance

    if bool(keys) == remove_all:
        _fail("give KEY... or --all (not both): see `artstore rm --help`", EXIT_USAGE)
    for key in keys:
        if len(key) < 8 or any(c not in "0123456789abcdefABCDEF" for c in key):
            _fail(f"invalid key {key!r}: use a key or a hex prefix of at least 8 characters "
                  "as `artstore ls` prints it", EXIT_USAGE)  # fmt: skip
    with obj.store() as store:
        if remove_all:
            if not yes and sys.stdin.isatty():
                click.confirm(f"remove every entry in namespace {store.namespace!r}?", abort=True)
            report = maintenance.remove(store, None)
        else:
            full, unknown = maintenance.resolve_keys(store, keys)
            if unknown:
                _fail(f"no entry matches {unknown[0]!r}: check `artstore ls`")
            report = maintenance.remove(store, full)
    click.echo(f"removed {report.entries} entries, {report.objects} objects "
               f"({format_size(report.bytes)})")  # fmt: skip


@cli.command("fingerprint")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (input for --expect-fingerprint)."
)
@click.option("--backend", help="JAX backend to describe (default: JAX's default).")
def fingerprint_cmd(as_json: bool, backend: str | None) -> None:
    """Print this host's platform fingerprint."""
    from artifactstore.jax_integration import host_fingerprint

    try:
        fp = host_fingerprint(backend)
    except RuntimeError as exc:
        _fail(f"cannot open JAX backend {backend or 'default'!r}: {one_line(exc)}")
    data = {**fp.to_dict(), "digest": fp.digest}
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for name in ("digest", "platform", "platform_version", "device_kind", "device_count",
                 "jax_version", "jaxlib_version", "cpu_arch", "os"):  # fmt: skip
        click.echo(f"{name + ':':<18}{data[name]}")
    click.echo(f"{'cpu_features:':<18}{' '.join(fp.cpu_features) or '(none detected)'}")


@cli.group("db")
def db_group() -> None:
    """Index schema: show or apply migrations."""


def _engine(obj: _Ctx) -> Any:
    from artifactstore.index import db

    settings = obj.settings()
    return settings, db.open_engine(settings.index_url, timeout_secs=settings.timeout_secs)


@db_group.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(obj: _Ctx, revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.upgrade(engine, revision)
    click.echo(f"index {_config.redact_url(settings.index_url)} at revision {status.current}")


@db_group.command("current")
@click.pass_obj
def db_current(obj: _Ctx) -> None:
    """Show the schema revision and whether it matches this version."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.schema_status(engine)
    click.echo(f"index:    {_config.redact_url(settings.index_url)}")
    click.echo(f"revision: {status.current or '(none)'}")
    click.echo(f"head:     {status.head}")
    click.echo(f"state:    {status.state.value}")
    if status.state is not db.SchemaState.CURRENT:
        sys.exit(EXIT_FAIL)


@cli.command("demo")
@click.option("--layers", type=click.IntRange(1, 200), default=10, show_default=True,
              help="Model depth; more layers compile longer.")  # fmt: skip
@click.option("--keep", is_flag=True, help="Keep the temporary store and print its path.")
def demo_cmd(layers: int, keep: bool) -> None:
    """Run a compile-heavy example twice in fresh processes: cold, then warm."""
    from artifactstore import demo

    demo.run(layers=layers, keep=keep, echo=click.echo)


def _dispatch_errors(fn: Any) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        fn()
    except ArtstoreError as exc:
        _fail(str(exc))
    except SQLAlchemyError as exc:
        reason = one_line(getattr(exc, "orig", None) or exc)
        _fail(f"index database error ({reason}): check ARTSTORE_INDEX and the database server")
    except click.exceptions.Abort:
        _fail("aborted")
    except click.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        _fail(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:
        if os.environ.get("ARTSTORE_DEBUG"):
            raise
        _fail(f"{one_line(exc)} (set ARTSTORE_DEBUG=1 for a traceback)")


def main() -> None:
    def run() -> None:
        code = cli.main(standalone_mode=False, prog_name="artstore")
        if isinstance(code, int) and code:
            sys.exit(code)

    _dispatch_errors(run)
