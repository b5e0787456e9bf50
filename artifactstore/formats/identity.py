"""The store's identity object: `{namespace}/identity` in the object store.

Why here: its bytes are bucket input, decoded before anything binds or compares
(store.identity decides what a pair of object store and index is). Format: JSON
`{"format": "artifactstore-identity/1", "id": <8-64 letters and digits>}`, at most
MAX_IDENTITY_BYTES, created once and never replaced.
"""

from __future__ import annotations

import json

FORMAT = "artifactstore-identity/1"
MAX_IDENTITY_BYTES = 4096  # backends read at most this far (+1), so `decode` refuses more


def encode(store_id: str) -> bytes:
    return json.dumps({"format": FORMAT, "id": store_id}, sort_keys=True).encode()


def decode(data: bytes) -> str:
    """The id in an identity object; ValueError for anything else (it is bucket input)."""
    if len(data) > MAX_IDENTITY_BYTES:
        raise ValueError("identity object too large")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("identity object is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("identity object is not artifactstore's")
    store_id = doc.get("id")
    if not isinstance(store_id, str):
        raise ValueError("identity object holds no id")
    if not (8 <= len(store_id) <= 64 and store_id.isalnum()):
        raise ValueError("identity object holds an invalid id")
    return store_id
