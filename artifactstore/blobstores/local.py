"""Objects in a local (or network-mounted) directory.

Writes go to a temporary file in the same directory, are fsynced and then
renamed into place, so a reader never sees a half-written object and an object
reported as stored survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from artifactstore.blobstores import safedir
from artifactstore.blobstores.base import (
    IDENTITY,
    BlobInfo,
    BlobStore,
    RecordKind,
    is_digest_name,
)
from artifactstore.config import check_namespace
from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats.codec import check_digest
from artifactstore.formats.identity import MAX_IDENTITY_BYTES


class LocalBlobStore(BlobStore):
    def __init__(
        self,
        root: str | Path,
        namespace: str,
        *,
        modes: safedir.Modes = safedir.PRIVATE,
        top: str | Path | None = None,
        trust: safedir.Trust = "mine",
        setting: str = "ARTSTORE_URL",
    ) -> None:
        """`modes`: of what it creates; `top`, `trust`: the highest directory that must be
        this user's (`root` by default) and whose may be read (see `safedir.Tree`, which
        checks the directories on every open)."""
        self.root = Path(root)
        check_namespace(namespace)  # a path component: never "..", "/", or a newline
        self.base = self.root / namespace
        self.objects = self.base / "objects"
        self.quarantine_dir = self.base / "quarantine"
        self.modes = modes
        self.tree = safedir.Tree(
            self.root if top is None else top, modes=modes, trust=trust, setting=setting
        )

    def make_dir(self, path: Path) -> None:
        """Create `path` (a directory in this tree) and what is missing above it, checking
        every directory from `/` (UnsafeDirectory names the fix)."""
        self.tree.check(path, create=True)

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.objects / digest[:2] / digest

    def get(self, digest: str, *, max_bytes: int | None = None) -> bytes | None:
        try:
            with self.tree.open(self._path(digest)) as handle:
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
        except safedir.NotRegularFile:
            raise CorruptObject(f"object {digest[:12]} is not a regular file") from None

    def exists(self, digest: str) -> bool:
        return self.tree.is_file(self._path(digest))

    def put(self, digest: str, data: bytes) -> bool:
        path = self._path(digest)
        if self.tree.is_file(path):
            return False
        self.tree.write(path, data)
        return True

    def touch(self, digest: str) -> None:
        """Mark an object as just used (its mtime orders LRU pruning of private copies)."""
        with contextlib.suppress(FileNotFoundError):
            self.tree.touch(self._path(digest))

    def delete(self, digest: str) -> bool:
        try:
            self.tree.unlink(self._path(digest))
            return True
        except FileNotFoundError:
            return False

    def quarantine(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.tree.rename(self._path(digest), self.quarantine_dir / digest)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        yield from _scan(self.objects, nested=True)

    def iter_quarantined(self) -> Iterator[BlobInfo]:
        yield from _scan(self.quarantine_dir, nested=False)

    def _records_dir(self, kind: RecordKind) -> Path:
        return self.base / kind.directory

    def _record_path(self, kind: RecordKind, name: str) -> Path:
        kind.check_name(name)
        folder = self._records_dir(kind)
        return folder / name[:2] / name if kind.sharded else folder / name

    def get_record(self, kind: RecordKind, name: str) -> bytes | None:
        try:
            with self.tree.open(self._record_path(kind, name)) as handle:
                return handle.read(kind.max_bytes + 1)  # more is refused by its decode
        except FileNotFoundError:
            return None
        except safedir.NotRegularFile:
            return b""  # not a record: its decode refuses it

    def put_record(self, kind: RecordKind, name: str, data: bytes) -> None:
        self.tree.write(self._record_path(kind, name), data)

    def delete_records(self, kind: RecordKind, names: Sequence[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                self.tree.unlink(self._record_path(kind, name))

    def iter_records(self, kind: RecordKind, *, prefix: str = "") -> Iterator[str]:
        found = _scan(self._records_dir(kind), nested=kind.sharded, ours=kind.listed)
        return (info.digest for info in found if info.digest.startswith(prefix))

    def list_records(self, kind: RecordKind) -> Iterator[BlobInfo]:
        return _scan(self._records_dir(kind), nested=kind.sharded, ours=kind.listed)

    def get_identity(self) -> bytes | None:
        try:
            with self.tree.open(self.base / IDENTITY) as handle:
                return handle.read(MAX_IDENTITY_BYTES + 1)
        except FileNotFoundError:
            return None
        except safedir.NotRegularFile:
            return b""  # not an identity: its decode refuses it

    def delete_identity(self) -> None:
        with self.tree.dir(self.base, create=True) as base, contextlib.suppress(FileNotFoundError):
            os.unlink(IDENTITY, dir_fd=base)

    def put_identity(self, data: bytes) -> bool:
        with self.tree.dir(self.base, create=True) as base:
            tmp = f".tmp-{uuid.uuid4().hex}.part"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=base)
            try:
                os.fchmod(fd, self.modes.file)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                # A link fails where one exists: the identity is never replaced.
                os.link(tmp, IDENTITY, src_dir_fd=base, dst_dir_fd=base)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=base)
            with contextlib.suppress(OSError):  # durable before the index records it
                dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=base)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        return True

    def describe(self) -> str:
        return str(self.base)


def _scan(
    directory: Path, *, nested: bool, ours: Callable[[str], bool] = is_digest_name
) -> Iterator[BlobInfo]:
    """Files under `directory` (in its shard directories if `nested`) whose names are
    `ours` (records: their kind's names, RecordKind.listed; records' `digest` is their
    name), as S3's `_list` filters its listing."""
    if not directory.is_dir():
        return
    dirs = sorted(p for p in directory.iterdir() if p.is_dir()) if nested else [directory]
    for sub in dirs:
        with os.scandir(sub) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or not ours(name):
                    continue  # not ours: a temporary file, a stray
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    yield BlobInfo(entry.name, st.st_size, st.st_mtime)


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o600) -> None:
    """Readers see the old file or all of `data`, never a part (temp file + rename).

    `durable`: fsync the file and its directory before returning, for what was
    reported as stored; caches that can be rebuilt (key maps, journals) skip it.
    `mode`: the file's, whatever the umask: private unless a store is made
    group-readable (safedir.GROUP_READABLE). The rename replaces a symbolic link
    at `path`, never writes through it.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        os.fchmod(fd, mode)
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
