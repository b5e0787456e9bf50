"""Reading a record that someone else chose: the one JSON parser for untrusted bytes.

Why one place: every record read from a bucket, a tier or a bundle (manifests, hit
journals, working sets, quick keys, lease records, named headers) is input that anyone
who may write there chose. Each decoder goes through `load_record` (bounded nesting,
UTF-8 only) or `decode_record` (that, a size bound, a version check, and one error),
so that no such byte reaches `json.loads` unchecked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from artifactstore.errors import CorruptObject

T = TypeVar("T")
# Records read from a bucket (manifests, hit journals, lease records) nest a few levels
# at most; the JSON parser recurses once per level, so deeper input is refused unparsed.
MAX_RECORD_DEPTH = 8
# A string, or an unterminated one to the end (always matching from its quote: linear).
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


def load_record(data: bytes, max_depth: int = MAX_RECORD_DEPTH) -> Any:
    """JSON from a bucket, which anyone who may write it chose: UTF-8 only, and nested
    at most `max_depth` levels, checked before parsing (in a bounded number of linear
    passes), so that no input makes the parser recurse deeply. ValueError otherwise."""
    text = data.decode("utf-8")
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(max_depth):
        brackets, pairs = _EMPTY_PAIR.subn("", brackets)
        if not pairs:
            break
    if brackets:  # JSON within the bound reduces to nothing
        raise ValueError(f"nested deeper than {max_depth} levels, or unbalanced")
    return json.loads(text)


def decode_record(
    data: bytes,
    what: str,
    max_bytes: int,
    versions: Collection[int],
    parse: Callable[[dict[str, Any]], T],
) -> T:
    """`parse` of a record from a bucket or a tier: a JSON object whose "v" is one of
    `versions`, bytes that anyone who may write there chose. Over `max_bytes` it is
    refused unread; whatever else the bytes make fail is CorruptObject naming `what`."""
    if len(data) > max_bytes:
        raise CorruptObject(f"{what} is {len(data)} bytes: over {max_bytes}")
    try:
        raw = load_record(data)
        if not isinstance(raw, dict) or raw.get("v") not in versions:
            got = raw.get("v") if isinstance(raw, dict) else "?"
            raise ValueError(f"format {str(got)[:20]}, not {'/'.join(map(str, versions))}")
        return parse(raw)
    except CorruptObject:
        raise
    except Exception as exc:  # anything the bytes can cause: RecursionError, OverflowError
        raise CorruptObject(f"{what} is unreadable ({str(exc)[:100]})") from None
