"""Fill a torch-xla cache directory with this fingerprint's stored files, before any compile.

torch-xla has no hook on its compiles: it looks for a file named by the graph's hash in
its cache directory and loads it if there. So the files have to be there first. The
fingerprint's entries are found by name (their keys start with the fingerprint digest's
first digits: formats.torchxla), listed from this host's tier and from the store's
manifests (one LIST; a reader's credentials suffice, no database); each is fetched
through the session's one lookup chain (tier, then store: digest, envelope, fingerprint,
key, sizes and, where required, signature verified), its frame checked (the name a plain
hash that yields the entry's key) and only then placed, atomically. A placed file is not
yet a hit: the adapter claims it (counted as the chain counts a hit, an access for LRU)
when torch-xla reports that it loaded one, since a client that cannot deserialize it
(torch-xla's CPU client) compiles the graph again. Bounded: at most
MAX_FILES files and ARTSTORE_LOCAL_TIER_SIZE bytes; what is refused or over the bound is
counted, never placed. Nothing here raises into the program: a failure is a file less.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from artifactstore.blobstores.base import MANIFESTS
from artifactstore.errors import CorruptObject, one_line
from artifactstore.formats.torchxla import key_prefix, unframe
from artifactstore.process.lanes import Lane
from artifactstore.process.notices import warn_once
from artifactstore.store.chain import Found, Request

if TYPE_CHECKING:
    from artifactstore.runtime.session import Session
    from artifactstore.torch_xla.cachedir import CacheDir

log = logging.getLogger("artifactstore")

MAX_FILES = 1024  # files placed at most (a program's graphs, with room to spare)
JOBS = 8  # fetched in parallel, so at most this many payloads held at once
KIND = "torch-xla"  # the chain's request kind: no loaded-ahead JAX entry answers it


def fill(
    session: Session,
    fingerprint: str,
    directory: CacheDir,
    *,
    max_files: int = MAX_FILES,
    max_bytes: int | None = None,
) -> tuple[Counter[str], dict[str, Found]]:
    """Place `fingerprint`'s stored files in `directory`: (counts, the verified hit each
    name placed came from, in the order placed).
    Counts: listed, placed, placed_bytes, refused, over_bound, missing, failed."""
    counts: Counter[str] = Counter()
    placed: dict[str, Found] = {}
    keys = list(islice(_listed(session, fingerprint), max_files))
    counts["listed"] = len(keys)
    bound = session.settings.local_tier_bytes if max_bytes is None else max_bytes
    lock = threading.Lock()

    def count(name: str, n: int = 1) -> None:
        with lock:
            counts[name] += n

    def one(key: str) -> None:
        request = Request(key, fingerprint, kind=KIND)
        found = session.chain.peek(request)
        if found is None or found.payload is None:
            # Gone since the listing, refused for trust by a source (counted there), or
            # refused by the verifier as no torch-xla file of this key.
            store = request.store
            if store is not None and store.parts.reads.refused.get(key) == "malformed":
                count("refused")
            else:
                count("missing")
            return
        try:
            name, data = unframe(found.payload, key=key, fingerprint=fingerprint)
        except CorruptObject as exc:  # a verified object that is no torch-xla file of this key
            count("refused")
            warn_once("torch-xla-frame", "stored torch-xla file %s not used: %s", key[:12], exc)
            return
        with lock:
            if counts["placed_bytes"] + len(data) > bound:
                counts["over_bound"] += 1
                return
            counts["placed_bytes"] += len(data)
        try:
            new = directory.place(name, data)
        except Exception as exc:  # a full or refused disk costs the file, nothing else
            count("failed")
            warn_once("torch-xla-place", "torch-xla cache file not placed: %s", one_line(exc))
            return
        if new:
            with lock:
                counts["placed"] += 1
                placed[name] = found

    def guarded(key: str) -> None:
        try:
            one(key)
        except Exception as exc:
            count("failed")
            log.debug("artifactstore: torch-xla file not placed: %s", one_line(exc))

    if keys:
        fetches = Lane("torch-xla fill", min(JOBS, len(keys)), joined=True)
        for key in keys:
            fetches.submit("torch-xla fill", functools.partial(guarded, key))
        fetches.drain(None)
    return counts, placed


def _listed(session: Session, fingerprint: str) -> Iterator[str]:
    """Keys of `fingerprint`'s files: this host's tier first, then the store's manifests."""
    prefix = key_prefix(fingerprint)
    seen: set[str] = set()
    for key in [*_tier_keys(session, prefix), *_store_keys(session, prefix)]:
        if key not in seen:
            seen.add(key)
            yield key


def _tier_keys(session: Session, prefix: str) -> list[str]:
    """The keys this host's tier holds under `prefix` (one directory of its key map)."""
    tier = session.tier
    if tier is None:
        return []
    with contextlib.suppress(Exception):  # a missing or refused tier lists nothing
        return sorted(n for n in tier.tree.names(tier.keys / prefix[:2]) if n.startswith(prefix))
    return []


def _store_keys(session: Session, prefix: str) -> list[str]:
    """The keys of the store's manifests under `prefix` (a listing, bounded by the
    session's timeout; nothing while the store is unavailable)."""
    store = session.store()
    if store is None:
        return []
    try:
        listed = session.bounded(
            lambda: list(
                islice(store.parts.records.iter_records(MANIFESTS, prefix=prefix), MAX_FILES)
            )
        )
    except Exception as exc:
        warn_once("torch-xla-list", "stored torch-xla files not listed: %s", one_line(exc))
        return []
    return sorted(listed)
