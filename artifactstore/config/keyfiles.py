"""Signing keys in files: read (ARTSTORE_SIGNING_KEY, ARTSTORE_TRUSTED_KEYS) and written
(`artstore keygen`), in the format of Nix binary caches (see `formats.signing`).

The file handling lives here, apart from the key format, so that `formats/` reads no
files: a key file is refused when it is not one short ASCII line, a secret one when
others may read it, and neither its contents nor a pasted key ever reach a message.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from artifactstore.errors import ConfigError
from artifactstore.formats.signing import (
    SigningKey,
    TrustedKeys,
    check_key_name,
    looks_like_key_material,
    public_key_from_text,
    show_path,
    signing_key_from_text,
)

_MAX_KEY_FILE = 4096


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The secret key in `path` (`NAME:BASE64(seed)`); a one-line ConfigError otherwise."""
    where = str(path)
    if not os.path.exists(where) and looks_like_key_material(where):
        # The key itself pasted into the variable: never echo it.
        raise ConfigError(
            "ARTSTORE_SIGNING_KEY must be the path of a .key file (`artstore keygen NAME`), "
            "not the key itself"
        )
    if where.endswith(".pub"):
        raise ConfigError(
            f"signing key file {show_path(where)} is a public key: ARTSTORE_SIGNING_KEY "
            "names the secret NAME.key file"
        )
    text = _read_key_file(
        where,
        f"signing key file {show_path(where)}",
        "(ARTSTORE_SIGNING_KEY must be the path of a .key file from `artstore keygen`)",
    )
    key = signing_key_from_text(text, where)
    _check_private_mode(where)
    return key


def load_trusted_keys(spec: str) -> TrustedKeys:
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
    return TrustedKeys(tuple(keys))


def _parse_public(item: str, n: int) -> tuple[str, bytes]:
    where = f"entry {n} of ARTSTORE_TRUSTED_KEYS"
    text = item
    looks_inline = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}:[A-Za-z0-9+/=]+", item)
    if not looks_inline and not os.path.exists(item) and looks_like_key_material(item):
        raise ConfigError(
            f"{where} is neither a file nor NAME:BASE64 (not echoed: it may be key "
            "material): list NAME.pub files or NAME:BASE64 public keys"
        )
    if not looks_inline:
        text = (
            _read_key_file(
                Path(item).expanduser(),
                f"public key file {show_path(item)} ({where})",
                "(use .pub files or NAME:BASE64 public keys, comma-separated)",
            )
            or ""
        )
        where = f"public key file {show_path(item)}"
    return public_key_from_text(text, where, item)


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
            f"signing key file {show_path(path)} is readable or writable by other users "
            f"(mode {mode:04o}): run `chmod 600 {path}` (and rotate the key if others "
            "may have read it)"
        )


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
        raise ConfigError(f"no such directory {show_path(str(base))}: create it first")
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
