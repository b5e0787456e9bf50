"""Building a named executable: lower, compile freshly, describe, check that it loads.

What is stored must come from this compile (`compile.fresh_compiles`), never from an
executable JAX kept, and must load back: on some jaxlibs an executable that was itself
deserialized serializes into bytes that no longer load. A function that a loaded
executable could not be given (host callbacks, effects, hidden constants) is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Target:
    """What a build compiles: NAME@VERSION for these arguments (`static`: the indices of
    the static ones), from the function (`source` "compiled") or its portable form."""

    name: str
    version: str
    args: tuple[Any, ...]
    static: frozenset[int]
    source: str

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


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

    return compile_fresh(lower, backend, Target(name, version, args, static, "compiled"))


def rebuild(header: container.Header, body: bytes, backend: Any) -> Built:
    """Compile the portable form for this host, with no source (`portable`)."""
    lower, args, static = portable.lowering(header, body, backend)
    target = Target(header.name, header.version, args, static, "portable")
    return compile_fresh(lower, backend, target)


def compile_fresh(lower: Callable[[], Any], backend: Any, target: Target) -> Built:
    """Compile what `lower` returns with JAX's caches bypassed (`compile.fresh_compiles`):
    the bytes we store must come from this compile, not from an executable JAX kept."""
    with _compile.fresh_compiles() as fresh:
        compiled = lower().compile()
    if not fresh:
        raise NamedBuildError(f"{target}: JAX reused a compile; cannot store fresh bytes")
    return _finish(target, compiled, fresh[-1], backend)


def _finish(target: Target, compiled: Any, fresh: tuple[Any, Any, float], backend: Any) -> Built:
    """Describe a fresh executable (`fresh`: its compile request, the executable and its
    compile seconds; `compiled`: JAX's view of it), check that its bytes load, wrap it."""
    import jax

    request, executable, secs = fresh
    name = target.name
    in_shardings = jax.tree.leaves(compiled.input_shardings[0])
    inputs = Signature.of(target.args, spec_leaf, path="args", static=static_check(target.static))
    if len(in_shardings) != len(inputs.leaves):
        raise NamedBuildError(
            f"{target}: {len(inputs.leaves)} array arguments, "
            f"but the executable takes {len(in_shardings)}"
        )
    leaves = zip(inputs.leaves, in_shardings, strict=True)
    inputs = Signature(
        inputs.tree,
        tuple(Leaf(leaf.shape, leaf.dtype, sharding_to_json(s, name)) for leaf, s in leaves),
    )
    out_info = compiled.out_info
    out_leaves = jax.tree.leaves(out_info)
    outputs = Signature.of(
        out_info,
        lambda o: Leaf(tuple(o.shape), str(o.dtype), sharding_to_json(o.sharding, name)),
        path="result",
    )
    if len(outputs.leaves) != len(out_leaves):
        raise NamedBuildError(f"{target}: could not describe the results")
    header = container.Header(
        kind="native",
        name=name,
        version=target.version,
        inputs=inputs,
        outputs=outputs,
        jax_version=jax.__version__,
        devices=tuple(d.id for d in request.executable_devices),
        platform=str(backend.platform),
    )
    body = executable.serialize()
    try:  # only ever store bytes that load (the re-serialization trap)
        backend.deserialize_executable(body, device_list(header), None)
    except Exception as exc:
        raise NamedBuildError(
            f"{target}: the compiled executable does not load back ({one_line(exc)}); not stored"
        ) from exc
    executable = NamedExecutable(header, executable, target.source)
    return Built(executable, container.encode(header, body), secs)


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
        raise NamedBuildError(
            f"{name}: JAX tuples or mutates this function's arguments; "
            "named executables do not support that"
        )


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
