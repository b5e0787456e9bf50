"""Commands on a namespace's entries: `ls`, `stats`, `verify`, `rm`."""

from __future__ import annotations

import io
import sys

import click

from artifactstore.cli.context import EXIT_FAIL, EXIT_USAGE, Ctx, fail
from artifactstore.cli.render import json_option, print_fields, print_json, print_table, safe, when
from artifactstore.sizes import format_seconds, format_size


@click.command("ls")
@json_option()
@click.option("--platform", help="Only entries for this backend (cpu, gpu, tpu).")
@click.option("--device-kind", help="Only entries for this device kind.")
@click.option("--jaxlib", help="Only entries built by this jaxlib version.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many entries.")
@click.pass_obj
def ls_cmd(
    obj: Ctx,
    as_json: bool,
    platform: str | None,
    device_kind: str | None,
    jaxlib: str | None,
    limit: int | None,
) -> None:
    """List entries, most recently used first."""
    from artifactstore.index.repo import Filters

    filters = Filters(platform=platform, device_kind=device_kind, jaxlib_version=jaxlib)
    with obj.store(index_only=True) as store:
        entries = []
        for entry in store.index.iter_entries(filters):
            entries.append(entry)
            if limit is not None and len(entries) >= limit:
                break
    if as_json:
        print_json([e.to_json() for e in entries])
        return
    if not entries:
        click.echo("no entries")
        return
    rows = [
        [
            e.key[:12],
            e.module_name[:40],
            e.platform,
            e.device_kind[:24],
            e.jaxlib_version,
            format_size(e.size),
            str(e.hits),
            when(e.last_access),
            e.signer or "unsigned",
        ]
        for e in entries
    ]
    headers = ["KEY", "MODULE", "PLATFORM", "DEVICE", "JAXLIB", "SIZE", "HITS", "LAST ACCESS",
               "SIGNER"]  # fmt: skip
    print_table(headers, rows, right={5, 6})


@click.command("stats")
@json_option()
@click.pass_obj
def stats_cmd(obj: Ctx, as_json: bool) -> None:
    """Entries, bytes, hits, misses and compile time saved."""
    with obj.store(index_only=True) as store:
        stats = store.index.stats()
        where = store.describe()
    lookups = stats.hits + stats.misses
    hit_rate = stats.hits / lookups if lookups else 0.0
    namespace = obj.settings().namespace
    if as_json:
        print_json(
            {
                "store": where,
                "namespace": namespace,
                "entries": stats.entries,
                "bytes": stats.bytes,
                "objects": stats.objects,
                "object_bytes": stats.object_bytes,
                "hits": stats.hits,
                "misses": stats.misses,
                "corrupt": stats.corrupt,
                "hit_rate": hit_rate,
                "compile_secs_saved": stats.compile_secs_saved,
            }
        )
        return
    print_fields(
        [
            ("store", where),
            ("namespace", namespace),
            ("entries", stats.entries),
            ("stored", format_size(stats.bytes)),
            ("hits", stats.hits),
            ("misses", stats.misses),
            ("hit rate", f"{100 * hit_rate:.1f}%"),
            ("corrupt objects seen", stats.corrupt),
            ("compile time saved", format_seconds(stats.compile_secs_saved)),
        ]
    )


@click.command("verify")
@json_option()
@click.option(
    "--repair",
    is_flag=True,
    help="Quarantine corrupt objects; drop dangling entries; republish or withdraw manifests.",
)
@click.option(
    "--grace",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="Unreferenced objects younger than this are puts in flight, not orphans.",
)
@click.pass_obj
def verify_cmd(obj: Ctx, as_json: bool, repair: bool, grace: str) -> None:
    """Check every object's digest; cross-check objects, entries and manifests."""
    from artifactstore.gc.verify import verify
    from artifactstore.sizes import parse_duration

    grace_secs = parse_duration(grace)

    with obj.store() as store:
        show = sys.stderr.isatty() and not as_json
        with click.progressbar(
            length=store.index.stats().objects or 1,
            label="verifying",
            file=sys.stderr if show else io.StringIO(),
        ) as bar:
            report = verify(store, repair=repair, progress=bar.update, grace_secs=grace_secs)
    if as_json:
        print_json(report.to_json())
    else:
        click.echo(
            f"checked {report.objects_checked} objects ({format_size(report.bytes_checked)})"
        )
        for title, items in (
            ("corrupt objects", report.corrupt),
            ("entries without object", report.entries_without_object),
            ("objects without entry", report.objects_without_entry),
            ("quarantined objects", report.quarantined),
            ("entries without manifest", report.manifests_missing),
            ("manifests without entry", report.manifests_without_entry),
            ("manifests without object", report.manifests_without_object),
            ("unsigned entries", report.unsigned),
            ("badly signed entries", report.bad_signature),
            ("entries signed by an untrusted key", report.untrusted_key),
        ):
            if title.startswith(("badly", "entries signed")) and not report.signatures_checked:
                continue
            click.echo(f"{title}: {len(items)}")
            for item in items[:20]:
                click.echo(f"  {safe(item)}")
            if len(items) > 20:
                click.echo(f"  ... and {len(items) - 20} more")
        signers = ", ".join(f"{safe(name)} ({n})" for name, n in sorted(report.signers.items()))
        click.echo(f"signed by: {signers or 'nobody'}")
        if not report.signatures_checked:
            click.echo(
                "signatures not checked: set ARTSTORE_TRUSTED_KEYS to check them "
                "(unsigned entries are loaded by readers without trusted keys)"
            )
        if report.repaired:
            click.echo(
                "repaired: corrupt objects quarantined, dangling entries removed, "
                "manifests republished from their entries or withdrawn"
            )
        click.echo("OK" if report.ok else "PROBLEMS FOUND")
    if not report.ok and not report.repaired:
        sys.exit(EXIT_FAIL)


@click.command("rm")
@click.argument("keys", nargs=-1)
@click.option("--all", "remove_all", is_flag=True, help="Remove every entry of the namespace.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation with --all.")
@click.pass_obj
def rm_cmd(obj: Ctx, keys: tuple[str, ...], remove_all: bool, yes: bool) -> None:
    """Remove entries by KEY (or a unique prefix of 8+ characters, as `ls` shows)."""
    from artifactstore.gc.remove import remove, resolve_keys

    if bool(keys) == remove_all:
        fail("give KEY... or --all (not both): see `artstore rm --help`", EXIT_USAGE)
    for key in keys:
        if len(key) < 8 or any(c not in "0123456789abcdefABCDEF" for c in key):
            fail(
                f"invalid key {key!r}: use a key or a hex prefix of at least 8 characters "
                "as `artstore ls` prints it",
                EXIT_USAGE,
            )
    with obj.store() as store:
        if remove_all:
            if not yes and sys.stdin.isatty():
                click.confirm(f"remove every entry in namespace {store.namespace!r}?", abort=True)
            report = remove(store, None)
        else:
            full, unknown = resolve_keys(store, keys)
            if unknown:
                fail(f"no entry matches {unknown[0]!r}: check `artstore ls`")
            report = remove(store, full)
    click.echo(
        f"removed {report.entries} entries, {report.objects} objects ({format_size(report.bytes)})"
    )
