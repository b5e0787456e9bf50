"""`artstore export` and `artstore import`: entries carried between stores as one file
(artifactstore.bundles), for clusters that cannot reach the store they were built in."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from artifactstore.cli.context import Ctx
from artifactstore.cli.render import json_option, print_json
from artifactstore.formats.sizes import format_size

# Without --progress/--no-progress a bar is shown on a terminal, and only for bundles
# big enough to take a while (a few entries finish before a bar would draw).
PROGRESS_ENTRIES = 50
PROGRESS_BYTES = 64 * 1024 * 1024


_progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="A progress bar on stderr [default: on a terminal, for large bundles].",
)


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
@_progress_option
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
    from artifactstore.bundles.layout import BundleError
    from artifactstore.cli.context import Ctx
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
    selection = Selection(names=names, modules=modules, fingerprint=fingerprint,
                          everything=everything)  # fmt: skip
    if selection.empty:
        raise click.UsageError(
            "say which entries to export: --name PATTERN, --module PATTERN, "
            "--fingerprint DIGEST or --all"
        )
    if not file.parent.is_dir():
        raise BundleError(f"cannot write {file}: no directory {file.parent}")
    if file.exists() and not force:
        raise BundleError(f"{file} exists: give --force to replace it")
    with obj.store(namespace=export_namespace) as store:
        bar = _Bar(progress, as_json, "exporting")
        try:
            report = export_bundle(store, file, selection, progress=bar.entries)
        finally:
            bar.close()
    if as_json:
        print_json(report.to_json())
        return
    click.echo(
        f"exported {report.entries} entries ({report.objects} objects, "
        f"{format_size(report.bytes)}) from namespace {report.namespace} to {file} "
        f"({format_size(report.file_bytes)})"
    )


@click.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--max-entries",
    type=click.IntRange(min=1),
    metavar="N",
    help="Refuse a bundle of more entries [default: ARTSTORE_BUNDLE_MAX_ENTRIES, else 10000].",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Refuse a bundle that unpacks to more (500G) [default: ARTSTORE_BUNDLE_MAX_SIZE, "
    "else 64x the bundle's size + 16 MiB].",
)
@json_option("Print the summary as JSON.")
@_progress_option
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
    from artifactstore.bundles.layout import BundleError
    from artifactstore.errors import ConfigError
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
    with obj.store(changes=True) as store:
        bar = _Bar(progress, as_json, "importing", size=file.stat().st_size)
        try:
            report = import_bundle(
                store, file, progress=bar.phase, max_entries=max_entries, max_bytes=max_bytes
            )
        finally:
            bar.close()
    if as_json:
        print_json(report.to_json())
        return
    click.echo(
        f"imported {report.imported} entries ({format_size(report.bytes)}) into namespace "
        f"{report.namespace}; {report.skipped} already present (skipped); "
        f"{report.entries} in the bundle"
    )


class _Bar:
    """click progress bars on stderr, per phase; shown where `show` says (or, by
    default, on a terminal for large bundles)."""

    def __init__(self, show: bool | None, as_json: bool, label: str, size: int = 0) -> None:
        from artifactstore.cli.gc_output import Bars

        self.explicit = show
        self.tty = sys.stderr.isatty() and not as_json
        self.label = label
        self.size = size
        self.bars = Bars(bool(show) if show is not None else self.tty)
        if show is None and size and size < PROGRESS_BYTES:
            self.bars.show = False

    def entries(self, done: int, total: int) -> None:
        if self.explicit is None and done == 1 and total < PROGRESS_ENTRIES:
            self.bars.show = False
        self.bars.update(self.label, 1, total)

    def phase(self, name: str, advance: int, total: int | None) -> None:
        self.bars.update(name, advance, total)

    def close(self) -> None:
        self.bars.close()
