"""Named executables with JAX: build once, then load and call with no trace at all.

`compiled(fn, *specs, name=, version=)` looks NAME@VERSION up for this host's
fingerprint; on a hit it deserializes the executable and never calls, traces or
lowers `fn`. On a miss it rebuilds from the stored `jax.export` form if there is
one, else lowers and compiles `fn` (always freshly: see `compile.fresh_compiles`),
checks that the bytes load, and stores the native executable and its portable form.
Calls go through JAX's own C++ call path, as a jitted function's do
(`named_call`); a call that does not fit is checked against the stored declarative
signature, which names the first mismatch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from artifactstore.errors import (
    ArtstoreError,
    CorruptObject,
    NamedBuildError,
    NamedNotFound,
    one_line,
)
from artifactstore.formats import fingerprint as _fp
from artifactstore.jaxhook import compile as _compile
from artifactstore.jaxhook import named_portable
from artifactstore.jaxhook.named_call import NamedExecutable, _sharding_json
from artifactstore.named import container, keys
from artifactstore.named.signature import (
    Leaf,
    NamedCallError,
    Signature,
)
from artifactstore.runtime.session import Session, warn_once
from artifactstore.store.background import call_with_timeout

log = logging.getLogger("artifactstore")


def compiled(
    fn: Any = None,
    *specs: Any,
    name: str,
    version: str,
    static_argnums: int | Sequence[int] = (),
    portable: bool = True,
    platforms: str | Sequence[str] | None = None,
) -> Any:
    """The named executable NAME@VERSION: loaded from the store when it holds one for
    this host (no trace), else built from `fn` and `specs` and stored.

    `specs`: one per positional argument of `fn`: `jax.ShapeDtypeStruct`s (with
    `sharding=` where the inputs are sharded), or dicts/tuples/lists/None of them;
    the values of `static_argnums` positions are passed as they are. As a decorator:
    `@compiled(*specs, name=..., version=...)`. `portable=False` skips storing the
    `jax.export` form; `platforms` are those it is exported for (default: this
    host's and "cpu"; any of "cpu", "cuda", "rocm", "tpu").
    """
    keys.check_name(name)
    keys.check_version(version)
    chosen = keys.check_platforms(platforms)
    if fn is None or not callable(fn) or _is_spec(fn):
        given = specs if fn is None else (fn, *specs)
        return functools.partial(
            _compiled, specs=given, name=name, version=version,
            static_argnums=static_argnums, portable=portable, platforms=chosen,
        )  # fmt: skip
    return _compiled(
        fn, specs=specs, name=name, version=version, static_argnums=static_argnums,
        portable=portable, platforms=chosen,
    )  # fmt: skip


def _compiled(
    fn: Callable[..., Any],
    *,
    specs: Sequence[Any],
    name: str,
    version: str,
    static_argnums: int | Sequence[int],
    portable: bool,
    platforms: tuple[str, ...] | None = None,
) -> NamedExecutable:
    static = _static_positions(static_argnums, len(specs))
    wanted = Signature.of(tuple(specs), _spec_leaf, path="args", static=_static_check(static))
    context = _Context.open()
    try:
        found = context.find(name, version)
    except (NamedNotFound, CorruptObject) as exc:  # unusable as stored; the source is here
        warn_once("named-rebuild", "%s; compiling it from the function", exc)
        found = None
    if found is not None:
        _check_same_inputs(found.header, wanted)
        return found
    built = _build(fn, specs, static, name=name, version=version, backend=context.backend)
    context.store_native(built)
    if portable:
        exported = named_portable.export(fn, specs, static, built.executable.header, platforms)
        if exported is not None:
            context.store_portable(name, version, exported)
    return built.executable


def load(name: str, version: str) -> NamedExecutable:
    """NAME@VERSION from the store, without the function or its source: the native
    executable for this host, else rebuilt from the portable form (and stored for
    this host). NamedNotFound when the store holds neither."""
    keys.check_name(name)
    keys.check_version(version)
    context = _Context.open()
    found = context.find(name, version)
    if found is None:
        raise NamedNotFound(context.not_found(name, version))
    return found


# -- the store side -------------------------------------------------------------
class _Built:
    def __init__(self, executable: NamedExecutable, payload: bytes, secs: float) -> None:
        self.executable = executable
        self.payload = payload  # the container stored for this fingerprint
        self.compile_secs = secs


class _Context:
    """This process's session, backend and fingerprint, for one lookup or build."""

    def __init__(self, session: Session | None, backend: Any) -> None:
        self.session = session
        self.backend = backend
        self.fingerprint = _compile.backend_fingerprint(backend)
        self.problems: list[str] = []  # why a lookup found nothing, for the error

    @classmethod
    def open(cls) -> _Context:
        from jax._src import xla_bridge

        from artifactstore.jaxhook import api

        session = _compile.current()
        if session is None:
            api.configure()  # from ARTSTORE_* or the embedded default, as documented
            session = _compile.current()
        hooks = api.jax_hooks()
        if hooks is None:
            raise NamedBuildError(
                "this JAX's internals do not match what artifactstore supports; "
                "named executables need them (see `artstore doctor`)"
            )
        _compile.ensure_installed(hooks)
        return cls(session, xla_bridge.get_backend())

    def _store(self) -> Any:
        return self.session.store() if self.session is not None else None

    def fetch(self, key: str, fingerprint_digest: str) -> bytes | None:
        """The verified payload of `key` from this host's tier or the store, or None."""
        session = self.session
        if session is None:
            return None
        hit = session.tier_get(key, fingerprint_digest)
        if hit is not None:
            session.tier_hit()
            return bytes(hit.payload)
        store = self._store()
        if store is None:
            self.problems.append("the store is unavailable (see the log)")
            return None
        try:
            got = session.lookup(store, key, fingerprint_digest)
        except Exception as exc:
            self.problems.append(f"the store did not answer ({one_line(exc)})")
            return None
        if got is None:
            reason = store.refused(key)
            if reason:
                self.problems.append(f"refused: {reason}")
            return None
        return bytes(got.payload)

    def find(self, name: str, version: str) -> NamedExecutable | None:
        fp = self.fingerprint
        payload = self.fetch(keys.key(name, version, fp.digest), fp.digest)
        if payload is not None:
            started = time.monotonic()
            header, body = _decode(payload, name, version, "native")
            try:
                executable = self.backend.deserialize_executable(body, _device_list(header), None)
            except Exception as exc:
                warn_once(
                    "named-load", "stored %s@%s did not load (%s)", name, version, one_line(exc)
                )
            else:
                if self.session is not None:
                    self.session.observe_load(time.monotonic() - started)
                    self.session.loads += 1
                return NamedExecutable(header, executable, "store")
        payload = self.fetch(keys.portable_key(name, version), keys.PORTABLE.digest)
        if payload is None:
            return None
        header, body = _decode(payload, name, version, "portable")
        built = _rebuild(header, body, self.backend)
        self.store_native(built)
        return built.executable

    def not_found(self, name: str, version: str) -> str:
        fp = self.fingerprint
        where = self._store()
        place = where.describe() if where is not None else "no store (see the log)"
        why = f" ({'; '.join(sorted(set(self.problems)))})" if self.problems else ""
        return (
            f"no executable {name}@{version} for this host ({fp.platform} "
            f"{fp.device_kind} x{fp.device_count}, jaxlib {fp.jaxlib_version}) and no portable "
            f"form in {place}{why}: build it with artifactstore.compiled(...) or "
            "`artstore warm` with artifactstore.NamedSpec items"
        )

    def _put(self, key: str, payload: bytes, fingerprint: _fp.Fingerprint, module: str,
             secs: float) -> None:  # fmt: skip
        session = self.session
        store = self._store()
        if session is None or store is None:
            warn_once("named-put", "no store: %s built but not stored", module)
            return
        if session.settings.read_only:
            store.counters.add("skipped_read_only")
            return
        try:
            call_with_timeout(
                lambda: store.put(key, payload, fingerprint=fingerprint, module_name=module,
                                  compile_secs=secs, callbacks=0),
                session.settings.timeout_secs,
            )  # fmt: skip
        except Exception as exc:
            session.fail(exc)
            warn_once("named-put", "%s not stored (%s)", module, one_line(exc))

    def store_native(self, built: _Built) -> None:
        header = built.executable.header
        fp = self.fingerprint
        self._put(keys.key(header.name, header.version, fp.digest), built.payload, fp,
                  keys.module_name(header.name, header.version), built.compile_secs)  # fmt: skip

    def store_portable(self, name: str, version: str, payload: bytes) -> None:
        self._put(keys.portable_key(name, version), payload, keys.PORTABLE,
                  keys.module_name(name, version), 0.0)  # fmt: skip


def _decode(payload: bytes, name: str, version: str, kind: str) -> tuple[container.Header, bytes]:
    header, body = container.decode(payload)
    if (header.name, header.version, header.kind) != (name, version, kind):
        # Signed and bound to its key, so only a forged or mis-written entry gets here.
        raise CorruptObject(
            f"entry for {name}@{version} holds {header.kind} {header.name}@{header.version}"
        )
    return header, body


# -- building -------------------------------------------------------------------
def _build(
    fn: Callable[..., Any],
    specs: Sequence[Any],
    static: frozenset[int],
    *,
    name: str,
    version: str,
    backend: Any,
) -> _Built:
    import jax

    args = tuple(specs)
    jitted = jax.jit(fn, keep_unused=True, static_argnums=tuple(sorted(static)))

    def lower() -> Any:
        lowered = jitted.lower(*args)
        _refuse_implicit(lowered, name)
        return lowered

    return _compile_fresh(
        lower, backend, name=name, version=version, args=args, static=static, source="compiled"
    )


def _compile_fresh(
    lower: Callable[[], Any],
    backend: Any,
    *,
    name: str,
    version: str,
    args: tuple[Any, ...],
    static: frozenset[int],
    source: str,
) -> _Built:
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
) -> _Built:
    """Describe a fresh executable, check that its bytes load, and wrap it."""
    import jax

    inputs = Signature.of(args, _spec_leaf, path="args", static=_static_check(static))
    if len(in_shardings) != len(inputs.leaves):
        raise NamedBuildError(f"{name}@{version}: {len(inputs.leaves)} array arguments, "
                              f"but the executable takes {len(in_shardings)}")  # fmt: skip
    inputs = Signature(inputs.tree, tuple(
        Leaf(leaf.shape, leaf.dtype, _sharding_json(s, name))
        for leaf, s in zip(inputs.leaves, in_shardings, strict=True)
    ))  # fmt: skip
    out_leaves = jax.tree.leaves(out_info)
    outputs = Signature.of(
        out_info, lambda o: Leaf(tuple(o.shape), str(o.dtype), _sharding_json(o.sharding, name)),
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
        backend.deserialize_executable(body, _device_list(header), None)
    except Exception as exc:
        raise NamedBuildError(
            f"{name}@{version}: the compiled executable does not load back "
            f"({one_line(exc)}); not stored"
        ) from exc
    return _Built(NamedExecutable(header, executable, source), container.encode(header, body), secs)


def _refuse_implicit(lowered: Any, name: str) -> None:
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


def _rebuild(header: container.Header, body: bytes, backend: Any) -> _Built:
    """Compile the portable form for this host, with no source (`named_portable`)."""
    lower, args, static = named_portable.lowering(header, body, backend)
    return _compile_fresh(
        lower,
        backend,
        name=header.name,
        version=header.version,
        args=args,
        static=static,
        source="portable",
    )


# -- specs, shardings, arrays ---------------------------------------------------
def _is_spec(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _spec_leaf(spec: Any) -> Leaf:
    return Leaf(tuple(int(d) for d in spec.shape), str(spec.dtype), None)


def _static_positions(static_argnums: int | Sequence[int], count: int) -> frozenset[int]:
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    out = set()
    for n in nums:
        if not -count <= n < count:
            raise NamedBuildError(f"static_argnums {n} is out of range for {count} specs")
        out.add(n % count)
    return frozenset(out)


def _static_check(static: frozenset[int]) -> Callable[[str], bool]:
    paths = {f"args[{i}]" for i in static}
    return lambda path: path in paths


def _check_same_inputs(header: container.Header, wanted: Signature) -> None:
    stored = Signature(
        header.inputs.tree, tuple(Leaf(x.shape, x.dtype) for x in header.inputs.leaves)
    )
    if stored != wanted:
        raise NamedCallError(
            f"{header.name}@{header.version} in the store takes {stored.describe()}, but these "
            f"specs are {wanted.describe()}: give the new specs a new version"
        )


def _device_list(header: container.Header) -> Any:
    import jax
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    by_id = {d.id: d for d in jax.devices()}
    try:
        return xc.DeviceList(tuple(by_id[i] for i in header.devices))
    except KeyError as exc:
        raise NamedNotFound(f"this host has no device {exc} that the executable runs on") from exc


__all__ = ["ArtstoreError", "NamedExecutable", "compiled", "load"]
