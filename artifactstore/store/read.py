"""The lookup: record -> object -> verify -> remember in the tier, walking down.

Why a pipeline: every step either hands what it found to the next or turns into a
miss, and a miss is always "JAX compiles as usual", never an error. No step reads
a database server (a cluster of any size costs the index nothing, issue 16): the
record is the key's manifest in the object store; only a SQLite index, a file, is
also asked for entries stored without one (0.2 clients, a failed publication).
This host's tier is asked before any Store opens (runtime.session); a hit found
here is remembered in it. What a step found bad is removed by the write path.
"""

from __future__ import annotations

from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats import codec
from artifactstore.formats.manifest import Manifest
from artifactstore.index.repo import EntryInfo
from artifactstore.store import removed
from artifactstore.store.account import Accounts
from artifactstore.store.backends import Backends
from artifactstore.store.chain import Found, Missed
from artifactstore.store.notices import warn_once as process_warn_once
from artifactstore.store.write import WritePath, remember

NO_TRUSTED_KEYS = (
    "this store requires signatures and no key is trusted: loading nothing, compiling. "
    "Set ARTSTORE_TRUSTED_KEYS to your writers' .pub files (`artstore keygen` makes a pair)"
)


class ReadPath:
    """One store's lookups; what they found bad goes to `writes` (withdrawn, quarantined)."""

    def __init__(
        self, backends: Backends, accounts: Accounts, writes: WritePath, refused: dict[str, str]
    ) -> None:
        self.backends = backends
        self.accounts = accounts
        self.writes = writes
        self.refused = refused  # key -> why this process refused its entry's signature

    def get(
        self, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | None:
        """Verified payload for `key` built for this fingerprint, or None (a miss): `peek`,
        its hit or miss counted (`count`)."""
        outcome = self.peek(key, fingerprint_digest, callbacks=callbacks)
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
    ) -> Found | Missed:
        """`key`'s verified payload, or why not, counted nothing (`count` does): what a
        step found bad is still withdrawn or quarantined, and a hit remembered in the tier."""
        settings, warn_once = self.backends.settings, self.backends.warn_once
        entry = self.find(key)
        if entry is None:
            return Missed("misses")
        if settings.trusted_keys is not None and not settings.trusted_keys.keys:
            # Signatures required, no key trusted: nothing here may run, so fetch nothing.
            process_warn_once("untrusted_key", NO_TRUSTED_KEYS)
            self.refused[key] = "untrusted_key"
            return Missed("untrusted_key")
        if entry.fingerprint != fingerprint_digest:
            # Keys include the fingerprint, so this means a damaged or forged row.
            warn_once(
                "fingerprint", "entry %s was built for another platform; ignoring it", key[:12]
            )
            return Missed("fingerprint_mismatch")
        try:
            data = self.fetch_object(entry)
        except OverLimit as exc:
            return self._over_limit(exc)
        if data is None:
            warn_once(
                "missing",
                "entry %s points at object %s, which is gone (removed by gc or by hand); compiling",
                key[:12],
                entry.digest[:12],
            )
            self.writes.drop_entry(entry)
            return Missed("missing_object")
        try:
            payload = self.verify(entry, data, fingerprint_digest, callbacks=callbacks)
        except removed.RemovedVersion as exc:  # planted back after `rm --name`: never run
            warn_once("named-removed", "refusing executable: %s; compiling", exc)
            self.refused[key] = exc.reason
            return Missed(exc.reason)
        except codec.SignatureRefused as exc:
            # Intact bytes this reader will not run (unsigned, unknown key, bad
            # signature): a miss, never quarantined (another reader may trust the key).
            process_warn_once(
                exc.reason, "refusing executable: %s (ARTSTORE_TRUSTED_KEYS); compiling", exc
            )
            self.refused[key] = exc.reason
            return Missed(exc.reason)
        except codec.FingerprintMismatch as exc:
            warn_once("fingerprint", "refusing foreign executable: %s", exc)
            return Missed("fingerprint_mismatch")
        except codec.WrongEntry as exc:
            # The object is intact; the index row pointing here is wrong (damaged or forged).
            warn_once("wrong-entry", "refusing executable of another entry: %s", exc)
            return Missed("wrong_entry")
        except codec.CallbackMismatch as exc:
            # Bound to its key but not to this trace's callbacks: a damaged or forged
            # entry that would crash on execute. Refused, not quarantined (see codec).
            warn_once("callbacks", "refusing executable: %s; compiling", exc)
            return Missed("callback_mismatch")
        except OverLimit as exc:  # bigger than this reader allows; another may load it
            return self._over_limit(exc)
        except CorruptObject as exc:
            self.writes.quarantine(entry, str(exc))
            return Missed("corrupt")
        record = entry if isinstance(entry, Manifest) else Manifest.of(entry, callbacks=callbacks)
        remember(self.backends, key, record, data)
        return Found(entry, payload)  # entry: its manifest, or its index row

    def find(self, key: str) -> EntryInfo | Manifest | None:
        """Where `key`'s object is: its manifest in the object store. A SQLite index (a
        file) is also asked for entries without one (stored by 0.2 clients, or whose
        publication failed); a database server never is: there, a missing manifest is
        a miss, and a writer that compiles the key publishes it (see `WritePath.admit`)."""
        backends = self.backends
        backends.using("object store")
        data = backends.blobs.get_manifest(key)
        if data is not None:
            try:
                return Manifest.decode(data, key)
            except Exception as exc:  # untrusted bytes: a miss for this key, never the breaker
                self.accounts.counters.add("bad_manifest")
                backends.warn_once("manifest", "ignoring a damaged manifest: %s", exc)
        if backends.settings.index_is_server:
            return None
        backends.using("index")
        return backends.index.lookup(key)

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
    ) -> bytes:
        """The executable in `entry`'s object `data`, verified as every load is: digest,
        envelope, fingerprint, entry key, callback count (given `callbacks`), sizes, and
        the signature where this reader lists trusted keys; then, for a named version,
        that `artstore rm --name` did not remove it (`removed.RemovedVersion`). Raises
        what `codec.decode` raises (CorruptObject and its kinds, OverLimit); what a
        refusal costs is the caller's to decide (`get`: a miss; `artstore pull`: counted,
        not kept)."""
        settings = self.backends.settings
        payload = codec.decode(
            data,
            expected_digest=entry.digest,
            fingerprint_digest=fingerprint_digest,
            key=entry.key,
            callbacks=callbacks,
            expected_raw_size=entry.raw_size,
            max_raw_size=settings.max_executable_bytes,
            trusted=settings.trusted_keys,
            namespace=settings.namespace,
        )
        removed.check(self.backends.blobs, data)  # after: only authentic objects cost a GET
        return payload

    def _over_limit(self, exc: OverLimit) -> Missed:
        self.backends.warn_once("over-limit", "executable not loaded: %s; compiling", exc)
        return Missed("over_limit")
