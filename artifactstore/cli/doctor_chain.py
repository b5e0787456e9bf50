"""`artstore doctor`'s verdict as a program here meets it: which levels of its lookup
chain answer, and whether what it compiles is stored.

Why apart from the backend rows: a row says whether a backend answers; the verdict must
say what a program does (issue 39.7), and that follows the program's chain
(store.chain; its levels are runtime.sources): this host's tier is asked before any
Store opens, so a pulled node loads with the object store unreachable; the store's
lookups read the object store's manifests and never a database-server index
(store.read.find), and a read-only process never opens one (no write, no lease:
store.flight), so a reader loads with the index unreachable or its driver not
installed; a writer needs the index only to store. Nothing is created or written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactstore import config as _config
from artifactstore.cli.doctor_report import Check
from artifactstore.errors import one_line
from artifactstore.index import diagnosis
from artifactstore.runtime.sources import StoreSource, TierSource
from artifactstore.store.chain import LEVELS

if TYPE_CHECKING:
    from artifactstore.store.tier import LocalTier


def index_contacted(settings: _config.Settings) -> bool:
    """Whether programs here open the index: a writer (to store), and a reader of a
    SQLite file (asked for entries stored without a manifest); a reader of a database
    server never does."""
    return not (settings.read_only and settings.index_is_server)


def not_contacted(settings: _config.Settings, shown: str) -> Check:
    """The index row of a reader whose index is a database server: not opened, as its
    programs never open it (ARTSTORE_INDEX only names the store there)."""
    detail = (
        f"{shown}: not contacted: programs here only read (ARTSTORE_READ_ONLY), "
        "through the object store's manifests, and never connect to it"
    )
    data = {"url": shown, "contacted": False, "writes": None, "kind": None}
    return Check("index", "ok", detail, data=data)


def check_tier(settings: _config.Settings, fingerprint: str | None) -> Check:
    """This host's copy: where it is, how much it holds and, given this host's
    `fingerprint`, how many of its entries a program here would load (each key file
    read; one that does not parse is dropped, as a program's lookup of it would)."""
    from artifactstore.formats.sizes import format_limit, format_size, plural
    from artifactstore.store.tiers import open_tier

    try:
        tier = open_tier(settings)
        if tier is None:
            return Check("local tier", "ok", "off", blocking=False, data={"path": None})
        tier.check()  # another user's, or writable by others: not used (creates nothing)
        keys = tier.key_names()
        size = sum(blob.size for blob in tier.blobs.iter_blobs())
    except Exception as exc:
        return Check("local tier", "warn", f"unusable: {one_line(exc)}", blocking=False)
    if tier.owns_objects and tier.max_bytes is not None:
        kind = f"private copies, bound {format_limit(tier.max_bytes)}"
    else:
        kind = "the store's own directory"
    held = f"{plural(len(keys), 'key', 'keys')}, {format_size(size)}"
    data: dict[str, Any] = {"path": str(tier.base), "keys": len(keys), "bytes": size}
    if fingerprint is not None and keys:
        # What the tier level's lookup compares first: the entry's fingerprint.
        mine = sum(1 for key in keys if _built_for(tier, key, fingerprint))
        data["entries_here"] = mine
        held += f" ({mine} built for this host)" if mine != len(keys) else ""
    return Check("local tier", "ok", f"{tier.base}: {held} ({kind})", blocking=False, data=data)


def _built_for(tier: LocalTier, key: str, fingerprint: str) -> bool:
    entry = tier.lookup(key)
    return entry is not None and entry.fingerprint == fingerprint


def tier_answers(tier: Check) -> bool:
    """Whether the tier level would answer a program here: it holds entries for this
    host (all it holds, where the fingerprint is not known)."""
    return bool(tier.data.get("entries_here", tier.data.get("keys", 0)))


def levels(objects: Check, tier: Check) -> list[str]:
    """The levels of a program's chain that answer here, in the order it asks them
    (store.chain.LEVELS), of those doctor judges: this host's tier and the store."""
    store = objects.status != "fail" and not objects.data.get("tier_only")
    answering = {TierSource.name: tier_answers(tier), StoreSource.name: store}
    return [name for name in LEVELS if answering.get(name)]


def served_by_tier(settings: _config.Settings, objects: Check, tier: Check) -> Check:
    """The object store row when it fails and the tier holds entries for this host: a
    program loads those (the tier is asked first) and compiles the rest; not a block."""
    held = tier.data.get("entries_here", tier.data.get("keys", 0))
    stores = "" if settings.read_only else "; what they compile is not stored"
    detail = (
        f"{objects.detail}; programs here load the {held} entries of this host's tier "
        f"and compile what it lacks{stores}"
    )
    data = dict(objects.data, tier_only=True)
    return Check("object store", "warn", detail, verdict=objects.verdict, blocking=False, data=data)


def loads_without(index: Check) -> Check:
    """A failed index blocks no load: lookups read the object store's manifests and this
    host's tier, a database server never and a SQLite file only for entries stored
    without a manifest. The row stays; the access row says what it costs (a writer
    stores nothing; a reader of a SQLite file misses such entries)."""
    index.blocking = False
    return index


def check_access(settings: _config.Settings, objects: Check, index: Check, tier: Check) -> Check:
    """What a program here does with the store: loads and stores, loads only (as
    configured, or because writes would fail or be refused: degraded), or nothing; and
    from which levels of its chain (`from`)."""
    ns = settings.namespace
    answering = levels(objects, tier)
    data: dict[str, Any] = {"loads": True, "stores": False, "from": answering}
    loads = f"loads entries of namespace {ns}"
    if StoreSource.name not in answering:
        loads += " from this host's tier alone (the object store does not answer)"
    if settings.read_only and index.status == "fail":  # a SQLite file: servers are not asked
        why = f"entries stored without a manifest are not found: {index.verdict or index.detail}"
        detail = f"{loads} by their manifests, stores nothing (read-only); {why}"
        return Check("access", "warn", detail, why, blocking=False, data=data, degrades=True)
    if settings.read_only and objects.data.get("never_held"):  # the object store's row says
        detail = f"{loads}: none there to load, stores nothing (read-only)"
        return Check("access", "warn", detail, blocking=False, data=data)
    if settings.read_only:
        detail = f"{loads}, stores nothing (read-only: ARTSTORE_READ_ONLY=1)"
        return Check("access", "ok", detail, blocking=False, data=data)
    down = index if index.status == "fail" else None
    if StoreSource.name not in answering:
        down = objects
    if down is not None:  # loads go on; what it compiles is not stored
        why = f"nothing is stored: {down.verdict or down.detail}"
        detail = f"{loads}, but {why}"
        return Check("access", "warn", detail, why, blocking=False, data=data, degrades=True)
    refusals = []
    if objects.data.get("writable") is False:
        path = Path(settings.blobs.path) / ns
        refusals.append(f"{path} is not writable by this user")
    if index.data.get("writes"):
        refusals.append(str(index.data["writes"]))
    if not refusals:
        data["stores"] = True
        detail = f"loads and stores entries of namespace {ns}"
        return Check("access", "ok", detail, blocking=False, data=data)
    why = "; ".join(refusals)
    index_file = diagnosis.sqlite_path(settings.index_url)
    owner = (
        Path(settings.blobs.path)
        if objects.data.get("writable") is False
        else (index_file.parent if index_file is not None else None)
    )
    fix = (
        ""
        if any("`" in r for r in refusals)
        else ": run as the user who owns the store "
        f"(`ls -ld {owner}` shows who), or set ARTSTORE_READ_ONLY=1 where this host "
        "only loads"
    )
    detail = f"{loads}, but every write is refused: {why}"
    return Check(
        "access",
        "warn",
        detail,
        blocking=False,
        degrades=True,
        data=data,
        verdict=why if "every write is refused" in why else f"every write is refused: {why}{fix}",
    )


def refused_by(access: Check, namespace: str) -> Check:
    """The access row of a writer whose binding row refuses every write (bucket and index
    are not one store): it loads and stores nothing, as the binding row's verdict says."""
    if not access.data.get("stores"):
        return access  # it says already that writes are refused, or that none are made
    detail = f"loads entries of namespace {namespace}, but every write is refused: see binding"
    data = dict(access.data, stores=False)
    return Check("access", "warn", detail, blocking=False, data=data)


def binding_not_checked() -> Check:
    """A reader's binding row: whether bucket and index are one store matters to writes
    only (a writer checks it before its first), and a reader makes none."""
    detail = "not checked: a reader writes nothing (a writer checks it before its first write)"
    return Check("binding", "skip", detail, blocking=False, data={"state": None})
