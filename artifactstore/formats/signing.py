"""Ed25519 signing keys for entries, in the format of Nix binary caches.

Digests prove integrity, not authorship: anyone who can write the index (or a
local store's key files) chooses which object a key resolves to. Writers that
hold a signing key sign each object; readers that list trusted public keys
load only objects signed by one of them.

Key files, as `nix-store --generate-binary-cache-key` writes them:

    NAME.key   NAME:BASE64(32-byte Ed25519 private seed)   mode 0600
    NAME.pub   NAME:BASE64(32-byte Ed25519 public key)

`ARTSTORE_SIGNING_KEY` names a `.key` file (never the key itself);
`ARTSTORE_TRUSTED_KEYS` is a comma-separated list of `.pub` files or
`NAME:BASE64` public keys, several at once while keys are rotated.

What is signed (`message`) is domain-separated and covers everything that
decides what runs: the namespace, the entry key, the digest of the object's
bytes before the signature (envelope, fingerprint, payload and metadata with
its callback count and raw size), the fingerprint digest, the callback count
and the raw size. Messages name key files and key names, never key material.

`cryptography` is imported only when a key is loaded or checked, so processes
without keys (and warm processes answered by the tier) never pay for it. This module
reads no files: key files are read and written by `artifactstore.config.keyfiles`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from artifactstore.errors import ConfigError
from artifactstore.formats.names import NAME_RE, check_name

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
    )

__all__ = [
    "RecordSignature",
    "SigningKey",
    "TrustedKeys",
    "message",
    "public_key_from_text",
    "record_refusal",
    "record_signature",
    "sign_record",
    "signing_key_from_text",
]

DOMAIN = b"artifactstore-entry-signature-v1\x00"
SEED_LEN = 32
PUBLIC_LEN = 32
SIGNATURE_LEN = 64


def check_key_name(name: str) -> str:
    return check_name(name, "key name")


def message(
    *,
    namespace: str,
    key: str,
    content_digest: str,
    fingerprint_digest: str,
    callbacks: int | None,
    raw_size: int,
) -> bytes:
    """The canonical bytes a signature covers (never ambiguous: a JSON array of
    fixed fields after a domain tag that no other message of ours starts with)."""
    fields = [namespace, key, content_digest, fingerprint_digest, callbacks, int(raw_size)]
    return DOMAIN + json.dumps(fields, separators=(",", ":")).encode()


# -- signed records (working sets, removal records) ---------------------------------
# A record from a bucket that decides what a process does (what it loads ahead, which
# version it refuses) carries one more field, "s": {"k": key name, "sig": base64
# Ed25519}, over `record_message(domain, namespace, name, sha256 of the record without
# "s")`: the record re-encoded as a writer encodes it (compact JSON, its fields in their
# order), so a reader checks the fields it parsed, whatever the bytes' spacing. Each kind
# has its own domain tag: no signature of one kind (nor an entry's) is another's.
RECORD_SEPARATORS = (",", ":")


@dataclass(frozen=True)
class RecordSignature:
    """A record's "s" field: who signed it, and the digest of the record it covers."""

    signer: str
    signature: bytes
    content: str  # sha256 of the record without "s", re-encoded as a writer encodes it


def record_message(domain: bytes, namespace: str, name: str, content_digest: str) -> bytes:
    """What a record's signature covers: its kind's domain tag, then a JSON array."""
    fields = [namespace, name, content_digest]
    return domain + json.dumps(fields, separators=RECORD_SEPARATORS).encode()


def _content(record: dict[str, object]) -> str:
    unsigned = {k: v for k, v in record.items() if k != "s"}
    return hashlib.sha256(json.dumps(unsigned, separators=RECORD_SEPARATORS).encode()).hexdigest()


def sign_record(
    record: dict[str, object], signer: SigningKey, domain: bytes, namespace: str, name: str
) -> dict[str, object]:
    """`record` with its "s" field: signed by `signer` for `namespace` and `name`."""
    message = record_message(domain, namespace, name, _content(record))
    sig = base64.b64encode(signer.sign(message)).decode()
    return {**record, "s": {"k": signer.name, "sig": sig}}


def record_signature(raw: dict[str, object]) -> RecordSignature | None:
    """The "s" field of a parsed record (None: unsigned); ValueError if malformed."""
    if "s" not in raw:
        return None
    s = raw["s"]
    if (
        not isinstance(s, dict)
        or not isinstance(s.get("k"), str)
        or not isinstance(s.get("sig"), str)
    ):
        raise ValueError("the signature field is not {k, sig}")
    if not NAME_RE.fullmatch(s["k"]) or len(s["sig"]) > 128:
        raise ValueError("the signature field names no key")
    try:
        signature = base64.b64decode(s["sig"], validate=True)
    except binascii.Error:
        raise ValueError("the signature is not base64") from None
    if len(signature) != SIGNATURE_LEN:
        raise ValueError(f"the signature is not {SIGNATURE_LEN} bytes")
    return RecordSignature(s["k"], signature, _content(raw))


def record_refusal(
    sig: RecordSignature | None, trusted: TrustedKeys, domain: bytes, namespace: str, name: str
) -> str | None:
    """Why a process that requires signatures does not follow a record (one line, no key
    material); None when a key in `trusted` signed it for `namespace` and `name`."""
    if sig is None:
        return "unsigned"
    if not trusted.knows(sig.signer):
        return f"signed by key {sig.signer!r}, which is not trusted"
    message = record_message(domain, namespace, name, sig.content)
    if not trusted.verify(sig.signer, sig.signature, message):
        return f"the signature of key {sig.signer!r} does not match (altered or misplaced)"
    return None


def decode_b64(text: str, length: int) -> bytes | None:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == length else None


@dataclass(frozen=True)
class SigningKey:
    """A writer's secret key; its repr and str never show key material."""

    name: str
    path: str
    _private: Ed25519PrivateKey = field(repr=False)

    # Equal when they are the same key (Ed25519PrivateKey objects compare by identity):
    # settings resolved twice from one environment are equal (runtime.process shares them).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SigningKey):
            return NotImplemented
        return (self.name, self.public_key()) == (other.name, other.public_key())

    def __hash__(self) -> int:
        return hash(self.public_key())

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def public_key(self) -> tuple[str, bytes]:
        """(name, raw 32-byte public key): what a reader lists to trust this writer."""
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self.name, self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def public_line(self) -> str:
        name, raw = self.public_key()
        return f"{name}:{base64.b64encode(raw).decode()}"

    def is_seed(self, raw: bytes) -> bool:
        """Whether `raw` is this key's secret seed (listed where a public key belongs)."""
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
        )

        seed = self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return hmac.compare_digest(seed, raw)

    def __str__(self) -> str:
        return f"signing key {self.name!r} ({self.path})"


def signing_key_from_text(text: str | None, path: str) -> SigningKey:
    """The secret key in the text of the key file `path` (`NAME:BASE64(seed)`); a one-line
    ConfigError, which never shows the text, when it is not one."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    bad = ConfigError(
        f"signing key file {show_path(path)} is not an artifactstore/Nix secret key "
        "(expected one line NAME:BASE64 of a 32-byte Ed25519 seed, as `artstore keygen` "
        "writes it)"
    )
    name, b64 = _key_line(text, bad)
    seed = decode_b64(b64, SEED_LEN)
    if seed is None:
        # Nix writes 64 bytes (seed followed by the public key); accept that too.
        both = decode_b64(b64, SEED_LEN + PUBLIC_LEN)
        if both is None:
            raise bad
        seed = both[:SEED_LEN]
    return SigningKey(name, path, Ed25519PrivateKey.from_private_bytes(seed))


def _key_line(text: str | None, bad: ConfigError) -> tuple[str, str]:
    """The NAME and BASE64 of a key file's `NAME:BASE64` line, the name checked; `bad`,
    which never shows the text, where it is not one."""
    if text is None or text.count(":") != 1:
        raise bad
    name, b64 = text.split(":", 1)
    if not NAME_RE.fullmatch(name):
        raise bad
    return name, b64


def looks_like_key_material(value: str) -> bool:
    """A setting that names no file and reads like a key (NAME:BASE64, or bare base64
    of 32 bytes or more): refused without being echoed."""
    return re.fullmatch(r"(?:[A-Za-z0-9._-]+:)?[A-Za-z0-9+/]{40,}={0,2}", value.strip()) is not None


def show_path(path: str) -> str:
    return repr(path[:200])


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a reader accepts signatures from (several while rotating)."""

    keys: tuple[tuple[str, bytes], ...]  # (name, 32-byte public key)

    @property
    def names(self) -> list[str]:
        return sorted({name for name, _ in self.keys})

    def including(self, key: tuple[str, bytes]) -> TrustedKeys:
        """These keys and `key` (a process trusts what it signs itself)."""
        return self if key in self.keys else TrustedKeys((*self.keys, key))

    def knows(self, name: str) -> bool:
        return any(n == name for n, _ in self.keys)

    def verify(self, name: str, signature: bytes, data: bytes) -> bool:
        """Whether a key called `name` in this list made `signature` over `data`."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        for known, raw in self.keys:
            if known != name:
                continue
            try:
                Ed25519PublicKey.from_public_bytes(raw).verify(signature, data)
            except InvalidSignature:
                continue
            return True
        return False

    def lists_secret(self, name: str, signature: bytes, data: bytes) -> bool:
        """Whether a key called `name` here is a secret seed (a .key file's contents): a
        signature that failed against the listed bytes verifies against the public key
        derived from them as a seed. Only ever a reason to refuse, never to accept."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        for known, raw in self.keys:
            if known != name:
                continue
            try:
                Ed25519PrivateKey.from_private_bytes(raw).public_key().verify(signature, data)
            except (InvalidSignature, ValueError):
                continue
            return True
        return False

    def __str__(self) -> str:
        return "trusted keys " + ", ".join(self.names)


def public_key_from_text(text: str, where: str, item: str) -> tuple[str, bytes]:
    """(name, raw key) of the public key `text` (`NAME:BASE64`), entry `item` of
    ARTSTORE_TRUSTED_KEYS; a one-line ConfigError naming `where` when it is not one,
    or when it looks like a secret key (a .key file, or 64 bytes: seed and public key)."""
    bad = ConfigError(
        f"{where} is not a public key: expected NAME:BASE64 of a 32-byte Ed25519 public key, "
        "as `artstore keygen` writes it into NAME.pub"
    )
    secret = ConfigError(
        f"{where} looks like a secret key: list public keys (NAME.pub) in "
        "ARTSTORE_TRUSTED_KEYS, never .key files"
    )
    name, b64 = _key_line(text, bad)
    raw_key = decode_b64(b64, PUBLIC_LEN)
    if raw_key is None:
        if decode_b64(b64, SEED_LEN + PUBLIC_LEN) is not None or _looks_secret(item):
            raise secret
        raise bad
    if _looks_secret(item):
        raise secret
    if not is_curve_point(raw_key):
        # About half of all secret seeds are no point at all: never a public key.
        raise ConfigError(
            f"{where} is not a public key (is it the .key file's contents?): list the "
            "NAME.pub file or its NAME:BASE64 line in ARTSTORE_TRUSTED_KEYS"
        )
    return name, raw_key


def _looks_secret(item: str) -> bool:
    return item.endswith(".key")


# Ed25519's curve (RFC 8032, 5.1.3): p = 2^255 - 19, d = -121665/121666 mod p.
_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def is_curve_point(raw: bytes) -> bool:
    """Whether 32 bytes decode to a point of Ed25519's curve (RFC 8032 point decoding):
    every public key does; `cryptography` accepts any 32 bytes as one without checking."""
    if len(raw) != PUBLIC_LEN:
        return False
    number = int.from_bytes(raw, "little")
    sign, y = number >> 255, number & ((1 << 255) - 1)
    if y >= _P:
        return False
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x2 = u * pow(v, _P - 2, _P) % _P
    if x2 == 0:
        return sign == 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    return (x * x - x2) % _P == 0
