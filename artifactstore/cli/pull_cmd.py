"""`artstore pull`: fill this host's local tier from the object store (bundles/pull.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from artifactstore.cli.context import EXIT_FAIL, Ctx, fail
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import fetch_jobs_option, json_option, print_json, safe
from artifactstore.errors import one_line
from artifactstore.formats.sizes import format_limit, format_size, plural

if TYPE_CHECKING:
    from artifactstore.bundles.pull import PullReport
    from artifactstore.formats.manifest import Manifest


@click.command("pull")
@click.option(
    "--fingerprint",
    metavar="DIGEST",
    help="Pull the entries of this fingerprint digest [default: this host's, for the "
    "JAX backend --backend names; see `artstore fingerprint`].",
)
@click.option("--backend", help="JAX backend whose fingerprint to pull (default: JAX's default).")
@click.option(
    "--torch-xla",
    "torch_xla",
    is_flag=True,
    help="Pull this host's torch-xla entries (its fingerprint for torch-xla; imports torch_xla).",
)
@click.option(
    "--module",
    metavar="PATTERN",
    help="Only entries whose module name matches this shell pattern (jit_train*).",
)
@fetch_jobs_option("Objects fetched in parallel (and at most held in memory).")
@click.option("--dry-run", is_flag=True, help="List what would be fetched; fetch nothing.")
@json_option("Print the summary as JSON.")
@progress_option
@click.pass_obj
def pull_cmd(
    obj: Ctx,
    fingerprint: str | None,
    backend: str | None,
    torch_xla: bool,
    module: str | None,
    jobs: int,
    dry_run: bool,
    as_json: bool,
    progress: bool,
) -> None:
    """Fill this host's local tier with the namespace's entries for one fingerprint.

    Processes on this host then load those executables from the tier, without
    the object store or the index (a node that starts many processes, or loses
    the network, starts warm). Reads manifests and objects from the object store
    only, never the database: read-only credentials suffice. Entries already in
    the tier are not fetched again; each object is verified as a load verifies it;
    the tier's bound (ARTSTORE_LOCAL_TIER_SIZE) is kept, and what would exceed it
    is skipped and counted. The keys of this fingerprint that writers found too
    quick to store are learned too, so that processes here never look them up.
    Exits 1 if the pull stopped or an entry failed, or where the namespace never held
    an entry (no store identity, no manifests: ARTSTORE_URL names another bucket or
    prefix, likely).
    """
    from artifactstore.bundles import pull as _pull

    fingerprint = _given_fingerprint(fingerprint, backend, torch_xla)
    settings = obj.settings(need_index=False)  # the object store alone: no ARTSTORE_INDEX
    puller = _pull.open_puller(settings, dry_run=dry_run)  # a bad store fails before JAX loads
    if fingerprint is None:
        fingerprint = _host_fingerprint(backend, torch_xla)
    would: list[dict[str, object]] = []
    fetched = _dry_run_listing(would, listed=not as_json) if dry_run else None
    with Progress(progress) as shown:
        report = _pull.pull(
            puller,
            fingerprint,
            module=module,
            jobs=jobs,
            dry_run=dry_run,
            progress=shown.counter("pulling into the local tier"),
            on_fetch=fetched,
        )
    if as_json:
        print_json({**report.to_json(), **({"would_fetch": would} if dry_run else {})})
    else:
        click.echo(summary(report))
    if report.never_held:
        fail(report.never_held)
    if not report.ok:
        sys.exit(EXIT_FAIL)


def summary(r: PullReport) -> str:
    """The one line every pull ends with."""
    verb = "would fetch" if r.dry_run else "fetched"
    over = f"{r.over_bound} skipped over the tier's bound"
    if r.over_bound:
        over += (
            f" ({format_size(r.over_bound_bytes)}; the tier is bounded at "
            f"{format_limit(r.tier_bound or 0)} by ARTSTORE_LOCAL_TIER_SIZE)"
        )
    parts = [
        f"{verb} {plural(r.fetched, 'entry', 'entries')} ({format_size(r.fetched_bytes)}) for "
        f"fingerprint {r.fingerprint[:12]} in namespace {r.namespace}",
        f"{r.present} already in the tier",
        over,
        f"{r.failed} failed",
    ]
    extra = [
        ("other_fingerprint", "of other fingerprints (not fetched)"),
        ("other_module", "not matching --module"),
        ("refused", "refused for their signature (ARTSTORE_TRUSTED_KEYS)"),
        ("corrupt", "corrupt (not kept; `artstore verify` names them)"),
        ("over_limit", "over this host's size limits"),
        ("missing", "gone since the listing"),
        ("bad_manifests", "with unreadable manifests"),
    ]
    parts += [f"{getattr(r, name)} {what}" for name, what in extra if getattr(r, name)]
    if r.quick_keys:
        learn = "would learn" if r.dry_run else "learned"
        parts.append(f"{learn} {r.quick_keys} keys too quick to store")
    if r.quick_unlisted:
        parts.append(f"keys too quick to store not listed: {r.quick_unlisted}")
    if r.working_sets:
        copy = "would copy" if r.dry_run else "copied"
        parts.append(f"{copy} {r.working_sets} programs' working sets")
    if r.working_sets_refused:
        parts.append(
            f"{r.working_sets_refused} working sets refused (unreadable or not signed by a "
            "trusted key; not copied)"
        )
    if r.working_sets_unlisted:
        parts.append(f"working sets not read: {r.working_sets_unlisted}")
    if r.tier_bound is not None:
        parts.append(f"tier {format_size(r.tier_bytes)} of {format_limit(r.tier_bound)}")
    line = "; ".join(parts)
    if r.stopped:
        line += f"; stopped: {r.stopped}"
    return line


def _given_fingerprint(fingerprint: str | None, backend: str | None, torch_xla: bool) -> str | None:
    """The digest --fingerprint gives, checked (a usage error, before the store is
    opened), where it is given; one of the three options at most."""
    from artifactstore.formats.codec import check_digest

    if sum((fingerprint is not None, backend is not None, torch_xla)) > 1:
        raise click.UsageError("give one of --fingerprint, --backend and --torch-xla")
    if fingerprint is None:
        return None
    try:
        return check_digest(fingerprint.strip().lower())
    except ValueError:
        raise click.UsageError(
            f"--fingerprint {fingerprint[:80]!r} is not a digest (64 hex digits, "
            "the `digest` of `artstore fingerprint`)"
        ) from None


def _host_fingerprint(backend: str | None, torch_xla: bool) -> str:
    """This host's fingerprint for torch-xla or a JAX backend (loads the framework)."""
    if torch_xla:
        from artifactstore.cli.setup_cmd import torch_xla_fingerprint

        return torch_xla_fingerprint().digest
    from artifactstore.jaxhook import host_fingerprint

    try:
        return host_fingerprint(backend).digest
    except RuntimeError as exc:
        fail(f"cannot open JAX backend {backend or 'default'!r}: {one_line(exc)}")


def _dry_run_listing(would: list[dict[str, object]], *, listed: bool) -> Callable[[Manifest], None]:
    """What a dry run does with each entry it would fetch: a line per entry as it comes
    (`listed`), else one item of `would` for --json."""

    def fetched(manifest: Manifest) -> None:
        if listed:
            click.echo(
                f"would fetch {manifest.key[:12]}  {format_size(manifest.size):>10}  "
                f"{safe(manifest.module_name[:60])}"
            )
        else:
            would.append(
                {
                    "key": manifest.key,
                    "digest": manifest.digest,
                    "size": manifest.size,
                    "module": manifest.module_name,
                }
            )

    return fetched
