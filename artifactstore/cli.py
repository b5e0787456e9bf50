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
@click.option(
    "--grace",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="Unreferenced objects younger than this are puts in flight, not orphans.",
)
@click.pass_obj
def verify_cmd(obj: _Ctx, as_json: bool, repair: bool, grace: str) -> None:
    """Check every object's digest and cross-check objects against entries."""
    from artifactstore.gc.verify import verify
    from artifactstore.sizes import parse_duration

    grace_secs = parse_duration(grace)

    with obj.store() as store:
        show = sys.stderr.isatty() and not as_json
        with click.progressbar(length=store.index.stats().objects or 1, label="verifying",
                               file=sys.stderr if show else io.StringIO()) as bar:  # fmt: skip
            report = verify(store, repair=repair, progress=bar.update, grace_secs=grace_secs)
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
    from artifactstore.gc.remove import remove, resolve_keys

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
            report = remove(store, None)
        else:
            full, unknown = resolve_keys(store, keys)
            if unknown:
                _fail(f"no entry matches {unknown[0]!r}: check `artstore ls`")
            report = remove(store, full)
    click.echo(f"removed {report.entries} entries, {report.objects} objects "
               f"({format_size(report.bytes)})")  # fmt: skip


# -- eviction: gc and quotas ------------------------------------------------
@cli.command("gc")
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Evict least-recently-used entries until the namespace fits in SIZE "
    "(500G, 1.5TiB, 800MB; decimal and binary units). A quota, if smaller, wins.",
)
@click.option(
    "--older-than",
    metavar="DURATION",
    help="Also evict entries unused for DURATION (30d, 12h, 90m, 1w, 45s).",
)
@click.option(
    "--jaxlib-older-than",
    metavar="VERSION",
    help="Also evict entries built by jaxlib versions older than VERSION.",
)
@click.option(
    "--grace",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="Never delete an unreferenced object younger than this (puts in flight).",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to collect (repeatable; default: the global --namespace).",
)
@click.option("--all-namespaces", is_flag=True, help="Collect every namespace in the index.")
@click.option("--dry-run", is_flag=True, help="Print what would go, delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (removals and summary).")
@click.option(
    "--no-reconcile",
    is_flag=True,
    help="Skip listing the object store for orphans and entries without objects.",
)
@click.option("--wait", is_flag=True, help="Wait for a running gc instead of failing.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bars on stderr [default: when stderr is a terminal].",
)
@click.pass_obj
def gc_cmd(
    obj: _Ctx, max_size: str | None, older_than: str | None, jaxlib_older_than: str | None,
    grace: str, namespaces: tuple[str, ...], all_namespaces: bool, dry_run: bool,
    as_json: bool, no_reconcile: bool, wait: bool, progress: bool | None,
) -> None:  # fmt: skip
    """Evict entries (LRU, quotas, age, old jaxlib), then objects nothing references."""
    from artifactstore import gc
    from artifactstore.gc.output import Bars, Output
    from artifactstore.sizes import parse_duration, parse_size

    if namespaces and all_namespaces:
        _fail("give --namespace or --all-namespaces, not both", EXIT_USAGE)
    if jaxlib_older_than is not None:
        gc.old_jaxlib_versions([], jaxlib_older_than)  # validates before opening anything
    policy = gc.Policy(
        max_bytes=parse_size(max_size) if max_size is not None else None,
        older_than_secs=parse_duration(older_than) if older_than is not None else None,
        jaxlib_older_than=jaxlib_older_than,
        grace_secs=parse_duration(grace),
        reconcile=not no_reconcile,
        dry_run=dry_run,
    )
    targets: list[str | None] = list(namespaces) or [None]
    if all_namespaces:
        from artifactstore.index.quotas import namespaces as all_ns

        with obj.store() as store:
            targets = list(all_ns(store.engine)) or [None]
    out = Output(as_json=as_json, dry_run=dry_run, several=len(targets) > 1)
    bars = Bars(sys.stderr.isatty() if progress is None else progress)
    out.begin()
    for namespace in targets:
        with obj.store(namespace=namespace) as store:
            out.begin_namespace(store.namespace)
            try:
                report = gc.collect(store, policy, on_remove=out.item, progress=bars.update,
                                    wait=wait)  # fmt: skip
            finally:
                bars.close()
        out.end_namespace(report)
    out.finish()


@cli.group("quota")
def quota_group() -> None:
    """Per-namespace size quotas, enforced by `artstore gc`."""


@quota_group.command("set")
@click.argument("namespace")
@click.argument("size")
@click.pass_obj
def quota_set(obj: _Ctx, namespace: str, size: str) -> None:
    """Limit NAMESPACE to SIZE (500G, 1.5TiB, 800MB)."""
    from artifactstore.index import quotas
    from artifactstore.sizes import parse_size

    _config.check_namespace(namespace)
    max_bytes = parse_size(size)
    with obj.store() as store:
        if store.read_only:
            _fail("quotas are kept in the index: unset ARTSTORE_READ_ONLY to set one")
        quotas.set_quota(store.engine, namespace, max_bytes)
    click.echo(f"quota of {namespace}: {format_size(max_bytes)} ({max_bytes} bytes)")


@quota_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def quota_ls(obj: _Ctx, as_json: bool) -> None:
    """Quotas with each namespace's current size."""
    from artifactstore.index import quotas
    from artifactstore.index.eviction import EvictionIndex

    with obj.store() as store:
        rows = [
            (ns, limit, EvictionIndex(store.engine, ns).referenced_bytes())
            for ns, limit in quotas.list_quotas(store.engine)
        ]
    if as_json:
        click.echo(json.dumps([{"namespace": ns, "max_bytes": limit, "bytes": used}
                               for ns, limit, used in rows], indent=2))  # fmt: skip
        return
    if not rows:
        click.echo("no quotas")
        return
    table = [[ns, format_size(limit), format_size(used), f"{100 * used / limit:.0f}%"
              if limit else "-"] for ns, limit, used in rows]  # fmt: skip
    click.echo(_table(["NAMESPACE", "QUOTA", "USED", "USE"], table, right={1, 2, 3}))


@quota_group.command("rm")
@click.argument("namespace")
@click.pass_obj
def quota_rm(obj: _Ctx, namespace: str) -> None:
    """Remove NAMESPACE's quota."""
    from artifactstore.index import quotas

    with obj.store() as store:
        if not quotas.remove_quota(store.engine, namespace):
            _fail(f"namespace {namespace!r} has no quota: see `artstore quota ls`")
    click.echo(f"quota of {namespace} removed")


@cli.command("fingerprint")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (input for --expect-fingerprint)."
)
@click.option("--backend", help="JAX backend to describe (default: JAX's default).")
def fingerprint_cmd(as_json: bool, backend: str | None) -> None:
    """Print this host's platform fingerprint."""
    from artifactstore.jaxhook import host_fingerprint

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


class _WarmCommand(click.Command):
    """Everything after the first `--` is CMD, verbatim: its options are not ours."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["warm_cmd"] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "(MODULE:FUNCTION | -- CMD [ARGS]...)"]


@cli.command("warm", cls=_WarmCommand)
@click.argument("target", required=False, metavar="MODULE:FUNCTION")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="MODULE:FUNCTION: compile in this many worker processes.")  # fmt: skip
@click.option("--expect-fingerprint", metavar="FILE|JSON",
              help="Fail unless this host matches the target (`artstore fingerprint --json` "
              "output from a target node).")  # fmt: skip
@click.option("--report-json", type=click.Path(dir_okay=False),
              help="Also write the report as JSON to this file.")  # fmt: skip
@click.pass_context
def warm_cmd(ctx: click.Context, target: str | None, jobs: int, expect_fingerprint: str | None,
             report_json: str | None) -> None:  # fmt: skip
    """Fill the store for this host's target, from CI.

    `artstore warm -- CMD [ARGS]...` runs CMD with the store in write mode in every Python
    process it starts (no change to CMD) and exits with CMD's exit code.
    `artstore warm MODULE:FUNCTION` compiles, without running, the specializations FUNCTION
    returns: (jax.jit function, argument specs) pairs, specs being pytrees of
    jax.ShapeDtypeStruct. Exits 1 if any failed or anything could not be stored.
    """
    from artifactstore import warm

    obj: _Ctx = ctx.obj
    command: list[str] | None = ctx.meta.get("warm_cmd")
    if (target is None) == (command is None):
        raise click.UsageError("give MODULE:FUNCTION or -- CMD [ARGS]... (one of them)", ctx)
    if command is not None and not command:
        raise click.UsageError("no command after --", ctx)
    if command is not None and jobs != 1:
        raise click.UsageError("-j applies to MODULE:FUNCTION, not to -- CMD", ctx)
    expected = warm.load_expected(expect_fingerprint) if expect_fingerprint else None
    warm.check_store(obj.settings(read_only=False))
    if command is not None:
        report = warm.run_command(command, obj.overrides, expected)
    else:
        assert target is not None
        display = warm.ProgressDisplay()
        try:
            report = warm.run_specs(target, jobs, obj.overrides, expected, display.start)
        finally:
            display.close()
    click.echo(report.render())
    if report_json:
        with open(report_json, "w") as out:
            json.dump(report.to_json(), out, indent=2)
    if report.exit_code:
        sys.exit(report.exit_code)
    if report.failed or report.problems:
        sys.exit(EXIT_FAIL)


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


@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def doctor_cmd(obj: _Ctx, as_json: bool) -> None:
    """Say whether the store would be used here and, if not, why and what to do."""
    from artifactstore import doctor

    report = doctor.gather(obj.overrides)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        status = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "-"}
        rows = [[c.label, status[c.status], c.detail] for c in report.checks.values()]
        click.echo(_table(["CHECK", "STATUS", "DETAIL"], rows))
        click.echo(f"verdict: {report.verdict}")
    if not report.ok:
        sys.exit(EXIT_FAIL)


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
