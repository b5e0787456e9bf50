"""One working-set entry on its way to being loaded ahead (`prefetch`), and what
deserializing it takes: a jitted entry with its recorded compile options and devices,
a named one with its header's devices (`formats.named`), never options of its own.

Apart from the prefetcher's threads and claims so that what a load ahead produces
reads in one place.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from artifactstore.formats import named as named_format
from artifactstore.formats.workingset import WorkingEntry
from artifactstore.jaxhook import compat
from artifactstore.jaxhook.validate import checked_devices, checked_options

THREADS = 4  # deserializations at once: the backend's parallelism, not the host's cores


@dataclass
class Ahead:
    """One working-set entry on its way: queued, loading, then done (or given up)."""

    entry: WorkingEntry
    state: str = "queued"  # queued -> loading -> done; "taken" once the wrapper took it
    done: threading.Event = field(default_factory=threading.Event)
    executable: Any = None
    fingerprint: str = ""
    found: Any = None  # its peek of the lookup chain (store.chain.Found): counted when claimed
    header: Any = None  # a named entry's header (parsed JSON, from its verified payload)
    size: int = 0  # its serialized size, held against the bound


def deserialize(
    backend: Any, devices: dict[int, Any], entry: WorkingEntry, payload: bytes
) -> tuple[Any, Any]:
    """(executable, named header or None) of `entry`'s verified payload; (None, None)
    for a named payload that is not a native executable on `entry`'s devices. Its
    devices and options are checked against `devices` (this backend's) first: an entry
    they do not fit raises `validate.Refused` and reaches no XLA call."""
    if entry.kind == "named":
        header, body = named_format.unframe(bytes(payload))
        ids = named_format.native_devices(header)
        if ids is None or ids != entry.devices:
            return None, None
        device_list = compat.device_list(checked_devices(ids, devices))
        return backend.deserialize_executable(body, device_list, None), header
    chosen = checked_devices(entry.devices, devices)
    options = checked_options(entry.options, entry.devices)
    return backend.deserialize_executable(payload, compat.device_list(chosen), options), None


def loadable(entries: Sequence[WorkingEntry]) -> list[WorkingEntry]:
    """What is loaded ahead: never an entry with host callbacks, which a load binds to
    this trace's Python functions (the trace is not there yet)."""
    return [e for e in entries if not e.callbacks]
