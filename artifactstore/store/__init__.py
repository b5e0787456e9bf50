"""The store: verified get / put of executables over a blob store and an index.

`Store` (facade) composes the parts: backends, read, write, account, uploads,
flight. This package keeps their public names importable from `artifactstore.store`
but loads them on first use, so that a warm process that only needs the local tier
(`store.tier`) never imports SQLAlchemy or boto3 (issue 16). It imports nothing
itself: a part may import the package's lazy names without an import circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from artifactstore.store.backends import migrates_on_open, open_index, secure_local_dirs
    from artifactstore.store.chain import Found, Missed
    from artifactstore.store.facade import Store
    from artifactstore.store.parts import Parts, StoreParts
    from artifactstore.store.tiers import encode_entry, keep_in_tier

# Each lazy name and the module that defines it.
_HOMES = {
    "Found": "artifactstore.store.chain",
    "Missed": "artifactstore.store.chain",
    "Parts": "artifactstore.store.parts",
    "Store": "artifactstore.store.facade",
    "StoreParts": "artifactstore.store.parts",
    "encode_entry": "artifactstore.store.tiers",
    "keep_in_tier": "artifactstore.store.tiers",
    "migrates_on_open": "artifactstore.store.backends",
    "open_index": "artifactstore.store.backends",
    "secure_local_dirs": "artifactstore.store.backends",
}
__all__ = [
    "Found",
    "Missed",
    "Parts",
    "Store",
    "StoreParts",
    "encode_entry",
    "keep_in_tier",
    "migrates_on_open",
    "open_index",
    "secure_local_dirs",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'artifactstore.store' has no attribute {name!r}")
