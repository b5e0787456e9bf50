"""How a named executable is found: its key and module name, from name and version.

An entry for NAME@VERSION built for fingerprint F has the key
sha256("artifactstore-named-v1\\0NAME\\0VERSION\\0F") and the module name
`named:NAME@VERSION`, so `ls`, `rm`, bundles and gc find it in the index without
decoding anything. Its portable (`jax.export`) form is the same name stored for
`PORTABLE`, a fingerprint no host has: it is never loaded as an executable.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Sequence

from artifactstore.errors import ConfigError
from artifactstore.formats.fingerprint import FINGERPRINT_VERSION, Fingerprint

KEY_FORMAT = "artifactstore-named-v1"
MODULE_PREFIX = "named:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-+]{0,63}")

# The fingerprint of portable entries (StableHLO from `jax.export`): compiled on load
# by whatever host needs it, so no platform field applies.
PORTABLE = Fingerprint(
    cpu_arch="any",
    cpu_features=(),
    os="any",
    jax_version="any",
    jaxlib_version="any",
    platform="jax.export",
    platform_version="any",
    device_kind="any",
    device_count=0,
    version=FINGERPRINT_VERSION,
)


def _check(value: str, pattern: re.Pattern[str], what: str, rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(
            f"invalid executable {what} {value!r}: use letters, digits and {rule}, "
            "starting with a letter or digit)"
        )
    return value


def check_name(name: str) -> str:
    return _check(name, _NAME, "name", "_ . - / (at most 128")


def check_version(version: str) -> str:
    return _check(version, _VERSION, "version", "_ . - + (at most 64")


# What jax.export lowers for (`gpu` is not one: it means cuda or rocm).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def check_platforms(platforms: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """The platforms a portable form is exported for, as given (None: the default,
    the building host's and cpu), deduplicated."""
    if platforms is None:
        return None
    given = (platforms,) if isinstance(platforms, str) else tuple(platforms)
    bad = [p for p in given if p not in PLATFORMS]
    if bad or not given:
        what = f"unknown platform {bad[0]!r}" if bad else "no platform given"
        raise ConfigError(
            f"platforms=: {what}; jax.export lowers for {', '.join(PLATFORMS)} "
            "(e.g. platforms=('tpu', 'cpu'); leave it out for this host's platform and cpu)"
        )
    return tuple(dict.fromkeys(given))


def module_name(name: str, version: str) -> str:
    return f"{MODULE_PREFIX}{check_name(name)}@{check_version(version)}"


def parse_module_name(module: str) -> tuple[str, str] | None:
    """(name, version) of a named entry's module name; None for any other entry."""
    if not module.startswith(MODULE_PREFIX):
        return None
    name, at, version = module[len(MODULE_PREFIX) :].rpartition("@")
    if not at or not _NAME.fullmatch(name) or not _VERSION.fullmatch(version):
        return None
    return name, version


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`NAME` or `NAME@VERSION` as given on a command line (the name may be a glob)."""
    name, at, version = ref.rpartition("@")
    if not at:
        name, version = ref, ""
    if not name:
        raise ConfigError(f"invalid executable reference {ref!r}: write NAME or NAME@VERSION")
    if version:
        check_version(version)
    return name, version or None


def matches(module: str, name_pattern: str, version: str | None = None) -> bool:
    """Whether `module` is a named entry whose name matches the glob `name_pattern`."""
    parsed = parse_module_name(module)
    if parsed is None:
        return False
    return fnmatch.fnmatchcase(parsed[0], name_pattern) and version in (None, parsed[1])


def key(name: str, version: str, fingerprint_digest: str) -> str:
    """The entry key of NAME@VERSION built for the fingerprint with this digest."""
    text = "\0".join((KEY_FORMAT, check_name(name), check_version(version), fingerprint_digest))
    return hashlib.sha256(text.encode()).hexdigest()


def portable_key(name: str, version: str) -> str:
    return key(name, version, PORTABLE.digest)
