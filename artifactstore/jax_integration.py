"""The JAX adapter: the only module that touches JAX's private compilation hooks.

`configure()` replaces `jax._src.compiler.compile_or_get_cached` with a wrapper
that looks the compile up in the store first and stores what it compiled, and
adds the platform fingerprint to JAX's cache key through `cache_key.custom_hook`.
If this JAX's internals do not look as expected (`_jax_compat` decides, and holds
every difference between JAX releases), it warns once and leaves JAX untouched:
the program runs, it just compiles. Programs with host callbacks are stored too
(JAX's own cache skips them before 0.11): keyed with their signature
(`_jax_callbacks`), loaded with this trace's callbacks.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from artifactstore import _jax_compat as _compat
from artifactstore import config as _config
from artifactstore import fingerprint as _fp
from artifactstore._jax_callbacks import NotStorable as _NotStorable
from artifactstore._jax_callbacks import callback_signature as _callback_signature
from artifactstore.background import call_with_timeout
from artifactstore.errors import ArtstoreError, one_line

if TYPE_CHECKING:
    from artifactstore.quota_pass import QuotaPass
    from artifactstore.store import Store
    from artifactstore.tier import LocalTier

log = logging.getLogger("artifactstore")

# Hashed into every key as JAX's "compression algorithm": it names our payload
# format, so our keys never collide with JAX's own cache's.
KEY_FORMAT = "artifactstore-v1"

# A process still running this long after its first local-tier hit opens the
# index in the background to record its hits (LRU must see them).
FOLD_AFTER_SECS = 30.0

_lock = threading.RLock()
_state: _State | None = None
_hooks: _compat.Hooks | None = None
_original: Any = None
_previous_hook: Any = None
_local = threading.local()
_warned: set[str] = set()


def _warn_once(topic: str, message: str, *args: object) -> None:
    if topic not in _warned:
        _warned.add(topic)
        log.warning("artifactstore: " + message, *args)


# -- compatibility ----------------------------------------------------------
def _jax_internals() -> _compat.Hooks | None:
    """This JAX's hooks, or None after one warning naming what does not fit."""
    probe = _compat.probe()
    if probe.hooks is None:
        _warn_once(
            "compat",
            "JAX %s internals do not match what this artifactstore supports (%s); "
            "JAX left untouched, compiling as usual",
            probe.jax_version,
            "; ".join(probe.problems),
        )
    return probe.hooks


# -- per-process state ------------------------------------------------------
@dataclass
class _Prepared:
    key: str
    module_name: str
    fingerprint: _fp.Fingerprint
    callbacks: int


class _State:
    """The configured store, opened lazily on the first compile."""

    def __init__(self, settings: _config.Settings) -> None:
        self.settings = settings
        self._store: Store | None = None
        self._failed = False
        self._open_lock = threading.Lock()
        self._fingerprints: dict[tuple[int, str, int], _fp.Fingerprint] = {}
        self.loads = 0
        self.compiles = 0
        self.tier_hits = 0
        self.tier: LocalTier | None = None
        try:
            from artifactstore.tier import open_tier

            self.tier = open_tier(settings)
        except Exception as exc:
            log.debug("artifactstore: no local tier: %s", one_line(exc))
        self._fold_timer: threading.Timer | None = None
        self.quota: QuotaPass | None = None

    def tier_hit(self) -> None:
        """Count a tier hit; a process that lives on opens the index later to record it."""
        self.tier_hits += 1
        if self._fold_timer is None and self._store is None:
            # Short programs leave their hits in a journal at exit; long ones
            # (training, serving) report them while running, off the hot path.
            self._fold_timer = threading.Timer(FOLD_AFTER_SECS, self._fold)
            self._fold_timer.daemon = True
            self._fold_timer.start()

    def _fold(self) -> None:
        store = self.store()
        if store is not None and self.tier is not None:
            store.add_accesses(self.tier.take_accesses())

    def finish(self) -> None:
        """At exit: hand tier hits to the index if it is open, else to a journal."""
        if self._fold_timer is not None:
            self._fold_timer.cancel()
        store = self._store
        if store is not None:
            if self.tier is not None:
                store.add_accesses(self.tier.take_accesses())
            if self.quota is not None:
                store.worker.submit("quota pass", self.quota.finish)
            store.flush()
        elif self.tier is not None:
            try:
                self.tier.write_journal()
            except Exception as exc:
                log.debug("artifactstore: could not write the access journal: %s", exc)

    def store(self) -> Store | None:
        if self._store is not None or self._failed:
            return self._store
        with self._open_lock:
            if self._store is None and not self._failed:
                try:
                    from artifactstore.store import Store

                    self._store = call_with_timeout(
                        lambda: Store.open(self.settings), self.settings.timeout_secs
                    )
                    log.debug("artifactstore: using %s", self._store.describe())
                    if self.settings.enforce_quota and not self.settings.read_only:
                        from artifactstore.quota_pass import QuotaPass

                        self.quota = QuotaPass.attach(self._store)
                    _flush_before_thread_shutdown()
                except Exception as exc:
                    self.fail(exc)
        return self._store

    def fail(self, exc: BaseException) -> None:
        self._failed = True
        _warn_once(
            "unavailable",
            "store unavailable (%s); compiling without it in this process",
            _describe_failure(exc),
        )

    @property
    def active(self) -> bool:
        return not self._failed

    def fingerprint(self, backend: Any, devices: Any) -> _fp.Fingerprint:
        first = devices.flat[0] if hasattr(devices, "flat") else next(iter(devices))
        ident = (id(backend), str(first.device_kind), int(backend.device_count()))
        fp = self._fingerprints.get(ident)
        if fp is None:
            fp = self._fingerprints[ident] = _backend_fingerprint(backend, first.device_kind)
        return fp


def _backend_fingerprint(backend: Any, device_kind: str) -> _fp.Fingerprint:
    import jax
    import jaxlib

    return _fp.compute(
        platform_name=str(backend.platform),
        platform_version=str(backend.platform_version),
        device_kind=str(device_kind),
        device_count=int(backend.device_count()),
        jax_version=jax.__version__,
        jaxlib_version=str(getattr(jaxlib, "__version__", "unknown")),
    )


def _describe_failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within the {_state.settings.timeout_secs if _state else '?'} s bound"
    if isinstance(exc, ArtstoreError):
        return str(exc)
    return one_line(exc)


# -- the key hook -----------------------------------------------------------
def _key_hook() -> str:
    """Added to every JAX cache key: our fingerprint when we compute the key,
    the host CPU features otherwise (so JAX's own cache gains them too)."""
    previous = _previous_hook() if _previous_hook is not None else ""
    ours = getattr(_local, "fingerprint", None) or _fp.host_cpu_digest()
    return f"{previous}|artifactstore:{ours}" if previous else f"artifactstore:{ours}"


# -- the compile wrapper ----------------------------------------------------
def _compile_or_get_cached(
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
    state = _state
    passthrough = (
        state is None
        or not state.active
        or pgle_profiler is not None
        or args
        or kwargs
        or (bool(host_callbacks) and not state.settings.cache_callbacks)  # JAX's behaviour
        or _compat.expects_pgle()
    )
    if passthrough:
        return _original(
            backend, computation, devices, compile_options, host_callbacks,
            executable_devices, pgle_profiler, *args, **kwargs,
        )  # fmt: skip
    assert state is not None
    from jax._src import compiler

    try:
        prepared = _prepare(state, backend, computation, devices, compile_options, host_callbacks)
    except _NotStorable as exc:
        log.debug("artifactstore: compiling without the store: %s", exc)
        prepared = None
    except Exception as exc:
        _warn_once("key", "could not compute a cache key (%s); compiling", one_line(exc))
        prepared = None
    if prepared is not None and state.tier is not None:
        executable = _load_from_tier(state, prepared, backend, executable_devices,
                                     compile_options, host_callbacks)  # fmt: skip
        if executable is not None:
            return executable
    store = state.store() if prepared is not None else None
    if prepared is None or store is None:
        return _original(
            backend, computation, devices, compile_options, host_callbacks,
            executable_devices, pgle_profiler,
        )  # fmt: skip

    _record_event("/jax/compilation_cache/compile_requests_use_cache")
    started = time.monotonic()
    hit = None
    try:
        hit = call_with_timeout(
            lambda: store.get(prepared.key, prepared.fingerprint.digest),
            state.settings.timeout_secs,
        )
    except Exception as exc:
        state.fail(exc)
    if hit is not None:
        try:
            executable = _deserialize(backend, hit.payload, executable_devices, compile_options,
                                      host_callbacks, prepared.callbacks)  # fmt: skip
        except Exception as exc:
            store.counters.add("load_errors")
            _warn_once("load", "stored executable did not load (%s); compiling", one_line(exc))
        else:
            _record_load(state, hit.entry.compile_secs, started)
            return executable

    started = time.monotonic()
    executable = compiler.backend_compile_and_load(
        backend, computation, executable_devices, compile_options, host_callbacks
    )
    compile_secs = time.monotonic() - started
    state.compiles += 1
    _record_event("/jax/compilation_cache/cache_misses")
    if state.settings.read_only:
        store.counters.add("skipped_read_only")
    elif compile_secs >= state.settings.min_compile_secs:
        try:
            payload = executable.serialize()
            store.submit_put(
                prepared.key,
                payload,
                fingerprint=prepared.fingerprint,
                module_name=prepared.module_name,
                compile_secs=compile_secs,
            )
        except Exception as exc:
            _warn_once("serialize", "could not serialize %s (%s); not stored",
                       prepared.module_name, one_line(exc))  # fmt: skip
    return executable


def _load_from_tier(
    state: _State, prepared: _Prepared, backend: Any, executable_devices: Any,
    compile_options: Any, host_callbacks: Any,
) -> Any:  # fmt: skip
    """The executable from this host's tier, or None (then the full store is asked)."""
    assert state.tier is not None
    started = time.monotonic()
    try:
        hit = state.tier.get(prepared.key, prepared.fingerprint.digest)
    except Exception as exc:
        log.debug("artifactstore: local tier read failed: %s", one_line(exc))
        return None
    if hit is None:
        return None
    try:
        executable = _deserialize(backend, hit.payload, executable_devices, compile_options,
                                  host_callbacks, prepared.callbacks)  # fmt: skip
    except Exception as exc:
        log.debug("artifactstore: tier copy of %s did not load: %s", prepared.key[:12], exc)
        state.tier.forget(prepared.key)
        return None
    state.tier_hit()
    _record_event("/jax/compilation_cache/compile_requests_use_cache")
    _record_load(state, hit.entry.compile_secs, started)
    return executable


def _record_load(state: _State, compile_secs: float, started: float) -> None:
    """Count a load and report it through JAX's own cache events, as its cache would."""
    state.loads += 1
    retrieval = time.monotonic() - started
    _record_event("/jax/compilation_cache/cache_hits")
    _record_duration("/jax/compilation_cache/compile_time_saved_sec", compile_secs - retrieval)
    _record_duration("/jax/compilation_cache/cache_retrieval_time_sec", retrieval)


def _prepare(
    state: _State, backend: Any, computation: Any, devices: Any, compile_options: Any,
    host_callbacks: Any,
) -> _Prepared | None:  # fmt: skip
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    hooks = _hooks
    if hooks is None or not getattr(backend, "supports_executable_serialization", True):
        return None
    fingerprint = state.fingerprint(backend, devices)
    drop_partitioning = _compat.drop_partitioning_pointers()
    extra = ""
    if host_callbacks:
        try:
            extra = _callback_signature(computation, len(host_callbacks), drop_partitioning)
        except _NotStorable:
            raise
        except Exception as exc:  # a JAX/MLIR change: never break the program
            _warn_once("callbacks", "could not read a program's host callbacks (%s); "
                       "compiling such programs without the store", one_line(exc))  # fmt: skip
            raise _NotStorable("host callbacks unreadable") from exc
    _local.fingerprint = fingerprint.digest + (f"|callbacks:{extra}" if extra else "")
    try:
        full = hooks.key(computation, devices, compile_options, backend, KEY_FORMAT,
                         drop_partitioning, bool(host_callbacks))  # fmt: skip
    finally:
        _local.fingerprint = None
    module_name, _, digest = full.rpartition("-")
    if not module_name:
        module_name = ir.StringAttr(computation.operation.attributes["sym_name"]).value
    return _Prepared(digest, module_name, fingerprint, len(host_callbacks or ()))


def _deserialize(
    backend: Any, payload: bytes, executable_devices: Any, compile_options: Any,
    host_callbacks: Any, expected_callbacks: int,
) -> Any:  # fmt: skip
    if len(host_callbacks or ()) != expected_callbacks:
        # jaxlib binds any list; too few callbacks crash on execute, not on load.
        raise ValueError(f"{len(host_callbacks or ())} host callbacks, entry expects "
                         f"{expected_callbacks}")  # fmt: skip
    if host_callbacks:
        return backend.deserialize_executable(
            payload, executable_devices, compile_options, host_callbacks=list(host_callbacks)
        )
    return backend.deserialize_executable(payload, executable_devices, compile_options)


def _record_event(name: str) -> None:
    try:
        from jax._src import monitoring

        monitoring.record_event(name)
    except Exception:
        pass


def _record_duration(name: str, secs: float) -> None:
    try:
        from jax._src import monitoring

        monitoring.record_event_duration_secs(name, max(secs, 0.0))
    except Exception:
        pass


# -- public API -------------------------------------------------------------
def configure(
    url: str | None = None,
    *,
    index: str | None = None,
    namespace: str | None = None,
    read_only: bool | None = None,
    **options: Any,
) -> _config.Settings | None:
    """Route every JAX compile in this process through the store.

    Arguments override `ARTSTORE_*` environment variables, which override the
    embedded default (a directory and SQLite index under the user's cache
    directory). Returns the settings in force, or None if JAX could not be
    hooked (the program then compiles as usual). Raises ConfigError at once for
    a malformed URL or unknown option.
    """
    global _state
    given = {"url": url, "index": index, "namespace": namespace, "read_only": read_only}
    explicit = any(v is not None for v in given.values()) or bool(options)
    try:
        settings = _config.resolve({**given, **options})
    except ArtstoreError as exc:
        if explicit:
            raise  # a mistake in the program's own call: say so at once
        # A bad ARTSTORE_* variable on some node must not stop the program.
        _warn_once("config", "%s; compiling without the store", exc)
        return None
    internals = _jax_internals()
    if internals is None:
        return None
    with _lock:
        _install(internals)
        old, _state = _state, _State(settings)
        new = _state
    if old is not None:
        _shutdown_state(old)
    # Open the store (imports, connection, schema check) while the program goes
    # on importing and tracing, instead of on its first compile, unless this
    # host's tier probably holds what it needs: then the index is opened only
    # on a miss, and a fully warm process never imports SQLAlchemy or boto3.
    if new.tier is None or not new.tier.has_entries():
        threading.Thread(target=new.store, name="artifactstore-open", daemon=True).start()
    return settings


def _install(hooks: _compat.Hooks) -> None:
    global _hooks, _original, _previous_hook
    compiler, cache_key = hooks.compiler, hooks.cache_key
    _hooks = hooks
    if _original is None:
        _original = compiler.compile_or_get_cached
        _compile_or_get_cached.__wrapped_original__ = _original  # type: ignore[attr-defined]
        compiler.compile_or_get_cached = _compile_or_get_cached
        _previous_hook = cache_key.custom_hook
        cache_key.custom_hook = _key_hook
        atexit.register(_at_exit)


def deactivate() -> None:
    """Stop using the store and restore JAX's own functions."""
    global _state, _original, _previous_hook
    with _lock:
        old, _state = _state, None
        if _original is not None:
            from jax._src import cache_key, compiler

            compiler.compile_or_get_cached = _original
            cache_key.custom_hook = _previous_hook
            _original = None
            _previous_hook = None
    if old is not None:
        _shutdown_state(old)


def _shutdown_state(state: _State) -> None:
    state.finish()
    if state._store is not None:
        state._store.close()


def _flush_before_thread_shutdown() -> None:
    """Run the exit flush before concurrent.futures stops taking work.

    boto3's transfer manager uploads on a thread pool, and at interpreter exit
    concurrent.futures refuses new work *before* atexit handlers run: a put
    flushed from atexit fails with "cannot schedule new futures after
    interpreter shutdown". threading's own exit hooks run earlier, newest
    first, so registering after the store (and boto3) is open puts ours ahead.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(_at_exit)
    except RuntimeError:  # already shutting down: atexit still flushes
        pass


def _at_exit() -> None:
    state = _state
    if state is not None:
        state.finish()


def active_store() -> Store | None:
    """The store this process uses (opening it if needed), or None."""
    state = _state
    return state.store() if state is not None else None


def flush(timeout: float | None = None) -> bool:
    """Wait for queued uploads (bounded); True if all finished."""
    store = _state._store if _state is not None else None
    return store.flush(timeout) if store is not None else True


def process_stats() -> dict[str, int]:
    """This process's counters: hits, misses, stored, corrupt, loads, compiles, ..."""
    state = _state
    if state is None:
        return {}
    out = dict(state._store.counters.snapshot()) if state._store is not None else {}
    if state.tier_hits:
        out["hits"] = out.get("hits", 0) + state.tier_hits
        out["tier_hits"] = state.tier_hits
    out["loads"] = state.loads
    out["compiles"] = state.compiles
    out["active"] = int(state.active)
    return out


def host_fingerprint(backend_name: str | None = None) -> _fp.Fingerprint:
    """This host's fingerprint for the default (or named) JAX backend."""
    from jax._src import xla_bridge

    backend = xla_bridge.get_backend(backend_name)
    return _backend_fingerprint(backend, backend.devices()[0].device_kind)
