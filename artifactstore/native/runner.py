"""A native module run by IREE's runtime (no JAX): numpy arrays in, numpy arrays out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from artifactstore.native import iree

DRIVER = "local-task"  # IREE's CPU driver (a thread pool); `local-sync`: the caller's thread


class Module:
    """One loaded module's entry function, called with flat arrays."""

    def __init__(self, vmfb: bytes, function: str = "main", driver: str = DRIVER) -> None:
        runtime = iree.runtime()
        self._bound = runtime.load_vm_flatbuffer(vmfb, driver=driver)
        self._function = self._bound[function]

    def __call__(self, arrays: Sequence[Any]) -> list[Any]:
        """The module's outputs, flattened, as numpy arrays."""
        import numpy as np

        result = self._function(*arrays)
        if result is None:
            return []
        items = result if isinstance(result, (tuple, list)) else (result,)
        return [np.asarray(item.to_host() if hasattr(item, "to_host") else item) for item in items]
