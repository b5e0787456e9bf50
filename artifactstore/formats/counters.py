"""The names a process counts under, each declared once with what it means.

One table, because the readers must agree: `process_stats()` is a snapshot of the
process's one counting object (`artifactstore.process.counters.Counters`), the
`artstore run` and pytest summaries add up those snapshots, the Prometheus metrics
are fed from the same counts (`metric` below), `artstore stats --json` names the
index's totals with the same names, and the reference docs are generated from here.
Here, not beside the counting object, because the metrics sit below the store.

A name is counted (by the one part of the code that sees the event), or `sum_of`
others (computed at snapshot time), or a state read at snapshot time (`active`).
`stored_as`: its name in the index's counters and usage rows and in hit journals
(formats.usage, formats.journal), for the names that go there; the 0.3 names stay
there: a lookup that found nothing is `misses` there, `lookups_missed` here (where
`misses` are the compiles the store could have served).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Name:
    meaning: str
    metric: str | None = None  # the process metric it feeds (artifactstore.metrics.COUNTERS)
    label: str | None = None  # its second label: a hit's tier, an error's kind (else the name)
    stored_as: str | None = None  # its name in the index and hit journals; None: not there
    sum_of: tuple[str, ...] = ()  # a sum of other names, made at snapshot time
    always: bool = False  # in every process snapshot, 0 or not


_ERRORS = "artstore_errors"


def _refused(what: str, stored_as: str | None = None) -> Name:
    return Name(what, _ERRORS, stored_as=stored_as)


NAMES: dict[str, Name] = {
    # -- hits and misses: one meaning everywhere (docs/operations.md, "Stats") ---------
    "hits": Name(
        "executables served instead of compiled: store_hits + tier_hits + quick_loads",
        sum_of=("store_hits", "tier_hits", "quick_loads"),
    ),
    "store_hits": Name("hits the store served", "artstore_hits", "store", stored_as="hits"),
    "tier_hits": Name("hits this host's tier served", "artstore_hits", "local"),
    "quick_loads": Name(
        "compiles under ARTSTORE_MIN_COMPILE_SECS that this host kept, loaded from its tier",
        "artstore_hits",
        "local",
    ),
    "loads": Name("executables the program loaded (jit, named, torch-xla's)", always=True),
    "compiles": Name(
        "XLA compiles of programs routed through the store (torch-xla's included)",
        "artstore_compiles",
        always=True,
    ),
    "misses": Name(
        "compiles the store could have served (quick compiles are not misses)",
        "artstore_misses",
        always=True,
    ),
    "quick_compiles": Name(
        "compiles under ARTSTORE_MIN_COMPILE_SECS: never stored, not misses",
        "artstore_quick_compiles",
        stored_as="below_threshold",
    ),
    "quick_kept": Name(
        "of the quick compiles, kept in this host's tier (never in the store): loaded next time"
    ),
    "lookups_missed": Name(
        "store lookups that found nothing usable, quick compiles' too",
        stored_as="misses",
        always=True,
    ),
    "misses_below_threshold": Name(
        "lookups missed whose compile then was a quick one", stored_as="misses_below_threshold"
    ),
    "warm_compiles": Name(
        "lookups missed while warming the store (`artstore warm`): not misses",
        stored_as="warm_compiles",
    ),
    "compile_ms": Name("milliseconds XLA spent compiling", always=True),
    "compile_ms_saved": Name(
        "milliseconds of compiling the loaded executables took where they were built", always=True
    ),
    "bytes_fetched": Name(
        "object bytes read from the object store",
        "artstore_bytes_fetched",
        stored_as="bytes_fetched",
    ),
    # -- why a lookup found nothing usable (each is also a lookup missed) --------------
    "fingerprint_mismatch": _refused("an entry built for another platform fingerprint"),
    "wrong_entry": _refused("a manifest or row naming another key's object"),
    "callback_mismatch": _refused("an executable stored for another number of host callbacks"),
    "malformed": _refused("a verified entry whose payload is not of the kind it names"),
    "over_limit": _refused("bigger than ARTSTORE_MAX_OBJECT_SIZE / _EXECUTABLE_SIZE"),
    "missing_object": _refused("an entry whose object is gone"),
    "corrupt": _refused("an object that failed its digest: quarantined", stored_as="corrupt"),
    "bad_manifest": _refused("a damaged manifest"),
    "unsigned": _refused(
        "refused: not signed, while ARTSTORE_TRUSTED_KEYS is set", stored_as="unsigned"
    ),
    "untrusted_key": _refused(
        "refused: signed by a key ARTSTORE_TRUSTED_KEYS does not list", stored_as="untrusted_key"
    ),
    "bad_signature": _refused(
        "refused: a signature that does not verify", stored_as="bad_signature"
    ),
    "secret_key_listed": _refused("refused: ARTSTORE_TRUSTED_KEYS lists the signer's secret"),
    "load_errors": Name("verified executables JAX could not deserialize", _ERRORS, "load"),
    # -- this host's tier: its refusals -------------------------------------------------
    "tier_unsigned": _refused("a tier copy refused: not signed"),
    "tier_untrusted_key": _refused("a tier copy refused: signed by an untrusted key"),
    "tier_bad_signature": _refused("a tier copy refused: its signature does not verify"),
    "tier_secret_key_listed": _refused("a tier copy refused: a secret key listed as trusted"),
    "tier_wrong_entry": _refused("a tier key file naming another key's object"),
    # -- writes -------------------------------------------------------------------------
    "stored": Name("entries this process created", "artstore_stored"),
    "bytes_uploaded": Name("object bytes written to the object store", "artstore_bytes_uploaded"),
    "already_present": Name("puts of entries another process had stored"),
    "refused_present": Name("puts of entries present but refused here (their signature)"),
    "replaced_refused": Name("refused entries replaced by this process's signed ones"),
    "manifest_republished": Name("manifests published again for entries that had none"),
    "manifest_unpublished": _refused("entries stored whose manifest could not be published"),
    "manifest_withdrawn": Name("manifests withdrawn for entries being removed"),
    "quick_published": Name("keys published as too quick to store"),
    "quick_unpublished": _refused("quick keys that could not be published"),
    "put_errors": Name("uploads that failed", _ERRORS, "put"),
    "put_skipped": _refused("uploads dropped while the backend was failing"),
    "skipped_read_only": Name("compiles not stored: ARTSTORE_READ_ONLY"),
    "skipped_unsigned": Name(
        "compiles not stored: signatures required, ARTSTORE_SIGNING_KEY not set"
    ),
    "kept_in_tier": Name("compiled while the store was down: kept in this host's tier"),
    "store_mismatch": Name("writes refused: object store and index are not one store"),
    "named_removed_not_stored": Name("named builds of a removed version: not stored"),
    "named_removal_ignored": Name(
        "removal records ignored: not signed by a trusted key where signatures are required"
    ),
    # -- compile leases (single-flight) ---------------------------------------------------
    "lease_waits": Name(
        "compiles that waited for another process's lease",
        "artstore_lease_waits",
        stored_as="lease_waits",
    ),
    "lease_takeovers": Name(
        "expired leases taken over", "artstore_lease_takeovers", stored_as="lease_takeovers"
    ),
    "lease_loaded": Name("waits that ended with the other process's executable"),
    "lease_timeouts": Name("waits that ran out of time (compiled here)"),
    "lease_stale": Name("leases whose holder was dead (expired, or exited on this host)"),
    "lease_skipped": Name("misses not waited on: this process trusts no key, loads nothing"),
    "lease_errors": Name("lease operations that failed (compiled without one)"),
    "bad_lease_records": Name("lease records refused as damaged"),
    # -- loading ahead (jaxhook.prefetch) ---------------------------------------------
    "prefetched": Name("executables of the last run's working set loaded ahead"),
    "prefetch_used": Name("of those, asked for by the program"),
    "prefetch_unused": Name("of those, never asked for"),
    "prefetch_early": Name("fetched while JAX initialized"),
    "prefetch_over_bound": Name("not loaded ahead: over the memory bound"),
    "prefetch_refused": Name("loaded ahead, but asked for with other options or callbacks"),
    "prefetch_refused_options": Name("not loaded ahead: options or devices unfit for this backend"),
    "prefetch_refused_set": Name("working sets refused (unsigned, untrusted)"),
    # -- torch-xla's persistent cache (artifactstore.torch_xla): its files are entries;
    # torch-xla's own counters also count as the process's loads, misses and compiles --
    "torch_xla_listed": Name("stored torch-xla files listed for this platform (tier, store)"),
    "torch_xla_placed": Name(
        "stored torch-xla files placed in its cache (verified; each a hit once loaded)"
    ),
    "torch_xla_placed_bytes": Name("bytes of the torch-xla files placed"),
    "torch_xla_refused": _refused("stored torch-xla files not placed: not this key's file"),
    "torch_xla_over_bound": Name("torch-xla files not placed: over ARTSTORE_LOCAL_TIER_SIZE"),
    "torch_xla_missing": Name("torch-xla files listed, then gone or refused (counted there)"),
    "torch_xla_failed": Name("torch-xla files not placed: the disk refused"),
    "torch_xla_queued": Name("torch-xla files handed to the store (`stored` counts them)"),
    "torch_xla_over_limit": Name("torch-xla files not stored: over ARTSTORE_MAX_EXECUTABLE_SIZE"),
    "torch_xla_below_threshold": Name("torch-xla files not stored: quicker to compile"),
    "torch_xla_cache_hits": Name(
        "torch-xla's PersistentCacheHit: graphs it loaded (loads; placed files' hits)"
    ),
    "torch_xla_cache_misses": Name(
        "torch-xla's PersistentCacheMiss: graphs it found no file of (misses, compiles)"
    ),
    "torch_xla_cache_deserialize_failures": Name(
        "torch-xla's PersistentCacheDeserializeFailure: a file it could not load (misses, compiles)"
    ),
    # -- native modules (artifactstore.native): each also a store's or tier's hit --------
    "native_loads": Name(
        "native modules served to `native get` / `native.load` (verified, the one asked for)"
    ),
    "native_not_found": Name("native module lookups that found none for this host's CPUs"),
    # -- circuit breakers ---------------------------------------------------------------
    "breaker_opened": Name(
        "times a backend's breaker opened",
        sum_of=("breaker_opened_index", "breaker_opened_object_store"),
    ),
    "breaker_opened_index": Name("times the index's breaker opened", _ERRORS, "breaker_open_index"),
    "breaker_opened_object_store": Name(
        "times the object store's breaker opened", _ERRORS, "breaker_open_object_store"
    ),
    "breaker_refused": Name("lookups refused while a backend's breaker was open"),
    "active": Name("1 unless a backend's breaker is open (a state, read at snapshot time)"),
}

# 0.3's names of fields since renamed: `stats --json` and process_stats() carry them
# (the same value) for one release more, deprecated; gone in REMOVED_IN.
DEPRECATED: dict[str, str] = {"eligible_misses": "misses", "below_threshold": "quick_compiles"}
REMOVED_IN = "0.5"


def stored_name(name: str) -> str | None:
    """`name` as the index and hit journals call it; None if it does not go there."""
    entry = NAMES.get(name)
    return entry.stored_as if entry is not None else None


def with_aliases(fields: Mapping[str, T]) -> dict[str, T]:
    """`fields` and, for one release, the deprecated 0.3 name of each renamed one."""
    out = dict(fields)
    out.update({old: fields[new] for old, new in DEPRECATED.items() if new in fields})
    return out


def snapshot(counts: Mapping[str, float], states: Mapping[str, int]) -> dict[str, int]:
    """The flat, documented view of `counts`: what was counted (rounded), the sums, the
    states, the names every snapshot has (0 or not), and the deprecated aliases."""
    out = {name: round(value) for name, value in counts.items() if value}
    for name, entry in NAMES.items():
        if entry.sum_of and any(out.get(part) for part in entry.sum_of):
            out[name] = sum(out.get(part, 0) for part in entry.sum_of)
        elif entry.always:
            out.setdefault(name, 0)
    out.update(states)
    return with_aliases(out)
