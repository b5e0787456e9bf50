"""The portable form of a named executable: its `jax.export` serialization.

Stored beside the native executables under the name alone, so that a host of another
type (another device kind, another jaxlib, a CPU where it was built on a TPU) rebuilds
it with no source. It is exported for several platforms at once (jax.export's
multi-platform lowering): by default this host's and `cpu`, so that what a TPU job
builds also loads on a laptop, a CI runner or a CPU inference box.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from artifactstore.errors import NamedNotFound, one_line
from artifactstore.named import container
from artifactstore.named.call import sharding_from_json
from artifactstore.runtime.session import warn_once


def this_platform() -> str:
    """This host's platform as jax.export names it (`cuda`, never `gpu`)."""
    import jax

    return str(jax.export.default_export_platform())


def export(
    fn: Callable[..., Any],
    specs: Sequence[Any],
    static: frozenset[int],
    header: container.Header,
    platforms: tuple[str, ...] | None,
) -> bytes | None:
    """The portable form for `platforms` (default: this host's and cpu). Where the
    function does not lower for all of them (an op with no CPU lowering, a TPU-only
    kernel), it is exported for this host's platform alone, with one warning; None
    with a warning when it cannot be exported at all."""
    import jax

    this = this_platform()
    wanted = platforms if platforms is not None else tuple(dict.fromkeys((this, "cpu")))
    ref = f"{header.name}@{header.version}"
    jitted = jax.jit(fn, keep_unused=True, static_argnums=tuple(sorted(static)))
    try:
        exported = jax.export.export(jitted, platforms=wanted)(*specs)
    except Exception as exc:
        if len(wanted) == 1 or this not in wanted:
            warn_once("named-export", "%s has no portable form (%s)", ref, one_line(exc))
            return None
        warn_once(
            f"named-export-platforms:{ref}",
            "%s: portable form exported for %s alone "
            "(not for %s: %s); other hosts build it from the source",
            ref,
            this,
            ", ".join(p for p in wanted if p != this),
            one_line(exc),
        )
        try:
            exported = jax.export.export(jitted, platforms=(this,))(*specs)
        except Exception as again:
            warn_once("named-export", "%s has no portable form (%s)", ref, one_line(again))
            return None
    try:
        body = bytes(exported.serialize())
    except Exception as exc:
        warn_once("named-export", "%s has no portable form (%s)", ref, one_line(exc))
        return None
    portable = container.Header(
        kind="portable",
        name=header.name,
        version=header.version,
        inputs=header.inputs,
        outputs=header.outputs,
        jax_version=header.jax_version,
        devices=header.devices,
        platform=",".join(exported.platforms),
    )
    return container.encode(portable, body)


def lowering(
    header: container.Header, body: bytes, backend: Any
) -> tuple[Callable[[], Any], tuple[Any, ...], frozenset[int]]:
    """How to compile the portable form for this host, with no source: (lower, the
    argument specs, the static positions). `jax.export` checks its serialization and
    calling-convention versions and the platforms it was exported for; we say which."""
    import jax
    from jax import export as jax_export

    name = f"{header.name}@{header.version}"
    try:
        exported = jax_export.deserialize(bytearray(body))
    except Exception as exc:
        raise NamedNotFound(
            f"{name}: its portable form (written by JAX {header.jax_version}) cannot be read by "
            f"JAX {jax.__version__} ({one_line(exc)}): rebuild it with artifactstore.compiled "
            "on a JAX within jax.export's compatibility window"
        ) from exc
    low = jax_export.minimum_supported_calling_convention_version
    high = jax_export.maximum_supported_calling_convention_version
    ccv = exported.calling_convention_version
    if not low <= ccv <= high:
        raise NamedNotFound(
            f"{name}: its portable form uses calling convention {ccv} (JAX "
            f"{header.jax_version}); JAX {jax.__version__} supports {low}..{high}: it is too "
            f"{'old' if ccv < low else 'new'}; rebuild it with artifactstore.compiled"
        )
    this = this_platform()
    if this not in exported.platforms:
        fix = ", ".join(repr(p) for p in dict.fromkeys((*exported.platforms, this)))
        raise NamedNotFound(
            f"{name}: its portable form was exported for {', '.join(exported.platforms)} only, "
            f"and this host runs {this}: build it with artifactstore.compiled(..., "
            f"platforms=({fix})) (or NamedSpec(..., platforms=...) for `artstore warm`) "
            "under a new version (a published version is never replaced)"
        )
    devices = {d.id: d for d in backend.devices()}
    args = header.inputs.unflatten(
        [
            jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding_from_json(leaf, devices))  # type: ignore[no-untyped-call]
            for leaf in header.inputs.leaves
        ]
    )
    static = frozenset(i for i, _ in header.inputs.static_values())
    dynamic = [a for i, a in enumerate(args) if i not in static]

    def call(*values: Any) -> Any:
        return exported.call(*values)  # type: ignore[no-untyped-call]

    return (lambda: jax.jit(call, keep_unused=True).lower(*dynamic)), tuple(args), static
