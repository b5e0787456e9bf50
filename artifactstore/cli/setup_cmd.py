"""Setting a store up here: `fingerprint`, `db`, `demo`, `doctor`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from artifactstore import config as _config
from artifactstore.cli.context import EXIT_FAIL, EXIT_USAGE, Ctx, confirm, fail
from artifactstore.cli.progress import Progress, progress_option
from artifactstore.cli.render import (
    fingerprint_fields,
    json_option,
    print_fields,
    print_json,
)
from artifactstore.errors import one_line
from artifactstore.formats.sizes import plural
from artifactstore.redact import redact

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from artifactstore.formats.fingerprint import Fingerprint


@click.command("fingerprint")
@json_option("Print JSON (input for --expect-fingerprint).")
@click.option("--backend", help="JAX backend to describe (default: JAX's default).")
@click.option(
    "--torch-xla",
    "torch_xla",
    is_flag=True,
    help="The fingerprint of torch-xla's executables instead (imports torch_xla).",
)
def fingerprint_cmd(as_json: bool, backend: str | None, torch_xla: bool) -> None:
    """Print this host's platform fingerprint."""
    if torch_xla:
        if backend is not None:
            raise click.UsageError("give --backend or --torch-xla, not both")
        fp = torch_xla_fingerprint()
    else:
        from artifactstore.jaxhook import host_fingerprint

        try:
            fp = host_fingerprint(backend)
        except RuntimeError as exc:
            fail(f"cannot open JAX backend {backend or 'default'!r}: {one_line(exc)}")
    if as_json:
        print_json({**fp.to_dict(), "digest": fp.digest}, sort_keys=True)
        return
    print_fields(fingerprint_fields(fp))


def torch_xla_fingerprint() -> Fingerprint:
    """This host's torch-xla fingerprint, or one line saying why there is none."""
    from artifactstore.torch_xla import host_fingerprint

    try:
        return host_fingerprint()
    except ImportError as exc:
        fail(f"torch_xla does not import ({one_line(exc)}): pip install 'artifactstore[torch-xla]'")


@click.group("db")
def db_group() -> None:
    """Index schema: show or apply migrations."""


def _engine(obj: Ctx) -> tuple[_config.Settings, Engine]:
    from artifactstore.store import secure_local_dirs
    from artifactstore.store.backends import unchecked_index

    settings = obj.settings()
    secure_local_dirs(settings)  # the directory the index is created in: ours, private
    return settings, unchecked_index(settings)


@db_group.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(obj: Ctx, revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.upgrade(engine, revision)
    click.echo(f"index {redact(settings.index_url)} at revision {status.current}")


@db_group.command("current")
@click.pass_obj
def db_current(obj: Ctx) -> None:
    """Show the schema revision and whether it matches this version."""
    from artifactstore.index import db

    settings, engine = _engine(obj)
    status = db.schema_status(engine)
    print_fields(
        [
            ("index", redact(settings.index_url)),
            ("revision", status.current or "(none)"),
            ("head", status.head),
            ("state", status.state.value),
        ]
    )
    if status.state is not db.SchemaState.CURRENT:
        sys.exit(EXIT_FAIL)


@db_group.command("check")
@json_option()
@click.pass_obj
def db_check(obj: Ctx, as_json: bool) -> None:
    """Check the index: present, readable, current, and the one its objects belong to.

    Exits 1 naming the fix (usually `artstore db rebuild`); `gc` refuses to run
    on an index that fails this check.
    """
    from artifactstore.gc import rebuild

    report = rebuild.check(obj.settings())
    if as_json:
        print_json(report.to_json())
    else:
        entries = "?" if report.entries is None else str(report.entries)
        print_fields(
            [
                ("index", report.index),
                ("entries", entries),
                ("state", "ok" if report.ok else "FAIL"),
            ]
        )
        for problem in report.problems:
            click.echo(f"problem: {problem}")
    if not report.ok:
        sys.exit(EXIT_FAIL)


@db_group.command("rebuild")
@json_option()
@progress_option
@click.pass_obj
def db_rebuild(obj: Ctx, as_json: bool, progress: bool | None) -> None:
    """Recreate the entries the index lacks from the manifests and the objects' own metadata.

    A published manifest decides which object a key's entry is (where several
    carry the key); other objects give back the entries they carry.

    An index bound to no store that holds no entries (lost, set aside, new) takes the
    object store's identity: it is that store's index from then on (mind ARTSTORE_INDEX:
    two indexes over one object store each see the other's objects as unreferenced).

    A SQLite index that fails its integrity check is first moved aside (kept
    beside it as INDEX.corrupt-TIME) and a fresh one created. Hit counts and
    access times are not in the objects: they start again. Objects written
    before artifactstore 0.2 carry no metadata and cannot be recovered.
    """
    from artifactstore.gc import rebuild
    from artifactstore.index import health
    from artifactstore.store import identity

    settings = obj.settings()
    if settings.read_only:
        fail("rebuild writes the index: unset ARTSTORE_READ_ONLY to run it")
    moved = health.set_aside(settings.index_url)
    if moved is not None and not as_json:
        click.echo(f"corrupt index moved aside to {moved}")

    labels = {"manifests": "reading manifests", "objects": "reading objects"}
    with obj.store() as store, Progress(progress, labels=labels) as shown:
        adopted = identity.rebuilding(store.parts)
        if adopted is not None and not as_json:
            click.echo(f"index bound to the object store's identity (store {adopted})")
        store.parts.writes.gate.require()
        report = rebuild.rebuild(store, progress=shown.update)
    if as_json:
        moved_aside = str(moved) if moved else None
        print_json({**report.to_json(), "moved_aside": moved_aside, "bound_to": adopted})
        return
    corrupt = f", {len(report.corrupt)} corrupt (run `artstore verify --repair`)"
    click.echo(
        f"{plural(report.manifests, 'manifest', 'manifests')}, "
        f"{plural(report.objects, 'object', 'objects')}: "
        f"{plural(len(report.restored), 'entry', 'entries')} restored "
        f"({report.from_manifests} from manifests, "
        f"{report.from_objects} from objects), "
        f"{report.present} already indexed, {report.superseded} superseded, "
        f"{report.without_metadata} without metadata (written before 0.2; gc removes them)"
        + (corrupt if report.corrupt else "")
    )


@db_group.command("bind")
@click.option(
    "--force",
    is_flag=True,
    help="Bind them even where they do not look like one store (after checking by hand); "
    "says how many of the newest 100 entries have their object in the object store.",
)
@click.option(
    "--allow-missing",
    is_flag=True,
    help="With --force: bind even an object store that holds none of those objects.",
)
@click.option(
    "--yes", is_flag=True, help="Bind without asking, also where that orphans entries or objects."
)
@click.pass_obj
def db_bind(obj: Ctx, force: bool, allow_missing: bool, yes: bool) -> None:
    """Bind the object store and the index as one store (artifactstore.store.identity).

    The first writer and every command that changes the store bind them by themselves
    where neither is bound to anything else and they plausibly belong together. Writers
    refuse an index bound to no store in front of an object store that already has an
    identity (another index's: most likely ARTSTORE_INDEX names the wrong database);
    `db bind` binds that pair, deliberately, making this index that store's. Two indexes
    over one object store each see the other's objects as unreferenced, so before it
    binds, it says what binding orphans: entries of this index whose object is not in
    the object store, and objects there that no entry of this index references (gc
    deletes such entries, and such objects after its grace period); where that is
    anything, it asks first (--yes: without asking; no terminal: refused without it).

    --force is for a pair the rule refuses, such as a bucket copied without its identity
    object, once you have checked both URLs; an identity object that is not one (junk) it
    replaces, after asking (--yes), with the operator's S3 credentials (s3-gc.json). It
    refuses an object store that holds none of the newest entries' objects (a mistyped or
    empty bucket) unless --allow-missing.
    """
    from artifactstore.gc.reconcile import orphaned
    from artifactstore.store import identity

    if allow_missing and not force:
        fail("--allow-missing goes with --force", EXIT_USAGE)
    with obj.store() as store:
        if store.parts.read_only:
            fail("bind writes the index and the object store: unset ARTSTORE_READ_ONLY")
        parts = store.parts
        pair = (parts.blobs, parts.engine, parts.namespace, parts.settings.index_url)
        junk = identity.unreadable(pair[0]) if force else None
        if force:
            click.echo(identity.force_count(*pair, allow_missing=allow_missing))
        if junk is not None:
            click.echo(f"the object store's {junk}: --force replaces it with a new identity")
            confirm(yes, "replace it?", "its identity object", doing="replacing", verb="replace")
        found = identity.check(*pair)
        if found.state == identity.UNBOUND or found.other is not None or (force and not found.ok):
            lost, unreferenced = orphaned(*pair[:3])
            entries = plural(lost, "entry", "entries")
            objects = plural(unreferenced, "object", "objects")
            click.echo(
                f"binding them orphans {entries} of this index (their object is not in "
                f"{found.objects}) and {objects} in it (no entry of this index references "
                "them)" + (": gc would delete them" if lost or unreferenced else "")
            )
            if lost or unreferenced:
                what = f"{entries} and {objects}"
                confirm(yes, "bind them?", what, doing="binding them, orphaning", verb="bind")
            if force:
                found = identity.bind(*pair, force=True, replace=junk is not None)
            else:
                found = identity.adopt(*pair)
    if not found.ok:
        fail(found.refusal())
    click.echo(
        f"object store {found.objects} and index {found.index} bound as store "
        f"{found.store_id} (namespace {store.parts.namespace})"
    )


@click.command("demo")
@click.option(
    "--layers",
    type=click.IntRange(1, 200),
    default=10,
    show_default=True,
    help="Model depth; more layers compile longer.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary store and print its path.")
def demo_cmd(layers: int, keep: bool) -> None:
    """Run a compile-heavy example twice in fresh processes: cold, then warm."""
    from artifactstore.cli import demo

    demo.run(layers=layers, keep=keep, echo=click.echo)


@click.command("doctor")
@json_option()
@click.option(
    "--device/--no-device",
    default=None,
    help="Open JAX's backend to read this host's fingerprint (on a TPU: 10-15 s, holding "
    "the chip meanwhile), or never. Default: only where JAX_PLATFORMS=cpu.",
)
@click.pass_obj
def doctor_cmd(obj: Ctx, as_json: bool, device: bool | None) -> None:
    """Say whether programs here would use the store and, if not, why and what to do.

    Exits 0 when programs would use it as configured, 1 when they would not use it
    or would use it degraded (e.g. read-only because every write is refused)."""
    from artifactstore.cli import doctor
    from artifactstore.cli.doctor_report import echo

    report = doctor.gather(obj.overrides, device)
    if as_json:
        print_json(report.to_json())
    else:
        echo(report)
    if not report.ok:
        sys.exit(EXIT_FAIL)
