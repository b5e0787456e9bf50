"""torch_xla.runtime.initialize_cache as torch-xla's (environment variables), or failing
where FAKE_TORCH_XLA_INIT=fail."""

from __future__ import annotations

import os


def initialize_cache(path: str, readonly: bool = False) -> None:
    if os.environ.get("FAKE_TORCH_XLA_INIT") == "fail":
        raise ZeroDivisionError("initialize_cache failed")
    os.environ["XLA_PERSISTENT_CACHE_PATH"] = path
    os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1" if readonly else "0"
