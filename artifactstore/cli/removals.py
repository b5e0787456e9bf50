"""Removed named versions: `artstore rm --name` removes one (and leaves its removal
record), `artstore ls --removed` lists the records, `artstore rm --removal` (the gc role)
withdraws one (artifactstore/store/removed.py).

Why commands of their own: a removal record refuses its version for every reader and
writer, and where signatures are required one without a trusted signature is ignored;
either way an operator must be able to see what sits in the bucket and take it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from artifactstore.cli.context import Ctx, confirm, fail
from artifactstore.cli.render import print_json, print_table, safe
from artifactstore.formats.sizes import format_size, plural

if TYPE_CHECKING:
    from artifactstore.gc.remove import RemoveReport


def list_removals(obj: Ctx, as_json: bool) -> None:
    """`ls --removed`: the removal records (one listing of the bucket's manifests)."""
    from artifactstore.cli.render import when
    from artifactstore.gc.remove import removal_rows

    with obj.store(index_only=True) as store:
        rows = removal_rows(store.parts)
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no removal records")
        return
    table = [
        [
            safe(r["ref"][:72]),
            "-" if r["removed_at"] is None else when(_utc(r["removed_at"])),
            safe(r["signer"] or "unsigned"),
            "obeyed" if r["obeyed"] else f"IGNORED: {safe(r['why_ignored'])[:60]}",
        ]
        for r in rows
    ]
    print_table(["NAME@VERSION", "REMOVED", "SIGNER", "STATUS"], table)


def remove_version(obj: Ctx, ref: str, yes: bool) -> None:
    """`rm --name`: the named executable's entries (all fingerprints; one version or
    all), found in the index and removed as `rm KEY...` removes them."""
    from artifactstore.gc.remove import remove_named
    from artifactstore.index.repo import Filters
    from artifactstore.named import keys as named_keys

    name, version = named_keys.parse_ref(ref)
    glob = f"{named_keys.MODULE_PREFIX}{name}@{version or '*'}"
    with obj.store(changes=True) as store:
        found = {
            e.key: e.module_name
            for e in store.parts.index.iter_entries(Filters(module_glob=glob))
            if named_keys.matches(e.module_name, name, version)
        }
        if not found:
            fail(
                f"no named executable matches {ref!r} in namespace {store.parts.namespace!r}: "
                "check `artstore ls --named`"
            )
        if len(found) > 1:
            confirm(yes, f"remove {len(found)} entries of {ref!r}?", f"{len(found)} entries")
        report = remove_named(store, found)  # and the versions' removal records
    removed_report(report)


def withdraw(obj: Ctx, ref: str, yes: bool) -> None:
    """`rm --removal NAME@VERSION` (or a record's name): the version may be stored and
    loaded again. Deleting removal records is the gc role's (writers' policy denies it)."""
    from artifactstore.gc.remove import withdraw_removal

    if "@" not in ref and not ref.endswith(".removed"):
        fail(f"--removal takes NAME@VERSION or a record's name as `ls --removed` shows it: {ref!r}")
    confirm(
        yes,
        f"withdraw the removal record of {ref!r}?",
        "a removal record",
        doing="withdrawing",
        verb="withdraw",
    )
    with obj.store(changes=True) as store:
        try:
            record = withdraw_removal(store.parts, ref)
        except ValueError as exc:
            fail(str(exc))
    if record is None:
        fail(f"no removal record for {ref!r}: check `artstore ls --removed`")
    click.echo(f"withdrew the removal record of {safe(ref)}: that version may be stored again")


def _utc(seconds: int) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC)


def removed_report(report: RemoveReport) -> None:
    noun = plural(report.entries, "entry", "entries"), plural(report.objects, "object", "objects")
    click.echo(f"removed {noun[0]}, {noun[1]} ({format_size(report.bytes)})")
    if report.versions:  # `rm --name`: final (artifactstore/store/removed.py)
        names = ", ".join(safe(v) for v in report.versions)
        click.echo(f"removed for good (never loaded or stored again; use a new version): {names}")
