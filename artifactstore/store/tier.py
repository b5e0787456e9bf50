"""The local disk tier: key -> verified executable on this host, without the index.

Why: a warm process should pay neither for the index (importing SQLAlchemy,
a database round trip) nor for the object store (importing boto3, a GET) to
load executables this host already holds. The tier keeps, per namespace,

    keys/ab/<key>      the entry's manifest, the record the store publishes
                       (artifactstore.formats.manifest); 0.2 wrote {"d", "f", "c"} only
    objects/ab/<dig>   the object itself (for a writable local store: the store's own)
    access/*.json      hits served here, folded into the index by the next Store.open
    below-threshold.json  keys whose compile was too quick to store (see below)

A key file only says where to look: the object's digest, envelope and
fingerprint are verified on every read exactly as on the full path, so a stale
or damaged tier can cause a miss, never a wrong load. Without trusted keys that
verification cannot tell a planted object from ours, so the tier is used only
while its directories are this user's, writable and swappable by no one else
(artifactstore.blobstores.safedir: checked on every open, through directory descriptors); a
refused tier is not used again by the process (one warning), and the store works
without it. The tier is a cache in front of the index, not a second index:
deleting an entry in a shared store does not reach other hosts' tiers (their
copies remain valid executables); `invalidate()` drops this host's key map when
an operator removes entries from a local store. Tiers of remote stores are
bounded by ARTSTORE_LOCAL_TIER_SIZE, least recently used objects going first.

Ordinary programs also compile small jits (`jnp.ones`, reshapes) faster than
ARTSTORE_MIN_COMPILE_SECS; they are never stored, so looking them up is a
certain miss that would open the index (and import SQLAlchemy) in every warm
process. The tier remembers those keys with their compile time, bounded in
number and expiring, so a warm process answers them without opening anything. Their
executables are kept too, in a tier of this host's own (`below-threshold/`, store.tiers),
so that a warm process here loads them instead of compiling.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.errors import CorruptObject, OverLimit, UnsafeDirectory
from artifactstore.formats.codec import check_digest
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.records import load_record
from artifactstore.process.counters import Counters
from artifactstore.process.notices import warn_once
from artifactstore.store.chain import Found
from artifactstore.store.quick import QuickKeys
from artifactstore.store.verify import Expected, Refusal, refusal, verify

if TYPE_CHECKING:
    from artifactstore.formats.signing import TrustedKeys

log = logging.getLogger("artifactstore")
T = TypeVar("T")

# key -> (hits, latest access as seconds since the epoch)
Accesses = dict[str, tuple[int, float]]


@dataclass(frozen=True)
class TierEntry:
    digest: str
    fingerprint: str
    compile_secs: float
    raw_size: int | None = None  # the executable's size, checked on load where known
    size: int | None = None  # the object's size, where known (for usage counts)


@dataclass(frozen=True)
class TierMiss:
    """What `LocalTier.peek` found instead of a payload, its cost not paid (`settle`):
    whether the key file leads nowhere usable, and the verifier's refusal of the copy."""

    forget: bool = False
    refusal: Refusal | None = None
    digest: str | None = None  # the refused copy's


# Refused copies that can never load on this host: a private copy is dropped.
_UNLOADABLE = frozenset({"corrupt", "fingerprint_mismatch", "malformed"})


def _entry(record: Manifest | TierEntry) -> TierEntry:
    if isinstance(record, Manifest):
        m = record
        return TierEntry(m.digest, m.fingerprint, m.compile_secs, m.raw_size, m.size)
    return record


@dataclass(frozen=True)
class Reads:
    """What a tier of this process loads: only objects signed by one of `trusted` for
    `namespace` (ARTSTORE_TRUSTED_KEYS; None: signatures unchecked; the namespace defaults
    to the tier's directory name), none over `max_object_bytes` stored or
    `max_executable_bytes` inflated (ARTSTORE_MAX_OBJECT_SIZE, _EXECUTABLE_SIZE). A copy in
    the tier is checked as the store's would be."""

    trusted: TrustedKeys | None = None
    namespace: str | None = None
    max_object_bytes: int | None = None
    max_executable_bytes: int | None = None


class LocalTier:
    def __init__(
        self,
        blobs: LocalBlobStore,
        *,
        owns_objects: bool,
        max_bytes: int | None = None,
        reads: Reads = Reads(),
        counters: Counters | None = None,
        quiet: bool = False,
    ) -> None:
        """`blobs`: the directory (whose `safedir.Tree` checks every open, and names the
        option that chose it in refusals); `owns_objects`: its objects are this tier's
        copies (False: a writable local store's own); `max_bytes`: what it is pruned to;
        `counters`: where refusals count (a session's: the process's); `quiet`: a copy
        refused for its signature is a debug line, not counted (this host's own quick
        compiles: the next compile replaces it)."""
        self.blobs = blobs
        self.tree = self.blobs.tree  # every file below is opened through it
        self._off = False  # a directory was refused: not used again by this process
        self.reads = reads
        self.namespace = reads.namespace if reads.namespace is not None else blobs.base.name
        self.counters = counters if counters is not None else Counters()
        self.base = self.blobs.base
        self.keys = self.base / "keys"
        self.journal = self.base / "access"
        self.owns_objects = owns_objects
        self.quiet = quiet
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._accesses: Accesses = {}
        self._pruned = False
        # Keys too quick to store, so never looked up (store/quick.py).
        quick = "below-threshold.json"
        self.quick = QuickKeys(
            quick, lambda: self.read_file(quick), lambda data: self.write_file(quick, data)
        )

    # -- is this directory ours? ------------------------------------------------
    def check(self) -> bool:
        """Whether the tier directory exists and is safe to use; raises UnsafeDirectory."""
        return self.tree.check(self.base)

    def _refused(self, exc: UnsafeDirectory) -> None:
        """A refused directory turns the tier off for the process (one warning): nothing
        in it is read, so nothing another user planted or swapped in is loaded."""
        self._off = True
        warn_once("unsafe-tier", "local tier not used: %s", exc)

    def _do(self, action: Callable[[], T], default: T) -> T:
        """`action()` in the tier's directories, or `default` when the tier is (or now
        gets) refused, or a file or directory is missing; other OSErrors are raised."""
        try:
            return default if self._off else action()
        except UnsafeDirectory as exc:
            self._refused(exc)
        except FileNotFoundError:
            pass
        return default

    # -- small files beside the key map (quick keys, working sets) ---------------
    def read_file(self, name: str) -> bytes | None:
        """The file `name` under the tier's directory, or None if it is missing or the
        tier is refused; other OSErrors are raised."""
        return self._do(lambda: self.tree.read(self.base / name), None)

    def write_file(self, name: str, data: bytes) -> None:
        """Replace `name` atomically, not fsynced: these files are hints, rebuilt by use."""
        self._do(lambda: self.tree.write(self.base / name, data, durable=False), None)

    def _key_path(self, key: str) -> Path:
        if len(key) < 8 or not key.isalnum():
            raise ValueError(f"not a cache key: {key!r}")
        return self.keys / key[:2] / key

    # -- read ---------------------------------------------------------------
    def has_entries(self) -> bool:
        """Cheap check (no scan) whether this host has ever remembered a key."""
        with contextlib.suppress(OSError):
            return self._do(lambda: bool(self.tree.names(self.keys)), False)
        return False

    def key_names(self) -> list[str]:
        """Keys this host remembers (a scan of the key map: for reports, not the hot path)."""

        def names() -> list[str]:
            shards = [s for s in self.tree.names(self.keys) if len(s) == 2]
            return [n for s in shards for n in self.tree.names(self.keys / s) if n[0] != "."]

        with contextlib.suppress(OSError):
            return self._do(names, list[str]())
        return []

    def lookup(self, key: str) -> TierEntry | None:
        record = self.record(key)
        return _entry(record) if record is not None else None

    def record(self, key: str) -> Manifest | TierEntry | None:
        """`key`'s key file as written: a manifest, or a 0.2 key file; None (and an
        unreadable one forgotten) if there is none."""
        record, unreadable = self._read_record(key)
        if unreadable:
            self.forget(key)
        return record

    def _read_record(self, key: str) -> tuple[Manifest | TierEntry | None, bool]:
        """`key`'s key file, and whether one was there but unreadable; reads only."""
        if self._off:
            return None, False
        try:
            # Never through a symbolic link: a key file chooses what is loaded.
            data = self.tree.read(self._key_path(key))
            raw = load_record(data)  # nested a few levels at most: no RecursionError
            if isinstance(raw, dict) and "v" in raw:  # a manifest, checked as the store's
                return Manifest.decode(data, key), False
            # A 0.2 key file: its digests name files, so they are checked as digests.
            entry = TierEntry(check_digest(raw["d"]), check_digest(raw["f"]), float(raw["c"]))
            return entry, False
        except FileNotFoundError:
            return None, False
        except UnsafeDirectory as exc:
            self._refused(exc)
            return None, False
        except (OSError, ValueError, KeyError, TypeError, OverflowError, CorruptObject):
            return None, True

    def get(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | None:
        """`peek`, its cost paid (`settle`) and its access recorded (for LRU) when it hits."""
        hit = self.settle(key, self.peek(key, fingerprint_digest, callbacks=callbacks))
        if hit is not None:
            self.record_access(key)
        return hit

    def peek(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | TierMiss:
        """The verified payload for `key` (`callbacks`: as for `Store.get`), or why not;
        reads only: what a miss costs (the key file, the copy, a count) and a hit's LRU
        touch are `settle`'s, the access `get`'s."""
        record, unreadable = self._read_record(key)
        if record is None:
            return TierMiss(forget=unreadable)
        entry = _entry(record)
        if entry.fingerprint != fingerprint_digest:
            return TierMiss()
        try:
            data = self._do(
                lambda: self.blobs.get(entry.digest, max_bytes=self.reads.max_object_bytes), None
            )
        except OverLimit as exc:
            return TierMiss(refusal=refusal(exc))
        if data is None:
            return TierMiss(forget=not self._off)
        expected = Expected(
            digest=entry.digest,
            fingerprint=fingerprint_digest,
            namespace=self.namespace,
            key=key,
            trusted=self.reads.trusted,
            callbacks=callbacks,
            raw_size=entry.raw_size,
            max_raw_size=self.reads.max_executable_bytes,
        )
        checked = verify(data, expected)
        if isinstance(checked, Refusal):
            keep = checked.reason == "over_limit"  # another reader's limits may allow it
            return TierMiss(forget=not keep, refusal=checked, digest=entry.digest)
        return Found(entry, checked.payload)

    def settle(self, key: str, outcome: Found | TierMiss) -> Found | None:
        """What this tier charges for what `peek` found: a hit touches its copy (LRU order
        for pruning); a miss forgets a key file that leads nowhere usable and drops a
        private copy that can never load here. The store's path, asked next, decides what
        the key loads; a refusal of trust is counted here only for this tier's own copies."""
        if isinstance(outcome, Found):
            if self.owns_objects:
                with contextlib.suppress(UnsafeDirectory):  # refused at the next open
                    self.blobs.touch(outcome.entry.digest)
            return outcome
        why = outcome.refusal
        if why is not None and why.signature and self.owns_objects and not self.quiet:
            self.counters.add("tier_" + why.reason)
            warn_once(why.reason, "tier copy of %s not loaded: %s", key[:12], why)
        elif why is not None and why.reason == "wrong_entry":  # a damaged or planted key file
            self.counters.add("tier_wrong_entry")
            warn_once("wrong-entry", "tier key file of %s refused: %s", key[:12], why)
        elif why is not None:
            log.debug("artifactstore: tier copy of %s not loaded: %s", key[:12], why)
        if outcome.forget:
            self.forget(key)
        if why is not None and why.reason in _UNLOADABLE and self.owns_objects:
            assert outcome.digest is not None
            self.blobs.delete(outcome.digest)  # a private copy; a local store's is its own
        return None

    # -- write --------------------------------------------------------------
    def remember(self, key: str, entry: TierEntry | Manifest, data: bytes) -> None:
        """Note `key` -> `entry` (and keep a copy of `data` when the tier owns its objects).

        A manifest is written as the store publishes it; a bare TierEntry as 0.2 did."""
        if isinstance(entry, Manifest):
            body = entry.encode()
        else:
            old = {"d": entry.digest, "f": entry.fingerprint, "c": entry.compile_secs}
            body = json.dumps(old).encode()
        if self.owns_objects:
            self._do(lambda: self.blobs.put(entry.digest, data), False)
        self._do(lambda: self.tree.write(self._key_path(key), body, durable=False), None)
        if not self._off and self.owns_objects and self.max_bytes is not None and not self._pruned:
            self._pruned = True  # one scan per process bounds the cost
            self.prune(self.max_bytes)

    def prepare(self) -> None:
        """Create the tier's directory now, or raise why it cannot be used (UnsafeDirectory,
        OSError), where `remember` would only warn: for `artstore pull`, which must not
        report entries fetched that the tier then declined to keep."""
        self.blobs.make_dir(self.base)

    def object_bytes(self) -> int:
        """What this tier's own copies take on disk (a scan: for `artstore pull`, not the
        hot path); 0 for a local store's tier, whose objects are the store's."""
        if not self.owns_objects or self._off:
            return 0
        return sum(blob.size for blob in self.blobs.iter_blobs())

    def forget(self, key: str) -> None:
        with contextlib.suppress(OSError, ValueError, UnsafeDirectory):
            self.tree.unlink(self._key_path(key))

    def invalidate(self) -> None:
        """Forget every key at once (entries were removed from the store behind us)."""
        old = self.base / f".keys-old-{uuid.uuid4().hex}"
        if self._do(lambda: self.tree.rename(self.keys, old), False):
            shutil.rmtree(old, ignore_errors=True)

    def prune(self, max_bytes: int) -> int:
        """Delete least recently used private copies until at most 90% of `max_bytes` remain."""
        blobs = sorted(self.blobs.iter_blobs(), key=lambda b: b.mtime)
        total = sum(b.size for b in blobs)
        removed = 0
        if total <= max_bytes:
            return 0
        for blob in blobs:
            if total <= max_bytes * 0.9:
                break
            if self.blobs.delete(blob.digest):
                total -= blob.size
                removed += 1
        return removed

    # -- access journal -----------------------------------------------------
    def record_access(self, key: str, when: float | None = None) -> None:
        with self._lock:
            count, _ = self._accesses.get(key, (0, 0.0))
            self._accesses[key] = (count + 1, time.time() if when is None else when)

    def take_accesses(self) -> Accesses:
        with self._lock:
            taken, self._accesses = self._accesses, {}
        return taken

    def write_journal(self, accesses: Accesses | None = None) -> None:
        """Leave hits (this process's, or `accesses`) for a later Store.open to fold in."""
        accesses = self.take_accesses() if accesses is None else accesses
        if not accesses:
            return
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        body = json.dumps(accesses).encode()
        self._do(lambda: self.tree.write(self.journal / name, body, durable=False), None)

    def has_journals(self) -> bool:
        """Whether hits wait here to be reported (names only; `drain_journals` reads them)."""
        try:
            return not self._off and any(self.journal.glob("*.json"))
        except OSError:
            return False

    def drain_journals(self) -> Iterator[Accesses]:
        """Each journal once: claimed by an atomic rename, so two folders never both count it."""
        try:
            for name, data in [] if self._off else self.tree.claim(self.journal, ".json"):
                try:
                    raw = load_record(data)  # nested a few levels at most
                    yield {str(k): (int(n), float(t)) for k, (n, t) in raw.items()}
                except (ValueError, TypeError, AttributeError, OverflowError):
                    log.debug("artifactstore: dropping unreadable access journal %s", name)
        except UnsafeDirectory as exc:
            self._refused(exc)
