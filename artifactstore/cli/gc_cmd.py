"""Eviction commands: `gc` and the `quota` group it enforces."""

from __future__ import annotations

import click

from artifactstore import config as _config
from artifactstore.cli.context import EXIT_USAGE, Ctx, fail
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import json_option, print_json, print_table
from artifactstore.formats.sizes import format_limit, format_size


@click.command("gc")
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
@json_option("Print JSON (removals and summary).")
@click.option(
    "--no-reconcile",
    is_flag=True,
    help="Skip listing the object store for orphans and entries without objects.",
)
@click.option(
    "--allow-missing",
    is_flag=True,
    help="Drop entries whose object is gone even when they are more than 10% of the "
    "namespace (gc refuses that otherwise: a wrong bucket looks the same).",
)
@click.option("--wait", is_flag=True, help="Wait for a running gc instead of failing.")
@progress_option
@click.pass_obj
def gc_cmd(
    obj: Ctx,
    max_size: str | None,
    older_than: str | None,
    jaxlib_older_than: str | None,
    grace: str,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    dry_run: bool,
    as_json: bool,
    no_reconcile: bool,
    allow_missing: bool,
    wait: bool,
    progress: bool | None,
) -> None:
    """Evict entries (LRU, quotas, age, old jaxlib), then objects nothing references."""
    from artifactstore import gc
    from artifactstore.cli.gc_output import DRY_RUN_PHASES, PHASES, Output
    from artifactstore.formats.sizes import parse_duration, parse_size

    if namespaces and all_namespaces:
        fail("give --namespace or --all-namespaces, not both", EXIT_USAGE)
    if jaxlib_older_than is not None:
        gc.old_jaxlib_versions([], jaxlib_older_than)  # validates before opening anything
    policy = gc.Policy(
        max_bytes=parse_size(max_size) if max_size is not None else None,
        older_than_secs=parse_duration(older_than) if older_than is not None else None,
        jaxlib_older_than=jaxlib_older_than,
        grace_secs=parse_duration(grace),
        reconcile=not no_reconcile,
        dry_run=dry_run,
        allow_missing=allow_missing,
    )
    targets: list[str | None] = list(namespaces) or [None]
    if all_namespaces:
        from artifactstore.index.quotas import namespaces as all_ns

        with obj.index() as index:
            targets = list(all_ns(index.engine)) or [None]
    out = Output(as_json=as_json, dry_run=dry_run, several=len(targets) > 1)
    out.begin()
    for namespace in targets:
        with (
            obj.store(namespace=namespace, index_only=dry_run, changes=not dry_run) as store,
            Progress(progress, labels=DRY_RUN_PHASES if dry_run else PHASES) as shown,
        ):
            out.begin_namespace(store.parts.namespace)
            report = gc.collect(store, policy, on_remove=out.item, progress=shown.update, wait=wait)
        out.end_namespace(report)
    out.finish()


@click.command("fold")
@json_option()
@click.option(
    "--max-journals",
    type=click.IntRange(min=1),
    default=None,
    help="Fold at most this many journals (default 500); the rest waits.",
)
@click.pass_obj
def fold_cmd(obj: Ctx, as_json: bool, max_journals: int | None) -> None:
    """Fold readers' hit journals into the index (gc does too; run it every few minutes
    from cron where gc runs less often, so that `stats` and LRU see the cluster's hits).
    A run folds at most 500 journals or 8 MiB of them; it says how many it left."""
    from artifactstore.cli.gc_output import fold_line
    from artifactstore.gc.journals import fold_journals
    from artifactstore.index.accesses import fold_accesses

    with obj.store(changes=True) as store:
        if store.parts.read_only:
            fail("fold writes the index: unset ARTSTORE_READ_ONLY to run it", EXIT_USAGE)
        fold = fold_journals(store.parts, max_journals=max_journals)
        rows = fold_accesses(store.parts.engine, store.parts.namespace)
    if as_json:
        print_json(
            {
                "namespace": store.parts.namespace,
                "journals_folded": fold.journals,
                "journals_refused": fold.refused,
                "journals_set_aside": fold.set_aside,
                "journals_left": fold.left,
                "hits": fold.hits,
                "accesses_folded": rows,
            }
        )
        return
    line = fold_line(fold.journals, fold.refused, fold.set_aside, fold.left)
    click.echo(
        f"namespace {store.parts.namespace}: {line} ({fold.hits} hits); {rows} access rows applied"
    )


@click.group("quota")
def quota_group() -> None:
    """Per-namespace size quotas, enforced by `artstore gc`."""


@quota_group.command("set")
@click.argument("namespace")
@click.argument("size")
@click.pass_obj
def quota_set(obj: Ctx, namespace: str, size: str) -> None:
    """Limit NAMESPACE to SIZE (500G, 1.5TiB, 800MB)."""
    from artifactstore.formats.sizes import parse_size
    from artifactstore.index import quotas

    _config.check_namespace(namespace)
    max_bytes = parse_size(size)
    # A read-only index refuses, saying why.
    with obj.index() as index:
        quotas.set_quota(index.engine, namespace, max_bytes)
    click.echo(f"quota of {namespace}: {format_limit(max_bytes)} ({max_bytes} bytes)")


@quota_group.command("ls")
@json_option()
@click.pass_obj
def quota_ls(obj: Ctx, as_json: bool) -> None:
    """Quotas with each namespace's current size."""
    from artifactstore.index import quotas
    from artifactstore.index.eviction import EvictionIndex

    with obj.index() as index:
        rows = [
            (ns, limit, EvictionIndex(index.engine, ns).referenced_bytes())
            for ns, limit in quotas.list_quotas(index.engine)
        ]
    if as_json:
        print_json(
            [{"namespace": ns, "max_bytes": limit, "bytes": used} for ns, limit, used in rows]
        )
        return
    if not rows:
        click.echo("no quotas")
        return
    table = [
        [ns, format_limit(limit), format_size(used), f"{100 * used / limit:.0f}%" if limit else "-"]
        for ns, limit, used in rows
    ]
    print_table(["NAMESPACE", "QUOTA", "USED", "USE"], table, right={1, 2, 3})


@quota_group.command("rm")
@click.argument("namespace")
@click.pass_obj
def quota_rm(obj: Ctx, namespace: str) -> None:
    """Remove NAMESPACE's quota."""
    from artifactstore.index import quotas

    with obj.index() as index:
        if not quotas.remove_quota(index.engine, namespace):
            fail(f"namespace {namespace!r} has no quota: see `artstore quota ls`")
    click.echo(f"quota of {namespace} removed")
