"""Local control socket: `vcam ctl` talks to a running daemon without OBS.

Protocol: a Unix domain stream socket; the client sends one JSON object per line and gets one JSON
object per line back.

    {"face": "alice"}            {"ok": true, "face": "alice", "swap": "on", "faces": [...]}
    {"swap": "toggle"}           {"ok": true, "face": "alice", "swap": "off", "faces": [...]}
    {"status": true}             {"ok": true, ..., "status": {"fps_out": 29.9, ...}}
    {"face": "nobody"}           {"ok": false, "error": "unknown face 'nobody'", "hint": "known faces: ..."}

Only the user can connect: the socket file is created with mode 0600 (umask set around ``bind``,
then ``chmod``), a parent directory created here gets 0700, and each connection's peer uid is
checked (SO_PEERCRED) against ours as a second lock. The server runs in its own threads; a command
only calls :class:`~vcam.state.RuntimeState` methods, so it never blocks the frame loop.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import threading
from pathlib import Path

from ..errors import ControlError, VcamError
from ..state import RuntimeState
from . import apply_command

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
CLIENT_IDLE_TIMEOUT = 10.0
RUN_HINT = "is `vcam run` running? Start it first, or point [control] socket at its socket"


def _peer_uid(conn: socket.socket) -> int | None:
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _socket_alive(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # it exists and something odd answered: do not delete it
        return True


def handle_command(state: RuntimeState, cmd) -> dict:
    """One request -> one reply (never raises)."""
    if not isinstance(cmd, dict):
        return {"ok": False, "error": 'a command is a JSON object like {"face": "NAME"}'}
    try:
        reply = apply_command(state, cmd)
    except VcamError as exc:
        return {
            "ok": False,
            "error": exc.message,
            "hint": exc.hint,
            "face": state.active,
            "swap": "on" if state.swap_enabled else "off",
        }
    reply = {"ok": True, **reply, "faces": state.names}
    if cmd.get("status"):
        reply["status"] = state.read_status().as_dict()
    return reply


class ControlServer:
    """Serve control commands for ``state`` on the Unix socket ``path`` (``start()``/``stop()``)."""

    def __init__(self, path: str | os.PathLike, state: RuntimeState) -> None:
        self.path = Path(path)
        self.state = state
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._uid = os.getuid() if hasattr(os, "getuid") else None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._sock is not None:
            return
        self._prepare_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            raise ControlError(
                f"cannot create the control socket {self.path}: {exc.strerror}",
                hint="set [control] socket to a path in a directory you own",
            ) from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(8)
        sock.settimeout(0.2)
        self._sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._accept_loop, name="vcam-ctl", daemon=True)
        self._thread.start()
        log.info("control socket at %s", self.path)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    self.path.unlink()
            except FileNotFoundError:
                pass

    close = stop

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _prepare_path(self) -> None:
        parent = self.path.parent
        if not parent.exists():
            try:
                parent.mkdir(mode=0o700, parents=True)
                os.chmod(parent, 0o700)
            except OSError as exc:
                raise ControlError(
                    f"cannot create {parent} for the control socket: {exc.strerror}",
                    hint="set [control] socket to a path in a directory you own",
                ) from None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlError(
                f"{self.path} exists and is not a socket", hint="move that file away or set [control] socket to another path"
            )
        if _socket_alive(self.path):
            raise ControlError(
                f"another vcam is running (control socket {self.path} answers)",
                hint="stop it first, or give this one another [control] socket",
            )
        self.path.unlink()  # left behind by a daemon that died

    # -- serving (own threads) -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                log.debug("control socket accept failed", exc_info=True)
                self._stop.wait(0.1)
                continue
            threading.Thread(target=self._serve_client, args=(conn,), name="vcam-ctl-client", daemon=True).start()

    def _serve_client(self, conn: socket.socket) -> None:
        try:
            with conn:
                uid = _peer_uid(conn)
                if self._uid is not None and uid is not None and uid not in (self._uid, 0):
                    log.warning("control socket: refused a connection from uid %d", uid)
                    conn.sendall(b'{"ok": false, "error": "permission denied"}\n')
                    return
                conn.settimeout(CLIENT_IDLE_TIMEOUT)
                buf = b""
                while not self._stop.is_set():
                    try:
                        chunk = conn.recv(4096)
                    except TimeoutError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                    if len(buf) > MAX_LINE and b"\n" not in buf:
                        conn.sendall(b'{"ok": false, "error": "command too long"}\n')
                        return
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if not line.strip():
                            continue
                        try:
                            cmd = json.loads(line)
                        except ValueError:
                            reply = {"ok": False, "error": "not JSON: send one JSON object per line"}
                        else:
                            reply = handle_command(self.state, cmd)
                        conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            log.debug("control client went away", exc_info=True)
        except Exception:  # a client must never take the server down
            log.exception("control command failed")


def send_command(path: str | os.PathLike, cmd: dict, timeout: float = 30.0) -> dict:
    """Send one command to the daemon at ``path`` and return its reply.

    Raises ControlError when nothing listens (with a hint to start `vcam run`), when the socket
    belongs to someone else, on a timeout, or when the daemon answers ``ok: false`` (its error and
    hint are passed on).
    """
    path = Path(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise ControlError(f"no vcam daemon listens on {path}", hint=RUN_HINT) from None
        except PermissionError:
            raise ControlError(
                f"permission denied on {path}",
                hint="the control socket belongs to another user; run `vcam ctl` as the user running `vcam run`",
            ) from None
        except TimeoutError:
            raise ControlError(f"the vcam daemon at {path} did not answer", hint=RUN_HINT) from None
        try:
            sock.sendall(json.dumps(cmd).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise ControlError(f"the vcam daemon at {path} did not answer within {timeout:g}s", hint=RUN_HINT) from None
        except OSError as exc:
            raise ControlError(f"control socket {path} failed: {exc.strerror or exc}", hint=RUN_HINT) from None
    if not buf.strip():
        raise ControlError(f"the vcam daemon at {path} closed the connection without answering", hint=RUN_HINT)
    reply = json.loads(buf.split(b"\n", 1)[0])
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the daemon refused the command"), hint=reply.get("hint"))
    return reply
