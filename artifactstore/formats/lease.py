"""Compile lease records: the object-store mirror of a compile lease, polled by waiters.

Why here: a record is bytes anyone who may write the bucket chose (format version 1),
decoded before single-flight (store.flight) or gc decides anything by it; how long a
waiter trusts one is its own settings' (store.lease), never the record's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from artifactstore.errors import CorruptObject, one_line
from artifactstore.formats.records import load_record

FORMAT_VERSION = 1
MAX_LEASE_BYTES = 1024


@dataclass(frozen=True)
class LeaseRecord:
    """`{"v": 1, "holder": "host:pid", "beat": n, "ttl": secs, "state": "compiling" |
    "abandoned", "hint": secs | null, "at": unix secs}` (`at`, the holder's clock at its
    last beat, is optional: older writers leave it out)."""

    holder: str
    beat: int
    ttl: float
    state: str = "compiling"
    hint: float | None = None
    at: float | None = None

    def encode(self) -> bytes:
        body = {
            "v": FORMAT_VERSION,
            "holder": self.holder,
            "beat": self.beat,
            "ttl": self.ttl,
            "state": self.state,
            "hint": self.hint,
        }
        if self.at is not None:
            body["at"] = round(self.at, 3)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord:
        try:  # CorruptObject whatever the bytes (a bucket writer's) make fail
            raw = load_record(data[: MAX_LEASE_BYTES + 1])
            if len(data) > MAX_LEASE_BYTES or raw.get("v") != FORMAT_VERSION:
                raise ValueError("not a version 1 lease record")
            hint, beat, at = raw.get("hint"), raw["beat"], raw.get("at")
            if isinstance(beat, bool) or not isinstance(beat, int) or not 0 <= beat < 2**63:
                raise ValueError("beat is not a count")
            record = cls(
                holder=str(raw["holder"])[:255],
                beat=beat,
                ttl=float(raw["ttl"]),
                state=str(raw["state"]),
                hint=None if hint is None else float(hint),
                at=None if at is None else float(at),
            )
        except Exception as exc:  # ValueError, OverflowError, RecursionError, ...
            raise CorruptObject(f"bad lease record ({one_line(exc)})") from None
        if record.state not in ("compiling", "abandoned") or not (
            math.isfinite(record.ttl) and record.ttl > 0
        ):
            raise CorruptObject("bad lease record (state or ttl)")
        if record.at is not None and not math.isfinite(record.at):
            raise CorruptObject("bad lease record (at)")
        return record

    def shown_holder(self) -> str:
        """The holder, as a log line may show it (untrusted text: no control characters)."""
        return re.sub(r"[^A-Za-z0-9._:@-]", "?", self.holder[:80]) or "?"
