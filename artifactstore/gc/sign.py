"""`artstore sign`: re-sign a namespace's entries with the current ARTSTORE_SIGNING_KEY.

For key rotation. A signature vouches that a trusted key's holder stored this
object, so signing must never launder: only an object whose current signature
verifies, as a reader verifies it (`ReadPath.verify`, the one verifier: digest,
envelope, fingerprint, entry key, namespace, sizes, signature), under a key this
process trusts (ARTSTORE_TRUSTED_KEYS) is re-signed, and `signed_by` selects by
that verified signature, never by the index's signer column (index writers set
it). Unsigned objects, those signed by an untrusted key and those whose signature
does not verify are skipped and counted by reason.

Entries written before signing are adopted only on request (`adopt`): each is
checked as a load checks it (all but the signature), listed, and signed only if
the caller's `adopt` callback agrees (`artstore sign --adopt-unsigned` asks).

The signed copy has new bytes, so a new digest: it is uploaded, the entry is
repointed in one transaction (only if it still points at the old object), and the
old object is removed once no entry references it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from artifactstore import interrupts
from artifactstore.errors import ConfigError, OverLimit, ReadOnlyError
from artifactstore.formats import codec
from artifactstore.formats.signing import SigningKey, TrustedKeys
from artifactstore.index.repo import EntryInfo
from artifactstore.store import Store
from artifactstore.store.verify import Expected, Refusal, verify

CountProgress = Callable[[int], None]

# Why an entry was skipped for its signature (codec.SignatureRefused.reason).
SKIP_REASONS = ("unsigned", "untrusted_key", "bad_signature")


@dataclass(frozen=True)
class Candidate:
    """An unsigned entry that `--adopt-unsigned` would sign, as its object describes it."""

    key: str
    digest: str
    namespace: str
    size: int  # of the object, as stored
    producer_host: str
    module_name: str

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "namespace": self.namespace,
            "size": self.size,
            "producer_host": self.producer_host,
            "module_name": self.module_name,
        }


# Shown the unsigned entries that passed every check but the signature; True: sign them.
Adopt = Callable[[list[Candidate]], bool]


@dataclass
class SignReport:
    signer: str
    trusted: list[str] = field(default_factory=list)
    entries: int = 0
    signed: int = 0
    already_signed: int = 0  # by this key, already
    skipped_signer: int = 0  # verified, but not by a key --signed-by names
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> keys
    adopted: list[Candidate] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # keys whose object is gone
    refused: dict[str, list[str]] = field(default_factory=dict)  # why -> keys
    objects_removed: int = 0

    def skip(self, reason: str, key: str) -> None:
        self.skipped.setdefault(reason, []).append(key)

    def refuse(self, why: str, key: str) -> None:
        self.refused.setdefault(why, []).append(key)

    @property
    def ok(self) -> bool:
        """Skipped signatures are the point of the command, not a failure; damaged or
        missing objects are."""
        return not self.refused and not self.missing

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "signer": self.signer,
            "trusted_keys": self.trusted,
            "entries": self.entries,
            "signed": self.signed,
            "already_signed": self.already_signed,
            "skipped_signer": self.skipped_signer,
            "skipped": {r: self.skipped.get(r, []) for r in SKIP_REASONS},
            "adopted": [c.to_json() for c in self.adopted],
            "missing": self.missing,
            "refused": self.refused,
            "objects_removed": self.objects_removed,
        }


def sign_entries(
    store: Store,
    key: SigningKey,
    *,
    signed_by: Collection[str] = (),
    adopt: Adopt | None = None,
    progress: CountProgress | None = None,
) -> SignReport:
    """Re-sign the entries of the store's namespace whose signature verifies under a
    key the store trusts (see the module docstring).

    `signed_by`: only those whose verified signature is by one of these trusted keys;
    empty: every trusted key. `adopt`: also sign unsigned entries, if it agrees once
    shown the list of them (all other checks passed).
    """
    if store.parts.read_only:
        raise ReadOnlyError("cannot sign entries: the store is read-only (ARTSTORE_READ_ONLY)")
    if key is None:
        raise ConfigError("set ARTSTORE_SIGNING_KEY to the .key file to sign with")
    trusted = store.parts.settings.trusted_keys
    if trusted is None or not trusted.keys:
        raise ConfigError(
            "set ARTSTORE_TRUSTED_KEYS to the .pub files of the keys whose entries to re-sign: "
            "`artstore sign` re-signs only what a trusted key signed"
        )
    check_signed_by(signed_by, trusted)
    report = SignReport(key.name, trusted=trusted.names)
    candidates: list[tuple[Candidate, EntryInfo]] = []
    for entry in list(store.parts.index.iter_entries()):
        report.entries += 1
        if progress is not None:
            progress(1)
        data = _fetch(store, entry, report)
        if data is None:
            continue
        checked = store.parts.reads.verify(entry, data, entry.fingerprint, with_metadata=True)
        if isinstance(checked, Refusal) and checked.reason == "unsigned" and adopt is not None:
            if (found := _candidate(store, entry, data, report)) is not None:
                candidates.append((found, entry))
            continue
        if isinstance(checked, Refusal):
            _refused(report, entry.key, checked)
            continue
        sig = codec.read_signature(data)  # verified, so present and by a trusted key
        if signed_by and (sig is None or sig.signer not in signed_by):
            report.skipped_signer += 1
            continue
        _resign(store, key, entry, data, report)
    if candidates and adopt is not None:
        if adopt([c for c, _ in candidates]):
            for found, entry in candidates:
                if _adopt(store, key, found, entry, report):
                    report.adopted.append(found)
        else:
            for found, _ in candidates:
                report.skip("unsigned", found.key)
    if report.signed:
        store.parts.entries_removed()  # this host's tier maps keys to the old objects
    return report


def check_signed_by(signed_by: Collection[str], trusted: TrustedKeys) -> None:
    """`--signed-by` names trusted keys only: a signature by any other key never
    verifies here, and "unsigned" is `--adopt-unsigned`'s to ask for."""
    for name in sorted(signed_by):
        if name == "unsigned":
            raise ConfigError(
                "--signed-by unsigned: unsigned entries are never re-signed; adopt them "
                "explicitly with `artstore sign --adopt-unsigned`"
            )
        if not trusted.knows(name):
            raise ConfigError(
                f"--signed-by {name[:64]!r}: that key is not trusted here (trusted: "
                f"{', '.join(trusted.names)}); list its .pub in ARTSTORE_TRUSTED_KEYS to "
                "re-sign what it signed"
            )


def _fetch(store: Store, entry: EntryInfo, report: SignReport) -> bytes | None:
    """The entry's object as stored; None (counted) where it is gone or too big."""
    try:
        data = store.parts.reads.fetch_object(entry)
    except OverLimit:
        report.refuse("over_limit", entry.key)
        return None
    if data is None:
        report.missing.append(entry.key)
    return data


def _refused(report: SignReport, key: str, why: Refusal) -> None:
    """A refusal of trust skips the entry (the point of the command); any other is a
    damaged or foreign object, refused (the command then fails)."""
    if why.signature or why.reason == "named_removed":
        report.skip(why.reason, key)
    else:
        report.refuse(why.reason, key)


def _candidate(store: Store, entry: EntryInfo, data: bytes, report: SignReport) -> Candidate | None:
    """The unsigned entry as `--adopt-unsigned` lists it, once its object passed every
    check a load makes but the signature; None (counted) otherwise."""
    settings = store.parts.settings
    expected = Expected(
        digest=entry.digest,
        fingerprint=entry.fingerprint,
        namespace=store.parts.namespace,
        key=entry.key,
        raw_size=entry.raw_size,
        max_raw_size=settings.max_executable_bytes,
        with_metadata=True,
    )
    checked = verify(data, expected)
    if isinstance(checked, Refusal):
        _refused(report, entry.key, checked)
        return None
    meta = checked.meta
    assert meta is not None  # with_metadata: refused otherwise
    return Candidate(
        key=entry.key,
        digest=entry.digest,
        namespace=store.parts.namespace,
        size=len(data),
        producer_host=meta.producer_host,
        module_name=meta.module_name,
    )


def _adopt(
    store: Store, key: SigningKey, found: Candidate, entry: EntryInfo, rep: SignReport
) -> bool:
    """Sign one listed unsigned entry: the object read again must be the very bytes that
    were checked and listed (the same digest), still unsigned."""
    data = _fetch(store, entry, rep)
    if data is None:
        return False
    if codec.digest_of(data) != found.digest or codec.split_signature(data)[1] is not None:
        rep.refuse("changed_meanwhile", entry.key)
        return False
    return _resign(store, key, entry, data, rep)


def _resign(store: Store, key: SigningKey, entry: EntryInfo, data: bytes, rep: SignReport) -> bool:
    """Replace `entry`'s verified object with a copy signed by `key`; True if signed."""
    encoded = codec.sign(data, key, store.parts.namespace)
    if encoded.digest == entry.digest:  # Ed25519 is deterministic: signed by this key
        rep.already_signed += 1
        return False
    with interrupts.held():  # object, row and manifest move together
        moved, old_gone = store.parts.writes.replace_object(entry, encoded)
    if not moved:  # replaced or removed meanwhile: leave both to their owners and gc
        rep.refuse("changed_meanwhile", entry.key)
        return False
    rep.signed += 1
    rep.objects_removed += old_gone
    return True
