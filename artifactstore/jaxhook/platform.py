"""The platform fingerprint of a JAX backend's executables, computed once per backend.

Apart from the compile wrapper because the wrapper, named executables and the load
ahead (`prefetch`, which knows the platform only once JAX has a backend) all key by it.
"""

from __future__ import annotations

from typing import Any

from artifactstore.config import host as _host
from artifactstore.formats import fingerprint as _fp

_fingerprints: dict[tuple[int, str, int], _fp.Fingerprint] = {}


def backend_fingerprint(backend: Any, devices: Any = None) -> _fp.Fingerprint:
    """The fingerprint of executables `backend` builds for `devices` (default: its first)."""
    import jax
    import jaxlib

    if devices is None:
        first = backend.devices()[0]
    else:
        first = devices.flat[0] if hasattr(devices, "flat") else next(iter(devices))
    ident = (id(backend), str(first.device_kind), int(backend.device_count()))
    found = _fingerprints.get(ident)
    if found is None:
        found = _fingerprints[ident] = _host.compute(
            platform_name=str(backend.platform),
            platform_version=str(backend.platform_version),
            device_kind=str(first.device_kind),
            device_count=int(backend.device_count()),
            jax_version=jax.__version__,
            jaxlib_version=str(getattr(jaxlib, "__version__", "unknown")),
        )
    return found
