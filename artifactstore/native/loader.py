"""`load(NAME, version=)`: a stored native module as a callable over numpy arrays.

Imports neither JAX nor jaxlib: the store is read through the session's lookup chain
(the tier, then the store; each payload verified by the one verifier), the module run
by IREE's runtime. It takes the named function's arguments (the same pytrees: dicts,
tuples, lists, None; static arguments as they were built) and returns its outputs in
the same trees. Only modules built for a CPU this host has are asked for.
"""

from __future__ import annotations

from typing import Any

from artifactstore import config
from artifactstore.named import keys
from artifactstore.named.signature import Leaf, NamedCallError, check_array
from artifactstore.native import fetch, iree
from artifactstore.native.convention import Convention
from artifactstore.native.errors import NativeCallError
from artifactstore.native.runner import DRIVER, Module
from artifactstore.native.target import candidates, check_target


class NativeFunction:
    """A native module and its calling convention: called like the named function."""

    def __init__(self, convention: Convention, module: bytes, driver: str = DRIVER) -> None:
        self.convention = convention
        self.module_bytes = module
        self._module = Module(module, convention.function, driver)

    def __call__(self, *args: Any) -> Any:
        try:
            leaves = self.convention.inputs.flatten(tuple(args), path="args", check=_as_array)
        except NamedCallError as exc:
            raise NativeCallError(str(exc)) from exc
        return self.convention.outputs.unflatten(self._module(leaves))

    def __repr__(self) -> str:
        c = self.convention
        return f"NativeFunction({c.name}@{c.version}, {c.target}, cpu {c.cpu})"


def _as_array(value: Any, spec: Leaf, path: str) -> Any:
    import numpy as np

    check_array(value, spec, path)
    return np.ascontiguousarray(np.asarray(value, dtype=numpy_dtype(spec.dtype)))


def numpy_dtype(name: str) -> Any:
    """numpy's dtype for a signature's dtype name (bfloat16 and friends: ml_dtypes)."""
    import numpy as np

    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def load(
    name: str,
    version: str,
    *,
    target: str = "llvm-cpu",
    cpu: str | None = None,
    settings: config.Settings | None = None,
) -> NativeFunction:
    """NAME@VERSION's native module for this host: the one built for `cpu` (`generic`,
    `host`, or features), else this host's exact CPU, then the generic baseline.
    NativeNotFound when the store holds none this host may run; NativeUnavailable
    without IREE's runtime (`pip install 'artifactstore[native]'`)."""
    keys.check_name(name)
    keys.check_version(version)
    wanted = fetch.Wanted(name, version, check_target(target), iree.runtime_version())
    convention, module, _cpu = fetch.find(fetch.session(settings), wanted, candidates(cpu))
    return NativeFunction(convention, module)
