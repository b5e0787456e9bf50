"""The public entry points: `configure()` and friends, re-exported by `artifactstore`."""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING, Any

from artifactstore import config as _config
from artifactstore.errors import ArtstoreError
from artifactstore.formats import fingerprint as _fp
from artifactstore.jaxhook import compat, events, prefetch
from artifactstore.jaxhook import compile as _compile
from artifactstore.jaxhook.platform import backend_fingerprint
from artifactstore.process.background import executor
from artifactstore.runtime import process
from artifactstore.runtime.session import Session, warn_once

if TYPE_CHECKING:
    from artifactstore.store import Store

_lock = threading.RLock()
_exit_hook_registered = False
_configuring = 0  # explicit configure() calls in progress (they import JAX)
USER = "jax"  # this adapter, among the users of the process's session (runtime.process)


def jax_hooks() -> compat.Hooks | None:
    """This JAX's hooks, or None after one warning naming what does not fit."""
    probe = compat.probe()
    if probe.hooks is None:
        warn_once(
            "compat",
            "JAX %s internals do not match what this artifactstore supports (%s); "
            "JAX left untouched, compiling as usual",
            probe.jax_version,
            "; ".join(probe.problems),
        )
    return probe.hooks


def configure(
    url: str | None = None,
    *,
    index: str | None = None,
    namespace: str | None = None,
    read_only: bool | None = None,
    **options: Any,
) -> _config.Settings | None:
    """Route every JAX compile in this process through the store.

    Arguments (the keywords of `artifactstore.config.table`, one per `ARTSTORE_*`
    setting) override those variables, which override the embedded default (a
    directory and SQLite index under the user's cache directory). Returns the
    settings in force, or None if JAX could not be hooked (the program then
    compiles as usual). Raises ConfigError at once for a malformed URL or unknown
    option.
    """
    global _configuring
    _warn_typos()
    given = {"url": url, "index": index, "namespace": namespace, "read_only": read_only}
    explicit = any(v is not None for v in given.values()) or bool(options)
    with _lock:
        _configuring += 1  # JAX imported from here on does not activate from the environment
    try:
        try:
            settings = _config.resolve({**given, **options})
        except ArtstoreError as exc:
            if explicit:
                raise  # a mistake in the program's own call: say so at once
            # A bad ARTSTORE_* variable on some node must not stop the program.
            warn_once("config", "%s; compiling without the store", exc)
            return None
        return _install(settings, open_now=True, implicit=False)
    finally:
        with _lock:
            _configuring -= 1


def configure_from_environment() -> _config.Settings | None:
    """What `configure()` would do, unless the program configures (or did) itself.

    For activation without code (`artifactstore.jaxhook.environment`), once JAX is
    imported. The store opens on the first compile rather than now: a program that
    calls `configure()` after importing JAX replaces this session before it costs a
    connection.
    """
    with _lock:
        if _configuring or process.used_by(USER):
            return None
    _warn_typos()
    try:
        settings = _config.resolve({})
    except ArtstoreError as exc:
        warn_once("config", "%s; compiling without the store", exc)
        return None
    return _install(settings, open_now=False, implicit=True)


def _warn_typos() -> None:
    """One log line per mistyped `ARTSTORE_*` variable, once per process, naming the
    nearest real one: ignored silently, a misspelt READ_ONLY would leave it a writer."""
    for line in _config.typo_lines():
        warn_once("variable " + line.split(" ", 1)[0], "%s", line)


def _install(
    settings: _config.Settings, *, open_now: bool, implicit: bool
) -> _config.Settings | None:
    global _exit_hook_registered
    hooks = jax_hooks()
    if hooks is None:
        return None
    with _lock:
        if implicit and process.used_by(USER):
            return None  # the program configured itself meanwhile: it wins
        # The process's one session: torch-xla's adapter's, where it made one with these
        # settings (both from the environment); else a new one, which torch-xla's follows.
        joined = process.use(USER, settings, move=_follow)
        _compile.install(hooks)
        if not _exit_hook_registered:
            _exit_hook_registered = True
            atexit.register(_at_exit)
    if joined.replaced is not None:
        joined.replaced.close()
    session = joined.session
    _follow(session)
    # Open the store (imports, connection, schema check) while the program goes
    # on importing and tracing, instead of on its first compile, unless this
    # host's tier probably holds what it needs: then the index is opened only
    # on a miss, and a fully warm process never imports SQLAlchemy or boto3.
    if open_now and (session.tier is None or not session.tier.has_entries()):
        executor().submit(session.store, "open the store")
    return settings


def _follow(session: Session) -> None:
    """What JAX's adapter does with the process's session, new or moved to: JAX's cache
    events for what it writes; its working set, loaded while the program imports and traces."""
    events.watch(session)
    prefetch.start(session)


def deactivate() -> None:
    """Stop using the store and restore JAX's own functions."""
    with _lock:
        _compile.uninstall()
        old = process.leave(USER)
    if old is not None:  # closed unless torch-xla's adapter still uses it
        old.close()


def _at_exit() -> None:
    finish()


def finish() -> None:
    """Flush uploads (bounded) and record accesses, as at exit; once per session."""
    session = _compile.current()
    if session is not None:
        session.finish()


def active_store() -> Store | None:
    """The store this process uses (opening it if needed), or None."""
    session = _compile.current()
    return session.store() if session is not None else None


def flush(timeout: float | None = None) -> bool:
    """Wait for queued uploads (bounded); True if all finished."""
    session = _compile.current()
    return session.flush(timeout) if session is not None else True


def process_stats() -> dict[str, int]:
    """This process's counters: hits, misses, stored, corrupt, loads, compiles, ..."""
    session = _compile.current()
    return session.stats() if session is not None else {}


def host_fingerprint(backend_name: str | None = None) -> _fp.Fingerprint:
    """This host's fingerprint for the default (or named) JAX backend."""
    from jax._src import xla_bridge

    return backend_fingerprint(xla_bridge.get_backend(backend_name))
