"""Signed entries: `artstore keygen NAME` and `artstore sign` (see artifactstore/signing.py)."""

from __future__ import annotations

import io
import sys

import click

from artifactstore.cli.context import EXIT_FAIL, Ctx, fail
from artifactstore.cli.render import json_option, print_json


@click.command("keygen")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where to write NAME.key and NAME.pub.",
)
def keygen_cmd(name: str, directory: str) -> None:
    """Write a signing key pair: NAME.key (secret, mode 0600) and NAME.pub.

    Writers set ARTSTORE_SIGNING_KEY to the path of NAME.key; readers list NAME.pub
    (or its NAME:BASE64 line) in ARTSTORE_TRUSTED_KEYS. Existing files are never
    overwritten.
    """
    from artifactstore.signing import generate

    secret, public = generate(name, directory)
    click.echo(f"secret key: {secret} (mode 0600; set ARTSTORE_SIGNING_KEY={secret} on writers)")
    click.echo(f"public key: {public} (list it in ARTSTORE_TRUSTED_KEYS on readers)")
    click.echo(public.read_text().strip())


@click.command("sign")
@json_option()
@click.option(
    "--signed-by",
    "signed_by",
    multiple=True,
    metavar="NAME",
    help="Only re-sign entries now signed by key NAME ('unsigned' for unsigned ones); "
    "repeatable. Default: every entry.",
)
@click.pass_obj
def sign_cmd(obj: Ctx, as_json: bool, signed_by: tuple[str, ...]) -> None:
    """Re-sign the namespace's entries with ARTSTORE_SIGNING_KEY (key rotation, old stores).

    Each object's digest, fingerprint and entry key are checked first; the signed copy
    replaces it (a new object; the entry is repointed in one transaction).
    """
    from artifactstore.gc.sign import sign_entries

    settings = obj.settings()
    if settings.signing_key is None:
        fail("set ARTSTORE_SIGNING_KEY to the .key file to sign with (`artstore keygen NAME`)")
    with obj.store(changes=True) as store:
        show = sys.stderr.isatty() and not as_json
        with click.progressbar(
            length=store.index.stats().entries or 1,
            label="signing",
            file=sys.stderr if show else io.StringIO(),
        ) as bar:
            report = sign_entries(
                store, settings.signing_key, signed_by=set(signed_by), progress=bar.update
            )
    if as_json:
        print_json(report.to_json())
    else:
        click.echo(
            f"signed {report.signed} of {report.entries} entries with key {report.signer!r}; "
            f"{report.already_signed} already signed by it, {report.skipped_signer} skipped "
            f"(--signed-by), {report.objects_removed} old objects removed"
        )
        if report.missing:
            click.echo(f"entries without object: {len(report.missing)}")
        for why, keys in sorted(report.refused.items()):
            click.echo(f"not signed ({why}): {len(keys)}")
            for key in keys[:20]:
                click.echo(f"  {key}")
    if not report.ok:
        sys.exit(EXIT_FAIL)
