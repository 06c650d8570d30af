"""One daemon per control socket and per OBS scene: exclusive locks held for a daemon's life
(:mod:`vcam.platform.locks`: ``flock``, ``msvcrt.locking`` on Windows), whose files name the
holder's PID (:class:`InstanceLock`)."""

from __future__ import annotations

import os
from pathlib import Path

from vcam.control.local import FOLDER_HINT, check_private_folder
from vcam.errors import ControlError
from vcam.platform import files, locks


class AlreadyRunning(ControlError):
    """Another daemon holds the control socket's lock: one daemon per socket (and so per camera and
    OBS scene it controls)."""


class InstanceLock:
    """One daemon per control socket: an exclusive lock on ``<socket>.lock`` held for the
    daemon's life (the kernel releases it when the process ends, however it ends). The file holds
    the holder's PID so that a second daemon can name it. :meth:`for_obs_scene` is the same lock on
    an OBS scene (one daemon drives a scene's faces)."""

    def __init__(self, socket_path: str | os.PathLike, *, path: Path | None = None, what: str = "", hint: str = "") -> None:
        self.path = Path(path) if path is not None else Path(f"{socket_path}.lock")
        self.what = what or f"is running with the control socket {socket_path}"
        self.hint = hint or "stop it first, or give this run its own [control] socket (and stream names)"
        self._fd: int | None = None

    @classmethod
    def for_obs_scene(cls, folder: Path, host: str, port: int, scene: str) -> InstanceLock:
        """The lock of OBS scene ``scene`` on ``host:port``, a file in ``folder`` (the user's runtime
        folder, whatever socket each daemon uses)."""
        import hashlib

        host = "127.0.0.1" if host.strip().lower() in ("localhost", "::1", "") else host.strip().lower()
        key = hashlib.sha1(f"{host}:{port}/{scene}".encode()).hexdigest()[:16]
        return cls(
            "",
            path=folder / f"obs-{key}.lock",
            what=f"drives the OBS scene {scene!r} on {host}:{port}",
            hint="stop it first, or give this run its own OBS scene ([obs] scene) or stream name",
        )

    def acquire(self) -> None:
        """Take the lock, or raise :class:`AlreadyRunning` naming the holder's PID; a lock file that
        cannot be opened (another user's, a folder not ours) raises :class:`ControlError`."""
        parent = self.path.parent
        try:
            if not parent.exists():
                parent.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise ControlError(
                f"cannot create {parent} for the control socket: {exc.strerror or exc}", hint=FOLDER_HINT
            ) from None
        check_private_folder(parent)  # the socket's own rule: nobody else may swap files in there
        try:
            fd = files.open_private(self.path, os.O_RDWR)
        except OSError as exc:
            raise ControlError(f"cannot use the lock file {self.path}: {exc.strerror or exc}", hint=FOLDER_HINT) from None
        st = os.fstat(fd)
        if not files.mine(st):  # root can open anyone's file: still never ours to lock or write
            os.close(fd)
            raise ControlError(f"the lock file {self.path} belongs to another user (uid {st.st_uid})", hint=FOLDER_HINT)
        if not locks.try_lock(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(f"another vcam (pid {holder}) {self.what}", hint=self.hint) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def close(self) -> None:
        """Release the lock (the file stays: removing it could race a daemon starting meanwhile)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["AlreadyRunning", "InstanceLock"]
