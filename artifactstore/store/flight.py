"""Single-flight compiles: when many processes miss one key at once, one compiles.

Why: a 64-worker job starting on a store that lacks its programs would compile
each of them 64 times and upload it 64 times, and still start as slowly as one
cold compile. Here the first writer to miss a key takes the key's compile lease
in the index (`index.leases.Lease`: an insert or a takeover of an expired or
dead holder's row decides exactly one holder); the others wait for its result.

- The holder mirrors its lease as a small record in the object store
  (`leases/KEY`: holder, beat, state, the key's last known compile time), beats
  it and renews the index row every TTL/3 while it compiles and uploads, and
  deletes it once the entry's manifest is published. A compile it will not store
  (below the threshold, failed, the index gone) marks the record `abandoned`, so
  that waiters compile at once instead of queueing behind one another.
- Waiters hold no database connection: they poll the key's lease record and
  manifest in the object store (backing off to one poll a second). A manifest
  ends the wait with a load; an abandoned or vanished lease with a compile; a
  holder that stopped beating for a TTL (or died, on this host) is taken over
  through the index by exactly one waiting writer, the others wait on. Every wait
  is bounded (`ARTSTORE_LEASE_WAIT`, default a few times the key's last known compile
  time, else 5 minutes, at most ARTSTORE_LEASE_MAX_HOLD): then a waiter compiles.
- Read-only readers never hold a lease and never open the index: a reader that
  misses waits only when it finds a writer's record whose holder is alive (neither
  expired nor gone from this host), at most ARTSTORE_LEASE_READER_WAIT (a few
  seconds: it cannot take a silent holder over), and compiles otherwise.
- A process that trusts no key (signatures required, none listed, none of its own)
  neither waits nor holds: whatever a holder stores, it would refuse.
- Every wait is said in one log line: the key, the holder the record names, how
  long at most and which setting bounds it.
- A record is untrusted (anyone who may write the bucket can write one): a malformed
  one is no lease, and how long a waiter waits and trusts a silent holder comes from
  its own settings (and a writer's own index), never from the record's fields.

Any failure here (index or object store unreachable) degrades to compiling. The
record's format is formats.lease; wait bounds and whether single-flight is on here,
store.lease; the lease's row and SQL, index.leases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from artifactstore.blobstores.base import LEASES, MANIFESTS
from artifactstore.errors import LeaseHeld, PrivilegeRefused, StoreUnavailable, one_line
from artifactstore.formats.lease import LeaseRecord
from artifactstore.index.errors import UNAVAILABLE
from artifactstore.index.leases import Lease, compile_hint, compile_lease_name, dead_here
from artifactstore.process.background import call_with_timeout
from artifactstore.process.breaker import describe
from artifactstore.process.counters import Counters
from artifactstore.process.lanes import Lane, Tick
from artifactstore.store.backends import Backends, refused_topic
from artifactstore.store.lease import expired, reader_wait, trusts_no_key, wait_bound

log = logging.getLogger("artifactstore")

T = TypeVar("T")
_FIRST_POLL = 0.05
_MAX_POLL = 1.0


class Held:
    """A compile lease this process holds: beaten until `release`."""

    def __init__(self, flight: SingleFlight, key: str, lease: Lease) -> None:
        self.flight = flight
        self.key = key
        self.lease = lease
        self.record = LeaseRecord(lease.holder, 0, lease.ttl_secs)
        self.lost = False
        self._released = False
        self._lock = threading.Lock()

    def release(self, *, stored: bool) -> None:
        """The entry is published (`stored`), or will not be: let waiters go on (once:
        the upload's end and a failed renewal may both call this)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self.flight._release(self, stored=stored)


class SingleFlight:
    """One store's compile leases, as this process takes and waits for them."""

    def __init__(
        self,
        backends: Backends,
        counters: Counters,
        found_nothing: Callable[[str], bool],
        served: Callable[[str], None] = lambda _key: None,
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        """`found_nothing(key)`: whether this process's last lookup of `key` found no
        entry at all (the accounts'), the only misses worth waiting for. `served(key)`:
        that miss was then loaded from another process's compile (a hit, not a miss).
        `may_write()`: False once this writer's write gate refused it (its object store and
        index do not belong together; free to ask): it will store nothing, so it takes no
        compile lease for the index's writers to wait on, and lets go of one it took before
        the gate decided (`_announce`, `_beat`)."""
        self.backends = backends
        self.counters = counters
        self.found_nothing = found_nothing
        self.served = served
        self.may_write = may_write
        self.settings = backends.settings
        self.ttl = min(self.settings.lease_ttl_secs, self.settings.lease_max_hold_secs)
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()
        # Record writes and releases, in order, off the hot path; a beat every TTL/3.
        self._lane = Lane("leases", tick=Tick(self.ttl / 3, self._beat))
        self._abandoned: list[str] = []  # records marked abandoned: deleted at exit
        # Leases being taken on the executor now: at exit `drain` waits for them, so that
        # one its caller gave up on (Ctrl-C, SIGTERM) is let go before the process ends.
        self._taking = threading.Condition()
        self._being_taken = 0
        self._waits_said = False  # a wait was said once as a warning (see _say_wait)
        self._loads_nothing = trusts_no_key(self.settings)

    # -- holding --------------------------------------------------------------
    def try_hold(self, key: str) -> Held | None:
        """Take `key`'s lease (a writer); None if another process holds it."""
        index = self.backends.breakers["index"]  # a lease is a write to the index
        if not index.allow(write=True):
            raise StoreUnavailable("compile leases unavailable (cooling down)")
        name = compile_lease_name(self.backends.namespace, key)

        # The caller may time out or be interrupted while the lease is being taken: then
        # whichever of the two comes second lets it go (one lock orders them), so that no
        # lease is left held with nobody to compile under it or release it.
        handoff = threading.Lock()
        taken: list[Lease] = []  # the lease acquired, not yet let go
        left = False  # the caller gave up

        def take() -> Lease | None:  # opening the index, if not yet open, is bounded too
            max_hold = self.settings.lease_max_hold_secs
            lease = Lease(self.backends.engine, name, self.ttl, max_hold_secs=max_hold)
            if lease.try_acquire() is not None:
                return None
            with handoff:
                if not left:
                    taken.append(lease)
                    return lease
            lease.release()  # nobody will compile under it: let it go at once
            return None

        def acquire() -> Lease | None:
            with self._taking:
                self._being_taken += 1
            try:
                return take()
            finally:
                with self._taking:
                    self._being_taken -= 1
                    self._taking.notify_all()

        try:
            lease = call_with_timeout(acquire, self.settings.timeout_secs)
            held = None if lease is None else Held(self, key, lease)
            if held is not None:
                with self._lock, handoff:
                    self._held[key] = held  # from here, release_all lets it go
                    taken.clear()
        except BaseException as exc:
            with handoff:
                left = True
                orphans = list(taken)
            for orphan in orphans:  # taken after the caller stopped waiting
                self._submit(orphan.release)
            if isinstance(exc, (TimeoutError, StoreUnavailable, *UNAVAILABLE)):
                cause = describe(exc, self.settings.timeout_secs)
                index.failure(cause, write=True)  # not paid again for a while
            else:
                index.release_probe()  # refused, or interrupted: no verdict on the index
            raise
        index.success(write=True)
        if held is None:
            return None
        self._submit(lambda: self._announce(held))
        return held

    def release_all(self) -> None:
        """Let go of every lease held (a process stopped mid-compile): waiters go on now."""
        with self._lock:
            held = list(self._held.values())
        for one in held:
            one.release(stored=False)

    def _announce(self, held: Held) -> None:
        """Publish the lease record, with the key's last known compile time (for older
        clients: waiters here ask their own index); a writer its gate refused meanwhile
        lets the lease go instead and writes no record into a bucket not the index's."""
        if not self.may_write():
            self._let_go_refused(held)
            return
        held.record = replace(held.record, hint=self._known_compile_secs(held.key))
        self._put_record(held)

    def _let_go_refused(self, held: Held) -> None:
        """Let `held` go now (a writer its gate refused: it stores nothing here), deleting
        the record it wrote before the refusal rather than marking it abandoned; its own
        release, when its compile ends, then has nothing to do."""
        held.lost = True
        with self._lock:
            self._held.pop(held.key, None)
        if held.record.at is not None:  # written (`_put_record` stamps it)
            self._delete_record(held)
        self._release_row(held)

    def _delete_record(self, held: Held) -> None:
        try:
            self.backends.blobs.delete_records(LEASES, [held.key])
        except Exception as exc:
            log.debug("artifactstore: lease record not deleted: %s", one_line(exc))

    def _release_row(self, held: Held) -> None:
        try:
            call_with_timeout(held.lease.release, self.settings.timeout_secs)
        except Exception as exc:  # it expires after one TTL
            log.debug("artifactstore: lease not released: %s", one_line(exc))

    def _known_compile_secs(self, key: str) -> float | None:
        """The key's last known compile time in the index (a writer's), or None."""
        try:
            return call_with_timeout(
                lambda: compile_hint(self.backends.engine, key), self.settings.timeout_secs
            )
        except Exception as exc:
            log.debug("artifactstore: no compile-time hint for %s: %s", key[:12], exc)
            return None

    def _put_record(self, held: Held) -> None:
        held.record = replace(held.record, at=time.time())  # when it last showed life
        try:
            self.backends.blobs.put_record(LEASES, held.key, held.record.encode())
        except Exception as exc:
            log.debug("artifactstore: lease record of %s not written: %s", held.key[:12], exc)

    def _release(self, held: Held, *, stored: bool) -> None:
        with self._lock:
            self._held.pop(held.key, None)

        def job() -> None:
            if held.lost:  # taken over (the row is the new holder's), or let go refused
                return
            if stored:
                self._delete_record(held)
            else:
                held.record = replace(held.record, state="abandoned", beat=held.record.beat + 1)
                self._put_record(held)
                self._abandoned.append(held.key)
            self._release_row(held)

        self._submit(job)

    def _beat(self) -> None:
        """Renew every held lease and its record (every TTL/3)."""
        with self._lock:
            held = list(self._held.values())
        for one in held:
            if not self.may_write():  # refused since it was taken: waiters go on
                self._let_go_refused(one)
                continue
            try:
                call_with_timeout(one.lease.renew, self.settings.timeout_secs)
            except LeaseHeld:
                one.lost = True  # paused past its expiry: a waiter took over
                with self._lock:
                    self._held.pop(one.key, None)
                continue
            except Exception as exc:
                # The index is gone: this compile cannot be stored, so let waiters go.
                log.debug("artifactstore: lease renewal failed: %s", one_line(exc))
                one.release(stored=False)
                continue
            one.record = replace(one.record, beat=one.record.beat + 1)
            self._put_record(one)

    def _submit(self, job: Callable[[], None]) -> None:
        self._lane.submit("lease bookkeeping", job)

    def drain(self, timeout: float) -> None:
        """Let queued record writes and releases finish (at exit), within `timeout`, then
        delete the records this process marked abandoned: their waiters have long seen them
        (and one that has not asks the index, which the lease no longer holds)."""
        deadline = time.monotonic() + timeout
        with self._taking:  # a lease its caller gave up on lets itself go, or is queued to
            while self._being_taken and time.monotonic() < deadline:
                self._taking.wait(deadline - time.monotonic())
        self._lane.drain(max(deadline - time.monotonic(), 0.0))
        abandoned, self._abandoned = self._abandoned, []
        if abandoned and time.monotonic() < deadline:
            try:
                call_with_timeout(
                    lambda: self.backends.blobs.delete_records(LEASES, abandoned),
                    deadline - time.monotonic(),
                )
            except Exception as exc:
                log.debug("artifactstore: abandoned lease records left: %s", one_line(exc))

    # -- waiting --------------------------------------------------------------
    def turn(self, key: str, load: Callable[[], T | None]) -> tuple[T | None, Held | None]:
        """Take `key`'s lease or wait for its holder: (what `load` returned once the
        entry's manifest appeared, None), or (None, the lease now held, or None: compile)."""
        counters = self.counters
        writer = not self.settings.read_only
        if not self.found_nothing(key):
            # An entry this process cannot use (refused, another platform, over a limit):
            # nothing to wait for, and its compile may replace it (see Store.put).
            return None, None
        if writer and not self.may_write():
            return None, None  # it stores nothing here: compile, and hold nothing
        if self._loads_nothing:
            counters.add("lease_skipped")  # the entry a wait ends with would be refused
            return None, None
        try:
            if writer:
                held = self.try_hold(key)
                if held is not None:
                    if held.lease.took_over:  # its holder went silent before we got here
                        counters.add("lease_takeovers")
                    if self.backends.blobs.get_record(MANIFESTS, key) is None:
                        return None, held
                    # Published since this process missed it (and its holder let go).
                    held.release(stored=True)
                    loaded = load()
                    if loaded is not None:
                        self.served(key)
                    return loaded, None
            else:
                record = self._read_record(key)
                if record is None or record.state != "compiling":
                    return None, None  # no writer compiles it: a reader compiles itself
                if self._dead(record):
                    return None, None  # its holder is gone: waiting gains nothing
                return self._wait(key, load, writer, record)
            return self._wait(key, load, writer)
        except Exception as exc:
            if isinstance(exc, PrivilegeRefused):
                # The login's grants: single-flight must not be off unnoticed (said once,
                # with the upload and the hit flush that meet the same refusal).
                fix = "(or re-run infra/policies/postgres-roles.sql)"
                self.backends.warn_once(
                    refused_topic(exc), "compile leases refused, all compile: %s %s", exc, fix
                )
            # Else said once by the upload that follows (the index is the writer's to report).
            log.debug("artifactstore: compile leases unavailable (%s); compiling", one_line(exc))
            counters.add("lease_errors")
            return None, None

    def _wait(
        self,
        key: str,
        load: Callable[[], T | None],
        writer: bool,
        record: LeaseRecord | None = None,
    ) -> tuple[T | None, Held | None]:
        counters = self.counters
        counters.add("lease_waits")
        blobs = self.backends.blobs
        started = time.monotonic()
        if writer:
            bound = wait_bound(self.settings, self._known_compile_secs(key))
            setting = "ARTSTORE_LEASE_WAIT"
        else:  # its own short bound: it cannot take over, and the record may be forged
            bound, setting = reader_wait(self.settings)
        self._say_wait(key, self._read_record(key) if record is None else record, bound, setting)
        poll = _FIRST_POLL
        beat: int | None = None
        quiet_since = started  # when the holder last showed life (a new beat)
        asked = started  # when a writer last asked the index for the lease
        while True:
            time.sleep(poll)
            poll = min(poll * 1.5, _MAX_POLL)
            now = time.monotonic()
            if blobs.get_record(MANIFESTS, key) is not None:
                result = load()
                if result is not None:
                    counters.add("lease_loaded")
                    self.served(key)
                return result, None  # not loadable here (another fingerprint...): compile
            record = self._read_record(key)
            if record is not None and record.state == "abandoned":
                return None, None  # the holder will not store it: compile at once
            if record is None and blobs.get_record(MANIFESTS, key) is not None:
                continue  # published between the two reads: the next poll loads it
            if record is not None:
                if record.beat != beat:
                    beat, quiet_since = record.beat, now
            elif not writer:
                return None, None  # the holder is gone without a manifest
            if not writer and record is not None and self._dead(record):
                return None, None  # the holder died (or its record is stale): compile
            dead = record is not None and dead_here(record.holder)
            # Silent for our own TTL (not the record's); no record yet: written just after.
            quiet = now - quiet_since > (self.ttl if record is not None else 1.0)
            # A writer asks the index every TTL whatever the record says: a forged record
            # that keeps "beating" cannot hide that the holder's row expired.
            overdue = writer and now - asked > self.ttl
            if dead or quiet or overdue:
                if not writer:
                    if now - quiet_since > 2 * self.ttl:
                        return None, None  # no writer took it over: compile
                else:
                    asked = now
                    held = self.try_hold(key)  # exactly one waiter takes it over
                    if held is not None:
                        counters.add("lease_takeovers")
                        return None, held
                    quiet_since = now  # held: renewed, or another waiter took it over
            if now - started > bound:  # said when the wait began (`_say_wait`)
                counters.add("lease_timeouts")
                log.debug("artifactstore: waited %.1f s for %s; compiling", now - started, key[:12])
                return None, None

    def _dead(self, record: LeaseRecord) -> bool:
        """Whether a record's holder is dead: expired (past its TTL and a grace), or a
        process of this host that has exited. Such a record costs a reader no wait."""
        if not (expired(record, self.settings, time.time()) or dead_here(record.holder)):
            return False
        self.counters.add("lease_stale")
        return True

    def _say_wait(self, key: str, record: LeaseRecord | None, bound: float, setting: str) -> None:
        """One line per wait: whose compile, how long at most, which setting bounds it
        (the process's first wait as a warning, later ones at info: a 64-worker job
        waits on many keys)."""
        holder = record.shown_holder() if record is not None else "another process"
        level = logging.INFO if self._waits_said else logging.WARNING
        self._waits_said = True
        line = "artifactstore: waiting up to %.3g s for %s to compile %s, then compiling here"
        log.log(level, line + " (bound: %s)", bound, holder, key[:12], setting)

    def _read_record(self, key: str) -> LeaseRecord | None:
        data = self.backends.blobs.get_record(LEASES, key)
        if data is None:
            return None
        try:
            return LeaseRecord.decode(data)
        except Exception:  # malformed (CorruptObject, or anything it made fail): no lease
            self.counters.add("bad_lease_records")  # counted: the refusal is seen to run
            return None
