"""`build(NAME, version=)`: a named function's portable StableHLO compiled by IREE,
checked against XLA, then stored, signed and content-addressed like every entry.

For CI jobs (and `artstore native build`): the portable form is read from the store
(verified), lowered for the CPU (`lower`), refused with the operation's name where it
cannot go native, compiled for the target and CPU, then run beside XLA (the named
executable, loaded as any program loads it) on generated inputs (`check`). Only a
module that agreed on every output is stored, under a key of the name, version,
StableHLO digest and fingerprint (target, CPU, compiler); a disagreement raises
NativeBuildError naming the outputs and their difference, and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from artifactstore.errors import one_line
from artifactstore.formats.put import Put
from artifactstore.named import keys
from artifactstore.native import check, fetch, iree, lower
from artifactstore.native.convention import Convention, encode
from artifactstore.native.errors import NativeBuildError
from artifactstore.native.runner import Module
from artifactstore.native.target import Cpu, check_target, parse_cpu


@dataclass(frozen=True)
class Built:
    """What a build did: the module's key and size, and the check's rows (`present`:
    the store held it already; nothing was compiled)."""

    convention: Convention
    key: str
    size: int
    compile_secs: float = 0.0
    present: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)


def build(
    name: str,
    version: str,
    *,
    target: str = "llvm-cpu",
    cpu: str = "generic",
    inputs: int | Sequence[Any] = 0,
    rewrite: Callable[[str], str] | None = None,
) -> Built:
    """NAME@VERSION built, checked and stored for `target` and `cpu` (`generic`,
    `host`, or features such as `+avx2,+fma`, which this host must have: the check runs
    the module here). `inputs`: the check's inputs: a seed to generate them from, or
    the arrays (flat, in the module's order: real data the function will see). `rewrite`: a
    test seam, applied to the StableHLO text before IREE compiles it (so that a test
    can make a module that really disagrees)."""
    from artifactstore.named.api import load as load_named

    keys.check_name(name)
    keys.check_version(version)
    chosen = parse_cpu(cpu)
    missing = chosen.missing_here()
    if missing:
        raise NativeBuildError(
            f"cannot check a module for CPU {chosen.describe()} here: this host lacks "
            f"{', '.join(missing[:5])}; build it on a host that has them"
        )
    xla = load_named(name, version)  # configures the store from ARTSTORE_* if not yet
    where = fetch.session()
    wanted = fetch.Wanted(name, version, check_target(target), iree.compiler_version())
    source = fetch.portable(where, name, version)
    present = fetch.module(where, wanted, source.stablehlo, chosen)
    if present is not None:
        key, _ = wanted.key(source.stablehlo, chosen)
        return Built(present[0], key, len(present[1]), present=True)
    text = lower.stablehlo(source.header, source.body)
    lower.refuse_unsupported(text, source.header)
    vmfb, secs = lower.compile_module(rewrite(text) if rewrite else text, target, chosen)
    rows = _check(source.header, xla, Module(vmfb), inputs)
    convention = _convention(wanted, source, chosen, rows)
    key, _ = wanted.key(source.stablehlo, chosen)
    put = Put(
        key,
        encode(convention, vmfb),
        chosen.fingerprint(target, wanted.compiler),
        keys.module_name(name, version),
        secs,
        callbacks=0,
    )
    _store(where, put, wanted.ref)
    return Built(convention, key, len(vmfb), secs, rows=rows)


def _check(
    header: Any, xla: Any, module: Module, seed: int | Sequence[Any]
) -> list[dict[str, Any]]:
    """The module against the named executable; NativeBuildError where they disagree."""
    import numpy as np

    def run_xla(arrays: Sequence[Any]) -> list[Any]:
        out = xla(*header.inputs.unflatten(list(arrays)))
        flat: list[Any] = header.outputs.flatten(
            out, path="result", check=lambda v, _s, _p: np.asarray(v)
        )
        return flat

    try:
        rows = check.against(module, run_xla, (header.inputs, header.outputs), seed)
    except NativeBuildError:
        raise
    except Exception as exc:
        raise NativeBuildError(f"the module did not run: {one_line(exc)}") from exc
    if not all(row["ok"] for row in rows):
        raise NativeBuildError(
            f"{header.name}@{header.version}: the native module disagrees with XLA, not "
            f"stored: {check.disagreement(rows)}"
        )
    return rows


def _convention(
    wanted: fetch.Wanted, source: fetch.Portable, cpu: Cpu, rows: list[dict[str, Any]]
) -> Convention:
    header = source.header
    where = (source.stablehlo, wanted.target, cpu.kind, cpu.arch, cpu.features, wanted.compiler)
    return Convention(
        wanted.name, wanted.version, header.inputs, header.outputs, *where, check=rows
    )


def _store(where: Any, put: Put, ref: str) -> None:
    try:
        stored = fetch.store(where, put)
    except Exception as exc:
        raise NativeBuildError(f"{ref}: checked, but not stored ({one_line(exc)})") from exc
    if not stored:
        raise NativeBuildError(
            f"{ref}: checked, but not stored: the store is read-only or unavailable (see the log)"
        )
