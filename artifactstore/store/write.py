"""The write path: admit -> encode -> upload -> commit -> publish (and withdraw).

Why in this order: a reader that finds a manifest must find its object, and the
index must never point at a missing object for longer than one operation. So the
object is made durable first, then the index row is committed, and the manifest
(what readers follow) is published last; removal runs the other way (withdraw the
manifest, delete the row, and only after gc's grace period the object).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from artifactstore import interrupts
from artifactstore.blobstores.base import QUICK
from artifactstore.errors import CorruptObject, ReadOnlyError, one_line
from artifactstore.formats import codec, quick
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.index.repo import EntryInfo, NewEntry
from artifactstore.process.counters import Counters
from artifactstore.store import identity
from artifactstore.store.backends import Backends
from artifactstore.store.tiers import encode_entry, stamped

if TYPE_CHECKING:
    pass

log = logging.getLogger("artifactstore")

UNSIGNED_WRITE = (
    "this store requires signatures and ARTSTORE_SIGNING_KEY is not set: this process "
    "stores nothing (no reader would load an unsigned entry; it compiles as usual); set "
    "ARTSTORE_SIGNING_KEY to the writer's key from `artstore keygen`"
)


class WritePath:
    """One store's writes: entries stored, published, withdrawn, and bad ones removed."""

    def __init__(self, backends: Backends, counters: Counters, refused: dict[str, str]) -> None:
        self.backends = backends
        self.counters = counters
        # Keys whose entry this process refused for its signature (the read path says
        # which): a writer that then compiles them replaces the entry with one it signs.
        self.refused = refused
        # Called (on the writing thread) after each entry this process creates;
        # layers above subscribe here (the opt-in quota pass) without the store
        # importing them.
        self.on_stored: list[Callable[[], None]] = []
        # Object store and index one store? Asked before the first write (identity.WriteGate).
        self.gate = identity.WriteGate(backends, counters.add)

    def put(self, put: Put) -> bool:
        """Store `put` synchronously; True if this call created the entry. An object that
        is encoded already (a bundle's) is stored byte for byte, never re-encoded, so its
        signature stays its writer's: the caller verified it (`ReadPath.verify`)."""
        if self.unsigned(put):
            return False
        admitted, existing = self.admit(put.key)
        if not admitted:
            return False
        put = stamped(put)
        return self.commit(put, encode_entry(put, self.backends.settings), existing)

    @property
    def signs(self) -> bool:
        """Whether this writer's entries can be loaded where signatures are required."""
        settings = self.backends.settings
        return settings.signing_key is not None or not settings.require_signatures

    def unsigned(self, put: Put) -> bool:
        """Whether `put` is refused (counted, said once) because it would be stored
        unsigned where signatures are required: readers would load none of it, and its
        row would hold the key until a signed writer replaced it. An object encoded
        already (a verified bundle's) keeps its writer's signature and goes on."""
        if self.signs or isinstance(put.payload, codec.Encoded):
            return False
        self.counters.add("skipped_unsigned")
        self.backends.warn_once("unsigned-write", UNSIGNED_WRITE)
        return True

    def admit(self, key: str) -> tuple[bool, EntryInfo | None]:
        """(whether a put of `key` goes on, the entry it replaces): no on a read-only
        store or where the key is stored already (counted), except an entry this process
        refused for its signature, which a writer that can sign replaces."""
        if self.backends.read_only:
            self.counters.add("skipped_read_only")
            return False, None
        if not self.gate.admits():
            return False, None
        settings = self.backends.settings
        existing = self.backends.index.lookup(key)
        replace = existing is not None and key in self.refused
        if replace and settings.signing_key is None:
            # Present, but this process refused it for its signature (and cannot sign):
            # the entry stays as it is; its readers compile, as this process did.
            self.counters.add("refused_present")
            return False, None
        if existing is not None and not replace:  # another process stored it first
            self.counters.add("already_present")
            if settings.index_is_server and not self.published(existing):
                # Stored by a 0.2 client, its publication failed, or its manifest was
                # damaged: readers miss it until it is published (this process did too).
                if self.publish_checked(existing):
                    self.counters.add("manifest_republished")
            return False, None
        return True, existing

    def commit(self, put: Put, encoded: codec.Encoded, existing: EntryInfo | None) -> bool:
        """The write path every put ends in: object durable, then index row (or the
        replacement of a refused entry), then tier and manifest; True if created.
        Row and manifest go together: on the main thread (a flush at exit runs queued
        puts there) Ctrl-C or SIGTERM waits for both, never leaving a row unpublished."""
        uploaded = self.backends.blobs.put(encoded.digest, encoded.data)
        if uploaded:
            self.counters.add("bytes_uploaded", len(encoded.data))
        with interrupts.held():
            return self._commit_row(put, encoded, existing, uploaded)

    def _commit_row(
        self, put: Put, encoded: codec.Encoded, existing: EntryInfo | None, uploaded: bool
    ) -> bool:
        blobs, index = self.backends.blobs, self.backends.index
        key, fingerprint = put.key, put.fingerprint
        entry = NewEntry.of(put, encoded)
        if existing is not None:
            # This process refused the entry's object for its signature (unsigned, an
            # untrusted key, a bad signature) and just compiled the key itself: replace
            # it with its own, signed object, so readers that trust this key load it.
            created = index.repoint(key, old_digest=existing.digest, new=encoded, entry=entry)
            if created:
                index.add_entry(entry, fingerprint.to_json())  # its fingerprint row
                self.refused.pop(key, None)
                self.counters.add("replaced_refused")
                self._drop_if_unreferenced(existing.digest)
        else:
            created = index.add_entry(entry, fingerprint.to_json())
        self.counters.add("stored" if created else "already_present")
        if created:
            remember(self.backends, key, put.manifest(encoded), encoded.data)
        if created and not blobs.exists(encoded.digest):
            # A gc deleted the object between our existence check and our commit (the
            # race is explained in artifactstore/gc/__init__.py): put it back, so the
            # entry points at a missing object for no longer than this one operation.
            blobs.put(encoded.digest, encoded.data)
        if not created and uploaded:
            # Lost a race on the key with different bytes (XLA output is not
            # byte-identical across processes): drop our now-unreferenced copy.
            self._drop_if_unreferenced(encoded.digest)
        if created:
            self.publish_checked(entry, callbacks=put.callbacks)
            for listener in self.on_stored:
                listener()
        return created

    # -- manifests ------------------------------------------------------------
    def publish(self, entry: EntryInfo | NewEntry, *, callbacks: int | None = None) -> bool:
        """Publish `entry`'s manifest, after its object and index row: readers find it
        without the database. False (counted, logged once) if the object store refused;
        the entry is stored all the same, and `artstore verify --repair` publishes it."""
        try:
            manifest = Manifest.of(entry, callbacks=callbacks).encode()
            self.backends.blobs.put_manifest(entry.key, manifest)
            return True
        except Exception as exc:
            return self._unpublished(
                "manifest_unpublished",
                "publish",
                "manifest of %s not published (%s): readers find it through the index until "
                "`artstore verify --repair`",
                entry.key[:12],
                one_line(exc),
            )

    def publish_checked(self, entry: EntryInfo | NewEntry, *, callbacks: int | None = None) -> bool:
        """`publish`, then withdraw the manifest if a gc evicted the row meanwhile.

        A gc that deletes the row between the writer reading (or inserting) it and its
        manifest finds no manifest to withdraw, and may delete the object at once
        (`--grace 0`): the manifest would lead readers to nothing. Checked after
        publishing, either this finds the row gone or gc's own withdrawal comes after the
        manifest. A row for other bytes (another writer's, after the eviction) is left as
        it is: a reader that follows this manifest to a deleted object drops only the
        manifest, and the next writer of the key republishes the row's."""
        if not self.publish(entry, callbacks=callbacks):
            return False
        try:
            if self.backends.index.lookup(entry.key) is None:
                self.backends.blobs.delete_manifests([entry.key])
                self.counters.add("manifest_withdrawn")
                return False
        except Exception as exc:  # a manifest without entry costs misses; verify repairs it
            log.debug("artifactstore: re-check of %s's row failed: %s", entry.key[:12], exc)
        return True

    def published(self, entry: EntryInfo) -> bool:
        """Whether `entry`'s manifest is published and leads to its object."""
        data = self.backends.blobs.get_manifest(entry.key)
        try:
            return data is not None and Manifest.decode(data, entry.key).digest == entry.digest
        except CorruptObject:
            return False

    def require_writable_index(self) -> None:
        """ReadOnlyError, with the index's one line, where its role or file refuses writes."""
        why = db.read_only_reason(self.backends.engine)
        if why is not None:
            raise ReadOnlyError(why)

    def withdraw(self, keys: list[str]) -> None:
        """Withdraw the manifests of entries being removed (before or just after their
        rows go; their objects outlive both by gc's grace period). Refused, with the
        index's one line, where the index may not be written: removal needs both."""
        self.require_writable_index()
        if keys:
            self.backends.blobs.delete_manifests(keys)

    def remove_entries(self, keys: list[str] | None) -> int:
        """Remove the entries `keys` (all of the namespace's if None): manifests first, so
        that no reader is sent to an entry being removed, then rows. Their objects outlive
        both (gc's orphans, after the grace period). How many rows went."""
        blobs, index = self.backends.blobs, self.backends.index
        self.withdraw(list(blobs.iter_manifest_keys()) if keys is None else keys)
        return index.delete_all_entries() if keys is None else index.delete_entries(keys)

    def remove_object(self, digest: str, *, quarantine: bool) -> int:
        """Remove every entry that leads to `digest` (as `remove_entries`), then forget the
        object; a corrupt one is quarantined first (kept to inspect, never served). How
        many entries went."""
        if quarantine:
            self.backends.blobs.quarantine(digest)
        removed = self.remove_entries(self.backends.index.keys_for_digest(digest))
        self.backends.index.forget_objects([digest])
        return removed

    def replace_object(self, entry: EntryInfo, encoded: codec.Encoded) -> tuple[bool, bool]:
        """Point `entry` at `encoded` (its object signed anew): the new object, then the
        row (only if it still leads to the old one), then the manifest; the old object is
        deleted once no entry leads to it. (whether the entry moved, whether the old
        object went); not moved: replaced or removed meanwhile, left to its owners."""
        blobs, index = self.backends.blobs, self.backends.index
        blobs.put(encoded.digest, encoded.data)
        moved = index.repoint(entry.key, old_digest=entry.digest, new=encoded)
        if not moved:
            return False, False
        moved_entry = index.lookup(entry.key)
        if moved_entry is not None:
            self.publish(moved_entry)  # readers follow the manifest to the new object
        return True, self._drop_if_unreferenced(entry.digest)

    def _drop_if_unreferenced(self, digest: str) -> bool:
        """Delete the object `digest` and its row once no entry leads to it; whether it went."""
        index = self.backends.index
        if index.keys_for_digest(digest):
            return False
        self.backends.blobs.delete(digest)
        index.forget_objects([digest])
        return True

    # -- keys too quick to store (artifactstore.formats.quick) ------------------
    def publish_quick(self, key: str, fingerprint: str, compile_secs: float) -> bool:
        """Publish that `key` compiled below ARTSTORE_MIN_COMPILE_SECS on `fingerprint`,
        so that nodes `artstore pull` prepares never look it up. Best effort: False
        (counted, logged once) if the object store refused; nothing else depends on it."""
        if self.backends.read_only or self.gate.refused:  # readers never publish
            return False
        try:
            name = quick.quick_name(fingerprint, key)
        except ValueError:  # no fingerprint digest known for this compile
            return False
        try:
            self.backends.blobs.put_record(QUICK, name, quick.encode(compile_secs))
        except Exception as exc:
            return self._unpublished(
                "quick_unpublished",
                "publish quick",
                "keys too quick to store not published (%s): nodes that `artstore pull` "
                "prepares will look them up",
                one_line(exc),
            )
        self.counters.add("quick_published")
        return True

    def _unpublished(self, counted: str, topic: str, message: str, *args: object) -> bool:
        """A record the object store refused (best effort): counted, said once; False."""
        self.counters.add(counted)
        self.backends.warn_once(topic, message, *args)
        return False

    # -- removing what a reader found bad ---------------------------------------
    def quarantine(self, entry: EntryInfo | Manifest, why: str) -> None:
        """Move a corrupt object aside and drop its entry (a writer; a reader says so)."""
        if self.backends.read_only:  # a reader moves nothing: say so, leave it to a writer
            self.backends.warn_once(
                "corrupt",
                "corrupt object %s ignored (%s); read-only, so not quarantined: "
                "run `artstore verify --repair` as a writer",
                entry.digest[:12],
                why,
            )
            return
        if not self.gate.admits(quietly=True):  # another store's index: not this one's to fix
            return
        self.backends.warn_once("corrupt", "corrupt object ignored and quarantined (%s)", why)
        try:
            self.backends.blobs.quarantine(entry.digest)
            self.backends.index.forget_objects([entry.digest])
            self.drop_entry(entry)
        except Exception as exc:
            log.debug("artifactstore: quarantine of %s failed: %s", entry.digest[:12], exc)

    def drop_entry(self, entry: EntryInfo | Manifest) -> None:
        """Remove an entry whose object is gone, so the next compile can store it again."""
        if not self.backends.read_only and self.gate.admits(quietly=True):
            try:
                self.withdraw([entry.key])
                self.backends.index.delete_entry(entry.key, digest=entry.digest)
            except ReadOnlyError:  # a store this user may only read: leave it to a writer
                pass


def remember(backends: Backends, key: str, record: Manifest, data: bytes) -> None:
    """Keep a copy in this host's tier, so later processes here load it without asking."""
    if backends.tier is None:
        return
    try:
        backends.tier.remember(key, record, data)
    except Exception as exc:  # a full or read-only disk costs the tier, nothing else
        backends.warn_once("tier", "local tier not updated: %s", one_line(exc))
