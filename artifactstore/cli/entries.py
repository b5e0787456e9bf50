"""Commands on a namespace's entries: `ls`, `stats`, `rm` (`verify`: verify_cmd)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from artifactstore.cli.context import EXIT_USAGE, Ctx, confirm, fail
from artifactstore.cli.render import (
    json_option,
    print_fields,
    print_json,
    print_table,
    safe,
    short_keys,
    when,
)
from artifactstore.formats.counters import with_aliases
from artifactstore.formats.sizes import format_seconds, format_size

if TYPE_CHECKING:
    from artifactstore.index.repo import EntryInfo
    from artifactstore.index.usage import UsageGroup


@click.command("ls")
@json_option()
@click.option(
    "--platform",
    help="Only entries for this backend (cpu, gpu, tpu; torch-xla: its files; "
    "iree-llvm-cpu: native modules).",
)
@click.option("--device-kind", help="Only entries for this device kind.")
@click.option("--jaxlib", help="Only entries built by this jaxlib version.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many entries.")
@click.option(
    "--named",
    is_flag=True,
    help="Only named executables (artifactstore.compiled), by name and version.",
)
@click.option(
    "--removed",
    is_flag=True,
    help="Instead: the removal records of named versions (`rm --name`), and whether "
    "they are obeyed. Lists the object store's manifests.",
)
@click.pass_obj
def ls_cmd(
    obj: Ctx,
    as_json: bool,
    platform: str | None,
    device_kind: str | None,
    jaxlib: str | None,
    limit: int | None,
    named: bool,
    removed: bool,
) -> None:
    """List entries, most recently used first. Reads only the index (--removed: the
    object store)."""
    from artifactstore.index.repo import Filters
    from artifactstore.named.keys import MODULE_PREFIX

    if removed:
        from artifactstore.cli.removals import list_removals

        list_removals(obj, as_json)
        return

    filters = Filters(
        platform=platform,
        device_kind=device_kind,
        jaxlib_version=jaxlib,
        module_prefix=MODULE_PREFIX if named else None,
    )
    with obj.index() as index:
        entries = []
        for entry in index.iter_entries(filters):
            entries.append(entry)
            if limit is not None and len(entries) >= limit:
                break
    if named:
        _print_named(entries, as_json)
        return
    if as_json:
        print_json([e.to_json() for e in entries])
        return
    if not entries:
        click.echo("no entries")
        return
    keys = short_keys([e.key for e in entries])
    rows = [
        [
            keys[e.key],
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
    headers = [
        "KEY",
        "MODULE",
        "PLATFORM",
        "DEVICE",
        "JAXLIB",
        "SIZE",
        "HITS",
        "LAST ACCESS",
        "SIGNER",
    ]
    print_table(headers, rows, right={5, 6})


def _print_named(entries: list[EntryInfo], as_json: bool) -> None:
    """`ls --named`: one row per entry of a named executable (native per fingerprint,
    and the portable `jax.export` form, shown as platform `portable`)."""
    from artifactstore.named.keys import PORTABLE, parse_module_name

    rows: list[dict[str, Any]] = []
    for e in entries:
        parsed = parse_module_name(e.module_name)
        if parsed is None:  # `named:` but not the convention's shape: not one of ours
            continue
        portable = e.fingerprint == PORTABLE.digest
        rows.append(
            {
                "name": parsed[0],
                "version": parsed[1],
                "key": e.key,
                "platform": "portable" if portable else e.platform,
                "device_kind": None if portable else e.device_kind,
                "fingerprint": e.fingerprint,
                "size": e.size,
                "signer": e.signer,
                "hits": e.hits,
                "last_access": e.last_access.isoformat(),
            }
        )
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no named executables")
        return
    table = [
        [
            safe(r["name"][:40]),
            safe(r["version"][:20]),
            _named_platform(r),
            "-" if r["device_kind"] is None else r["fingerprint"][:12],
            format_size(r["size"]),
            safe(r["signer"] or "unsigned"),
        ]
        for r in rows
    ]
    print_table(["NAME", "VERSION", "PLATFORM", "FINGERPRINT", "SIZE", "SIGNER"], table, right={4})


def _named_platform(row: dict[str, Any]) -> str:
    if row["device_kind"] is None:
        return "portable"
    return safe(f"{row['platform']}/{row['device_kind']}"[:32])


@click.command("stats")
@json_option()
@click.option(
    "--by",
    "by",
    type=click.Choice(["fingerprint", "day", "module"]),
    help="One row per platform fingerprint, UTC day or module name (see below).",
)
@click.option(
    "--days",
    type=click.IntRange(min=1),
    help="With --by fingerprint or day: only the last N UTC days (today included).",
)
@click.pass_obj
def stats_cmd(obj: Ctx, as_json: bool, by: str | None, days: int | None) -> None:
    """Hits, eligible misses, hit rate and what the store saved.

    A miss whose compile then took less than ARTSTORE_MIN_COMPILE_SECS is never
    stored, so it is not an eligible miss: the hit rate is hits / (hits + eligible
    misses), and such compiles are counted as below-threshold instead.

    Without --by: the namespace's totals, from every client version (hits, bytes
    fetched and compile time saved of the entries held now and of those gc or rm
    deleted, their later hits included). --by fingerprint and --by day read the usage
    rows that clients of this version write (per UTC day and fingerprint, also from
    readers' hit journals once folded: `artstore fold`). --by module reads the entries
    held now, per module, all time, and one "(removed entries)" row; misses,
    below-threshold compiles and lease counts are not known per module. Every view
    counts the same hits. Reads only the index: works while the object store is down.
    """
    from datetime import timedelta

    from artifactstore.formats.usage import today
    from artifactstore.index import usage as index_usage

    if days is not None and by not in ("fingerprint", "day"):
        fail("--days goes with --by fingerprint or --by day", EXIT_USAGE)
    since = today() - timedelta(days=days - 1) if days is not None else None
    with obj.store(index_only=True, objects=False) as store:
        where = store.parts.describe()
        stats = store.parts.index.stats() if by is None else None
        if by == "day":
            groups = index_usage.by_day(store.parts.engine, store.parts.namespace, since)
        elif by == "fingerprint":
            groups = index_usage.by_fingerprint(store.parts.engine, store.parts.namespace, since)
        elif by == "module":
            groups = index_usage.by_module(store.parts.engine, store.parts.namespace)
    namespace = obj.settings().namespace
    if by is not None:
        _print_groups(where, namespace, by, days, groups, as_json)
    elif as_json:
        assert stats is not None
        print_json(_stats_json(where, namespace, stats))
    else:
        assert stats is not None
        _print_stats(where, namespace, stats)


def _stats_json(where: str, namespace: str, stats: Any) -> dict[str, Any]:
    """`artstore stats --json`: the names of process_stats() (formats.counters), with
    0.3's for one release."""
    return with_aliases(
        {
            "store": where,
            "namespace": namespace,
            "entries": stats.entries,
            "bytes": stats.bytes,
            "objects": stats.objects,
            "object_bytes": stats.object_bytes,
            "hits": stats.hits,
            "misses": stats.eligible_misses,
            "lookups_missed": stats.misses,
            "misses_below_threshold": stats.misses_below_threshold,
            "quick_compiles": stats.below_threshold,
            "corrupt": stats.corrupt,
            "hit_rate": stats.hit_rate,
            "bytes_fetched": stats.bytes_fetched,
            "compile_secs_saved": stats.compile_secs_saved,
            "lease_waits": stats.lease_waits,
            "lease_takeovers": stats.lease_takeovers,
            "warm_compiles": stats.warm_compiles,
        }
    )


def _print_stats(where: str, namespace: str, stats: Any) -> None:
    """`artstore stats`: the namespace's totals, one field a line."""
    print_fields(
        [
            ("store", where),
            ("namespace", namespace),
            ("entries", stats.entries),
            ("stored", format_size(stats.bytes)),
            ("hits", stats.hits),
            ("misses", stats.eligible_misses),
            ("hit rate", f"{100 * stats.hit_rate:.1f}%"),
            (
                "quick compiles",
                f"{stats.below_threshold} (under ARTSTORE_MIN_COMPILE_SECS: "
                "never stored, not misses)",
            ),
            ("warm compiles", f"{stats.warm_compiles} (artstore warm: not misses)"),
            ("corrupt objects seen", stats.corrupt),
            ("bytes fetched", format_size(stats.bytes_fetched)),
            ("compile time saved", format_seconds(stats.compile_secs_saved)),
            ("lease waits", stats.lease_waits),
            ("lease takeovers", stats.lease_takeovers),
        ]
    )


def _print_groups(
    where: str, namespace: str, by: str, days: int | None, groups: list[UsageGroup], as_json: bool
) -> None:
    """`artstore stats --by`: one row per group, and their total."""
    total = _total(groups, by)
    if as_json:
        print_json(
            {
                "store": where,
                "namespace": namespace,
                "by": by,
                "days": days,
                "groups": [g.to_json(by) for g in groups],
                "total": total.to_json(by),
            }
        )
    elif not groups:
        click.echo("no usage recorded" + (f" in the last {days} days" if days else ""))
    else:
        first = {"fingerprint": "FINGERPRINT", "day": "DAY", "module": "MODULE"}[by]
        headers = [first, "HITS", "MISSES", "HIT RATE", "QUICK COMPILES", "FETCHED", "SAVED"]
        headers += ["LEASE WAITS", "TAKEOVERS"]
        rows = [_group_row(g, by, is_total=False) for g in groups]
        print_table(headers, [*rows, _group_row(total, by, is_total=True)], right=set(range(1, 9)))


# What a total row sums (None, not known, where any group does not know it).
_SUMMED = (
    "hits",
    "bytes_fetched",
    "compile_secs_saved",
    "misses",
    "misses_below_threshold",
    "below_threshold",
    "lease_waits",
    "lease_takeovers",
)


def _total(groups: list[UsageGroup], by: str) -> UsageGroup:
    """The `stats --by` groups summed into one "total" row."""
    from artifactstore.index.usage import UsageGroup

    total = UsageGroup("total")
    for group in groups:
        for name in _SUMMED:
            value, mine = getattr(total, name), getattr(group, name)
            setattr(total, name, None if value is None or mine is None else value + mine)
    if by == "module":
        total.misses = total.misses_below_threshold = total.below_threshold = None
        total.lease_waits = total.lease_takeovers = None
    return total


def _group_row(g: UsageGroup, by: str, *, is_total: bool) -> list[str]:
    """One `stats --by` table row: the group's label (a fingerprint with what it ran on,
    a day, a module), then its counts ("-" where not known)."""

    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    label = g.group
    if by == "fingerprint" and not is_total:
        label = g.group[:12] or "(none)"
        described = [g.extra.get(k) for k in ("device_kind", "jaxlib_version")]
        if any(described):
            label += " " + "/".join(str(d) for d in described if d)[:40]
    elif by == "module" and not is_total:
        label = g.group[:40]
    rate = g.hit_rate
    no_lookups = rate is None or not g.hits + (g.eligible_misses or 0)
    return [
        label,
        str(g.hits),
        count(g.eligible_misses),
        "-" if no_lookups or rate is None else f"{100 * rate:.1f}%",  # not known, or no lookups
        count(g.below_threshold),
        format_size(g.bytes_fetched),
        format_seconds(g.compile_secs_saved),
        count(g.lease_waits),
        count(g.lease_takeovers),
    ]


@click.command("rm")
@click.argument("keys", nargs=-1)
@click.option("--all", "remove_all", is_flag=True, help="Remove every entry of the namespace.")
@click.option("--yes", "-y", is_flag=True, help="Remove several entries without asking.")
@click.option(
    "--name",
    "ref",
    metavar="NAME[@VERSION]",
    help="Remove a named executable: every fingerprint (native and portable) of that "
    "version, or of all its versions.",
)
@click.option(
    "--removal",
    metavar="NAME@VERSION",
    help="Withdraw that version's removal record (as `ls --removed` shows it), so that it "
    "may be stored and loaded again. The gc role's.",
)
@click.pass_obj
def rm_cmd(
    obj: Ctx,
    keys: tuple[str, ...],
    remove_all: bool,
    yes: bool,
    ref: str | None,
    removal: str | None,
) -> None:
    """Remove entries by KEY (or a unique prefix of 8+ characters, as `ls` shows), a
    named executable by --name (as `ls --named` shows), or a removal record."""
    from artifactstore.gc.remove import remove, resolve_keys

    if removal is not None:
        if keys or remove_all or ref is not None:
            fail("give --removal alone (not with KEY..., --all or --name)", EXIT_USAGE)
        from artifactstore.cli.removals import withdraw

        withdraw(obj, removal, yes)
        return
    if ref is not None:
        if keys or remove_all:
            fail("give --name alone (not with KEY... or --all)", EXIT_USAGE)
        from artifactstore.cli.removals import remove_version

        remove_version(obj, ref, yes)
        return
    if bool(keys) == remove_all:
        fail("give KEY... or --all (not both), or --name: see `artstore rm --help`", EXIT_USAGE)
    for key in keys:
        if len(key) < 8 or any(c not in "0123456789abcdefABCDEF" for c in key):
            fail(
                f"invalid key {key!r}: use a key or a hex prefix of at least 8 characters "
                "as `artstore ls` prints it",
                EXIT_USAGE,
            )
    if remove_all or len(keys) > 1:
        confirm(yes, "", "every entry of the namespace" if remove_all else f"{len(keys)} entries")
    with obj.store(changes=True) as store:
        if remove_all:
            confirm(yes, f"remove every entry in namespace {store.parts.namespace!r}?")
            report = remove(store, None)
        else:
            full, unknown = resolve_keys(store.parts, keys)
            if unknown:
                fail(f"no entry matches {unknown[0]!r}: check `artstore ls`")
            if len(full) > 1:
                confirm(
                    yes,
                    f"remove {len(full)} entries from namespace {store.parts.namespace!r}?",
                    f"{len(full)} entries",
                )
            report = remove(store, full)
    from artifactstore.cli.removals import removed_report

    removed_report(report)
