"""torch-xla's cache files as entries: their key, module name and payload frame.

torch-xla's persistent cache (`torch_xla.runtime.initialize_cache`) keeps one file per
compiled graph, named by the graph's hash (a decimal 128-bit number) and holding its
serialized executable; torch-xla loads whatever file of that name it finds. The
adapter (artifactstore.torch_xla) stores each such file as an entry and places stored
ones back where torch-xla looks, so both the name and the bytes read from a store are
untrusted input; they go through `unframe` before anything is placed:

- the entry key is `fingerprint digest[:16] + sha256(domain, fingerprint, name)[:48]`,
  so that the first 16 digits list a fingerprint's entries from the manifests' names
  alone (one LIST, as `artstore pull` reads manifests) and the rest binds the name to
  the fingerprint: a key names one file of one platform;
- the payload is `MAGIC + name + "\\n" + file bytes`: the name travels inside the
  verified object (digest, fingerprint, key, signature) and `unframe` checks that it is
  a plain hash (digits only, no path) and that it yields the entry's key, so a valid
  object of one graph can never be placed under another graph's name;
- the module name is `torch-xla:<name>` and the fingerprint's platform `torch-xla`
  (its `jax_version` and `jaxlib_version` fields hold torch's and torch-xla's): `ls`,
  `stats`, `gc`, bundles and `pull` tell these entries apart by either, with the
  columns every entry has.
"""

from __future__ import annotations

import hashlib
import re

from artifactstore.errors import CorruptObject
from artifactstore.formats.codec import check_digest

PLATFORM = "torch-xla"  # the fingerprint's platform field: the kind of these entries
MODULE_PREFIX = "torch-xla:"
MAGIC = b"ARTSTORE-TORCH-XLA-1\n"
_DOMAIN = "artifactstore-torch-xla-v1"
PREFIX_DIGITS = 16  # of the fingerprint digest, at the start of every key
# torch-xla names a file by its graph hash (torch::lazy::hash_t, 128 bits) in decimal.
_NAME_RE = re.compile(r"[0-9]{1,40}")
MAX_NAME = 40


def check_file_name(name: str) -> str:
    """`name` if torch-xla could have named a cache file so (digits only: no separator,
    no dot, nothing a path could climb with); else ValueError."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a torch-xla cache file name: {str(name)[:60]!r}")
    return name


def key_prefix(fingerprint: str) -> str:
    """What every key of `fingerprint`'s files starts with (a manifest listing's prefix)."""
    return check_digest(fingerprint)[:PREFIX_DIGITS]


def entry_key(fingerprint: str, name: str) -> str:
    """The entry key of cache file `name` built for the platform `fingerprint` (a digest)."""
    tail = hashlib.sha256(f"{_DOMAIN}\0{fingerprint}\0{check_file_name(name)}".encode())
    return key_prefix(fingerprint) + tail.hexdigest()[: 64 - PREFIX_DIGITS]


def module_name(name: str) -> str:
    return MODULE_PREFIX + check_file_name(name)


def frame(name: str, data: bytes) -> bytes:
    """The payload stored for cache file `name` holding `data`."""
    return MAGIC + check_file_name(name).encode() + b"\n" + data


def unframe(stored: bytes, *, key: str, fingerprint: str) -> tuple[str, bytes]:
    """(file name, file bytes) of a verified object's payload stored under `key` for
    `fingerprint`; CorruptObject for anything else: not a frame, a name that is not a
    plain hash, or a name whose key is not `key` (another graph's or platform's file)."""
    if not stored.startswith(MAGIC):
        raise CorruptObject("not a torch-xla cache file")
    end = stored.find(b"\n", len(MAGIC), len(MAGIC) + MAX_NAME + 1)
    if end < 0:
        raise CorruptObject("torch-xla cache file without a valid name")
    try:
        name = check_file_name(stored[len(MAGIC) : end].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptObject("torch-xla cache file without a valid name") from None
    if entry_key(fingerprint, name) != key:
        raise CorruptObject(f"torch-xla cache file {name} is not entry {key[:12]}'s")
    return name, stored[end + 1 :]


def parse_module_name(module: str) -> str | None:
    """The file name of a `torch-xla:<name>` module name, or None (not one of ours)."""
    if not module.startswith(MODULE_PREFIX):
        return None
    try:
        return check_file_name(module[len(MODULE_PREFIX) :])
    except ValueError:
        return None
