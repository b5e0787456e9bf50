"""`artstore verify`: check every object and cross-check objects, entries and manifests
(artifactstore.gc.verify); `--repair` refuses to drop most entries without --allow-missing."""

from __future__ import annotations

import sys

import click

from artifactstore.cli.context import EXIT_FAIL, Ctx
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import json_option, print_json, safe
from artifactstore.formats.sizes import format_size


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
@click.option(
    "--allow-missing",
    is_flag=True,
    help="With --repair: drop the entries even where more than 10% of them would go "
    "(a wrong or emptied bucket looks like that: check ARTSTORE_URL first).",
)
@progress_option
@click.pass_obj
def verify_cmd(
    obj: Ctx, as_json: bool, repair: bool, grace: str, allow_missing: bool, progress: bool
) -> None:
    """Check every object's digest; cross-check objects, entries and manifests."""
    from artifactstore.formats.sizes import parse_duration
    from artifactstore.gc.verify import verify

    grace_secs = parse_duration(grace)

    with obj.store(changes=repair) as store, Progress(progress) as shown:
        total = store.parts.index.stats().objects  # the index's count; the listing may hold more
        count = shown.counter("verifying objects", total)
        report = verify(
            store, repair=repair, progress=count, grace_secs=grace_secs, allow_missing=allow_missing
        )
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
            ("removed named versions", report.removals),
            (
                "removal records ignored (withdraw: `artstore rm --removal`)",
                report.removals_ignored,
            ),
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
