"""The store side of native modules, without JAX: the portable form a module is built
from, and the modules this host may run, through the session's one lookup chain.

Each payload is verified by the one verifier on its way (digest, fingerprint, key,
signature, the frame of its kind) before anything here reads it; what is read then is
checked against what was asked (name, version, the StableHLO, the CPU), since only a
forged or mis-written entry could differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from artifactstore import config
from artifactstore.errors import CorruptObject
from artifactstore.formats import native as native_format
from artifactstore.formats.put import Put
from artifactstore.named import container, keys
from artifactstore.native.convention import Convention, decode
from artifactstore.native.errors import NativeNotFound
from artifactstore.native.target import Cpu
from artifactstore.runtime import process
from artifactstore.runtime.session import Session
from artifactstore.store.chain import Request

USER = "native"


def session(settings: config.Settings | None = None) -> Session:
    """The process's session (the one JAX's adapter uses, if it is on and `settings`
    are its own), else one for `settings` (default: ARTSTORE_* and the embedded store)."""
    current = process.current()
    if current is not None and (settings is None or current.settings == settings):
        return current
    return process.use(USER, settings or config.resolve({})).session


@dataclass(frozen=True)
class Portable:
    """NAME@VERSION's portable form: its header and the `jax.export` serialization."""

    header: container.Header
    body: bytes

    @property
    def stablehlo(self) -> str:
        """The digest of the StableHLO a module is compiled from (part of its key)."""
        return hashlib.sha256(self.body).hexdigest()


def portable(where: Session, name: str, version: str) -> Portable:
    """NAME@VERSION's portable form, verified; NativeNotFound when the store holds none."""
    request = Request(keys.portable_key(name, version), keys.PORTABLE.digest, kind="named")
    found = where.chain.get(request)
    if found is None or found.payload is None:
        why = f" ({'; '.join(sorted(set(request.notes)))})" if request.notes else ""
        raise NativeNotFound(
            f"no portable form of {name}@{version} in the store{why}: build it with "
            "artifactstore.compiled(...) (portable=True, the default) first"
        )
    header, body = container.decode(bytes(found.payload))
    if (header.name, header.version, header.kind) != (name, version, "portable"):
        raise CorruptObject(f"entry for {name}@{version} holds {header.kind} {header.name}")
    return Portable(header, body)


@dataclass(frozen=True)
class Wanted:
    """Which modules of NAME@VERSION: for `target`, compiled by IREE `compiler`."""

    name: str
    version: str
    target: str
    compiler: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def key(self, stablehlo: str, cpu: Cpu) -> tuple[str, str]:
        """(key, fingerprint digest) of the module for `cpu` from StableHLO `stablehlo`."""
        fingerprint = cpu.fingerprint(self.target, self.compiler)
        key = native_format.entry_key(self.name, self.version, stablehlo, fingerprint.digest)
        return key, fingerprint.digest


def module(
    where: Session, wanted: Wanted, stablehlo: str, cpu: Cpu
) -> tuple[Convention, bytes] | None:
    """The module `wanted` for `cpu`, verified and matching what was asked; None: the
    store holds none (or refused it: the chain counted and logged why)."""
    key, fingerprint = wanted.key(stablehlo, cpu)
    request = Request(key, fingerprint, kind="native")
    found = where.chain.get(request)
    if found is None or found.payload is None:
        return None
    convention, body = decode(bytes(found.payload))
    said = (convention.name, convention.version, convention.stablehlo, convention.target)
    asked = (wanted.name, wanted.version, stablehlo, wanted.target)
    if said != asked or (convention.cpu, convention.cpu_features) != (cpu.kind, cpu.features):
        raise CorruptObject(f"entry {key[:12]} holds another module than {wanted.ref}'s")
    return convention, body


def find(where: Session, wanted: Wanted, cpus: list[Cpu]) -> tuple[Convention, bytes, Cpu]:
    """The first module of `wanted` for one of `cpus` (best first); NativeNotFound
    naming what was asked when none is stored. Counted in the session's counters
    (`native_loads`, `native_not_found`: process_stats())."""
    source = portable(where, wanted.name, wanted.version)
    for cpu in cpus:
        found = module(where, wanted, source.stablehlo, cpu)
        if found is not None:
            where.counters.add("native_loads")
            return (*found, cpu)
    where.counters.add("native_not_found")
    asked = ", ".join(cpu.describe() for cpu in cpus) or "none this host runs"
    raise NativeNotFound(
        f"no native module of {wanted.ref} for {wanted.target} (CPU: {asked}; IREE "
        f"{wanted.compiler}) in the store: build one with `artstore native build "
        f"{wanted.ref} --target {wanted.target} --cpu generic`"
    )


def store(where: Session, put: Put) -> bool:
    """Store `put` now (synchronously); True where it was stored or already there.
    NativeBuildError-free: the caller says what a False costs."""
    opened = where.store()
    if opened is None or where.settings.read_only:
        return False
    opened.put(put)
    return True
