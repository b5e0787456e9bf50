"""`artstore pull`: fill this host's local tier with every entry for one fingerprint.

Nodes that start many processes, or that may lose the network, start warm: after a
pull, a process loads this fingerprint's executables from the tier without asking
the object store or the index (artifactstore.store.tier). A pull reads the namespace's
manifests and objects from the object store only, never the database, so it works
with a reader's read-only credentials and while the index is down.

Per published manifest (a streamed listing; never the whole list in memory):

- a key this host's key map already holds, for this fingerprint and with its object
  here, is present: nothing is fetched (a second pull GETs no object);
- otherwise its manifest is read; one for another fingerprint (or, given a module
  pattern, another module) is left alone: its object is never fetched;
- the object is fetched and verified exactly as a hit is (`ReadPath.verify`: digest,
  envelope, fingerprint, entry key, sizes, signature where trusted keys are set); a
  refused or corrupt one is counted and never kept;
- what fits within the tier's bound (ARTSTORE_LOCAL_TIER_SIZE) is kept; an entry that
  would take the tier past it is skipped and counted. Nothing already there is evicted.

Keys too quick to store (artifactstore.formats.quick) are learned too: the records of
this fingerprint are listed first (their names say everything: no GET), those whose key
has a manifest are dropped as the manifests are listed (stored since: not quick; the
tier forgets them as quick too), and the rest join the tier's quick keys once the
listing is complete (a pull that stopped learns none), so that a pulled node never
looks up its trivial jits. A refused listing of them (credentials from before they
existed) is said in the summary and stops nothing. So are the working sets of this
fingerprint (artifactstore.formats.workingset): copied into the tier, so that a pulled
node's first run of a program loads ahead what the team's runs of it loaded. Only a set
that parses and, where this host requires signatures, that a trusted key signed is
copied (replacing the tier's copy); the others are counted as refused and never copied.
The bound on sets read counts names of working sets only, so junk names cannot hide
the team's sets.

A namespace with no manifest to list and no store identity never held an entry: the
pull says so (`never_held`) and fails, for an `ARTSTORE_URL` that names an existing but
wrong bucket or prefix is what that looks like, and fetching nothing there is no success.

At most `jobs` entries are in flight (their GETs in parallel), so at most `jobs`
objects and their inflated executables are in memory at once. A failure of the object
store or of the tier's disk stops the pull (what was kept stays kept).
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from artifactstore.blobstores import never_held, open_blobstore
from artifactstore.blobstores.base import QUICK, WORKING_SETS
from artifactstore.config import Settings
from artifactstore.errors import ConfigError, CorruptObject, OverLimit, StoreUnavailable, one_line
from artifactstore.formats import codec
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.quick import SEPARATOR, split_quick_name
from artifactstore.formats.workingset import WorkingSet, check_program_id
from artifactstore.process.lanes import Lane
from artifactstore.store import Parts, Store, StoreParts, secure_local_dirs
from artifactstore.store.quick import BELOW_THRESHOLD_MAX
from artifactstore.store.tier import LocalTier
from artifactstore.store.tiers import open_tier
from artifactstore.store.verify import Refusal, refusal

log = logging.getLogger("artifactstore")

DEFAULT_JOBS = 8
MAX_WORKING_SETS = 1000  # records a pull reads (each at most 1 MiB): a team's programs


@dataclass
class PullReport:
    """What one pull did; `to_json` for `--json`."""

    namespace: str
    fingerprint: str
    tier: str
    tier_bound: int | None  # bytes; None: a local store's own tier, unbounded
    module: str | None = None
    dry_run: bool = False
    manifests: int = 0  # listed
    fetched: int = 0  # kept in the tier (dry run: would be)
    fetched_bytes: int = 0
    present: int = 0  # already in the tier: nothing fetched
    over_bound: int = 0  # skipped: the tier would exceed its bound
    over_bound_bytes: int = 0
    other_fingerprint: int = 0  # another platform's: never fetched
    other_module: int = 0  # not matching the module pattern: never fetched
    refused: int = 0  # signature refused (ARTSTORE_TRUSTED_KEYS): not kept
    corrupt: int = 0  # failed verification: not kept
    over_limit: int = 0  # over ARTSTORE_MAX_OBJECT_SIZE / ARTSTORE_MAX_EXECUTABLE_SIZE
    missing: int = 0  # manifest or object gone since the listing
    bad_manifests: int = 0  # unreadable manifests
    failed: int = 0  # could not be fetched or kept (see `stopped`)
    tier_bytes: int = 0  # the tier's own copies after the pull
    quick_keys: int = 0  # keys too quick to store, now known to the tier (dry run: would be)
    quick_unlisted: str | None = None  # why they were not listed, if they were not
    working_sets: int = 0  # programs' working sets copied to the tier (dry run: would be)
    working_sets_unlisted: str | None = None  # why they were not, if they were not read
    working_sets_refused: int = 0  # unreadable, or not signed by a trusted key: not copied
    stopped: str | None = None  # why the pull stopped early, if it did
    never_held: str | None = None  # the namespace never held an entry: a wrong URL, likely

    @property
    def ok(self) -> bool:
        return self.stopped is None and not self.failed and self.never_held is None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class Puller:
    """The store to read from and the tier to fill, opened without the index."""

    store: Store
    tier: LocalTier


def open_puller(settings: Settings, *, dry_run: bool = False) -> Puller:
    """The object store (checked) and this host's tier; never the index. Raises
    ConfigError / StoreUnavailable / UnsafeDirectory (one line each) when either
    cannot be used."""
    tier = open_tier(settings)
    if tier is None:
        raise ConfigError("the local tier is off (ARTSTORE_LOCAL_TIER=off): nothing to pull into")
    if settings.blobs.scheme == "file" and not Path(settings.blobs.path).is_dir():
        raise StoreUnavailable(f"no store at {settings.blobs.path}: check ARTSTORE_URL")
    secure_local_dirs(settings)
    blobs = open_blobstore(settings)
    blobs.check()
    if dry_run:
        tier.check()  # only refuses an unsafe one: a dry run creates nothing
    else:
        tier.prepare()
    # No engine: the index is opened only by writes and queries, and a pull makes none.
    return Puller(Store(Parts(settings, blobs, tier=tier)), tier)


def pull(
    puller: Puller,
    fingerprint: str,
    *,
    module: str | None = None,
    jobs: int = DEFAULT_JOBS,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    on_fetch: Callable[[Manifest], None] | None = None,
) -> PullReport:
    """Fill the tier with the namespace's entries for `fingerprint` (a digest), whose
    module names match the fnmatch `module` pattern if given. `progress` is called
    with 1 per manifest handled, `on_fetch` with each entry kept (or, in a dry run,
    that would be), both under one lock."""
    codec.check_digest(fingerprint)
    if jobs < 1:
        raise ValueError("jobs must be at least 1")
    run = _Pull(puller, fingerprint, module, dry_run, progress, on_fetch)
    quick = _quick_keys(run.store.parts, fingerprint, run.report)
    run.each_manifest(jobs, quick)
    report, store, tier = run.report, run.store, run.tier
    if report.stopped is None and not report.manifests:
        report.never_held = _never_held(store.parts, report)
    if report.stopped is None:  # else some manifests went unseen: their keys may be stored
        report.quick_keys = len(quick)
        if not dry_run:
            for key in quick:
                tier.quick.remember(key, 0.0)  # under any threshold that stores anything
    if not dry_run:
        tier.quick.save()
    if report.stopped is None:
        _working_sets(store.parts, tier, fingerprint, report, dry_run)
    report.tier_bytes = tier.object_bytes() if not dry_run else run.used
    return report


class _Pull:
    """One pull's shared state: its report, the tier's bytes used and in flight, and
    whether it stopped; the entries in flight update them under one lock."""

    def __init__(
        self,
        puller: Puller,
        fingerprint: str,
        module: str | None,
        dry_run: bool,
        progress: Callable[[int], None] | None,
        on_fetch: Callable[[Manifest], None] | None,
    ) -> None:
        self.store, self.tier = puller.store, puller.tier
        self.fingerprint, self.module, self.dry_run = fingerprint, module, dry_run
        self.progress, self.on_fetch = progress, on_fetch
        self.bound = self.tier.max_bytes if self.tier.owns_objects else None
        self.report = PullReport(
            namespace=self.store.parts.namespace,
            fingerprint=fingerprint,
            tier=str(self.tier.base),
            tier_bound=self.bound,
            module=module,
            dry_run=dry_run,
        )
        self.lock = threading.Lock()
        self.used = self.tier.object_bytes()  # the bound counts what is there and in flight
        self.stop = threading.Event()

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self.report, name, getattr(self.report, name) + n)

    def reserve(self, size: int) -> bool:
        """Room in the tier's bound for `size` bytes more, taken; else counted as over."""
        with self.lock:
            if self.bound is not None and self.used + size > self.bound:
                self.report.over_bound += 1
                self.report.over_bound_bytes += size
                return False
            self.used += size
            return True

    def release(self, size: int) -> None:
        with self.lock:
            self.used -= size

    def halt(self, why: str) -> None:
        with self.lock:
            if self.report.stopped is None:
                self.report.stopped = why
        self.stop.set()

    def each_manifest(self, jobs: int, quick: set[str]) -> None:
        """Stream the namespace's manifest keys, at most `jobs` entries (and objects) in
        flight; a listed key is no quick key (it is stored now)."""
        slots = threading.BoundedSemaphore(jobs)
        fetches = Lane("pull", threads=jobs)
        try:
            for key in self.store.parts.records.iter_manifest_keys():
                quick.discard(key)
                if not self.dry_run:
                    self.tier.quick.forget(key)  # nor here, if this host once found it quick
                slots.acquire()
                if self.stop.is_set():
                    slots.release()
                    break
                self.count("manifests")
                fetches.submit("pull", functools.partial(self.one_slot, key, slots))
        except StoreUnavailable as exc:  # the listing failed part way
            self.halt(str(exc))
        finally:
            fetches.drain(None)

    def one_slot(self, key: str, slots: threading.BoundedSemaphore) -> None:
        """One entry in flight: a store outage stops the pull, any other failure is
        this entry's (counted; the pull goes on)."""
        try:
            if not self.stop.is_set():
                self.one(key)
        except StoreUnavailable as exc:
            self.count("failed")
            self.halt(str(exc))
        except Exception as exc:
            log.debug("artifactstore: pull of %s failed: %s", key[:12], one_line(exc))
            self.count("failed")
        finally:
            if self.progress is not None:
                with self.lock:
                    self.progress(1)
            slots.release()

    def one(self, key: str) -> None:
        """One listed key: kept in the tier if it is this pull's, not here yet, and fits."""
        found = self.manifest(key)
        if found is None:
            return
        manifest, present = found
        if manifest.fingerprint != self.fingerprint:
            self.count("other_fingerprint")
            return
        if self.module is not None and not fnmatch.fnmatchcase(manifest.module_name, self.module):
            self.count("other_module")
            return
        if present:
            self.count("present")
            return
        if not self.reserve(manifest.size):
            return
        kept = self.dry_run
        if not self.dry_run:
            try:
                kept = _fetch(
                    self.store, self.tier, manifest, self.fingerprint, self.count, self.halt
                )
            finally:
                if not kept:
                    self.release(manifest.size)
        if kept:
            with self.lock:
                self.report.fetched += 1
                self.report.fetched_bytes += manifest.size
                if self.on_fetch is not None:
                    self.on_fetch(manifest)

    def manifest(self, key: str) -> tuple[Manifest, bool] | None:
        """`key`'s manifest and whether its entry is here already: the tier's record
        where the tier holds this fingerprint's object, else the store's (None, counted,
        where it is gone or unreadable)."""
        held = self.tier.record(key)
        if (
            isinstance(held, Manifest)
            and held.fingerprint == self.fingerprint
            and self.tier.blobs.exists(held.digest)
        ):
            return held, True
        data = self.store.parts.records.get_manifest(key)
        if data is None:  # withdrawn since the listing
            self.count("missing")
            return None
        try:
            return Manifest.decode(data, key), False
        except CorruptObject as exc:
            log.debug("artifactstore: pull: %s", exc)
            self.count("bad_manifests")
            return None


def _never_held(parts: StoreParts, report: PullReport) -> str | None:
    """The line saying this namespace never held an entry, where it did not: a pull there
    fetched nothing from a store that never existed, and fails (a refused look is one
    more reason the pull stopped)."""
    try:
        return never_held(parts.blobs, parts.settings)
    except StoreUnavailable as exc:
        report.stopped = str(exc)
        return None


def _quick_keys(parts: StoreParts, fingerprint: str, report: PullReport) -> set[str]:
    """The keys of `fingerprint`'s quick-key records (at most as many as a tier keeps);
    none, with the reason in `report`, where the object store refuses to list them."""
    keys: set[str] = set()
    try:
        for name in parts.blobs.iter_records(QUICK, prefix=fingerprint + SEPARATOR):
            try:
                of, key = split_quick_name(name)
            except ValueError:  # not one of ours: anyone who may write the bucket put it
                continue
            if of == fingerprint:
                keys.add(key)
            if len(keys) >= BELOW_THRESHOLD_MAX:
                break
    except StoreUnavailable as exc:
        report.quick_unlisted = str(exc)  # one secret-free line, as `stopped`
        keys.clear()
    return keys


def _working_sets(
    parts: StoreParts, tier: LocalTier, fingerprint: str, report: PullReport, dry_run: bool
) -> None:
    """Copy `fingerprint`'s working sets into the tier, replacing the tier's copies; one
    that is unreadable or (where signatures are required) not signed by a trusted key is
    counted and not copied: anyone who may write the bucket chose its bytes. A refused
    listing is said. The bound counts working-set names only, never junk ones."""
    trusted, read = parts.settings.trusted_keys, 0
    try:
        for name in parts.blobs.iter_records(WORKING_SETS):
            try:
                check_program_id(name)
            except ValueError:  # not a working set's name: not counted against the bound
                continue
            read += 1
            if read > MAX_WORKING_SETS:
                break
            data = parts.blobs.get_record(WORKING_SETS, name)
            try:
                found = None if data is None else WorkingSet.decode(data, name)
            except CorruptObject as exc:
                log.debug("artifactstore: pull: %s", exc)
                report.working_sets_refused += 1
                continue
            if data is None or found is None or found.fingerprint != fingerprint:
                continue
            why = None if trusted is None else found.refusal(trusted, parts.namespace)
            if why is not None:
                log.debug("artifactstore: pull: working set %s not copied: %s", name[:12], why)
                report.working_sets_refused += 1
                continue
            if not dry_run:
                tier.write_file(f"{WORKING_SETS.folder}/{name}", data)
            report.working_sets += 1
    except StoreUnavailable as exc:
        report.working_sets_unlisted = str(exc)  # one secret-free line, as `stopped`


def _fetch(
    store: Store,
    tier: LocalTier,
    manifest: Manifest,
    fingerprint: str,
    count: Callable[[str], None],
    halt: Callable[[str], None],
) -> bool:
    """Fetch, verify and keep one entry; True if kept."""
    try:
        data = store.parts.reads.fetch_object(manifest)
    except OverLimit as exc:
        return _not_kept(refusal(exc), count)
    if data is None:
        count("missing")
        return False
    # The executable is inflated and checked as a load would; it is not kept.
    checked = store.parts.reads.verify(manifest, data, fingerprint)
    if isinstance(checked, Refusal):
        return _not_kept(checked, count)
    try:
        tier.remember(manifest.key, manifest, data)
    except OSError as exc:  # a full or read-only disk: every next entry would fail too
        count("failed")
        halt(f"local tier not updated ({one_line(exc)})")
        return False
    return True


def _not_kept(why: Refusal, count: Callable[[str], None]) -> bool:
    """An entry the verifier refused costs a count: over this reader's limits, refused
    for trust (its signature, a removed version), or else damaged or foreign."""
    log.debug("artifactstore: pull: not kept: %s", why)
    trust = why.signature or why.reason == "named_removed"
    count("over_limit" if why.reason == "over_limit" else "refused" if trust else "corrupt")
    return False
