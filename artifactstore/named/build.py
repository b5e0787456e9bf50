"""Building a named executable: lower, compile freshly, describe, check that it loads.

What is stored must come from this compile (`compile.fresh_compiles`), never from an
executable JAX kept, and must load back: on some jaxlibs an executable that was itself
deserialized serializes into bytes that no longer load. A function that a loaded
executable could not be given (host callbacks, effects, hidden constants) is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from artifactstore.errors import NamedBuildError, NamedNotFound, one_line
from artifactstore.jaxhook import compat
from artifactstore.jaxhook import compile as _compile
from artifactstore.named import container, portable
from artifactstore.named.call import NamedExecutable, sharding_to_json
from artifactstore.named.signature import Leaf, Signature


class Built:
    """A fresh executable and the container to store for this host's fingerprint."""

    def __init__(self, executable: NamedExecutable, payload: bytes, secs: float) -> None:
        self.executable = executable
        self.payload = payload  # the container stored for this fingerprint
        self.compile_secs = secs


def build(
    fn: Callable[..., Any],
    specs: Sequence[Any],
    static: frozenset[int],
    *,
    name: str,
    version: str,
    backend: Any,
) -> Built:
    """`fn` lowered for `specs` and compiled for this host."""
    import jax

    args = tuple(specs)
    jitted = jax.jit(fn, keep_unused=True, static_argnums=tuple(sorted(static)))

    def lower() -> Any:
        lowered = jitted.lower(*args)
        refuse_implicit(lowered, name)
        return lowered

    return compile_fresh(
        lower, backend, name=name, version=version, args=args, static=static, source="compiled"
    )


def rebuild(header: container.Header, body: bytes, backend: Any) -> Built:
    """Compile the portable form for this host, with no source (`portable`)."""
    lower, args, static = portable.lowering(header, body, backend)
    return compile_fresh(
        lower,
        backend,
        name=header.name,
        version=header.version,
        args=args,
        static=static,
        source="portable",
    )


def compile_fresh(
    lower: Callable[[], Any],
    backend: Any,
    *,
    name: str,
    version: str,
    args: tuple[Any, ...],
    static: frozenset[int],
    source: str,
) -> Built:
    """Compile what `lower` returns with JAX's caches bypassed (`compile.fresh_compiles`):
    the bytes we store must come from this compile, not from an executable JAX kept."""
    import jax

    with _compile.fresh_compiles() as fresh:
        compiled = lower().compile()
    if not fresh:
        raise NamedBuildError(f"{name}@{version}: JAX reused a compile; cannot store fresh bytes")
    request, executable, secs = fresh[-1]
    return _finish(
        executable, request.executable_devices, backend, secs,
        name=name, version=version, args=args, static=static,
        in_shardings=jax.tree.leaves(compiled.input_shardings[0]),
        out_info=compiled.out_info, source=source,
    )  # fmt: skip


def _finish(
    executable: Any,
    devices: Any,
    backend: Any,
    secs: float,
    *,
    name: str,
    version: str,
    args: tuple[Any, ...],
    static: frozenset[int],
    in_shardings: list[Any],
    out_info: Any,
    source: str,
) -> Built:
    """Describe a fresh executable, check that its bytes load, and wrap it."""
    import jax

    inputs = Signature.of(args, spec_leaf, path="args", static=static_check(static))
    if len(in_shardings) != len(inputs.leaves):
        raise NamedBuildError(f"{name}@{version}: {len(inputs.leaves)} array arguments, "
                              f"but the executable takes {len(in_shardings)}")  # fmt: skip
    inputs = Signature(inputs.tree, tuple(
        Leaf(leaf.shape, leaf.dtype, sharding_to_json(s, name))
        for leaf, s in zip(inputs.leaves, in_shardings, strict=True)
    ))  # fmt: skip
    out_leaves = jax.tree.leaves(out_info)
    outputs = Signature.of(
        out_info, lambda o: Leaf(tuple(o.shape), str(o.dtype), sharding_to_json(o.sharding, name)),
        path="result",
    )  # fmt: skip
    if len(outputs.leaves) != len(out_leaves):
        raise NamedBuildError(f"{name}@{version}: could not describe the results")
    header = container.Header(
        kind="native", name=name, version=version, inputs=inputs, outputs=outputs,
        jax_version=jax.__version__, devices=tuple(d.id for d in devices),
        platform=str(backend.platform),
    )  # fmt: skip
    body = executable.serialize()
    try:  # only ever store bytes that load (the re-serialization trap)
        backend.deserialize_executable(body, device_list(header), None)
    except Exception as exc:
        raise NamedBuildError(
            f"{name}@{version}: the compiled executable does not load back "
            f"({one_line(exc)}); not stored"
        ) from exc
    return Built(NamedExecutable(header, executable, source), container.encode(header, body), secs)


def refuse_implicit(lowered: Any, name: str) -> None:
    """Refuse what a loaded executable could not be given: host callbacks and effects
    (Python code), constants JAX passes as hidden arguments, tupled or pruned args."""
    lowering = getattr(lowered, "_lowering", None)
    args = getattr(lowering, "compile_args", None)
    if not isinstance(args, dict):
        raise NamedBuildError(f"{name}: cannot inspect this JAX's lowering; not stored")
    if args.get("host_callbacks") or args.get("ordered_effects") or args.get("unordered_effects"):
        raise NamedBuildError(
            f"{name}: the function has host callbacks or side effects (jax.debug.print, "
            "pure_callback, io_callback): they are Python code, which a named executable "
            "cannot carry; remove them, or rely on the compile cache (jax.jit)"
        )
    if getattr(lowering, "const_args", None):
        raise NamedBuildError(
            f"{name}: the function closes over array constants that JAX passes as hidden "
            "arguments; pass them as arguments instead"
        )
    if args.get("tuple_args") or args.get("mut"):
        raise NamedBuildError(f"{name}: JAX tuples or mutates this function's arguments; "
                              "named executables do not support that")  # fmt: skip


# -- specs and devices ----------------------------------------------------------
def spec_leaf(spec: Any) -> Leaf:
    return Leaf(tuple(int(d) for d in spec.shape), str(spec.dtype), None)


def static_check(static: frozenset[int]) -> Callable[[str], bool]:
    paths = {f"args[{i}]" for i in static}
    return lambda path: path in paths


def device_list(header: container.Header) -> Any:
    """The devices the executable runs on, as `deserialize_executable` takes them."""
    import jax

    by_id = {d.id: d for d in jax.devices()}
    try:
        devices = tuple(by_id[i] for i in header.devices)
    except KeyError as exc:
        raise NamedNotFound(f"this host has no device {exc} that the executable runs on") from exc
    return compat.device_list(devices)
