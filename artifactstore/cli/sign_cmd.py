"""Signed entries: `artstore keygen NAME` and `artstore sign` (formats/signing.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

import click

from artifactstore.cli.context import EXIT_FAIL, EXIT_USAGE, Ctx, fail
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import json_option, print_json, safe
from artifactstore.config import from_environment
from artifactstore.errors import ConfigError
from artifactstore.formats.sizes import format_size, plural

if TYPE_CHECKING:
    from artifactstore.config import Settings
    from artifactstore.formats.signing import SigningKey
    from artifactstore.gc.sign import Candidate, SignReport


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
    from artifactstore.config.keyfiles import generate

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
    help="Only re-sign entries whose signature verifies under trusted key NAME "
    "(in ARTSTORE_TRUSTED_KEYS); repeatable. Default: every trusted key.",
)
@click.option(
    "--adopt-unsigned",
    "adopt_unsigned",
    is_flag=True,
    help="Also sign unsigned entries (written before signing), after checking each as a "
    "load does; lists them and asks first.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before --adopt-unsigned signs.")
@progress_option
@click.pass_obj
def sign_cmd(
    obj: Ctx,
    as_json: bool,
    signed_by: tuple[str, ...],
    adopt_unsigned: bool,
    yes: bool,
    progress: bool | None,
) -> None:
    """Re-sign what a trusted key signed with ARTSTORE_SIGNING_KEY (key rotation).

    Only entries whose object carries a signature that verifies, as a reader checks it,
    under a key in ARTSTORE_TRUSTED_KEYS are re-signed; unsigned, untrusted and badly
    signed ones are skipped and counted. The signed copy replaces the object (a new
    object; the entry is repointed in one transaction).
    """
    from artifactstore.gc.sign import sign_entries

    settings = obj.settings()
    signing_key = _signing_key(settings, signed_by)
    ask = adopt_unsigned and not yes
    if ask and not sys.stdin.isatty():
        fail(
            "--adopt-unsigned signs entries no trusted key signed: run it on a terminal "
            "to confirm the list, or add --yes; nothing was signed"
        )
    shown = Progress(progress)
    adopt = _adopt(signing_key.name, shown, sys.stderr if as_json else sys.stdout, ask=ask)
    with obj.store(changes=True) as store, shown:
        report = sign_entries(
            store,
            signing_key,
            signed_by=set(signed_by),
            adopt=adopt if adopt_unsigned else None,
            progress=shown.counter("signing entries", store.parts.index.stats().entries),
        )
    if as_json:
        print_json(report.to_json())
    else:
        _print_report(report)
    if not report.ok:
        sys.exit(EXIT_FAIL)


def _signing_key(settings: Settings, signed_by: tuple[str, ...]) -> SigningKey:
    """The key to sign with, once the operator listed the keys whose entries to re-sign
    and --signed-by names only those; else one line and exit."""
    from artifactstore.gc.sign import check_signed_by

    # Listed by the operator: a process with a signing key may trust its own key too,
    # and that alone must not make this command run.
    if not from_environment("trusted_keys").strip():
        fail(
            "set ARTSTORE_TRUSTED_KEYS to the .pub files of the keys whose entries to "
            "re-sign (the old and the new key while rotating): `artstore sign` re-signs "
            "only what a trusted key signed"
        )
    if settings.signing_key is None:
        fail("set ARTSTORE_SIGNING_KEY to the .key file to sign with (`artstore keygen NAME`)")
    if settings.trusted_keys is not None:
        try:
            check_signed_by(signed_by, settings.trusted_keys)
        except ConfigError as exc:
            fail(str(exc), EXIT_USAGE)
    return settings.signing_key


def _adopt(
    key_name: str, shown: Progress, listing: TextIO, *, ask: bool
) -> Callable[[list[Candidate]], bool]:
    """--adopt-unsigned's question: list what will be signed; on a terminal, ask
    (unless --yes)."""

    def adopt(found: list[Candidate]) -> bool:
        shown.break_line()
        click.echo(
            f"unsigned entries to adopt (sign with key {key_name!r}): {len(found)}",
            file=listing,
        )
        for c in found:
            click.echo(
                f"  {c.key}  namespace {safe(c.namespace)}  {format_size(c.size)}  "
                f"producer {safe(c.producer_host)}  {safe(c.module_name)}",
                file=listing,
            )
        if not ask:
            return True
        return click.confirm(f"sign these {len(found)} unsigned entries?", err=True)

    return adopt


def _print_report(report: SignReport) -> None:
    """What `artstore sign` did, and what it skipped and why."""
    click.echo(
        f"signed {report.signed} of {plural(report.entries, 'entry', 'entries')} with key "
        f"{report.signer!r}; {report.already_signed} already signed by it, "
        f"{report.skipped_signer} skipped (--signed-by), "
        f"{plural(report.objects_removed, 'old object', 'old objects')} removed"
    )
    if report.adopted:
        click.echo(f"adopted (were unsigned): {len(report.adopted)}")
    for why, keys in sorted(report.skipped.items()):
        _listed(f"skipped, never signed ({_SKIPPED[why]})", keys)
    if report.missing:
        click.echo(f"entries without object: {len(report.missing)}")
    for why, keys in sorted(report.refused.items()):
        _listed(f"not signed ({why})", keys)


_SKIPPED = {
    "unsigned": "unsigned; --adopt-unsigned to sign them",
    "untrusted_key": "untrusted_key: signed by a key not in ARTSTORE_TRUSTED_KEYS",
    "bad_signature": "bad_signature: does not verify",
}


def _listed(title: str, keys: list[str]) -> None:
    """A count and the first 20 keys under it."""
    click.echo(f"{title}: {len(keys)}")
    for key in keys[:20]:
        click.echo(f"  {key}")
