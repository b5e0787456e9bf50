"""The optional IREE packages (`pip install 'artifactstore[native]'`), imported here only.

Nothing else in artifactstore imports IREE, so an install without the `native` extra
pays nothing for it; where it is missing (or this Python has no wheel for it), the
one error says what to install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from types import ModuleType

from artifactstore.errors import ArtstoreError

INSTALL = "pip install 'artifactstore[native]'"


class NativeUnavailable(ArtstoreError):
    """IREE's compiler or runtime is not installed here."""


def _missing(package: str) -> NativeUnavailable:
    if sys.version_info < (3, 12):
        return NativeUnavailable(
            f"native modules need {package}, which has no wheel for Python "
            f"{sys.version_info[0]}.{sys.version_info[1]} (IREE publishes them for "
            f"Python 3.12 and newer): use Python 3.12+ and {INSTALL}"
        )
    return NativeUnavailable(f"native modules need {package}, not installed here: {INSTALL}")


def _module(name: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _missing(package) from exc


def compiler() -> ModuleType:
    """`iree.compiler`, or NativeUnavailable saying what to install."""
    return _module("iree.compiler", "iree-base-compiler")


def runtime() -> ModuleType:
    """`iree.runtime`, or NativeUnavailable saying what to install."""
    return _module("iree.runtime", "iree-base-runtime")


def compiler_version() -> str:
    """The installed IREE compiler's version (part of every module's key)."""
    compiler()
    return importlib.metadata.version("iree-base-compiler")


def runtime_version() -> str:
    """The installed IREE runtime's version: the compiler version whose modules it runs."""
    runtime()
    return importlib.metadata.version("iree-base-runtime")


def run_module_binary() -> str:
    """The path of the `iree-run-module` binary the runtime's wheel carries (else the
    one on PATH)."""
    import shutil
    from pathlib import Path

    libs = Path(str(runtime().__file__)).resolve().parents[1] / "_runtime_libs"
    for candidate in (libs / "iree-run-module", libs / "iree-run-module.exe"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("iree-run-module")
    if found is None:
        raise NativeUnavailable(f"iree-run-module not found beside {libs}: {INSTALL}")
    return found
