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
without keys (and warm processes answered by the tier) never pay for it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from artifactstore.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
    )

__all__ = [
    "SigningKey",
    "TrustedKeys",
    "generate",
    "load_signing_key",
    "message",
]

DOMAIN = b"artifactstore-entry-signature-v1\x00"
KEY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_SEED_LEN = 32
_PUBLIC_LEN = 32
SIGNATURE_LEN = 64
_MAX_KEY_FILE = 4096


def check_key_name(name: str) -> str:
    if not KEY_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"invalid key name {name[:64]!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


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


def _decode_b64(text: str, length: int) -> bytes | None:
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

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def public_key(self) -> tuple[str, bytes]:
        """(name, raw 32-byte public key): what a reader lists to trust this writer."""
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self.name, self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def public_line(self) -> str:
        name, raw = self.public_key()
        return f"{name}:{base64.b64encode(raw).decode()}"

    def __str__(self) -> str:
        return f"signing key {self.name!r} ({self.path})"


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The secret key in `path` (`NAME:BASE64(seed)`); a one-line ConfigError otherwise."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    where = str(path)
    if not os.path.exists(where) and _looks_like_key_material(where):
        # The key itself pasted into the variable: never echo it.
        raise ConfigError(
            "ARTSTORE_SIGNING_KEY must be the path of a .key file (`artstore keygen NAME`), "
            "not the key itself"
        )
    if where.endswith(".pub"):
        raise ConfigError(
            f"signing key file {_show_path(where)} is a public key: ARTSTORE_SIGNING_KEY "
            "names the secret NAME.key file"
        )
    text = _read_key_file(
        where,
        f"signing key file {_show_path(where)}",
        "(ARTSTORE_SIGNING_KEY must be the path of a .key file from `artstore keygen`)",
    )
    bad = ConfigError(
        f"signing key file {_show_path(where)} is not an artifactstore/Nix secret key "
        "(expected one line NAME:BASE64 of a 32-byte Ed25519 seed, as `artstore keygen` "
        "writes it)"
    )
    if text is None or text.count(":") != 1:
        raise bad
    name, b64 = text.split(":", 1)
    if not KEY_NAME_RE.fullmatch(name):
        raise bad
    seed = _decode_b64(b64, _SEED_LEN)
    if seed is None:
        # Nix writes 64 bytes (seed followed by the public key); accept that too.
        both = _decode_b64(b64, _SEED_LEN + _PUBLIC_LEN)
        if both is None:
            raise bad
        seed = both[:_SEED_LEN]
    _check_private_mode(where)
    return SigningKey(name, where, Ed25519PrivateKey.from_private_bytes(seed))


def _looks_like_key_material(value: str) -> bool:
    """A setting that names no file and reads like a key (NAME:BASE64, or bare base64
    of 32 bytes or more): refused without being echoed."""
    return re.fullmatch(r"(?:[A-Za-z0-9._-]+:)?[A-Za-z0-9+/]{40,}={0,2}", value.strip()) is not None


def _read_key_file(path: str | os.PathLike[str], what: str, fix: str) -> str | None:
    """The text of a key file (secret or public): None when it is not one short ASCII
    line, a one-line ConfigError naming `what` and `fix` when it cannot be read. The
    contents never reach a message: callers say only that the format is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"cannot read {what}: {reason} {fix}") from None
    if len(raw) > _MAX_KEY_FILE:
        return None
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def _check_private_mode(path: str) -> None:
    """A secret key others can read is no longer secret, as ssh says of its own keys."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:  # read a moment ago; the read itself is what matters
        return
    if mode & 0o077:
        raise ConfigError(
            f"signing key file {_show_path(path)} is readable or writable by other users "
            f"(mode {mode:04o}): run `chmod 600 {path}` (and rotate the key if others "
            "may have read it)"
        )


def _show_path(path: str) -> str:
    return repr(path[:200])


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a reader accepts signatures from (several while rotating)."""

    keys: tuple[tuple[str, bytes], ...]  # (name, 32-byte public key)

    @classmethod
    def parse(cls, spec: str) -> TrustedKeys:
        """A comma-separated list of `.pub` file paths or `NAME:BASE64` public keys."""
        items = [part.strip() for part in spec.split(",") if part.strip()]
        if not items:
            raise ConfigError(
                "ARTSTORE_TRUSTED_KEYS is empty: give .pub files or NAME:BASE64 public keys, "
                "comma-separated"
            )
        keys: list[tuple[str, bytes]] = []
        for n, item in enumerate(items, 1):
            keys.append(_parse_public(item, n))
        return cls(tuple(keys))

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

    def __str__(self) -> str:
        return "trusted keys " + ", ".join(self.names)


def _parse_public(item: str, n: int) -> tuple[str, bytes]:
    where = f"entry {n} of ARTSTORE_TRUSTED_KEYS"
    text = item
    looks_inline = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}:[A-Za-z0-9+/=]+", item)
    if not looks_inline and not os.path.exists(item) and _looks_like_key_material(item):
        raise ConfigError(
            f"{where} is neither a file nor NAME:BASE64 (not echoed: it may be key "
            "material): list NAME.pub files or NAME:BASE64 public keys"
        )
    if not looks_inline:
        text = (
            _read_key_file(
                Path(item).expanduser(),
                f"public key file {_show_path(item)} ({where})",
                "(use .pub files or NAME:BASE64 public keys, comma-separated)",
            )
            or ""
        )
        where = f"public key file {_show_path(item)}"
    bad = ConfigError(
        f"{where} is not a public key: expected NAME:BASE64 of a 32-byte Ed25519 public key, "
        "as `artstore keygen` writes it into NAME.pub"
    )
    if text.count(":") != 1:
        raise bad
    name, b64 = text.split(":", 1)
    if not KEY_NAME_RE.fullmatch(name):
        raise bad
    raw_key = _decode_b64(b64, _PUBLIC_LEN)
    if raw_key is None:
        if _decode_b64(b64, _SEED_LEN + _PUBLIC_LEN) is not None or _looks_secret(item):
            raise ConfigError(
                f"{where} looks like a secret key: list public keys (NAME.pub) in "
                "ARTSTORE_TRUSTED_KEYS, never .key files"
            )
        raise bad
    if _looks_secret(item):
        raise ConfigError(
            f"{where} looks like a secret key: list public keys (NAME.pub) in "
            "ARTSTORE_TRUSTED_KEYS, never .key files"
        )
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        Ed25519PublicKey.from_public_bytes(raw_key)
    except ValueError:
        raise bad from None
    return name, raw_key


def _looks_secret(item: str) -> bool:
    return item.endswith(".key")


def generate(name: str, directory: str | os.PathLike[str] = ".") -> tuple[Path, Path]:
    """Write NAME.key (mode 0600, never overwritten) and NAME.pub into `directory`."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    check_key_name(name)
    base = Path(directory)
    if not base.is_dir():
        raise ConfigError(f"no such directory {_show_path(str(base))}: create it first")
    secret_path, public_path = base / f"{name}.key", base / f"{name}.pub"
    for path in (secret_path, public_path):
        if path.exists() or path.is_symlink():
            raise ConfigError(f"{path} exists: refusing to overwrite a key (choose another NAME)")
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(secret_path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(
            f"{secret_path} exists: refusing to overwrite a key (choose another NAME)"
        ) from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # whatever the umask
        f.write(f"{name}:{base64.b64encode(seed).decode()}\n".encode())
    try:
        fd = os.open(public_path, flags, 0o644)
    except FileExistsError:
        secret_path.unlink()
        raise ConfigError(
            f"{public_path} exists: refusing to overwrite a key (choose another NAME)"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(f"{name}:{base64.b64encode(public).decode()}\n".encode())
    return secret_path, public_path
