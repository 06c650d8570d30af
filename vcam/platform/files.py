"""Private files: created readable by the user alone, opened without following a symlink where the
OS can refuse one, and checked to be the user's own.

POSIX: mode 0600 from creation on (and ``fchmod`` after, for a file that existed), ``O_NOFOLLOW``,
owner uid compared with ours, folders that only we (or root, sticky like /tmp) can change.
Windows has no uid, mode bits or ``O_NOFOLLOW`` (and ``os.fchmod`` only from Python 3.13): the
files live in the user's profile folder (``%LOCALAPPDATA%``), whose ACL admits the user, SYSTEM and
the administrators, so the owner checks answer "ours" there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Open flags that refuse a symlink as the last part of the path (0 where the OS has none) and keep
#: bytes as they are (Windows' text mode would turn "\n" into "\r\n").
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
BINARY = getattr(os, "O_BINARY", 0)


class NotPrivate(OSError):
    """A folder someone else owns or may write: files in it could be swapped for theirs."""

    def __init__(self, folder: Path, owner: int, mode: int) -> None:
        super().__init__(f"{folder} is not private (owner uid {owner}, mode {mode:04o})")
        self.folder, self.owner, self.mode = folder, owner, mode


def my_uid() -> int | None:
    """This process's uid; None where the OS has none (Windows)."""
    getuid = getattr(os, "getuid", None)
    return getuid() if getuid is not None else None


def mine(st: os.stat_result) -> bool:
    """Whether the file of ``st`` belongs to this process's user (always, where there are no uids)."""
    uid = my_uid()
    return uid is None or st.st_uid == uid


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` of a file only the user can read and write: created with mode 0600, never
    through a symlink where the OS can tell, in binary mode. ``flags`` as for ``os.open``
    (``O_CREAT`` is added). Raises OSError (``ELOOP`` for a symlink)."""
    return os.open(path, flags | os.O_CREAT | NOFOLLOW | BINARY, 0o600)


def restrict(fd: int) -> None:
    """Mode 0600 on an open file (one that existed keeps its old mode through ``open``); nothing
    where the OS has no ``fchmod`` (Windows before Python 3.13; from 3.13 it sets the read-only flag
    alone, and 0600 leaves that off)."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o600)


def write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, readable by the user alone from creation on, replaced atomically (a
    reader sees the old file or the new one, never a half-written one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        restrict(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def check_private_folder(folder: Path) -> None:
    """Nothing when ``folder`` is a real directory that only we (or root, with the sticky bit, as
    /tmp) can change. Raises OSError when it cannot be read, NotADirectoryError when it is not a
    folder (a symlink to one included), :class:`NotPrivate` when someone else controls it. Windows:
    a folder is enough (its ACL is the profile's, see the module's doc)."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{folder} is not a folder")
    uid = my_uid()
    if uid is None:
        return
    mode = stat.S_IMODE(st.st_mode)
    owner_ok = st.st_uid == uid or (st.st_uid == 0 and mode & stat.S_ISVTX)
    if not owner_ok or (mode & 0o022 and not mode & stat.S_ISVTX):
        raise NotPrivate(folder, st.st_uid, mode)
