"""The lookup: record -> object -> verify, walking down; then what it costs.

Why a pipeline: every step either hands what it found to the next or turns into a
miss, and a miss is always "JAX compiles as usual", never an error. No step reads
a database server (a cluster of any size costs the index nothing, issue 16): the
record is the key's manifest in the object store; only a SQLite index, a file, is
also asked for entries stored without one (0.2 clients, a failed publication).
This host's tier is asked before any Store opens (runtime.session).

`peek` only reads: it returns a hit or what it refused (`Refused`), and the bytes
are checked by the one verifier (store.verify). `settle` is the store level's price
of each: a hit is remembered in the tier, a gone object's entry withdrawn, a damaged
object quarantined (by the write path), a refusal of trust noted for `refused`;
`count` counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from artifactstore.errors import OverLimit
from artifactstore.formats.manifest import Manifest
from artifactstore.index.repo import EntryInfo
from artifactstore.process.notices import warn_once as process_warn_once
from artifactstore.store import removed
from artifactstore.store.account import Accounts
from artifactstore.store.backends import Backends
from artifactstore.store.chain import Found, Missed
from artifactstore.store.lease import trusts_no_key
from artifactstore.store.verify import Expected, Refusal, Verified, refusal, verify
from artifactstore.store.write import WritePath, remember

NO_TRUSTED_KEYS = (
    "this store requires signatures and no key is trusted: loading nothing, compiling. "
    "Set ARTSTORE_TRUSTED_KEYS to your writers' .pub files (`artstore keygen` makes a pair)"
)


@dataclass(frozen=True)
class Looked:
    """What `peek` found: a verified payload, its cost not paid yet (`settle` makes it the
    lookup's one result, a `store.chain.Found`)."""

    payload: bytes
    entry: EntryInfo | Manifest  # what led to the object: its manifest, or its index row
    # For `settle`: the object as stored and the record the tier remembers it by.
    data: bytes | None = field(default=None, repr=False, compare=False)
    record: Manifest | None = field(default=None, repr=False, compare=False)
    bad_manifest: str | None = None  # a damaged manifest passed over on the way (see find)


@dataclass(frozen=True)
class Refused:
    """What `peek` found instead of a payload, its cost not paid yet (`settle`): the miss
    it is counted as, the entry that led there, and the verifier's refusal where the
    object was checked (None: refused from its record alone)."""

    reason: str
    entry: EntryInfo | Manifest | None = None
    refusal: Refusal | None = None
    bad_manifest: str | None = None


class ReadPath:
    """One store's lookups; what they found bad goes to `writes` (withdrawn, quarantined)."""

    def __init__(
        self, backends: Backends, accounts: Accounts, writes: WritePath, refused: dict[str, str]
    ) -> None:
        self.backends = backends
        self.accounts = accounts
        self.writes = writes
        self.refused = refused  # key -> why this process refused its entry (see _refused)

    def get(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | None:
        """Verified payload for `key` built for this fingerprint, or None (a miss): `peek`,
        its cost paid (`settle`) and its hit or miss counted (`count`)."""
        outcome = self.settle(key, self.peek(key, fingerprint_digest, callbacks=callbacks))
        self.count(key, fingerprint_digest, outcome)
        return outcome if isinstance(outcome, Found) else None

    def count(self, key: str, fingerprint_digest: str, outcome: Found | Missed) -> None:
        """Count what `peek` returned: a hit (its access, for LRU, and the process's
        counters) or a miss and its reason."""
        if isinstance(outcome, Missed):
            self.accounts.miss(outcome.reason, key=key, fingerprint=fingerprint_digest)
        else:
            self.accounts.touch(key)
            entry = outcome.entry
            self.accounts.hit(entry.fingerprint, size=entry.size, compile_secs=entry.compile_secs)

    def peek(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Looked | Refused:
        """`key`'s verified payload, or what was refused; reads only (no count, no log,
        nothing withdrawn, quarantined or remembered: `settle` decides that)."""
        settings = self.backends.settings
        entry, bad = self.find(key)
        if entry is None:
            return Refused("misses", bad_manifest=bad)
        if trusts_no_key(settings):
            # Signatures required, no key trusted: nothing here may run, so fetch nothing.
            return Refused("untrusted_key", entry, bad_manifest=bad)
        if entry.fingerprint != fingerprint_digest:
            # Keys include the fingerprint, so this means a damaged or forged row.
            return Refused("fingerprint_mismatch", entry, bad_manifest=bad)
        try:
            data = self.fetch_object(entry)
        except OverLimit as exc:
            return Refused("over_limit", entry, refusal(exc), bad_manifest=bad)
        if data is None:
            return Refused("missing_object", entry, bad_manifest=bad)
        checked = self.verify(entry, data, fingerprint_digest, callbacks=callbacks)
        if isinstance(checked, Refusal):
            return Refused(checked.reason, entry, checked, bad_manifest=bad)
        record = entry if isinstance(entry, Manifest) else Manifest.of(entry, callbacks=callbacks)
        return Looked(checked.payload, entry, data, record, bad)

    def settle(self, key: str, outcome: Looked | Refused) -> Found | Missed:
        """What the store level charges for what `peek` found (counted nothing: `count`
        does). A hit is remembered in this host's tier. A refusal is a miss, logged once;
        one of trust is noted for `refused`; a gone object costs its entry, damaged bytes
        their object (quarantined); any other refusal costs nothing but the miss, since
        the bytes are intact and another reader (or trace) may load them."""
        warn_once = self.backends.warn_once
        if outcome.bad_manifest is not None:  # passed over: a miss for this key, not the breaker
            self.accounts.counters.add("bad_manifest")
            warn_once("manifest", "ignoring a damaged manifest: %s", outcome.bad_manifest)
        if isinstance(outcome, Looked):
            if outcome.data is not None and outcome.record is not None:
                remember(self.backends, key, outcome.record, outcome.data)
            return Found(outcome.entry, outcome.payload)  # its manifest, or its index row
        reason, entry, why = outcome.reason, outcome.entry, outcome.refusal
        if reason == "untrusted_key" and why is None:
            process_warn_once("untrusted_key", NO_TRUSTED_KEYS)
            self.refused[key] = reason
        elif reason == "fingerprint_mismatch" and why is None:
            warn_once(
                "fingerprint", "entry %s was built for another platform; ignoring it", key[:12]
            )
        elif reason == "missing_object" and entry is not None:
            warn_once(
                "missing",
                "entry %s points at object %s, which is gone (removed by gc or by hand); compiling",
                key[:12],
                entry.digest[:12],
            )
            self.writes.drop_entry(entry)
        elif why is not None:
            self._refused(key, entry, why)
        return Missed(reason)

    def _refused(self, key: str, entry: EntryInfo | Manifest | None, why: Refusal) -> None:
        """The cost of bytes the verifier refused (see `settle`); why is noted for
        `ReadPath.refused` where the entry itself is refused, not this reader's view of it."""
        if why.signature:  # intact bytes this reader will not run: never quarantined
            process_warn_once(
                why.reason, "refusing executable: %s (ARTSTORE_TRUSTED_KEYS); compiling", why
            )
        elif why.damaged and entry is not None:
            self.writes.quarantine(entry, str(why))
        elif why.reason in _LOGGED:
            name, message = _LOGGED[why.reason]
            self.backends.warn_once(name, message, why)
        if why.signature or why.reason in _NOTED:
            self.refused[key] = why.reason

    def find(self, key: str) -> tuple[EntryInfo | Manifest | None, str | None]:
        """Where `key`'s object is: its manifest in the object store, and why a manifest
        there was passed over (damaged: `settle` counts it), if one was. A SQLite index
        (a file) is also asked for entries without one (stored by 0.2 clients, or whose
        publication failed); a database server never is: there, a missing manifest is
        a miss, and a writer that compiles the key publishes it (see `WritePath.admit`)."""
        backends = self.backends
        backends.using("object store")
        data = backends.blobs.get_manifest(key)
        bad = None
        if data is not None:
            try:
                return Manifest.decode(data, key), None
            except Exception as exc:  # untrusted bytes: a miss for this key, never the breaker
                bad = str(exc)
        if backends.settings.index_is_server:
            return None, bad
        backends.using("index")
        return backends.index.lookup(key), bad

    def fetch_object(self, entry: EntryInfo | Manifest) -> bytes | None:
        """The bytes of `entry`'s object as stored, unverified (see `verify`), or None if
        it is gone; OverLimit for one bigger than ARTSTORE_MAX_OBJECT_SIZE (not downloaded)."""
        self.backends.using("object store")
        max_bytes = self.backends.settings.max_object_bytes
        return self.backends.blobs.get(entry.digest, max_bytes=max_bytes)

    def verify(
        self,
        entry: EntryInfo | Manifest,
        data: bytes,
        fingerprint_digest: str,
        *,
        callbacks: int | None = None,
        with_metadata: bool = False,
    ) -> Verified | Refusal:
        """The payload in `entry`'s object `data`, checked by the one verifier as every
        load is (digest, envelope, fingerprint, entry key, callback count given
        `callbacks`, sizes, the signature where this reader lists trusted keys, the
        payload as its kind); then, for a named version, that `artstore rm --name` did
        not remove it (`named_removed`). `with_metadata`: objects that name no entry are
        refused (`artstore sign`). What a refusal costs is the caller's to decide
        (`settle`: a miss; `artstore pull`: counted, not kept)."""
        settings = self.backends.settings
        expected = Expected(
            digest=entry.digest,
            fingerprint=fingerprint_digest,
            namespace=settings.namespace,
            key=entry.key,
            trusted=settings.trusted_keys,
            callbacks=callbacks,
            raw_size=entry.raw_size,
            max_raw_size=settings.max_executable_bytes,
            with_metadata=with_metadata,
        )
        checked = verify(data, expected)
        if isinstance(checked, Verified):
            try:  # after: only authentic objects cost a GET
                ignored = removed.check(
                    self.backends.blobs, data, settings.trusted_keys, settings.namespace
                )
            except removed.RemovedVersion as exc:
                return refusal(exc)
            if ignored is not None:  # no trusted signature where one is required: said once
                self.accounts.counters.add("named_removal_ignored")
                process_warn_once("named-removal-ignored", "%s", ignored)
        return checked


# Refusals that cost a miss and one log line: (its once-key, the line).
_LOGGED = {
    # Planted back after `artstore rm --name`: never run (store.removed).
    removed.RemovedVersion.reason: ("named-removed", "refusing executable: %s; compiling"),
    "fingerprint_mismatch": ("fingerprint", "refusing foreign executable: %s"),
    # The object is intact; the index row pointing here is wrong (damaged or forged).
    "wrong_entry": ("wrong-entry", "refusing executable of another entry: %s"),
    # Bound to its key but not to this trace's callbacks: would crash on execute.
    "callback_mismatch": ("callbacks", "refusing executable: %s; compiling"),
    # Bigger than this reader allows; another may load it.
    "over_limit": ("over-limit", "executable not loaded: %s; compiling"),
    # Signed and bound to its key, yet not a payload of its kind: a mis-written entry.
    "malformed": ("malformed", "refusing executable: %s; compiling"),
}
# Refusals of the entry itself, noted for `ReadPath.refused` (beside those of its signature).
_NOTED = frozenset({removed.RemovedVersion.reason, "malformed"})
