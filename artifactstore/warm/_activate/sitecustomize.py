"""Startup hook for `artstore warm -- CMD`: activates the store in every Python child.

`artstore warm` puts this directory first on PYTHONPATH, so every Python
process CMD starts imports this module at startup. It does nothing unless
ARTSTORE_WARM is set; then it waits for `jax` to be imported (a meta path
finder, so processes that never import JAX, such as pip or shell helpers, pay
nothing) and calls `artifactstore.warm.child.activate()`. Any other
`sitecustomize` further down sys.path (Debian, conda) still runs: we must not
shadow it. Standard library only, and never raises into the program.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

# A copy of artifactstore.warm.ENV_VAR, the one definition (a unit test keeps them
# equal): this file runs in every Python process under `warm`, including interpreters
# without artifactstore, and imports nothing of it until JAX is imported.
ENV_VAR = "ARTSTORE_WARM"
# Real paths: this directory may be on sys.path twice, once through a symbolic link
# (a symlinked checkout or venv); with mere absolute paths `_chain` would find this very
# file again under the other name and run it, which chains to it again, without end.
_HERE = os.path.dirname(os.path.realpath(__file__))


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path, as Python would have without us."""
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py would print and go on, so do we
        print(f"Error in sitecustomize ({spec.origin}): {exc!r}", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    """Delegates to JAX's own loader and activates the store once `jax` is imported."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _activate()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _JaxImportHook(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "jax":
            return None
        _remove_hook()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)  # type: ignore[arg-type]
                return spec
        return None


_hook = _JaxImportHook()


def _remove_hook() -> None:
    if _hook in sys.meta_path:
        sys.meta_path.remove(_hook)


def _activate() -> None:
    try:
        from artifactstore.warm import child
    except Exception as exc:
        print(
            f"artstore warm: {sys.executable} cannot import artifactstore ({exc!r}); "
            "compiles in this process are not stored",
            file=sys.stderr,
        )
        return
    child.activate()


def _install() -> None:
    if not os.environ.get(ENV_VAR):
        return
    if "jax" in sys.modules:  # imported by an earlier startup hook
        _activate()
    else:
        sys.meta_path.insert(0, _hook)


_install()
_chain()
