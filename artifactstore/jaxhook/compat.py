"""Every difference between the JAX releases we support, in one place.

Support is decided by what the installed JAX has
(functions, parameter names, attributes), never by its version string, so a
release we have not seen is used if its hooks fit and left alone, with the
missing internal named, if they do not.

What differs today:
- JAX <= 0.10: `cache_key.get(..., compression_algorithm, ignore_callbacks)`
  with the `IgnoreCallbacks` enum; host-callback programs are keyed with the
  callbacks' backend configs stripped (`IgnoreCallbacks.ALL`).
- JAX >= 0.11: `cache_key.get(..., compression_algorithm,
  ignore_custom_partitioning: bool)`; callbacks are referred to by index only,
  so their modules hash deterministically without stripping.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The parameters our wrapper of `compiler.compile_or_get_cached` passes on, in order.
COMPILE_PARAMS = (
    "backend",
    "computation",
    "devices",
    "compile_options",
    "host_callbacks",
    "executable_devices",
)


@dataclass(frozen=True)
class KeyInputs:
    """What one cache key is made of, whichever convention this JAX's `cache_key.get`
    follows: the module, its devices, compile options and backend, the key format, and
    whether custom-partitioning pointers and host callbacks are left out of it."""

    computation: Any
    devices: Any
    compile_options: Any
    backend: Any
    key_format: str
    drop_partitioning: bool
    host_callbacks: bool


# KeyInputs -> JAX's cache key with our hook's string in it.
KeyFn = Callable[[KeyInputs], str]


@dataclass(frozen=True)
class Hooks:
    """The JAX internals the adapter uses, bound to this JAX's calling convention."""

    compiler: Any
    cache_key: Any
    key: KeyFn
    style: str  # which convention `key` follows, for `artstore doctor`


@dataclass
class Probe:
    """The result of looking at the installed JAX: hooks, or what is missing."""

    jax_version: str
    jaxlib_version: str
    hooks: Hooks | None = None
    problems: list[str] = field(default_factory=list)


def _params(fn: Any) -> tuple[str, ...]:
    target = getattr(fn, "__wrapped_original__", fn)
    try:
        return tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return ()


def _key_fn(cache_key: Any) -> tuple[KeyFn, str] | str:
    """How to call `cache_key.get` on this JAX, or what does not fit."""
    get = getattr(cache_key, "get", None)
    if not callable(get):
        return "cache_key.get missing"
    if not hasattr(cache_key, "custom_hook"):
        return "cache_key.custom_hook missing"
    params = _params(get)
    if params[:5] != ("module", "devices", "compile_options", "backend", "compression_algorithm"):
        return f"cache_key.get{params}"
    extra = params[5:6]
    if extra == ("ignore_callbacks",):
        ignore = getattr(cache_key, "IgnoreCallbacks", None)
        if ignore is None or not all(hasattr(ignore, n) for n in ("NO", "ALL")):
            return "cache_key.IgnoreCallbacks missing"

        def enum_key(k: KeyInputs) -> str:
            mode = ignore.NO
            if k.host_callbacks:
                mode = ignore.ALL
            elif k.drop_partitioning:
                mode = ignore.CUSTOM_PARTITIONING
            return str(get(*_module_and_target(k), k.key_format, mode))

        return enum_key, "ignore_callbacks enum (JAX <= 0.10)"
    if extra == ("ignore_custom_partitioning",):

        def bool_key(k: KeyInputs) -> str:
            return str(get(*_module_and_target(k), k.key_format, k.drop_partitioning))

        return bool_key, "ignore_custom_partitioning flag (JAX >= 0.11)"
    if not extra:

        def plain_key(k: KeyInputs) -> str:
            return str(get(*_module_and_target(k), k.key_format))

        return plain_key, "no callback options"
    return f"cache_key.get{params}"


def _module_and_target(k: KeyInputs) -> tuple[Any, Any, Any, Any]:
    """The first four arguments of every convention of `cache_key.get`."""
    return k.computation, k.devices, k.compile_options, k.backend


def probe() -> Probe:
    """Look at the installed JAX without changing anything."""
    try:
        import jax
        import jaxlib
    except ImportError as exc:
        return Probe("not installed", "not installed", problems=[f"import jax: {exc}"])
    result = Probe(jax.__version__, str(getattr(jaxlib, "__version__", "unknown")))
    try:
        from jax._src import cache_key, compiler
    except ImportError as exc:
        result.problems.append(f"jax._src compiler hooks: {exc}")
        return result
    fn = getattr(compiler, "compile_or_get_cached", None)
    if fn is None or not callable(getattr(compiler, "backend_compile_and_load", None)):
        result.problems.append("compiler.compile_or_get_cached/backend_compile_and_load missing")
    else:
        params = _params(fn)
        if params[: len(COMPILE_PARAMS)] != COMPILE_PARAMS:
            result.problems.append(f"compiler.compile_or_get_cached{params}")
    key = _key_fn(cache_key)
    if isinstance(key, str):
        result.problems.append(key)
    if not result.problems:
        assert not isinstance(key, str)
        result.hooks = Hooks(compiler, cache_key, key[0], key[1])
    return result


def drop_partitioning_pointers() -> bool:
    """JAX was told that custom-partitioning pointers may be left out of cache keys."""
    from jax._src import config as jax_config

    flag = getattr(jax_config, "remove_custom_partitioning_ptr_from_cache_key", None)
    return bool(flag is not None and flag.value)


def expects_pgle() -> bool:
    try:
        from jax._src import config as jax_config

        return bool(jax_config.compilation_cache_expect_pgle.value)
    except Exception:
        return False


def backend(name: str | None = None) -> Any:
    """JAX's client for the default (or named) platform: it compiles, and deserializes
    stored executables, which JAX's public API does not offer."""
    from jax._src import xla_bridge

    return xla_bridge.get_backend(name)


def device_list(devices: tuple[Any, ...]) -> Any:
    """The device list a client's `deserialize_executable` takes, for `devices`."""
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    return xc.DeviceList(devices)


def initialized_backend() -> Any:
    """JAX's default backend if the program has initialized its backends, else None:
    never initializes one (the program may still choose its platforms or x64)."""
    from jax._src import xla_bridge

    if not getattr(xla_bridge, "_backends", None):
        return None
    return xla_bridge.get_backend()


def serialize_options(options: Any) -> bytes:
    """A compile request's options as bytes: what a deserialize needs, and what tells two
    requests with one cache key apart (`parse_options` reads them back)."""
    return bytes(options.SerializeAsString())


def parse_options(data: bytes) -> Any:
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    return xc.CompileOptions.ParseFromString(data)


def new_options() -> Any:
    """Compile options with this process's defaults (no debug options, no overrides)."""
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    return xc.CompileOptions()
