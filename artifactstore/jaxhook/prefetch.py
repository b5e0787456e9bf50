"""Loading ahead: the program's working set, deserialized while it imports and traces.

Why: a warm first call spends most of its time deserializing executables one after
another, as JAX asks for them (issue 31: 8 of 9.7 s on a TPU), and the backend
deserializes several at once. So when a session is installed, a background thread
reads the working set the last run of this program recorded for this platform
(runtime.workingset) and fetches, verifies and deserializes its entries in a few
threads. Deserializing needs the program's JAX backend, which the thread never
initializes (the program may still choose its platforms): it fetches and verifies
while JAX initializes, for the platform this host's last run had (the hint), and
deserializes once the backend is there and has that fingerprint (else it starts over
with the real one). The Prefetcher is the first level of the session's lookup chain
(store.chain), which the compile wrapper and named executables ask: an executable
loaded ahead is used only if the request's key, fingerprint, compile options and
devices are those it was deserialized with, so a stale or forged working set can never
cause a wrong load. Its object was fetched by a `peek` of the same chain's tier and
store levels, verified exactly as a hit is, and counted as the hit it is only when
the chain hands it over (`Chain.claim`). What is never claimed is dropped (after HOLD_SECS, at the
latest at exit); what is held is bounded (ARTSTORE_PREFETCH_MAX_SIZE); any failure is a
debug line, and the program proceeds as without it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from artifactstore.errors import one_line
from artifactstore.formats.workingset import Hint, WorkingEntry
from artifactstore.jaxhook import compat
from artifactstore.jaxhook.ahead import THREADS, Ahead, deserialize, loadable
from artifactstore.jaxhook.platform import backend_fingerprint
from artifactstore.jaxhook.validate import Refused
from artifactstore.process.background import Timer, executor
from artifactstore.process.lanes import Lane
from artifactstore.runtime.session import Session
from artifactstore.store.chain import LEVELS as CHAIN_LEVELS
from artifactstore.store.chain import Found, Missed, Request

log = logging.getLogger("artifactstore")
# What a load ahead peeks at: the chain's levels below its own.
LEVELS = CHAIN_LEVELS[CHAIN_LEVELS.index("ahead") + 1 :]

POLL_SECS = 0.02  # how often the thread looks for the program's backend
BACKEND_WAIT_SECS = 600.0  # a program that has none by then gets no load ahead
HOLD_SECS = 300.0  # what is unclaimed this long after the last load ends is dropped
CLAIM_WAIT_SECS = 120.0  # a request waits this long at most for its load in progress


class Prefetcher:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.max_bytes = session.settings.prefetch_max_bytes
        self._lock = threading.Lock()
        self._items: dict[str, Ahead] = {}
        self._held = 0
        self._closed = threading.Event()
        self._ready = threading.Event()  # the backend is known (or never will be: closed)
        self._backend: Any = None
        self._fingerprint = ""  # the default backend's, once known
        self._devices: dict[int, Any] = {}
        self._fetches = Lane("fetch ahead", threads=THREADS)  # never waited for at exit
        self._loads: Lane | None = None  # deserializes, once there is a backend
        self._parked: list[tuple[Ahead, Any, str]] = []  # fetched before there was one
        self._timer: Timer | None = None

    def start(self) -> None:
        self.session.on_finish.append(self.close)
        executor().submit(self._run, "load ahead")

    def _count(self, name: str, n: int = 1) -> None:
        self.session.counters.add(name, n)

    # -- the background thread ----------------------------------------------------
    def _run(self) -> None:
        try:
            session = self.session
            hint = session.working_sets.read_hint(session.tier)
            if hint is not None and enabled(session, hint.platform):
                self._begin(hint.fingerprint)  # fetched now, deserialized once JAX is ready
            backend = self._wait_for_backend()
            if backend is None:
                return
            fingerprint = backend_fingerprint(backend).digest
            self._ready_with(backend, fingerprint)
            now = Hint(fingerprint, str(backend.platform))
            if now != hint and (hint is not None or enabled(session, now.platform)):
                session.working_sets.save_hint(session.tier, now)
            if not enabled(session, now.platform):
                self.close()
            elif hint is None or hint.fingerprint != fingerprint:
                self._begin(fingerprint)
            self._timer = executor().later(HOLD_SECS, self.close)
        except Exception as exc:
            log.debug("artifactstore: no load ahead: %s", one_line(exc))
        finally:
            if not self._ready.is_set():
                self._ready_with(None, "")

    def _begin(self, fingerprint: str) -> None:
        """Load the working set recorded for `fingerprint` in a few threads."""
        session, tier = self.session, self.session.tier
        # A warm host's tier holds the working set too: the store is opened here only
        # where the tier is empty (then the session opens it anyway).
        store = session.store() if tier is None or not tier.has_entries() else None
        refused = functools.partial(self._count, "prefetch_refused_set")  # unsigned, untrusted
        found = session.working_sets.read(tier, store, fingerprint, on_refused=refused)
        entries = loadable(found.entries) if found else []
        if not entries or self._closed.is_set():
            return
        with self._lock:
            items = [self._items.setdefault(e.key, Ahead(e)) for e in entries]
        for item in items:
            self._fetches.submit("fetch ahead", functools.partial(self._fetch, item, fingerprint))

    def _wait_for_backend(self) -> Any:
        """The program's default backend once it has initialized its backends; None if
        it has none within BACKEND_WAIT_SECS or the session ends first."""
        deadline = time.monotonic() + BACKEND_WAIT_SECS
        while not self._closed.wait(POLL_SECS):
            backend = compat.initialized_backend()
            if backend is not None:
                return backend
            if time.monotonic() > deadline:
                break
        return None

    def _ready_with(self, backend: Any, fingerprint: str) -> None:
        """The backend is known: deserialize what was fetched meanwhile, and from now on
        each entry as soon as it is fetched (None: nothing is)."""
        with self._lock:
            if backend is not None and not self._closed.is_set():
                self._backend, self._fingerprint = backend, fingerprint
                self._devices = {d.id: d for d in backend.devices()}
                # Joined at exit: a deserialization must not outlive the backend.
                self._loads = Lane("deserialize ahead", THREADS, joined=True, keep_refused=False)
            parked, self._parked = self._parked, []
            self._ready.set()
        for args in parked:
            self._deserialize_later(*args)

    def _fetch(self, item: Ahead, fingerprint: str) -> None:
        """A peek of the program's own lookup chain (tier, else store), verified in full
        and counted only when claimed. Then deserialized, at once if the backend is
        there, else when it is."""
        with self._lock:
            if item.state != "queued" or self._closed.is_set():
                return
            item.state = "loading"
        hit = None
        try:
            hit = self._read(item, fingerprint)
        except Exception as exc:
            log.debug("artifactstore: %s not loaded ahead: %s", item.entry.key[:12], one_line(exc))
        if hit is None:
            self._end(item)
            return
        with self._lock:
            if not self._ready.is_set():
                self._count("prefetch_early")  # fetched while JAX initialized
                self._parked.append((item, hit, fingerprint))
                return
        self._deserialize_later(item, hit, fingerprint)

    def _read(self, item: Ahead, fingerprint: str) -> Found | None:
        hit = self.session.chain.peek(Request(item.entry.key, fingerprint, 0), names=LEVELS)
        if hit is None or hit.payload is None:
            return None
        with self._lock:
            if self._held + len(hit.payload) > self.max_bytes:
                self._count("prefetch_over_bound")
                return None
            self._held += len(hit.payload)
            item.size = len(hit.payload)
        return hit

    def _deserialize_later(self, item: Ahead, hit: Any, fingerprint: str) -> None:
        loads = self._loads
        if loads is None or fingerprint != self._fingerprint:
            self._end(item)  # no backend after all, or the hint was another platform's
            return
        work = functools.partial(self._deserialize, item, hit, fingerprint)
        if not loads.submit("deserialize ahead", work):  # the interpreter is exiting
            self._end(item)

    def _deserialize(self, item: Ahead, hit: Any, fingerprint: str) -> None:
        try:
            if self._closed.is_set():
                return
            item.executable, item.header = deserialize(
                self._backend, self._devices, item.entry, hit.payload
            )
            item.fingerprint, item.found = fingerprint, hit
            if item.executable is not None:
                self._count("prefetched")
        except Refused as exc:  # options or devices that do not fit this backend
            self._count("prefetch_refused_options")
            log.debug("artifactstore: %s not loaded ahead: %s", item.entry.key[:12], exc)
        except Exception as exc:
            log.debug("artifactstore: %s not loaded ahead: %s", item.entry.key[:12], one_line(exc))
        finally:
            self._end(item)

    def _end(self, item: Ahead) -> None:
        """`item` is done: loaded, or given up (its bytes then leave the bound)."""
        with self._lock:
            item.state = "done"
            if item.executable is None or self._closed.is_set():
                self._release(item)
        item.done.set()

    def _release(self, item: Ahead) -> None:
        """Drop `item`'s executable and its bytes from the bound (under the lock)."""
        self._held -= item.size
        item.size, item.executable = 0, None

    # -- the compile wrapper's side -----------------------------------------------
    def _take(self, key: str, kind: str) -> tuple[Ahead, Any] | None:
        """The item loaded ahead for `key` and its executable, waiting for a load in
        progress; None when there is none or it is not started (the caller loads it)."""
        with self._lock:
            item = self._items.get(key)
            if item is None or item.state == "taken" or item.entry.kind != kind:
                return None
            if item.state == "queued":  # not started: loading it now is no slower
                item.state = "taken"
                return None
        item.done.wait(CLAIM_WAIT_SECS)
        with self._lock:
            if item.state != "done":
                return None
            item.state = "taken"
            executable = item.executable
            self._release(item)
        return None if executable is None else (item, executable)

    # -- its level of the lookup chain (store.chain.Source) ------------------------
    name = "ahead"

    def peek(self, request: Request) -> Found | None:
        """The executable loaded ahead for `request`; None when there is none, it is not
        loaded yet (the chain's next levels load it), or it was loaded for another
        fingerprint, or (a jit) with other options, devices or callbacks than asked."""
        taken = self._take(request.key, request.kind)
        if taken is None:
            return None
        item, executable = taken
        fits = item.fingerprint == request.fingerprint
        if fits and request.kind == "jit":
            options, devices = wire(request.caller)
            fits = (item.entry.options, item.entry.devices) == (options, devices)
            fits = fits and not request.callbacks
        if not fits:
            self._count("prefetch_refused")
            return None
        value = executable if request.kind == "jit" else (item.header, executable)
        return Found(item.found.entry, value=value, origin=item.found, source=self)

    def count(self, request: Request, outcome: Found | Missed) -> None:
        """The tier or store hit it was peeked as, counted as the chain counts them."""
        if isinstance(outcome, Found) and outcome.origin is not None:
            self.session.chain.claim(outcome.origin)
            self._count("prefetch_used")
            log.debug("artifactstore: %s loaded ahead", request.key[:12])

    def unusable(self, request: Request, found: Found, exc: Exception) -> bool:
        return True  # never reached: what is loaded ahead is handed over loaded

    def close(self) -> None:
        """Drop whatever was not claimed; start nothing more."""
        self._closed.set()
        with self._lock:
            parked, self._parked = self._parked, []
            self._ready.set()
        for item, _hit, _fp in parked:
            self._end(item)
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            unused = [i for i in self._items.values() if i.state != "taken"]
            for item in unused:
                if item.executable is not None:
                    self._count("prefetch_unused")
                if item.state != "loading":
                    item.state = "taken"
                    self._release(item)


def wire(request: Any) -> tuple[bytes, tuple[int, ...]]:
    """`request`'s serialized compile options and device ids (computed once)."""
    if request.wire is None:
        ids = tuple(int(d.id) for d in request.executable_devices)
        request.wire = (compat.serialize_options(request.options), ids)
    return request.wire  # type: ignore[no-any-return]


_current: Prefetcher | None = None


def enabled(session: Session, platform: str) -> bool:
    """ARTSTORE_PREFETCH for a backend of `platform`: `auto` loads ahead on accelerators
    only. On the CPU, deserializing ahead takes the cores the program traces on (measured:
    a slower first call than without it), and a CPU executable loads fast anyway."""
    wanted = session.settings.prefetch
    return wanted if wanted is not None else platform != "cpu"


def start(session: Session) -> None:
    """Load `session`'s program's working set ahead, unless ARTSTORE_PREFETCH=0."""
    global _current
    if session.settings.prefetch is False or session.working_sets.program is None:
        _current = None
        session.chain.remove(Prefetcher.name)
        return
    _current = Prefetcher(session)
    session.chain.add(_current)
    _current.start()


def note_named(
    session: Session | None, key: str, fingerprint: str, devices: tuple[int, ...], platform: str
) -> None:
    """The program loaded or built the named executable `key`: part of its working set."""
    if session is not None and enabled(session, platform):
        entry = WorkingEntry(key, b"", devices, 0, "named")
        session.working_sets.note(fingerprint, entry)


def note(session: Session, request: Any) -> None:
    """The program loaded or stored `request`'s key: part of its working set."""
    if request.fingerprint is None or not request.key:
        return
    if not enabled(session, str(getattr(request.backend, "platform", "cpu"))):
        return
    try:
        options, devices = wire(request)
    except Exception as exc:
        log.debug("artifactstore: not in the working set: %s", one_line(exc))
        return
    entry = WorkingEntry(request.key, options, devices, request.callback_count)
    session.working_sets.note(request.fingerprint.digest, entry)
