"""Directories this process writes (the local tier, a local store) and files it loads from them.

Why: these directories hold executables that the process loads and runs. A
tier's name is predictable (a hash of the store's identity under the cache
directory), so on a shared host another user could create it first, or find
it writable, and plant an object a victim then loads. Hence:

- a directory this process writes, and every directory from its `top` (the
  configured root: the cache directory, `ARTSTORE_LOCAL_TIER`, the store) down
  to it, must be a real directory owned by this user and writable by no one
  else; missing ones are created with a private mode (0700; a store may be
  made group-readable, never group-writable);
- a store owned by another user may be read, if no one but its owner can
  write it: root's always, anyone else's with ARTSTORE_READ_ONLY=1, which says
  its owner is trusted like any store writer;
- no directory above `top` may be writable by every user unless it is sticky
  (like /tmp), or others could rename ours away and put theirs in its place;
- files are opened without following symbolic links, and must be regular files.

Existing directories are never chmod-ed: a refusal names the fix instead.
"""

from __future__ import annotations

import errno
import os
import stat
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
# it writes), "mine_or_root" for a store opened without ARTSTORE_READ_ONLY (read if
# not writable here: root can change anything anyway), "any" for a store read with
# ARTSTORE_READ_ONLY, which says its owner is trusted.
Trust = Literal["mine", "mine_or_root", "any"]

PRIVATE = Modes()
# ARTSTORE_GROUP_READABLE: a store shared read-only with the directory's group.
GROUP_READABLE = Modes(dir=0o750, file=0o640)


def store_modes(group_readable: bool) -> Modes:
    """Modes of a local store's new directories and files (ARTSTORE_GROUP_READABLE)."""
    return GROUP_READABLE if group_readable else PRIVATE


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
    Symbolic links above `top` are followed once (a configured /home -> /u/home);
    from `top` down none is. Returns False when `path` is missing and `create` is
    false (nothing to load there yet). Raises `UnsafeDirectory` naming the fix
    (`setting`: the option that chose the place) for a directory another user
    made or can write, or a symbolic link; OSError as mkdir would (a file in the way).
    """
    target = Path(os.path.abspath(path))
    top_path = target if top is None else Path(os.path.abspath(top))
    below = target.relative_to(top_path).parts  # ValueError if top is not above path
    real_top = Path(os.path.realpath(top_path))
    for parent in reversed([real_top.parent, *real_top.parent.parents]):
        if not _ancestor(parent, create, setting):
            return False
    current = real_top
    for part in ("", *below):
        current = current / part if part else current
        if not _own_dir(current, modes.dir, create=create, trust=trust, setting=setting):
            return False
    return True


def make_subdir(path: Path, base: Path, modes: Modes, *, trust: Trust = "mine") -> None:
    """Create `path` and its missing parents below `base` (checked by `secure_dir`),
    checking those that exist: a few lstat calls, cheap enough for every write."""
    current = base
    for part in path.relative_to(base).parts:
        current = current / part
        _own_dir(current, modes.dir, create=True, trust=trust, setting="")


class NotRegularFile(OSError):
    """A symbolic link, device or FIFO where a file of ours belongs: never followed."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading without following a symbolic link; a regular file only.

    Raises FileNotFoundError when missing, NotRegularFile (an OSError) for a link or
    anything that is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path) -> bytes:
    """The bytes of `path`, read as `open_regular` opens it."""
    with open_regular(path) as handle:
        return handle.read()


def _refuse(path: Path, problem: str, fix: str, setting: str) -> UnsafeDirectory:
    where = f", or set {setting} to a directory of yours" if setting else ""
    return UnsafeDirectory(f"{path} {problem}: {fix}{where}")


def _ancestor(path: Path, create: bool, setting: str) -> bool:
    """A directory above `top`: anyone's, but not replaceable by every user."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return False
        try:
            os.mkdir(path, 0o700)  # as XDG asks of a missing cache directory
        except FileExistsError:
            pass
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise _refuse(
            path,
            "is writable by every user and not sticky, so anyone can replace what is below it",
            f"run `chmod o-w {path}` (or `chmod +t`)",
            setting,
        )
    return True


def _own_dir(path: Path, mode: int, *, create: bool, trust: Trust, setting: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return False
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            st = os.lstat(path)  # made meanwhile, by someone: check it as any other
        else:
            os.chmod(path, mode)  # the mode asked for, whatever the umask
            return True
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link", f"remove it (`rm {path}`)", setting)
    if not stat.S_ISDIR(st.st_mode):  # in the way, not a danger: an OSError, as for mkdir
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    me = os.geteuid()
    if trust != "any" and st.st_uid != me and not (trust == "mine_or_root" and st.st_uid == 0):
        fix = "remove it (another user may have made it to plant executables)"
        if trust == "mine_or_root":
            fix = "set ARTSTORE_READ_ONLY=1 to read another user's store, or " + fix
        raise _refuse(
            path, f"is owned by uid {st.st_uid}, not by this user (uid {me})", fix, setting
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(
            path,
            "is writable by other users, who could plant executables in it",
            f"run `chmod go-w {path}`",
            setting,
        )
    return True
