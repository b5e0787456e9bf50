"""Named executables with JAX: build once, then load and call with no trace at all.

`compiled(fn, *specs, name=, version=)` looks NAME@VERSION up for this host's
fingerprint (`context`); on a hit it deserializes the executable and never calls,
traces or lowers `fn`. On a miss it rebuilds from the stored `jax.export` form if
there is one, else lowers and compiles `fn` (always freshly: see `build`), checks
that the bytes load, and stores the native executable and its portable form
(`portable`). Calls go through JAX's own C++ call path, as a jitted function's do
(`call`); a call that does not fit is checked against the stored declarative
signature, which names the first mismatch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from artifactstore.errors import (
    ArtstoreError,
    CorruptObject,
    NamedBuildError,
    NamedNotFound,
)
from artifactstore.named import container, keys
from artifactstore.named import portable as _portable
from artifactstore.named.build import build, spec_leaf, static_check
from artifactstore.named.call import NamedExecutable
from artifactstore.named.context import Context
from artifactstore.named.signature import Leaf, NamedCallError, Signature
from artifactstore.process.lanes import run_all
from artifactstore.runtime.session import warn_once

LOAD_THREADS = 4  # named executables deserialized at once by `load_many`


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
    wanted = _Wanted(name, version, static_argnums, portable, chosen)
    build = functools.partial(_compiled, wanted=wanted)
    if fn is None or not callable(fn) or _is_spec(fn):  # the decorator form
        return functools.partial(build, specs=specs if fn is None else (fn, *specs))
    return build(fn, specs=specs)


@dataclass(frozen=True)
class _Wanted:
    """What `compiled` was asked for, but the function and its specs: NAME@VERSION, its
    static arguments, and whether (and for which platforms) to store a portable form."""

    name: str
    version: str
    static_argnums: int | Sequence[int]
    portable: bool
    platforms: tuple[str, ...] | None


def _compiled(fn: Callable[..., Any], *, specs: Sequence[Any], wanted: _Wanted) -> NamedExecutable:
    name, version = wanted.name, wanted.version
    static = _static_positions(wanted.static_argnums, len(specs))
    inputs = Signature.of(tuple(specs), spec_leaf, path="args", static=static_check(static))
    context = Context.open()
    try:
        found = context.find(name, version)
    except (NamedNotFound, CorruptObject) as exc:  # unusable as stored; the source is here
        warn_once("named-rebuild", "%s; compiling it from the function", exc)
        found = None
    if found is not None:
        _check_same_inputs(found.header, inputs)
        return found
    built = build(fn, specs, static, name=name, version=version, backend=context.backend)
    context.store_native(built)
    if wanted.portable and (name, version) not in context.gone:  # a removed one: not stored
        header = built.executable.header
        exported = _portable.export(fn, specs, static, header, wanted.platforms)
        if exported is not None:
            context.store_portable(name, version, exported)
    return built.executable


def load(name: str, version: str) -> NamedExecutable:
    """NAME@VERSION from the store, without the function or its source: the native
    executable for this host, else rebuilt from the portable form (and stored for
    this host). NamedNotFound when the store holds neither."""
    keys.check_name(name)
    keys.check_version(version)
    context = Context.open()
    found = context.find(name, version)
    if found is None:
        raise NamedNotFound(context.not_found(name, version))
    return found


def load_many(named: Sequence[tuple[str, str]]) -> list[NamedExecutable]:
    """Several NAME@VERSIONs, as `load` gives each, fetched and deserialized in parallel
    (the backend deserializes several executables at once: issue 31), in the order
    asked. The first that is not found raises NamedNotFound, once all have ended."""
    for name, version in named:
        keys.check_name(name)
        keys.check_version(version)
    context = Context.open()  # the session and backend, on this thread

    def one(item: tuple[str, str]) -> NamedExecutable:
        own = Context(context.session, context.backend)  # its own reasons for a miss
        found = own.find(*item)
        if found is None:
            raise NamedNotFound(own.not_found(*item))
        return found

    if len(named) <= 1:
        return [one(item) for item in named]
    calls = [functools.partial(one, item) for item in named]
    return run_all("load named", calls, min(LOAD_THREADS, len(named)))


def _is_spec(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _static_positions(static_argnums: int | Sequence[int], count: int) -> frozenset[int]:
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    out = set()
    for n in nums:
        if not -count <= n < count:
            raise NamedBuildError(f"static_argnums {n} is out of range for {count} specs")
        out.add(n % count)
    return frozenset(out)


def _check_same_inputs(header: container.Header, wanted: Signature) -> None:
    stored = Signature(
        header.inputs.tree, tuple(Leaf(x.shape, x.dtype) for x in header.inputs.leaves)
    )
    if stored != wanted:
        raise NamedCallError(
            f"{header.name}@{header.version} in the store takes {stored.describe()}, but these "
            f"specs are {wanted.describe()}: give the new specs a new version"
        )


__all__ = ["ArtstoreError", "NamedExecutable", "compiled", "load", "load_many"]
