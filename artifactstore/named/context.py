"""The store side of named executables: find NAME@VERSION for this host, store builds.

A lookup tries the native executable for this host's fingerprint (the session's lookup
chain: loaded ahead, tier, then store), then the portable form, which it rebuilds for
this host and stores natively. Why a lookup found nothing is kept for the NamedNotFound
message.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from artifactstore.errors import CorruptObject, NamedBuildError, one_line
from artifactstore.formats.put import Put
from artifactstore.jaxhook import compat, prefetch
from artifactstore.jaxhook import compile as _compile
from artifactstore.jaxhook.platform import backend_fingerprint
from artifactstore.named import container, keys
from artifactstore.named.build import Built, device_list, rebuild
from artifactstore.named.call import NamedExecutable
from artifactstore.process.background import call_with_timeout
from artifactstore.runtime.session import Session, warn_once
from artifactstore.store import removed
from artifactstore.store.chain import Found, Request

if TYPE_CHECKING:
    from artifactstore.store import Store

IMMUTABLE = (
    "versions are immutable once published: this build is used but not stored; "
    "build it as a new version"
)


class Context:
    """This process's session, backend and fingerprint, for one lookup or build."""

    def __init__(self, session: Session | None, backend: Any) -> None:
        self.session = session
        self.backend = backend
        self.fingerprint = backend_fingerprint(backend)
        self.problems: list[str] = []  # why a lookup found nothing, for the error
        self.gone: set[tuple[str, str]] = set()  # removed versions: not stored (store.removed)

    @classmethod
    def open(cls) -> Context:
        import jax  # noqa: F401  (before configure: activation without code sees it first)

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
        return cls(session, compat.backend())

    def _store(self) -> Store | None:
        return self.session.store() if self.session is not None else None

    def lookup(self, key: str, fingerprint_digest: str) -> Found | None:
        """`key` from the session's lookup chain (store.chain: loaded ahead, tier, store),
        counted there; why it found nothing goes to `problems`."""
        if self.session is None:
            return None
        request = Request(key, fingerprint_digest, kind="named")
        found = self.session.chain.get(request)
        if found is None:
            self.problems.extend(request.notes)
        return found

    def find(self, name: str, version: str) -> NamedExecutable | None:
        fp = self.fingerprint
        key = keys.key(name, version, fp.digest)
        found = self.lookup(key, fp.digest)
        payload = found.payload if found is not None else None
        if found is not None and payload is None:  # loaded ahead: (header, executable)
            header_json, executable = found.value
            self._loaded(found)
            header = _check(container.parse_header(header_json), name, version, "native")
            return self._found(key, header, executable)
        if found is not None and payload is not None:
            started = time.monotonic()
            header, body = _decode(bytes(payload), name, version, "native")
            try:
                executable = self.backend.deserialize_executable(body, device_list(header), None)
            except Exception as exc:
                warn_once(
                    "named-load", "stored %s@%s did not load (%s)", name, version, one_line(exc)
                )
            else:
                self._loaded(found, started)
                return self._found(key, header, executable)
        portable = self.lookup(keys.portable_key(name, version), keys.PORTABLE.digest)
        if portable is None or portable.payload is None:
            return None
        header, body = _decode(bytes(portable.payload), name, version, "portable")
        built = rebuild(header, body, self.backend)
        self.store_native(built)
        return built.executable

    def _loaded(self, found: Found, started: float | None = None) -> None:
        """Count a load, timed from `started` (else from the lookup that found it)."""
        if self.session is not None:
            since = found.started if started is None else started
            self.session.observe_load(time.monotonic() - since)

    def _found(self, key: str, header: container.Header, executable: Any) -> NamedExecutable:
        """A native hit, noted in the working set for the next run to load ahead."""
        fp = self.fingerprint
        prefetch.note_named(self.session, key, fp.digest, header.devices, fp.platform)
        return NamedExecutable(header, executable, "store")

    def not_found(self, name: str, version: str) -> str:
        fp = self.fingerprint
        where = self._store()
        place = where.parts.describe() if where is not None else "no store (see the log)"
        why = f" ({'; '.join(sorted(set(self.problems)))})" if self.problems else ""
        return (
            f"no executable {name}@{version} for this host ({fp.platform} "
            f"{fp.device_kind} x{fp.device_count}, jaxlib {fp.jaxlib_version}) and no portable "
            f"form in {place}{why}: build it with artifactstore.compiled(...) or "
            "`artstore warm` with artifactstore.NamedSpec items"
        )

    def _put(self, put: Put) -> None:
        session = self.session
        store = self._store()
        if session is None or store is None:
            warn_once("named-put", "no store: %s built but not stored", put.module_name)
            return
        if session.settings.read_only:
            store.parts.counters.add("skipped_read_only")
            return
        name, version = keys.parse_module_name(put.module_name) or ("", "")

        def store_it() -> str | None:
            """Stored, or why not: a removed version is never stored again (readers
            refuse it, so the build would be lost; see `store.removed`)."""
            parts = store.parts
            settings = parts.settings
            try:
                record = removed.removal(
                    parts.records, name, version, settings.trusted_keys, settings.namespace
                )
            except removed.Ignored as exc:  # not a trusted key's removal: stored
                parts.counters.add("named_removal_ignored")
                warn_once("named-removal-ignored", "%s", exc)
                record = None
            if record is not None:
                return removed.describe(name, version, record)
            store.put(put)
            return None

        try:
            gone = call_with_timeout(store_it, session.settings.timeout_secs)
        except Exception as exc:
            session.fail(exc)
            warn_once("named-put", "%s not stored (%s)", put.module_name, one_line(exc))
            return
        if gone is not None:  # this process runs what it built; the store keeps nothing
            self.gone.add((name, version))
            store.parts.counters.add("named_removed_not_stored")
            warn_once("named-removed-put", "%s; %s", gone, IMMUTABLE)

    def store_native(self, built: Built) -> None:
        header = built.executable.header
        fp = self.fingerprint
        key = keys.key(header.name, header.version, fp.digest)
        module_name = keys.module_name(header.name, header.version)
        self._put(Put(key, built.payload, fp, module_name, built.compile_secs, callbacks=0))
        prefetch.note_named(self.session, key, fp.digest, header.devices, fp.platform)

    def store_portable(self, name: str, version: str, payload: bytes) -> None:
        key, module_name = keys.portable_key(name, version), keys.module_name(name, version)
        self._put(Put(key, payload, keys.PORTABLE, module_name, 0.0, callbacks=0))


def _decode(payload: bytes, name: str, version: str, kind: str) -> tuple[container.Header, bytes]:
    header, body = container.decode(payload)
    return _check(header, name, version, kind), body


def _check(header: container.Header, name: str, version: str, kind: str) -> container.Header:
    if (header.name, header.version, header.kind) != (name, version, kind):
        # Signed and bound to its key, so only a forged or mis-written entry gets here.
        raise CorruptObject(
            f"entry for {name}@{version} holds {header.kind} {header.name}@{header.version}"
        )
    return header
