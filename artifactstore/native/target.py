"""Which CPU a native module is built for, and whether this host may be served it.

`--cpu generic`: the architecture's baseline (any host of the architecture runs it);
`host`: this host's CPU (served only to hosts with exactly its features); a list of
LLVM features (`+avx2,+fma`): served only to hosts that have each. Features are
named as the platform fingerprint names them (/proc/cpuinfo's spelling, among the
features that change generated code); a feature outside that list is refused, since
no host could be proven to have it.
"""

from __future__ import annotations

from dataclasses import dataclass

from artifactstore.config.host import cpu_arch, host_cpu_features
from artifactstore.errors import ConfigError
from artifactstore.formats import native as native_format
from artifactstore.formats.fingerprint import Fingerprint, relevant_cpu_features

TARGETS = ("llvm-cpu",)
# LLVM's spelling -> /proc/cpuinfo's, where they differ.
_LLVM_TO_CPUINFO = {
    "sse3": "pni",
    "sha": "sha_ni",
    "pclmul": "pclmulqdq",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "bmi": "bmi1",
    "neon": "asimd",
    "dotprod": "asimddp",
    "fullfp16": "fphp",
    "crc": "crc32",
    "lzcnt": "abm",
}
_CPUINFO_TO_LLVM = {v: k for k, v in _LLVM_TO_CPUINFO.items()}


@dataclass(frozen=True)
class Cpu:
    """The CPU a module is built for: how it was chosen (`generic`, `host`,
    `features`), its architecture and features (fingerprint spelling)."""

    kind: str
    arch: str
    features: tuple[str, ...]

    def compiler_flags(self) -> list[str]:
        """IREE's llvm-cpu flags that build for this CPU."""
        if self.kind == "generic":
            return ["--iree-llvmcpu-target-cpu=generic"]
        # `host` too: exactly the fingerprint's features, never more that LLVM finds here
        llvm = ",".join("+" + _llvm_name(f) for f in self.features)
        return ["--iree-llvmcpu-target-cpu=generic", f"--iree-llvmcpu-target-cpu-features={llvm}"]

    def fingerprint(self, target: str, compiler: str) -> Fingerprint:
        return native_format.fingerprint(target, self.arch, self.features, self.kind, compiler)

    def missing_here(self) -> list[str]:
        """The features this CPU has that this host lacks (another architecture: all)."""
        if self.arch != cpu_arch():
            return [f"architecture {self.arch}"]
        have = set(host_cpu_features())
        if self.kind == "host":
            return sorted(set(self.features) ^ have)  # exactly this host's, or not it
        return sorted(set(self.features) - have)

    def describe(self) -> str:
        if self.kind == "features":
            return ",".join(self.features)
        return self.kind


def _llvm_name(feature: str) -> str:
    """A fingerprint's feature as LLVM spells it (one LLVM does not know is ignored by
    it: the module then uses less, never more, than the fingerprint says)."""
    if feature in _CPUINFO_TO_LLVM:
        return _CPUINFO_TO_LLVM[feature]
    if feature.startswith("sse4_"):
        return feature.replace("_", ".")
    if feature.startswith("amx_"):
        return feature.replace("_", "-")
    return feature.replace("_", "")


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown native target {target!r}; supported: {', '.join(TARGETS)}")
    return target


def parse_cpu(spec: str) -> Cpu:
    """`generic`, `host`, or LLVM features (`+avx2,+fma`, or `avx2,fma`) for this
    host's architecture; ConfigError for a feature no fingerprint names."""
    arch = cpu_arch()
    if spec == "generic":
        return Cpu("generic", arch, ())
    if spec == "host":
        return Cpu("host", arch, host_cpu_features())
    names = [part.strip().lstrip("+") for part in spec.split(",") if part.strip()]
    spelled = [_LLVM_TO_CPUINFO.get(n.lower(), n.lower().replace(".", "_")) for n in names]
    known = set(relevant_cpu_features(arch, spelled))
    unknown = [n for n, s in zip(names, spelled, strict=True) if s not in known]
    if not names or unknown:
        what = f"unknown CPU feature {unknown[0]!r}" if unknown else "no features given"
        raise ConfigError(
            f"--cpu {spec!r}: {what}; give generic, host, or {arch} features such as +avx2,+fma"
        )
    return Cpu("features", arch, tuple(sorted(set(spelled))))


def candidates(spec: str | None) -> list[Cpu]:
    """The CPUs a reader asks for, best first: the one named, or this host's exact
    features, then the generic baseline. Only those this host runs."""
    wanted = [parse_cpu(spec)] if spec else [parse_cpu("host"), parse_cpu("generic")]
    return [cpu for cpu in wanted if not cpu.missing_here()]
