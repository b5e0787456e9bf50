"""Objects in a local (or network-mounted) directory.

Writes go to a temporary file in the same directory, are fsynced and then
renamed into place, so a reader never sees a half-written object and an object
reported as stored survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from artifactstore.blobstores.base import BlobInfo, BlobStore, check_digest
from artifactstore.config import check_namespace
from artifactstore.errors import OverLimit
from artifactstore.manifest import MAX_MANIFEST_BYTES, check_key


class LocalBlobStore(BlobStore):
    def __init__(self, root: str | Path, namespace: str) -> None:
        self.root = Path(root)
        check_namespace(namespace)  # a path component: never "..", "/", or a newline
        self.base = self.root / namespace
        self.objects = self.base / "objects"
        self.quarantine_dir = self.base / "quarantine"
        self.manifests = self.base / "manifests"

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.objects / digest[:2] / digest

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        try:
            with open(self._path(digest), "rb") as handle:
                # Objects are replaced whole (rename), never appended to: the size of
                # the open file is the size read.
                size = os.fstat(handle.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise OverLimit(
                        f"object {digest[:12]} is {size} bytes, over this reader's limit "
                        f"of {max_bytes} (ARTSTORE_MAX_OBJECT_SIZE)"
                    )
                return handle.read()
        except FileNotFoundError:
            return None

    def exists(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def put(self, digest: str, data: bytes) -> bool:
        path = self._path(digest)
        if path.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        return True

    def touch(self, digest: str) -> None:
        """Mark an object as just used (its mtime orders LRU pruning of private copies)."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(digest))

    def delete(self, digest: str) -> bool:
        try:
            self._path(digest).unlink()
            return True
        except FileNotFoundError:
            return False

    def quarantine(self, digest: str) -> None:
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.replace(self._path(digest), self.quarantine_dir / digest)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        yield from _scan(self.objects, nested=True)

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        yield from _scan(self.quarantine_dir, nested=False)

    def _manifest_path(self, key: str) -> Path:
        check_key(key)
        return self.manifests / key[:2] / key

    def get_manifest(self, key: str) -> bytes | None:
        try:
            with open(self._manifest_path(key), "rb") as handle:
                return handle.read(MAX_MANIFEST_BYTES + 1)  # more is refused by its decode
        except FileNotFoundError:
            return None

    def put_manifest(self, key: str, data: bytes) -> None:
        path = self._manifest_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)

    def delete_manifests(self, keys: Sequence[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._manifest_path(key).unlink()

    def iter_manifest_keys(self) -> Iterator[str]:
        if not self.manifests.is_dir():
            return
        for shard in sorted(p for p in self.manifests.iterdir() if p.is_dir()):
            with os.scandir(shard) as entries:
                yield from (e.name for e in entries if not e.name.startswith("."))

    def describe(self) -> str:
        return str(self.base)


def _scan(directory: Path, *, nested: bool) -> Iterator[BlobInfo]:
    if not directory.is_dir():
        return
    dirs = sorted(p for p in directory.iterdir() if p.is_dir()) if nested else [directory]
    for sub in dirs:
        with os.scandir(sub) as entries:
            for entry in entries:
                if entry.name.startswith(".") or len(entry.name) != 64:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    yield BlobInfo(entry.name, st.st_size, st.st_mtime)


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


_UMASK = _umask()  # once, at import: os.umask is process-wide, not thread-safe to probe


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Readers see the old file or all of `data`, never a part (temp file + rename).

    `durable`: fsync the file and its directory before returning, for what was
    reported as stored; caches that can be rebuilt (key maps, journals) skip it.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        # mkstemp makes 0600 files: give them the mode any file of this user gets
        # (umask), so a store shared read-only with other users can be read by them.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
