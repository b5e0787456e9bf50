"""`artstore sign`: re-sign a namespace's entries with the current ARTSTORE_SIGNING_KEY.

For key rotation and for stores written before signing. Each object is read and
checked first (its digest, its envelope's fingerprint against the entry's, the key
its metadata names against the entry's, and, where this process trusts the key that
signed it, that signature), so a damaged or swapped entry is never vouched for.
The signed copy has new bytes, so a new digest: it is uploaded, the entry is
repointed in one transaction (only if it still points at the old object), and the
old object is removed once no entry references it. Signing vouches for what the
namespace holds: run `artstore verify` first, and use `--signed-by` to re-sign only
the entries of a key being retired.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from artifactstore import codec, interrupts
from artifactstore.errors import ConfigError, CorruptObject, ReadOnlyError
from artifactstore.signing import SigningKey
from artifactstore.store import Store

CountProgress = Callable[[int], None]


@dataclass
class SignReport:
    signer: str
    entries: int = 0
    signed: int = 0
    already_signed: int = 0  # by this key, already
    skipped_signer: int = 0  # not selected by --signed-by
    missing: list[str] = field(default_factory=list)  # keys whose object is gone
    refused: dict[str, list[str]] = field(default_factory=dict)  # why -> keys
    objects_removed: int = 0

    def refuse(self, why: str, key: str) -> None:
        self.refused.setdefault(why, []).append(key)

    @property
    def ok(self) -> bool:
        return not self.refused and not self.missing

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "signer": self.signer,
            "entries": self.entries,
            "signed": self.signed,
            "already_signed": self.already_signed,
            "skipped_signer": self.skipped_signer,
            "missing": self.missing,
            "refused": self.refused,
            "objects_removed": self.objects_removed,
        }


def sign_entries(
    store: Store,
    key: SigningKey,
    *,
    signed_by: Collection[str] = (),
    progress: CountProgress | None = None,
) -> SignReport:
    """Re-sign every entry of the store's namespace with `key` (see the module docstring).

    `signed_by`: only entries now signed by these key names ("unsigned" selects
    unsigned entries); empty: every entry.
    """
    if store.read_only:
        raise ReadOnlyError("cannot sign entries: the store is read-only (ARTSTORE_READ_ONLY)")
    if key is None:
        raise ConfigError("set ARTSTORE_SIGNING_KEY to the .key file to sign with")
    report = SignReport(key.name)
    trusted = store.settings.trusted_keys
    for entry in list(store.index.iter_entries()):
        report.entries += 1
        if progress is not None:
            progress(1)
        if signed_by and (entry.signer or "unsigned") not in signed_by:
            report.skipped_signer += 1
            continue
        data = store.blobs.get(entry.digest)
        if data is None:
            report.missing.append(entry.key)
            continue
        why = _problem(data, entry.digest, entry.key, entry.fingerprint)
        if why is None and trusted is not None and codec.read_signature(data) is not None:
            sig = codec.read_signature(data)
            if sig is not None and trusted.knows(sig.signer):
                try:
                    codec.check_signature(data, trusted, store.namespace, key=entry.key)
                except CorruptObject:
                    why = "bad_signature"
        if why is not None:
            report.refuse(why, entry.key)
            continue
        encoded = codec.sign(data, key, store.namespace)
        if encoded.digest == entry.digest:  # Ed25519 is deterministic: signed by this key
            report.already_signed += 1
            continue
        with interrupts.held():  # object, row and manifest move together
            store.blobs.put(encoded.digest, encoded.data)
            moved = store.index.repoint(
                entry.key,
                old_digest=entry.digest,
                new_digest=encoded.digest,
                size=len(encoded.data),
                signer=encoded.signer,
                signature=encoded.signature,
            )
            if not moved:  # replaced or removed meanwhile: leave both to their owners and gc
                report.refuse("changed_meanwhile", entry.key)
                continue
            report.signed += 1
            moved_entry = store.index.lookup(entry.key)
            if moved_entry is not None:
                store.publish(moved_entry)  # readers follow the manifest to the signed object
            if not store.index.keys_for_digest(entry.digest):
                store.blobs.delete(entry.digest)
                store.index.forget_objects([entry.digest])
                report.objects_removed += 1
    if report.signed:
        store.entries_removed()  # this host's tier maps keys to the old objects
    return report


def _problem(data: bytes, digest: str, key: str, fingerprint: str) -> str | None:
    """Why this object must not be signed for this entry; None when it may."""
    if codec.digest_of(data) != digest:
        return "corrupt"
    if codec.envelope_fingerprint(data) != fingerprint:
        return "corrupt" if codec.envelope_fingerprint(data) is None else "fingerprint_mismatch"
    try:
        meta = codec.read_meta(data)
    except CorruptObject:
        return "corrupt"
    if meta is None:
        return "without_metadata"
    if meta.key != key:
        return "wrong_entry"
    return None
