"""This host's platform facts, read once: what `formats.fingerprint` describes.

The CPU's code-generation features come from /proc/cpuinfo (or sysctl on macOS); the
architecture and OS from the platform module. JAX and the backend's facts are the
caller's (`jaxhook` asks JAX), so this module imports no JAX.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from artifactstore.formats.fingerprint import (
    FINGERPRINT_VERSION,
    Fingerprint,
    cpu_digest,
    parse_cpuinfo,
    relevant_cpu_features,
)


def _read_cpuinfo() -> tuple[set[str], str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set(), ""
    return parse_cpuinfo(text)


def _macos_features() -> set[str]:
    import subprocess

    feats: set[str] = set()
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
        try:
            out = subprocess.run(
                ["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        feats.update(f.lower().replace(".", "_") for f in out.split())
    return feats


def cpu_arch() -> str:
    """This host's CPU architecture as fingerprints name it (`x86_64`, `aarch64`, ...)."""
    return platform.machine().lower()


@cache
def host_cpu_features() -> tuple[str, ...]:
    """The sorted code-generation-relevant CPU features of this host."""
    flags, _ = _read_cpuinfo()
    if not flags and sys.platform == "darwin":
        flags = _macos_features()
    return relevant_cpu_features(cpu_arch(), flags)


# Test and cross-target seam: a function that may rewrite the computed fields.
Provider = Callable[[dict[str, Any]], dict[str, Any]]
_providers: list[Provider] = []


def register_provider(provider: Provider) -> None:
    """Add a function that adjusts the fingerprint fields (applied in order)."""
    _providers.append(provider)


def compute(
    *,
    platform_name: str,
    platform_version: str,
    device_kind: str,
    device_count: int,
    jax_version: str,
    jaxlib_version: str,
) -> Fingerprint:
    """The fingerprint of this host with a backend the caller describes."""
    fields: dict[str, Any] = {
        "cpu_arch": cpu_arch(),
        "cpu_features": list(host_cpu_features()),
        "os": sys.platform,
        "jax_version": jax_version,
        "jaxlib_version": jaxlib_version,
        "platform": platform_name,
        "platform_version": platform_version,
        "device_kind": device_kind,
        "device_count": int(device_count),
        "version": FINGERPRINT_VERSION,
    }
    for provider in _providers:
        fields = provider(dict(fields))
    return Fingerprint.from_dict(fields)


def host_cpu_digest() -> str:
    """Digest of the host-only part (arch and features), for keys made without a backend."""
    return cpu_digest(cpu_arch(), host_cpu_features())
