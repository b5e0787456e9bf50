"""The platform fingerprint: the facts that decide whether an executable runs here.

JAX's cache key already covers the module, jaxlib, backend version, XLA flags,
compile options and topology. It does not cover the host CPU's instruction set,
yet XLA:CPU compiles for the features of the host it runs on: an executable
built with AVX-512 must never reach a host without it. The fingerprint adds
those facts and is also stored as index metadata, so the index can answer
"what do we hold for this device and jaxlib".

Pure functions of the facts: reading them from this host (/proc/cpuinfo, sysctl,
the platform module) is `artifactstore.config.host`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

FINGERPRINT_VERSION = 1

# Instruction-set extensions that LLVM/XLA:CPU may emit code for. Flags outside
# this list (e.g. `ht`, `tsc`, cache quirks) do not change generated code and
# would only split the store between otherwise identical hosts.
_X86_FEATURES = frozenset(
    """
    sse sse2 sse3 pni ssse3 sse4_1 sse4_2 sse4a popcnt abm lzcnt movbe cx16 aes pclmulqdq
    avx avx2 fma fma4 f16c bmi1 bmi2 adx sha_ni xsave xsaveopt vaes vpclmulqdq gfni
    avx512f avx512cd avx512bw avx512dq avx512vl avx512ifma avx512vbmi avx512_vbmi2
    avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 avx512_4vnniw
    avx512_4fmaps avx512er avx512pf avx_vnni avx_vnni_int8 avx_ifma avx_ne_convert
    amx_tile amx_int8 amx_bf16 amx_fp16 amx_complex
    """.split()
)
_ARM_FEATURES = frozenset(
    """
    fp asimd neon sve sve2 svebf16 svei8mm sveaes svepmull svebitperm svesha3 svesm4
    sme sme2 bf16 i8mm dotprod asimddp asimdhp fphp fp16 asimdfhm crc32 aes pmull sha1
    sha2 sha3 sha512 atomics lse rcpc f32mm f64mm
    """.split()
)


@dataclass(frozen=True)
class Fingerprint:
    """One backend's platform facts; `digest` names it in keys and the index."""

    cpu_arch: str
    cpu_features: tuple[str, ...]
    os: str
    jax_version: str
    jaxlib_version: str
    platform: str
    platform_version: str
    device_kind: str
    device_count: int
    version: int = FINGERPRINT_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_features"] = list(self.cpu_features)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        fields = dict(data)
        fields.pop("digest", None)
        fields["cpu_features"] = tuple(fields.get("cpu_features", ()))
        return cls(**fields)


# Every field of `Fingerprint`, in the order people compare them: devices first, then
# software, then the host CPU (e.g. `artstore warm --expect-fingerprint` differences).
# The class keeps its own order, which `to_dict` and callers' JSON follow; a unit test
# keeps the two the same set.
FIELDS: tuple[str, ...] = (
    "platform",
    "device_kind",
    "device_count",
    "platform_version",
    "jax_version",
    "jaxlib_version",
    "cpu_arch",
    "cpu_features",
    "os",
    "version",
)


def parse_cpuinfo(text: str) -> tuple[set[str], str]:
    """The CPU flags and model name in the text of Linux's /proc/cpuinfo (first CPU)."""
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("flags", "features") and not flags:
            flags = set(value.split())
        elif name in ("model name", "cpu model") and not model:
            model = value.strip()
    return flags, model


def relevant_cpu_features(arch: str, flags: Iterable[str]) -> tuple[str, ...]:
    """The sorted flags of a CPU of architecture `arch` that change generated code."""
    relevant = _ARM_FEATURES if arch in ("aarch64", "arm64") else _X86_FEATURES
    return tuple(sorted(set(flags) & relevant))


def cpu_digest(arch: str, features: Iterable[str]) -> str:
    """Digest of the host-only part (arch and features), for keys made without a backend."""
    text = json.dumps({"cpu_arch": arch, "cpu_features": list(features)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
