"""artifactstore: a shared, content-addressed store for compiled JAX executables.

One line routes every JAX compile in the program through the store::

    import artifactstore
    artifactstore.configure()                      # embedded default
    artifactstore.configure("s3://team-jax/cache", index="postgresql+psycopg://...")

The JAX adapter is imported on first use of these names, so that importing a
lower layer (`artifactstore.formats.codec`, `artifactstore.index.db`) loads neither it
nor JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from artifactstore.errors import ArtstoreError, ConfigError, NamedBuildError, NamedNotFound
from artifactstore.named.signature import NamedCallError
from artifactstore.named.spec import NamedSpec
from artifactstore.redact import install_log_filter

if TYPE_CHECKING:
    from artifactstore.jaxhook import configure, deactivate, flush, process_stats
    from artifactstore.named.api import NamedExecutable, compiled, load, load_many

__version__ = "0.3.0"
__all__ = [
    "ArtstoreError",
    "ConfigError",
    "NamedBuildError",
    "NamedCallError",
    "NamedExecutable",
    "NamedNotFound",
    "NamedSpec",
    "__version__",
    "compiled",
    "configure",
    "deactivate",
    "flush",
    "load",
    "load_many",
    "process_stats",
]
# Every import of any part of the package passes here first, so no log record of the
# package is written before its secrets are redacted.
install_log_filter()

_ADAPTER = frozenset({"configure", "deactivate", "flush", "process_stats"})
_NAMED = frozenset({"compiled", "load", "load_many", "NamedExecutable"})


def __getattr__(name: str) -> Any:
    if name in _ADAPTER:
        from artifactstore import jaxhook

        return getattr(jaxhook, name)
    if name in _NAMED:
        from artifactstore.named import api

        return getattr(api, name)
    raise AttributeError(f"module 'artifactstore' has no attribute {name!r}")
