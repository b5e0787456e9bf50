"""The native part's errors, each one line for the CLI (ArtstoreError)."""

from __future__ import annotations

from artifactstore.errors import ArtstoreError


class NativeNotFound(ArtstoreError, LookupError):
    """No module (or no portable form to build one) that this host may run."""


class NativeBuildError(ArtstoreError):
    """A build refused: the function cannot go native, or the module disagrees with XLA."""


class NativeCallError(ArtstoreError, TypeError):
    """Arguments that do not fit a native module's calling convention."""
