"""One store operation, killed (SIGKILL, as a power cut or the OOM killer would) right
after one of its steps returns: what a crash between two steps leaves behind.

    crash_at.py put STEP KEY BYTE   # Store.put of PAYLOAD_SIZE copies of BYTE under KEY
    crash_at.py rm STEP KEY         # `artstore rm KEY`, the command itself

STEP is `blobs.METHOD` (the object store's) or `index.METHOD` (the index's):
put writes with blobs.put, index.add_entry, blobs.put_manifest; rm with
blobs.delete_manifests, index.delete_entries, blobs.delete. The store is the one the
ARTSTORE_* environment names, signed with its ARTSTORE_SIGNING_KEY. Exits 3 if the
step never ran, so a test cannot mistake a finished operation for a crash.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from artifactstore import config
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.blobstores.s3 import S3BlobStore
from artifactstore.config.host import compute
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.index.repo import EntryIndex
from artifactstore.store import Store

PAYLOAD_SIZE = 64


def fingerprint() -> Fingerprint:
    """The platform every entry of the ordering tests is built for (no JAX needed)."""
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def payload(byte: int) -> bytes:
    return bytes([byte]) * PAYLOAD_SIZE


def kill_after(step: str) -> None:
    """Make every class that implements `step` SIGKILL this process once it returns."""
    where, method = step.split(".")
    classes: list[type] = [LocalBlobStore, S3BlobStore] if where == "blobs" else [EntryIndex]
    for cls in classes:
        real: Callable[..., Any] = getattr(cls, method)

        def then_die(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            result = _real(*args, **kwargs)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(cls, method, then_die)


def main() -> None:
    operation, step, key, *rest = sys.argv[1:]
    kill_after(step)
    if operation == "put":
        store = Store.open(config.resolve({}, environ=dict(os.environ)))
        store.put(Put(key, payload(int(rest[0])), fingerprint(), "jit_f", 1.0))
    else:
        from artifactstore.cli import main as artstore

        sys.argv = ["artstore", "rm", key]
        try:
            artstore()
        except SystemExit:
            pass
    sys.exit(3)


if __name__ == "__main__":
    main()
