"""The compile wrapper: every JAX compile asks the lookup chain, then XLA.

`install()` replaces `jax._src.compiler.compile_or_get_cached` with
`compile_or_get_cached` below and adds our platform fingerprint to JAX's cache
key through `cache_key.custom_hook`. How to call this JAX's internals is
decided in `compat`; host-callback signatures in `callbacks`. The per-process
state (tier, Store, counters, exit) is a `Session`, which knows nothing of JAX.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from artifactstore.config import host as _host
from artifactstore.errors import one_line
from artifactstore.formats import fingerprint as _fp
from artifactstore.formats.put import Put
from artifactstore.jaxhook import compat, prefetch
from artifactstore.jaxhook.callbacks import NotStorable, callback_signature
from artifactstore.jaxhook.events import USE_CACHE, record_event, record_load
from artifactstore.jaxhook.platform import backend_fingerprint
from artifactstore.runtime import process
from artifactstore.runtime.session import Session, warn_once
from artifactstore.store.chain import Request

if TYPE_CHECKING:
    from artifactstore.store import Store
    from artifactstore.store.flight import Held

log = logging.getLogger("artifactstore")

STORE = ("store",)  # a lease waiter asks the store alone (its holder just published)

# Hashed into every key as JAX's "compression algorithm": it names our payload
# format, so our keys never collide with JAX's own cache's.
KEY_FORMAT = "artifactstore-v1"

_hooks: compat.Hooks | None = None
_original: Any = None  # JAX's compile_or_get_cached
_previous_hook: Any = None  # JAX's custom_hook before ours
_local = threading.local()  # the fingerprint our key hook adds while we compute a key


def install(hooks: compat.Hooks) -> None:
    """Route compiles through the process's session (runtime.process), whichever it is."""
    global _hooks, _original, _previous_hook
    _hooks = hooks
    if _original is None:
        _original = hooks.compiler.compile_or_get_cached
        compile_or_get_cached.__wrapped_original__ = _original  # type: ignore[attr-defined]
        hooks.compiler.compile_or_get_cached = compile_or_get_cached
        _previous_hook = hooks.cache_key.custom_hook
        hooks.cache_key.custom_hook = key_hook


def ensure_installed(hooks: compat.Hooks) -> None:
    """Our wrapper in place (for `fresh_compiles`), with whatever session is in use."""
    if _original is None:
        install(hooks)


@contextmanager
def fresh_compiles() -> Iterator[list[tuple[_Compile, Any, float]]]:
    """Compiles in this thread go straight to XLA, past every cache, ours and JAX's.

    Named executables store the bytes they serialize, and on some jaxlibs an
    executable that was itself loaded from serialized bytes serializes into bytes
    that no longer load: so what they store is always a fresh compile's. Yields
    the (request, executable, seconds) of each compile made inside.
    """
    previous = getattr(_local, "fresh", None)
    made: list[tuple[_Compile, Any, float]] = []
    _local.fresh = made
    try:
        yield made
    finally:
        _local.fresh = previous


@contextmanager
def provided(executable: Any) -> Iterator[None]:
    """Compiles in this thread return `executable` (a loaded named executable), so that
    JAX wraps it as it wraps its own compiles: a `Compiled` with jit's C++ call path
    (artifactstore.named.call). Nothing is compiled, looked up or stored."""
    previous = getattr(_local, "provided", None)
    _local.provided = executable
    try:
        yield
    finally:
        _local.provided = previous


def uninstall() -> None:
    """Give JAX its own functions back."""
    global _original, _previous_hook
    if _original is not None and _hooks is not None:
        _hooks.compiler.compile_or_get_cached = _original
        _hooks.cache_key.custom_hook = _previous_hook
        _original = _previous_hook = None


def current() -> Session | None:
    """The process's session (shared with torch-xla's adapter: runtime.process)."""
    return process.current()


def key_hook() -> str:
    """Added to every JAX cache key: our fingerprint when we compute the key,
    the host CPU features otherwise (so JAX's own cache gains them too)."""
    previous = _previous_hook() if _previous_hook is not None else ""
    ours = getattr(_local, "fingerprint", None) or _host.host_cpu_digest()
    return f"{previous}|artifactstore:{ours}" if previous else f"artifactstore:{ours}"


@dataclass
class _Compile:
    """One compile request, with our key once computed."""

    backend: Any
    computation: Any
    devices: Any
    options: Any
    callbacks: Any
    executable_devices: Any
    key: str = ""
    module_name: str = ""
    fingerprint: _fp.Fingerprint | None = None
    wire: Any = None  # (serialized options, device ids): see prefetch.wire
    _asked: Request | None = None

    @property
    def asked(self) -> Request:
        """What the lookup chain is asked for (once the key is computed); it remembers
        the store it asked, for the put after a miss."""
        if self._asked is None:
            digest = self.fingerprint.digest if self.fingerprint is not None else ""
            self._asked = Request(self.key, digest, self.callback_count, caller=self)
        return self._asked

    @property
    def callback_count(self) -> int:
        """The host callbacks this trace binds on load: stored with the executable and
        compared with what a stored one expects before it is deserialized (too few
        crash natively on execute; the key alone cannot be checked against an entry)."""
        return len(self.callbacks) if self.callbacks else 0

    def load(self, payload: bytes) -> Any:
        if self.callbacks:
            return self.backend.deserialize_executable(
                payload, self.executable_devices, self.options, host_callbacks=list(self.callbacks)
            )
        return self.backend.deserialize_executable(payload, self.executable_devices, self.options)

    def compile(self) -> tuple[Any, float]:
        started = time.monotonic()
        executable = _hooks.compiler.backend_compile_and_load(  # type: ignore[union-attr]
            self.backend, self.computation, self.executable_devices, self.options, self.callbacks
        )
        return executable, time.monotonic() - started


def compile_or_get_cached(
    backend: Any,
    computation: Any,
    devices: Any,
    compile_options: Any,
    host_callbacks: Any,
    executable_devices: Any,
    pgle_profiler: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    session = process.current()
    request = _Compile(
        backend, computation, devices, compile_options, host_callbacks, executable_devices
    )
    given = getattr(_local, "provided", None)
    if given is not None:  # a named executable's call path: see provided
        return given
    fresh = getattr(_local, "fresh", None)
    if fresh is not None:  # a named executable's build: see fresh_compiles
        executable, secs = request.compile()
        fresh.append((request, executable, secs))
        return executable

    def as_jax_would() -> Any:  # JAX's own path, its own cache included
        return _original(
            backend,
            computation,
            devices,
            compile_options,
            host_callbacks,
            executable_devices,
            pgle_profiler,
            *args,
            **kwargs,
        )

    # A failed store (its breaker open) does not bypass the tier: it is local disk.
    if (
        session is None
        or pgle_profiler is not None
        or args
        or kwargs
        or (bool(host_callbacks) and not session.settings.cache_callbacks)  # JAX's behaviour
        or compat.expects_pgle()
        or not _keyed(session, request)
    ):
        return as_jax_would()
    assert session is not None
    # One chain: loaded ahead, this host's tier, quick keys, then the store.
    record_event(USE_CACHE)  # as JAX's cache, for every compile it has a key for
    executable = _lookup(session, request)
    if executable is not None:
        return executable
    store = request.asked.store
    if store is None and not session.active and not session.can_keep_locally():
        return as_jax_would()
    if store is not None and not session.active:  # that lookup just failed: no upload behind it
        store = None
    return _compile_and_store(session, store, request)


def _keyed(session: Session, request: _Compile) -> bool:
    """Compute our key into `request`; False when this compile cannot use the store."""
    try:
        _prepare(session, request)
    except NotStorable as exc:
        log.debug("artifactstore: compiling without the store: %s", exc)
        return False
    except Exception as exc:
        warn_once("key", "could not compute a cache key (%s); compiling", one_line(exc))
        return False
    return bool(request.key)


def _lookup(session: Session, request: _Compile, names: tuple[str, ...] | None = None) -> Any:
    """The executable from the session's lookup chain (store.chain), loaded and counted
    there, or None; a load is reported through JAX's events as its cache would. A compile
    this host kept below the store threshold is not part of the working set (a team's)."""
    found = session.chain.get(request.asked, request.load, names=names)
    if found is None:
        return None
    record_load(session, found.compile_secs, found.started)
    if not found.below_threshold:
        prefetch.note(session, request)
    return found.value


def _compile_and_store(session: Session, store: Store | None, request: _Compile) -> Any:
    """Compile with XLA (or wait for the process that does: see singleflight); queue the
    result for upload, or remember it was too quick to store."""
    held: Held | None = None
    if store is not None and store.flight is not None:
        loaded, held = store.flight.turn(request.key, lambda: _lookup(session, request, STORE))
        if loaded is not None:
            return loaded
    handed_off = False
    try:
        executable, handed_off = _compile_then_store(session, store, request, held)
    finally:
        if held is not None and not handed_off:
            held.release(stored=False)  # waiters compile at once
    return executable


def _compile_then_store(
    session: Session, store: Store | None, request: _Compile, held: Held | None
) -> tuple[Any, bool]:
    """The executable, and whether its upload now releases `held` once it ends."""
    executable, compile_secs = request.compile()
    settings = session.settings
    quick = compile_secs < settings.min_compile_secs  # never stored, so not a miss
    session.observe_compile(compile_secs, quick=quick)
    if quick:
        if session.tier is not None:
            session.tier.quick.remember(request.key, compile_secs)
        # Never stored, so its miss (if it looked up) is not an eligible one.
        fp = request.fingerprint.digest if request.fingerprint is not None else ""
        session.compiled_below_threshold(store, request.key, fp, compile_secs)
        session.keep_below_threshold(lambda: _put(request, executable, compile_secs))
        return executable, False
    if session.tier is not None:
        session.tier.quick.forget(request.key)  # quick once, stored now
    if store is None:
        store = session.store()  # known quick before, slow now: store it after all
    if store is None and not session.can_keep_locally():
        return executable, False
    if store is not None and settings.read_only:
        store.parts.counters.add("skipped_read_only")
        return executable, False
    try:
        put = _put(request, executable, compile_secs)
        if store is None:  # the store is down: this host's tier keeps it
            session.keep_locally(put)
            prefetch.note(session, request)
            return executable, False
        then = (lambda published: held.release(stored=published)) if held else None
        store.submit(put, then=then)
        prefetch.note(session, request)
        return executable, held is not None
    except Exception as exc:
        warn_once(
            "serialize",
            "could not serialize %s (%s); not stored",
            request.module_name,
            one_line(exc),
        )
    return executable, False


def _put(request: _Compile, executable: Any, compile_secs: float) -> Put:
    """What `executable`, compiled for `request` in `compile_secs`, is kept as."""
    assert request.fingerprint is not None
    return Put(
        request.key,
        executable.serialize(),
        request.fingerprint,
        request.module_name,
        compile_secs,
        request.callback_count,
    )


def _prepare(session: Session, request: _Compile) -> None:
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    hooks = _hooks
    backend = request.backend
    if hooks is None or not getattr(backend, "supports_executable_serialization", True):
        return
    fingerprint = backend_fingerprint(backend, request.devices)
    drop_partitioning = compat.drop_partitioning_pointers()
    extra = ""
    if request.callbacks:
        try:
            extra = callback_signature(
                request.computation, len(request.callbacks), drop_partitioning
            )
        except NotStorable:
            raise
        except Exception as exc:  # a JAX/MLIR change: never break the program
            warn_once(
                "callbacks",
                "could not read a program's host callbacks (%s); "
                "compiling such programs without the store",
                one_line(exc),
            )
            raise NotStorable("host callbacks unreadable") from exc
    _local.fingerprint = fingerprint.digest + (f"|callbacks:{extra}" if extra else "")
    try:
        full = hooks.key(
            compat.KeyInputs(
                request.computation,
                request.devices,
                request.options,
                backend,
                KEY_FORMAT,
                drop_partitioning,
                bool(request.callbacks),
            )
        )
    finally:
        _local.fingerprint = None
    module_name, _, digest = full.rpartition("-")
    if not module_name:
        module_name = ir.StringAttr(request.computation.operation.attributes["sym_name"]).value
    request.key, request.module_name, request.fingerprint = digest, module_name, fingerprint
