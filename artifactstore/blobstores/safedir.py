"""Directories this process writes (the local tier, a local store) and files it loads from them.

Why: these directories hold executables that the process loads and runs. A
tier's name is predictable (a hash of the store's identity under the cache
directory), so on a shared host another user could create it first, find it
writable, or rename it away (from a directory above it they can write) and put
a link to theirs in its place, even while a process runs. Hence, on every open:

- the path is walked from `/` one directory at a time through file descriptors
  (`O_DIRECTORY | O_NOFOLLOW`, each opened relative to the last), each checked
  by `fstat` as it is held: a directory renamed or swapped for a link after one
  open is refused at the next, never followed;
- every directory from `top` (the configured root: the cache directory,
  `ARTSTORE_LOCAL_TIER`, the store) down must be a real directory (no symbolic
  link) owned by this user and writable by no one else; missing ones are
  created with a private mode (0700; a store may be made group-readable, never
  group-writable);
- a store owned by another user may be read, if no one but its owner can
  write it: root's always, anyone else's only by a read-only process that loads
  nothing but entries signed by keys it trusts (blobstores.store_trust);
- no directory above `top` may be writable by its group or by every user,
  unless it is root's and sticky (like /tmp): others could rename ours away;
- files are opened without following symbolic links, and must be regular files.

Symbolic links above `top` are resolved once, when the tree is made (a
configured /home -> /u/home). Existing directories are never chmod-ed: a
refusal names the fix instead. The walk costs a few microseconds per directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from artifactstore.errors import UnsafeDirectory


@dataclass(frozen=True)
class Modes:
    """Modes of the directories and files created in one tree."""

    dir: int = 0o700
    file: int = 0o600


# Whose directories are trusted: "mine" for what this process writes (a tier, a store
# it writes), "mine_or_root" for a store it reads (read if not writable here: root can
# change anything anyway), "any" for a store read-only with signatures required and
# keys trusted, where the files decide nothing (blobstores.store_trust).
Trust = Literal["mine", "mine_or_root", "any"]

PRIVATE = Modes()
# ARTSTORE_GROUP_READABLE: a store shared read-only with the directory's group.
GROUP_READABLE = Modes(dir=0o750, file=0o640)

# A directory held only to open what is in it (O_PATH where there is one: no read
# permission needed on an ancestor such as a mode-711 home), never through a link.
_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_UNSAFE = stat.S_IWGRP | stat.S_IWOTH


def store_modes(group_readable: bool) -> Modes:
    """Modes of a local store's new directories and files (ARTSTORE_GROUP_READABLE)."""
    return GROUP_READABLE if group_readable else PRIVATE


class NotRegularFile(OSError):
    """A symbolic link, device or FIFO where a file of ours belongs: never followed."""


class Tree:
    """A directory `top` and what is below it, reached only through checked directories.

    `trust`: whose directories from `top` down are accepted; `modes`: of what is
    created; `setting`: the option that chose the place, named in refusals."""

    def __init__(
        self,
        top: str | Path,
        *,
        modes: Modes = PRIVATE,
        trust: Trust = "mine",
        setting: str = "",
    ) -> None:
        self.top = Path(os.path.abspath(top))
        self._real = Path(os.path.realpath(self.top))  # the one resolution of links
        self.modes = modes
        self.trust: Trust = trust
        self.setting = setting
        real = self._real.parts[1:]
        self._to_top = [*((p, False) for p in real[:-1]), *((p, True) for p in real[-1:])]
        self._prefix = os.path.join(self.top, "")

    def _steps(self, path: Path) -> list[tuple[str, bool]]:
        """(name, at or below top?) for each directory from `/` down to `path`."""
        full = os.path.abspath(path)
        if full == str(self.top):
            return self._to_top
        if not full.startswith(self._prefix):
            raise ValueError(f"{path} is not in {self.top}")
        return self._to_top + [(p, True) for p in full[len(self._prefix) :].split(os.sep)]

    @contextlib.contextmanager
    def dir(self, path: Path, *, create: bool = False) -> Iterator[int]:
        """A descriptor of directory `path`, every directory to it checked as it is held.

        Raises FileNotFoundError (missing, and not `create`), UnsafeDirectory naming the
        fix, NotADirectoryError (a file in the way)."""
        fd = self._open_dir(path, create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, path: Path, create: bool) -> int:
        steps = self._steps(path)
        fd = os.open("/", _DIR)
        try:
            where = ""
            self._check(fd, "/", own=len(self._real.parts) == 1)  # top is /
            for name, own in steps:
                where = f"{where}/{name}"
                child = self._step(fd, name, where, own=own, create=create)
                os.close(fd)
                fd = child
        except PermissionError as exc:  # named by the whole path: `name` alone says nothing
            os.close(fd)
            raise PermissionError(exc.errno, exc.strerror, os.path.abspath(path)) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check(self, path: Path, *, create: bool = False) -> bool:
        """Whether `path` is there (made when `create`) and safe; raises as `dir` does."""
        try:
            with self.dir(path, create=create):
                return True
        except FileNotFoundError:
            if create:
                raise
            return False

    def _step(self, parent: int, name: str, where: str, *, own: bool, create: bool) -> int:
        """Open `name` in `parent`, checked; made first if missing and `create`."""
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            mode = self.modes.dir if own else 0o700  # as XDG asks of a missing cache dir
            with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                os.mkdir(name, mode, dir_fd=parent)
                os.chmod(name, mode, dir_fd=parent)  # whatever the umask
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                raise self._refuse(
                    where, "is a symbolic link", f"remove it (`rm {where}`)"
                ) from None
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(where)) from None
        try:
            self._check(fd, where, own=own)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check(self, fd: int, where: str, *, own: bool) -> None:
        st = os.fstat(fd)
        me = os.geteuid()
        if not st.st_mode & _UNSAFE and stat.S_ISDIR(st.st_mode) and (not own or st.st_uid == me):
            return  # the common case, first
        if stat.S_ISLNK(st.st_mode):  # O_PATH without O_DIRECTORY support: never followed
            raise self._refuse(where, "is a symbolic link", f"remove it (`rm {where}`)")
        if not own:
            if st.st_mode & _UNSAFE and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
                raise self._refuse(
                    where,
                    "is writable by other users, and not sticky and owned by root as /tmp is, "
                    "so they could swap what is below it for theirs",
                    f"run `chmod go-w {where}`",
                )
            return
        trust = self.trust
        if trust != "any" and st.st_uid != me and not (trust == "mine_or_root" and st.st_uid == 0):
            # Never advise trusting it more (read-only, signatures off): its owner may be
            # the one who planted it. A store another user publishes is read with its
            # writers' keys trusted and signatures required (store_trust).
            fix = "use a directory of your own (another user may have made this one to plant "
            fix += "executables)"
            raise self._refuse(
                where, f"is owned by uid {st.st_uid}, not by this user (uid {me})", fix
            )
        if st.st_mode & _UNSAFE:
            raise self._refuse(
                where,
                "is writable by other users, who could plant executables in it",
                f"run `chmod go-w {where}`",
            )

    def _refuse(self, path: str, problem: str, fix: str) -> UnsafeDirectory:
        where = f", or set {self.setting} to a directory of yours" if self.setting else ""
        return UnsafeDirectory(f"{path} {problem}: {fix}{where}")

    # -- files, each opened in its checked directory ------------------------------
    def open(self, path: Path) -> BinaryIO:
        """`path` for reading, never through a link, a regular file only: FileNotFoundError
        when it (or a directory to it) is missing, NotRegularFile (an OSError) for a link
        or anything else, UnsafeDirectory as `dir`."""
        parent = self._open_dir(path.parent, False)
        try:
            fd = os.open(path.name, _FILE | os.O_NONBLOCK, dir_fd=parent)  # a FIFO: no wait
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotRegularFile(errno.ELOOP, "a symbolic link", str(path)) from None
            raise
        finally:
            os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def read(self, path: Path) -> bytes:
        """The bytes of `path`, opened as `open` does."""
        with self.open(path) as handle:
            return handle.read()

    def write(self, path: Path, data: bytes, *, durable: bool = True) -> None:
        """Readers see the old file or all of `data`, never a part (temp file + rename),
        in `path`'s checked directory (made if missing), with `modes.file` whatever the
        umask. `durable`: fsync file and directory, for what was reported as stored."""
        with self.dir(path.parent, create=True) as parent:
            tmp = f".tmp-{uuid.uuid4().hex}.part"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE, 0o600, dir_fd=parent)
            try:
                os.fchmod(fd, self.modes.file)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    if durable:
                        handle.flush()
                        os.fsync(handle.fileno())
                os.replace(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            if durable:
                with contextlib.suppress(OSError):
                    dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)

    def unlink(self, path: Path) -> None:
        """Remove file `path` from its checked directory (FileNotFoundError if missing)."""
        with self.dir(path.parent) as parent:
            os.unlink(path.name, dir_fd=parent)

    def rename(self, src: Path, dst: Path) -> bool:
        """Rename `src` to `dst` (made missing parents of `dst`), both in checked directories
        (FileNotFoundError if `src` is missing); True, for callers that test it."""
        with self.dir(src.parent) as old, self.dir(dst.parent, create=True) as new:
            os.replace(src.name, dst.name, src_dir_fd=old, dst_dir_fd=new)
        return True

    def touch(self, path: Path) -> None:
        """Set `path`'s times to now (not through a link; FileNotFoundError if missing)."""
        with self.dir(path.parent) as parent:
            os.utime(path.name, dir_fd=parent, follow_symlinks=False)

    def claim(self, path: Path, suffix: str) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) of each file `*suffix` in directory `path` (none if it is missing),
        each claimed by an atomic rename and removed after it is read, so that two
        processes never both take one; one unreadable is skipped."""
        try:
            names = [n for n in self.names(path) if n.endswith(suffix) and n[0] != "."]
        except FileNotFoundError:
            return
        for name in names:
            claimed = path / f".claimed-{os.getpid()}-{name}"
            try:
                self.rename(path / name, claimed)
                data = self.read(claimed)
            except FileNotFoundError:
                continue  # another process took it
            except OSError:
                data = b""  # not a regular file: dropped
            finally:
                with contextlib.suppress(OSError):
                    self.unlink(claimed)
            yield name, data

    def is_file(self, path: Path) -> bool:
        """Whether `path` is a regular file (not a link) in its checked directory."""
        try:
            with self.dir(path.parent) as parent:
                return stat.S_ISREG(
                    os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_mode
                )
        except FileNotFoundError:
            return False

    def names(self, path: Path) -> list[str]:
        """The names in directory `path` (FileNotFoundError if missing)."""
        with self.dir(path) as held:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=held)
            try:
                return os.listdir(fd)
            finally:
                os.close(fd)


def secure_dir(
    path: str | Path,
    *,
    top: str | Path | None = None,
    modes: Modes = PRIVATE,
    create: bool = True,
    trust: Trust = "mine",
    setting: str = "",
) -> bool:
    """Check (creating it when `create`) that `path` is safe to load from (and to write).

    `top`: the highest directory that must be this user's (`path` itself by default).
    Returns False when `path` is missing and `create` is false (nothing to load there
    yet). Raises `UnsafeDirectory` naming the fix (`setting`: the option that chose the
    place) for a directory another user made or can write, or a symbolic link; OSError
    as mkdir would (a file in the way)."""
    tree = Tree(path if top is None else top, modes=modes, trust=trust, setting=setting)
    return tree.check(Path(path), create=create)
