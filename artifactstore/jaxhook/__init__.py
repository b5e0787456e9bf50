"""The JAX adapter: the only package that imports `jax._src`.

`compat` decides how to call this JAX's internals (every difference between
JAX releases lives there, and the few internals `artifactstore.named` needs),
`callbacks` reads host-callback signatures, `compile` is the wrapper JAX calls
for every compile, `api` the public calls.
"""

from artifactstore.jaxhook.api import (
    active_store,
    configure,
    deactivate,
    flush,
    host_fingerprint,
    process_stats,
)

__all__ = [
    "active_store",
    "configure",
    "deactivate",
    "flush",
    "host_fingerprint",
    "process_stats",
]
