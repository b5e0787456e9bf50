"""torch-xla's persistent compilation cache, served by the store (`pip install
'artifactstore[torch-xla]'`).

One call, before the program's first computation (where `xr.initialize_cache` would go;
in each process of `xmp.spawn`, in its function)::

    import artifactstore.torch_xla
    artifactstore.torch_xla.enable("s3://team-cache/jax", index="postgresql+psycopg://...")

or none: with ARTSTORE_URL set (or under `artstore run`), importing torch_xla turns it on.
This process's torch-xla then finds every graph the team stored for this platform in its
cache directory, and what it compiles is stored for the others. Importing this package
imports neither torch nor torch_xla; `enable()` imports torch_xla.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from artifactstore.config import Settings

if TYPE_CHECKING:
    from artifactstore.formats.fingerprint import Fingerprint

__all__ = ["disable", "enable", "host_fingerprint", "stats"]


def enable(
    url: str | None = None,
    *,
    index: str | None = None,
    namespace: str | None = None,
    read_only: bool | None = None,
    **options: Any,
) -> Settings | None:
    """Serve torch-xla's persistent cache from the store in this process.

    Arguments as `artifactstore.configure()`'s (each an `ARTSTORE_*` setting, which they
    override). `read_only=True`: a worker that loads and never stores (torch-xla's cache
    is then read only too). Returns the settings in force, or None where torch-xla
    compiled already or the store cannot be used (one log line; compiling as usual).
    Raises ConfigError at once for a malformed URL or unknown option.
    """
    from artifactstore.torch_xla import adapter

    given = {"url": url, "index": index, "namespace": namespace, "read_only": read_only}
    return adapter.enable({**given, **options}, explicit=True)


def disable() -> None:
    """Stop storing what torch-xla compiles (what it wrote so far is stored first)."""
    from artifactstore.torch_xla import adapter

    adapter.disable()


def stats() -> dict[str, int]:
    """This process's counts: the store's (hits, ...), the files placed and stored
    (`torch_xla_*`), and torch-xla's own cache counters (`torch_xla_cache_*`)."""
    from artifactstore.torch_xla import adapter

    current = adapter.current()
    return current.stats() if current is not None else {}


def host_fingerprint() -> Fingerprint:
    """This host's fingerprint for torch-xla's executables, as `enable()` computes it
    (imports torch_xla, opens no device): `artstore fingerprint --torch-xla` prints it,
    `artstore pull --torch-xla` fills this host's tier with its entries."""
    import torch_xla  # noqa: F401  (it chooses PJRT_DEVICE when imported)

    from artifactstore.torch_xla.platform import fingerprint

    return fingerprint()
