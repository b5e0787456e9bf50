"""One process's working set: read at start (for the prefetch), recorded, saved at exit.

JAX-free: the JAX adapter tells it each key the program loaded or stored, with the
serialized compile options and device ids (`note`); the prefetch reads what the last
run of the same program recorded (`read`). Where the record lives (formats.workingset):
this host's tier, `workingsets/<program id>` beside its key map, so that a host with
no store reachable still predicts; and, written by writers only, the store's
WORKING_SETS record, so that a new host predicts from the team's runs. A process writes
only when its set differs from what it read, the store's copy on the writer thread so
that the exit flush bounds it, and only where the store is open already (a process the
tier answered in full opens nothing at exit for this).

Signed sets (issue 38): a process with ARTSTORE_SIGNING_KEY signs both copies. One that
requires signatures (ARTSTORE_TRUSTED_KEYS) follows a copy, tier or store, only when a
trusted key signed it; another is refused whole, counted, and said once (a warning).
Such a process without a key of its own writes no copy: an unsigned one it would refuse
itself next run, and it would replace a signed one (pulled, or copied from the store).
Instead it keeps in its tier the trusted record it read from the store, so that its next
runs predict from the tier without asking the store.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from artifactstore.blobstores.base import WORKING_SETS
from artifactstore.errors import one_line
from artifactstore.formats.workingset import (
    MAX_WORKING_SET_KEYS,
    Hint,
    WorkingEntry,
    WorkingSet,
    hint_id,
    program_id,
)

if TYPE_CHECKING:
    from artifactstore.config import Settings
    from artifactstore.store import Store
    from artifactstore.store.tier import LocalTier

log = logging.getLogger("artifactstore")

# Working sets written at exit, one per platform the program used: bounds that work.
MAX_RECORDS_PER_PROCESS = 4


def program_name(settings: Settings) -> str | None:
    """What this program is called for its working set: ARTSTORE_PROGRAM, else the
    script's resolved path; None for `python -c` and interactive sessions (no program)."""
    if settings.program:
        return settings.program
    script = sys.argv[0] if sys.argv else ""
    if script in ("", "-c", "-"):
        return None
    return os.path.realpath(script)


class WorkingSets:
    """The working sets this process read, and the keys it used, per fingerprint."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.program = program_name(settings)
        self._warned = False  # a refused set is said once per process
        self._lock = threading.Lock()
        self._read: dict[str, tuple[str, ...]] = {}  # fingerprint -> the keys read
        self._used: dict[str, dict[str, WorkingEntry]] = {}  # fingerprint -> key -> entry

    def name(self, fingerprint: str) -> str | None:
        return None if self.program is None else program_id(self.program, fingerprint)

    # -- at start --------------------------------------------------------------
    def read(
        self,
        tier: LocalTier | None,
        store: Store | None,
        fingerprint: str,
        on_refused: Callable[[], None] | None = None,
    ) -> WorkingSet | None:
        """The working set the last run recorded for this platform: this host's copy, else
        the store's (`store`: None where the caller will not open one). Anything unreadable
        is no working set (a debug line): the program runs as without one. Where this
        process requires signatures, a copy no trusted key signed is refused
        (`on_refused` is called for each)."""
        name = self.name(fingerprint)
        if name is None:
            return None
        found = None
        for where in ("tier", "store"):
            data = None
            try:
                data = _tier_get(tier, name) if where == "tier" else _store_get(store, name)
                if data is not None:
                    found = WorkingSet.decode(data, name)
            except Exception as exc:
                log.debug("artifactstore: %s working set unusable: %s", where, one_line(exc))
            if found is not None and not self._trusted(found, where, on_refused):
                found = None
            if found is not None and found.fingerprint == fingerprint:
                if where == "store" and data is not None:
                    self._keep(tier, name, data)
                break
            found = None
        with self._lock:
            self._read[fingerprint] = found.keys if found is not None else ()
        return found

    def _trusted(
        self, found: WorkingSet, where: str, on_refused: Callable[[], None] | None
    ) -> bool:
        """Whether `found` may be followed: always where signatures are not required."""
        trusted = self.settings.trusted_keys
        why = None if trusted is None else found.refusal(trusted, self.settings.namespace)
        if why is None:
            return True
        if on_refused is not None:
            on_refused()
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        where = "this host's tier" if where == "tier" else "the store"
        log.log(
            level,
            "artifactstore: the working set in %s is not followed (nothing loaded ahead from "
            "it): %s, and this process requires signatures (ARTSTORE_TRUSTED_KEYS)",
            where,
            why,
        )
        return False

    def _keep(self, tier: LocalTier | None, name: str, data: bytes) -> None:
        """A process that will not write its own copy (it requires signatures and holds
        no key) keeps the store's trusted one in its tier, where its next runs find it."""
        if self.settings.trusted_keys is None or self.settings.signing_key is not None:
            return
        try:
            _tier_put(tier, name, data)
        except Exception as exc:
            log.debug("artifactstore: could not keep the working set: %s", one_line(exc))

    def read_hint(self, tier: LocalTier | None) -> Hint | None:
        """The fingerprint and platform of this program's last default backend here."""
        if self.program is None or tier is None:
            return None
        try:
            data = _tier_get(tier, hint_id(self.program))
            return None if data is None else Hint.decode(data)
        except Exception as exc:
            log.debug("artifactstore: working set hint unusable: %s", one_line(exc))
            return None

    def save_hint(self, tier: LocalTier | None, hint: Hint) -> None:
        if self.program is None:
            return
        try:
            _tier_put(tier, hint_id(self.program), hint.encode())
        except Exception as exc:
            log.debug("artifactstore: could not keep the working set hint: %s", one_line(exc))

    # -- while running ---------------------------------------------------------
    def note(self, fingerprint: str, entry: WorkingEntry) -> None:
        """The program loaded or stored `entry.key` (the first use counts)."""
        with self._lock:
            used = self._used.setdefault(fingerprint, {})
            if entry.key not in used and len(used) < MAX_WORKING_SET_KEYS:
                used[entry.key] = entry

    # -- at exit ---------------------------------------------------------------
    def changed(self) -> list[WorkingSet]:
        """The working sets to write: those whose keys differ from what was read."""
        out = []
        with self._lock:
            for fingerprint, used in list(self._used.items())[:MAX_RECORDS_PER_PROCESS]:
                name = self.name(fingerprint)
                if name is None or not used or tuple(used) == self._read.get(fingerprint):
                    continue
                out.append(WorkingSet(name, fingerprint, tuple(used.values())))
        return out

    def save(self, tier: LocalTier | None, store: Store | None) -> None:
        """Write what changed: this host's copy now, the store's on its writer thread
        (a writer's open store only), which the exit flush then bounds."""
        key, namespace = self.settings.signing_key, self.settings.namespace
        if key is None and self.settings.trusted_keys is not None:
            if self.changed():  # its own copy it would refuse next run: keep what it read
                log.debug("artifactstore: working set not written: unsigned (no signing key)")
            return
        for found in self.changed():
            data = found.encode(key, namespace)
            try:
                _tier_put(tier, found.program, data)
            except Exception as exc:
                log.debug("artifactstore: could not keep the working set: %s", one_line(exc))
            if store is not None and not self.settings.read_only:
                store.parts.worker.submit("working set", _putter(store, found.program, data))


def _tier_get(tier: LocalTier | None, name: str) -> bytes | None:
    return None if tier is None else tier.read_file(f"{WORKING_SETS.folder}/{name}")


def _tier_put(tier: LocalTier | None, name: str, data: bytes) -> None:
    if tier is not None:
        tier.write_file(f"{WORKING_SETS.folder}/{name}", data)


def _store_get(store: Store | None, name: str) -> bytes | None:
    return None if store is None else store.parts.records.get_record(WORKING_SETS, name)


def _putter(store: Store, name: str, data: bytes) -> Callable[[], None]:
    def put() -> None:
        try:
            # A writer whose bucket and index are not one store writes nothing there, this
            # record included (the gate's check, once per process, said so in one line).
            store.parts.records.put_record(WORKING_SETS, name, data)
        except Exception as exc:  # a prediction only: never a warning
            log.debug("artifactstore: could not store the working set: %s", one_line(exc))

    return put
