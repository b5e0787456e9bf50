"""artifactstore: a shared, content-addressed store for compiled JAX executables.

One line routes every JAX compile in the program through the store::

    import artifactstore
    artifactstore.configure()                      # embedded default
    artifactstore.configure("s3://team-jax/cache", index="postgresql+psycopg://...")
"""

from __future__ import annotations

from artifactstore.errors import ArtstoreError, ConfigError
from artifactstore.jax_integration import configure, deactivate, flush, process_stats

__version__ = "0.1.0"
__all__ = [
    "ArtstoreError",
    "ConfigError",
    "__version__",
    "configure",
    "deactivate",
    "flush",
    "process_stats",
]
