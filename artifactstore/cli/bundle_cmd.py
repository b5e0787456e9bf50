"""`artstore export` and `artstore import`: entries carried between stores as one file
(artifactstore.bundles), for clusters that cannot reach the store they were built in."""

from __future__ import annotations

from pathlib import Path

import click

from artifactstore.cli.context import Ctx
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import json_option, print_json
from artifactstore.config import help_text
from artifactstore.formats.sizes import format_size, plural

# What import's phases (bundles/importer.py) are called on its progress display.
IMPORT_PHASES = {"verifying": "verifying entries", "importing": "importing entries"}


@click.command("export")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--namespace",
    "export_namespace",
    help="Export from this namespace [default: the configured one].",
)
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="PATTERN",
    help="Named executables whose name matches this shell pattern (NAME or NAME@VERSION); "
    "repeatable.",
)
@click.option(
    "--module",
    "modules",
    multiple=True,
    metavar="PATTERN",
    help="Entries whose module name matches this shell pattern (jit_train*); repeatable.",
)
@click.option("--fingerprint", metavar="DIGEST_PREFIX", help="Entries of this fingerprint.")
@click.option("--all", "everything", is_flag=True, help="Every entry of the namespace.")
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@json_option("Print the summary as JSON.")
@progress_option
@click.pass_obj
def export_cmd(
    obj: Ctx,
    file: Path,
    export_namespace: str | None,
    names: tuple[str, ...],
    modules: tuple[str, ...],
    fingerprint: str | None,
    everything: bool,
    force: bool,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Write chosen entries of a namespace to FILE, one bundle (zstd-compressed tar).

    Each object is verified as a load verifies it and written as stored (signed,
    never re-encoded); one that fails refuses the whole bundle. Selectors of
    different kinds must all match; `--name` and `--module` may be repeated.
    Carry FILE to a cluster that cannot reach this store and `artstore import` it.
    """
    from artifactstore.bundles.export import Selection, export_bundle
    from artifactstore.cli.context import Ctx
    from artifactstore.formats.bundle import BundleError
    from artifactstore.named import keys as named_keys

    assert isinstance(obj, Ctx)
    if everything and (names or modules or fingerprint):
        raise click.UsageError("--all takes every entry: give it alone")
    if fingerprint is not None:
        fingerprint = fingerprint.strip().lower()
        if not fingerprint or any(c not in "0123456789abcdef" for c in fingerprint):
            raise click.UsageError(f"--fingerprint {fingerprint[:80]!r} is not a hex digest prefix")
    for ref in names:
        named_keys.parse_ref(ref)  # a bad version: one line now, not per entry
    selection = Selection(
        names=names, modules=modules, fingerprint=fingerprint, everything=everything
    )
    if selection.empty:
        raise click.UsageError(
            "say which entries to export: --name PATTERN, --module PATTERN, "
            "--fingerprint DIGEST or --all"
        )
    if not file.parent.is_dir():
        raise BundleError(f"cannot write {file}: no directory {file.parent}")
    if file.exists() and not force:
        raise BundleError(f"{file} exists: give --force to replace it")
    with obj.store(namespace=export_namespace) as store, Progress(progress) as shown:

        def exported(_done: int, total: int) -> None:
            shown.update("exporting entries", 1, total)

        report = export_bundle(store, file, selection, progress=exported)
    if as_json:
        print_json(report.to_json())
        return
    click.echo(
        f"exported {plural(report.entries, 'entry', 'entries')} "
        f"({plural(report.objects, 'object', 'objects')}, "
        f"{format_size(report.bytes)}) from namespace {report.namespace} to {file} "
        f"({format_size(report.file_bytes)})"
    )


@click.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--max-entries",
    type=click.IntRange(min=1),
    metavar="N",
    help=help_text("bundle_max_entries", "Refuse a bundle of more entries"),
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help=help_text("bundle_max_size", "Refuse a bundle that unpacks to more (500G)"),
)
@json_option("Print the summary as JSON.")
@progress_option
@click.pass_obj
def import_cmd(
    obj: Ctx,
    file: Path,
    max_entries: int | None,
    max_size: str | None,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Store the entries of the bundle FILE (from `artstore export`) in this store.

    The whole bundle is verified first (every member, digest, signature where
    ARTSTORE_TRUSTED_KEYS is set, and that it holds nothing else); any problem
    refuses all of it and nothing is written. Entries the store already holds are
    skipped, so importing twice is harmless. What a bundle may unpack to is bounded
    (entries, each object by ARTSTORE_MAX_OBJECT_SIZE, the whole), so that a hostile
    one costs no more memory or temporary disk than a genuine one of its size.
    """
    from artifactstore.bundles.importer import import_bundle
    from artifactstore.errors import ConfigError
    from artifactstore.formats.bundle import BundleError
    from artifactstore.formats.sizes import parse_size

    max_bytes = None
    if max_size is not None:
        try:
            max_bytes = parse_size(max_size)
        except ConfigError as exc:
            raise click.UsageError(f"--max-size: {exc}") from None
        if max_bytes < 1:
            raise click.UsageError("--max-size must be at least 1 byte, e.g. 500G")
    if not file.is_file():
        raise BundleError(f"no bundle at {file}: not a file")
    with (
        obj.store(changes=True) as store,
        Progress(progress, labels=IMPORT_PHASES, byte_phases={"reading bundle"}) as shown,
    ):
        report = import_bundle(
            store, file, progress=shown.update, max_entries=max_entries, max_bytes=max_bytes
        )
    if as_json:
        print_json(report.to_json())
        return
    click.echo(
        f"imported {plural(report.imported, 'entry', 'entries')} ({format_size(report.bytes)}) "
        "into namespace "
        f"{report.namespace}; {report.skipped} already present (skipped); "
        f"{report.entries} in the bundle"
    )
