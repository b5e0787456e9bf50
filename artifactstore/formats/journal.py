"""Hit journals: a process's batched hits, one small object beside the manifests.

Why: a reader must not need the database (issue 16), yet LRU eviction must see
the hits of the whole cluster. So a process whose index is a database server
writes its hits (key -> count, latest access) and miss counters as a journal
object in the object store, at most once per ARTSTORE_JOURNAL_SECS and once at
exit; `artstore fold` (and every `artstore gc`) reads the journals, appends them
to the index's access rows with the same validation and clamps as any reader's
rows (index/accesses.py), and deletes them. Folding is at least once: a fold
killed between its commit and the journal's deletion counts that journal again,
which costs hit statistics, never an entry.

Journals come from readers, who are trusted less than writers, and from anyone
else who may write the bucket: a journal is at most MAX_JOURNAL_BYTES (only that
much is read; a bigger one is deleted unread), nested at most a few levels (checked
before parsing), every row is checked and clamped, and a malformed journal, whatever
it makes fail, is deleted and counted, never retried (artifactstore.gc.journals).

Format (version 1): one UTF-8 JSON object,

    {"v": 1, "a": {key: [hits, latest access as seconds since the epoch]},
     "c": {counter: count},
     "u": [[UTC day "YYYY-MM-DD", fingerprint digest or "", {field: value}], ...]}

named by 32 random hex digits (`new_name`), so that writers never collide.

"u" (usage per day and fingerprint, artifactstore.formats.usage) was added without a new
version: it is optional, so journals of clients that do not write it still fold,
and a folder that does not know it folds the rest and ignores it (a version 2 would
be deleted unread by such a folder, losing the hits of readers upgraded before it).
Counters a folder does not know are ignored the same way.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.records import decode_record
from artifactstore.formats.usage import Usage

FORMAT_VERSION = 1
MAX_JOURNAL_BYTES = 1024 * 1024
# Keys per journal: a batch beyond this waits for the next journal (bounds its size:
# about 100 bytes a row).
MAX_JOURNAL_KEYS = 8000
# The counters a journal may carry (store.account.Accounts.miss counts these for the index).
COUNTERS = frozenset(
    {
        "misses",
        "corrupt",
        "unsigned",
        "untrusted_key",
        "bad_signature",
        # Since usage rows ("u"): older folders ignore them.
        "misses_below_threshold",
        "below_threshold",
        "lease_waits",
        "lease_takeovers",
        "warm_compiles",  # since issue 38: older folders ignore it
    }
)
_NAME_RE = re.compile(r"[0-9a-f]{32}")

# key -> (hits, latest access as seconds since the epoch)
Accesses = dict[str, tuple[int, float]]


def new_name() -> str:
    return uuid.uuid4().hex


def check_journal_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a journal name: {name[:140]!r}")
    return name


@dataclass(frozen=True)
class Journal:
    accesses: Accesses = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    usage: Usage = field(default_factory=dict)

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "v": FORMAT_VERSION,
            "a": {k: [int(n), float(t)] for k, (n, t) in self.accesses.items()},
            "c": {k: int(v) for k, v in self.counts.items() if k in COUNTERS and v},
        }
        if self.usage:
            body["u"] = [
                [day.isoformat(), fingerprint, {k: v for k, v in values.items() if v}]
                for (day, fingerprint), values in self.usage.items()
            ]
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def decode(cls, data: bytes) -> Journal:
        """Strict about the shape (CorruptObject otherwise, whatever the bytes make fail);
        rows are checked by the fold."""
        return decode_record(data, "hit journal", MAX_JOURNAL_BYTES, (FORMAT_VERSION,), cls._decode)

    @classmethod
    def _decode(cls, raw: dict[str, Any]) -> Journal:
        rows, counts = raw.get("a"), raw.get("c", {})
        if not isinstance(rows, dict) or not isinstance(counts, dict):
            raise CorruptObject("hit journal without its tables")
        accesses: Accesses = {}
        for key, row in rows.items():
            if not (isinstance(row, list) and len(row) == 2 and all(_number(x) for x in row)):
                raise CorruptObject("hit journal row is not [hits, time]")
            accesses[key] = (int(row[0]), float(row[1]))
        out: dict[str, int] = {}
        for name, value in counts.items():
            if name in COUNTERS and isinstance(value, int) and not isinstance(value, bool):
                out[name] = value
        return cls(accesses, out, _decode_usage(raw.get("u", [])))


def _decode_usage(rows: object) -> Usage:
    """The optional "u" table; its values are checked and clamped by the fold."""
    if not isinstance(rows, list):
        raise CorruptObject("hit journal usage is not a list")
    usage: Usage = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)):
            raise CorruptObject("hit journal usage row is not [day, fingerprint, counts]")
        day_text, fingerprint, values = row
        if not isinstance(fingerprint, str) or not isinstance(values, dict):
            raise CorruptObject("hit journal usage row is not [day, fingerprint, counts]")
        try:
            day = date.fromisoformat(day_text)
        except ValueError:
            raise CorruptObject("hit journal usage row without a day") from None
        if not all(_number(v) for v in values.values()):
            raise CorruptObject("hit journal usage counts are not numbers")
        target = usage.setdefault((day, fingerprint), {})
        for name, value in values.items():
            target[str(name)] = target.get(str(name), 0) + value
    return usage


def _number(value: object) -> bool:
    """A finite JSON number that fits a float (a 400-digit integer does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return math.isfinite(value)
