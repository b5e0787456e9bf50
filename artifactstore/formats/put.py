"""What one put carries: an executable for a key, and the facts that describe it.

Built once, where an executable is ready to store (the compile hook, a named build, a
bundle import, gc's rebuild from objects), and passed whole through the session, the
Store, the queued uploads and the write path down to what is written: the object's
metadata frame, the index row (`index.repo.NewEntry.of`) and the manifest. No layer
retypes these fields (tests/test_layers.py), so a new fact about a put is added here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from artifactstore.formats.codec import Encoded, ObjectMeta, encode
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.manifest import Manifest

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey


@dataclass(frozen=True)
class Put:
    """One executable to store under `key`, built for `fingerprint`'s platform."""

    key: str
    # The serialized executable; or its object as already encoded (and signed) as it will
    # be kept, which is stored byte for byte so its signature stays its writer's (imports).
    payload: bytes | Encoded
    fingerprint: Fingerprint
    module_name: str
    compile_secs: float
    # How many host callbacks the executable calls (recorded in the object, checked on
    # load); None where the caller does not know.
    callbacks: int | None = None
    # The host that compiled it; None: the host that writes it (the writer names it:
    # formats/ asks no host anything).
    producer_host: str | None = None

    def encoded(self, *, signer: SigningKey | None = None, namespace: str | None = None) -> Encoded:
        """The object this put stores: payload, fingerprint and metadata, signed by
        `signer` for `namespace` when given; an object encoded already, as it is."""
        if isinstance(self.payload, Encoded):
            return self.payload
        meta = ObjectMeta(
            key=self.key,
            module_name=self.module_name[:255],
            compile_secs=float(self.compile_secs),
            raw_size=len(self.payload),
            producer_host=(self.producer_host or "")[:255],
            fingerprint=self.fingerprint.to_dict(),
            callbacks=self.callbacks,
        )
        return encode(
            self.payload, self.fingerprint.digest, meta, signer=signer, namespace=namespace
        )

    def manifest(self, encoded: Encoded) -> Manifest:
        """The manifest of this put stored as `encoded` (published, and kept in the tier)."""
        return Manifest(
            key=self.key,
            digest=encoded.digest,
            fingerprint=self.fingerprint.digest,
            compile_secs=float(self.compile_secs),
            raw_size=encoded.raw_size,
            size=len(encoded.data),
            module_name=self.module_name[:255],
            callbacks=self.callbacks,
            signer=encoded.signer,
        )
