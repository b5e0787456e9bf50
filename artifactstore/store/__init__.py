"""The store: verified get / put of executables over a blob store and an index.

The Store itself lives in `facade`; this package keeps its names importable from
`artifactstore.store` but loads them on first use, so that a warm process that only
needs the local tier (`store.tier`) never imports SQLAlchemy or boto3 (issue 16).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from artifactstore.store.facade import (
        Hit,
        Store,
        encode_entry,
        keep_in_tier,
        migrates_on_open,
        open_index,
        secure_local_dirs,
    )

__all__ = [
    "Hit",
    "Store",
    "encode_entry",
    "keep_in_tier",
    "migrates_on_open",
    "open_index",
    "secure_local_dirs",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("artifactstore.store.facade"), name)
    raise AttributeError(f"module 'artifactstore.store' has no attribute {name!r}")
