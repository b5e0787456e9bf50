"""The private directory torch-xla's persistent cache uses in this process.

torch-xla loads any file in its cache directory whose name is a graph's hash, without
checking anything. So the directory is this process's own: made under the user's cache
directory (or ARTSTORE_LOCAL_TIER) through checked directories (blobstores.safedir:
this user's, writable by no one else), one per fingerprint and process
(`torch-xla/<fingerprint>/<host>-<pid>-<random>`), filled only with files this process
verified (`place`: a temporary file renamed into place, so torch-xla never reads half
of one), and removed at exit. Nothing an earlier process left is ever served: a directory
whose process is gone (same host, pid no longer running) is removed at the next start.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from artifactstore.blobstores import safedir
from artifactstore.config import Settings, default_cache_dir
from artifactstore.formats.torchxla import check_file_name

_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:32] or "host"
_PROCESS_DIR = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}")


@dataclass(frozen=True)
class CacheFile:
    name: str
    size: int
    mtime_ns: int


class CacheDir:
    """One process's torch-xla cache directory, reached through a checked tree."""

    def __init__(self, tree: safedir.Tree, path: Path) -> None:
        self.tree = tree
        self.path = path

    @classmethod
    def make(cls, settings: Settings, fingerprint: str) -> CacheDir:
        """A new, empty directory for this process; UnsafeDirectory (one line, its fix)
        where the place is not this user's alone, OSError where it cannot be made."""
        configured = settings.local_tier if settings.local_tier != "off" else None
        top = Path(os.path.realpath(configured or default_cache_dir()))
        setting = "ARTSTORE_LOCAL_TIER" if configured else ""
        tree = safedir.Tree(top, setting=setting)
        parent = top / "torch-xla" / fingerprint[:24]
        tree.check(parent, create=True)
        _remove_stale(tree, parent)
        path = parent / f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tree.check(path, create=True)
        return cls(tree, path)

    def place(self, name: str, data: bytes) -> bool:
        """Put verified `data` where torch-xla looks for graph `name`, whole or not at
        all (temporary file, rename); False where a file of that name is there already."""
        target = self.path / check_file_name(name)
        if self.tree.is_file(target):
            return False
        self.tree.write(target, data, durable=False)
        return True

    def files(self) -> list[CacheFile]:
        """The cache files torch-xla left here (names that are graph hashes; regular
        files only), with their sizes and modification times."""
        out = []
        with self.tree.dir(self.path) as held:
            for name in self.tree.names(self.path):
                try:
                    check_file_name(name)
                    st = os.stat(name, dir_fd=held, follow_symlinks=False)
                except (ValueError, OSError):
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append(CacheFile(name, st.st_size, st.st_mtime_ns))
        return out

    def read(self, name: str) -> bytes:
        return self.tree.read(self.path / check_file_name(name))

    def remove(self) -> None:
        """Remove the directory and what is in it (at exit)."""
        shutil.rmtree(self.path, ignore_errors=True)


def _remove_stale(tree: safedir.Tree, parent: Path) -> None:
    """Remove the directories of processes of this host that are no longer running."""
    with contextlib.suppress(OSError):
        for name in tree.names(parent):
            found = _PROCESS_DIR.fullmatch(name)
            if found is None or found["host"] != _HOST or _running(int(found["pid"])):
                continue
            shutil.rmtree(parent / name, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process of that pid: running
        return True
    return True
