"""Exclusive locks between processes on a file, released by the OS when the holder ends, however it
ends. POSIX: ``flock``. Windows: ``msvcrt.locking`` on one byte far past the data, so that the
file's contents (a holder's PID) stay readable to the process that was refused."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: Windows: the byte locked (a lock past the end of a file is allowed, and leaves its data readable).
_FAR = 1 << 30
#: Windows: how often a blocking lock asks again.
_POLL = 0.05


def try_lock(fd: int) -> bool:
    """Take an exclusive lock on the open file ``fd`` for as long as it stays open; False, at once,
    when another process holds it. The file's position is left at 0."""
    if sys.platform == "win32":
        return _lock_windows(fd, wait=False)
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def hold(path: Path) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (created when missing) while the block runs, waiting
    as long as another process holds it."""
    with open(path, "w") as fh:
        if sys.platform == "win32":
            _lock_windows(fh.fileno(), wait=True)
        else:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _lock_windows(fd: int, *, wait: bool) -> bool:
    if sys.platform != "win32":  # for the type checker: this branch runs on Windows only
        raise OSError("Windows only")
    import msvcrt

    while True:
        os.lseek(fd, _FAR, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EDEADLK, 0):  # 0: Wine 8 sets no errno for a held lock
                raise
            if not wait:
                return False
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
        time.sleep(_POLL)
