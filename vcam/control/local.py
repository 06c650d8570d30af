"""Local control socket: `vcam ctl` talks to a running daemon without OBS.

Protocol: a Unix domain stream socket; the client sends one JSON object per line and gets one JSON
object per line back.

    {"face": "alice"}            {"ok": true, "face": "alice", "swap": "on", "faces": [...]}
    {"swap": "toggle"}           {"ok": true, "face": "alice", "swap": "off", "faces": [...]}
    {"status": true}             {"ok": true, ..., "status": {"fps_out": 29.9, ...}}
    {"face": "nobody"}           {"ok": false, "error": "unknown face 'nobody'", "hint": "known faces: ..."}
    {"map": {"target": "alice", "source": "grace"}}
                                 {"ok": true, ..., "mappings": {"alice": "grace"}}
    {"unmap": "alice"}           {"ok": true, ..., "mappings": {}}

Every reply carries ``mappings`` (target -> source face, see :mod:`vcam.stages.mapping`).

Only the user can connect: the socket file is created with mode 0600 (umask set around ``bind``,
then ``chmod``), a parent directory created here gets 0700, a parent that someone else owns or can
write is refused (:func:`check_private_folder`), and each connection's peer uid is checked
(SO_PEERCRED) against ours as a second lock; the client checks the server's uid the same way.

Load: one thread serves every client through a selector (a command takes microseconds, and one
thread competes for the GIL with the frame loop far less than a thread per client would). At most
``MAX_CLIENTS`` connections are open at once; the others wait in the listen backlog (the system's
maximum), and :func:`send_command` retries a full backlog until its timeout. Every line gets a
reply, whatever it holds (deeply nested JSON, a last line without a newline before the client
closes its side). A command only calls :class:`~vcam.state.RuntimeState` methods, so it never
blocks the frame loop.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from vcam.control import apply_command
from vcam.errors import ControlError, VcamError
from vcam.state import RuntimeState

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
MAX_CLIENTS = 256  # connections served at once; more wait in the listen backlog
CLIENT_IDLE_TIMEOUT = 10.0
RUN_HINT = "is `vcam run` running? Start it first, or point [control] socket at its socket"


@dataclass
class _Client:
    buf: bytes = b""
    seen: float = field(default_factory=time.monotonic)


def check_private_folder(folder: Path) -> None:
    """ControlError unless ``folder`` is a real directory that only we (or root, with the sticky bit,
    as /tmp) can change: a socket in a folder someone else controls could be replaced by theirs."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise ControlError(f"cannot use {folder} for the control socket: {exc.strerror or exc}", hint=_FOLDER_HINT) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"{folder} is not a folder (the control socket goes in it)", hint=_FOLDER_HINT)
    if uid is None:
        return
    mode = stat.S_IMODE(st.st_mode)
    owner_ok = st.st_uid == uid or (st.st_uid == 0 and mode & stat.S_ISVTX)
    if not owner_ok or (mode & 0o022 and not mode & stat.S_ISVTX):
        raise ControlError(
            f"the control socket folder {folder} is not private (owner uid {st.st_uid}, mode {mode:04o})",
            hint=_FOLDER_HINT,
        )


_FOLDER_HINT = "set [control] socket to a path in a folder only you can write, e.g. under your home"


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


COMMAND_KEYS = ("face", "swap", "map", "unmap", "status", "stream")


def apply_control(state: RuntimeState, cmd: dict) -> dict:
    """:func:`vcam.control.apply_command` plus the mapping commands, for both control channels:
    ``{"map": {"target": T, "source": S}}`` gives the person T the face S, ``{"unmap": T}`` drops
    that. Returns ``{"face": ..., "swap": ..., "mappings": {target: source}}``. Raises FaceError
    (unknown face or target) or ControlError (bad command, or mapping off in this run)."""
    unknown = set(cmd) - set(COMMAND_KEYS)
    if unknown:
        raise ControlError(
            f"unknown command key(s): {', '.join(sorted(map(str, unknown)))}", hint="use face, swap, map, unmap or status"
        )
    cmd = {k: v for k, v in cmd.items() if k != "stream"}
    if "map" in cmd:
        m = cmd["map"]
        if not (isinstance(m, dict) and set(m) == {"target", "source"} and all(isinstance(v, str) and v for v in m.values())):
            raise ControlError(
                '\'map\' must be an object like {"target": "NAME", "source": "FACE"}',
                hint="target: the person, source: their face",
            )
        state.set_mapping(m["target"], m["source"])
    if "unmap" in cmd:
        target = cmd["unmap"]
        if not isinstance(target, str) or not target:
            raise ControlError("'unmap' must be a target name", hint="see the mappings with `vcam ctl status`")
        state.remove_mapping(target)
    reply = apply_command(state, {k: v for k, v in cmd.items() if k not in ("map", "unmap")})
    reply["mappings"] = state.mappings
    return reply


def handle_command(state: RuntimeState, cmd, streams: dict[str, RuntimeState] | None = None) -> dict:
    """One request -> one reply (never raises). ``streams`` (a daemon running several streams):
    name -> state; ``{"stream": NAME, ...}`` acts on that stream, a command without it on every
    stream (the reply then carries ``streams``: each one's face, swap and mappings, and status)."""
    if not isinstance(cmd, dict):
        return {"ok": False, "error": 'a command is a JSON object like {"face": "NAME"}'}
    if streams:
        return _handle_streams(streams, cmd)
    if cmd.get("stream") is not None:
        return {
            "ok": False,
            "error": f"this daemon runs one stream, there is no stream {cmd['stream']!r}",
            "hint": "leave out --stream",
        }
    return _handle_one(state, cmd)


def _handle_streams(streams: dict[str, RuntimeState], cmd: dict) -> dict:
    name = cmd.get("stream")
    if name is not None:
        if name not in streams:
            return {
                "ok": False,
                "error": f"no stream {name!r}",
                "hint": "streams of this daemon: " + ", ".join(streams),
            }
        reply = _handle_one(streams[name], cmd)
        reply["stream"] = name
        return reply
    replies = {n: _handle_one(st, cmd) for n, st in streams.items()}
    first = next(iter(replies.values()))
    bad = next((r for r in replies.values() if not r["ok"]), None)
    reply = dict(bad or first)
    reply["streams"] = {
        n: {k: r[k] for k in ("ok", "face", "swap", "mappings", "status", "error") if k in r} for n, r in replies.items()
    }
    return reply


def _handle_one(state: RuntimeState, cmd: dict) -> dict:
    try:
        reply = apply_control(state, cmd)
    except Exception as exc:
        if not isinstance(exc, VcamError):  # a bug; the client still gets an answer
            log.exception("control command %s failed", cmd)
        return {
            "ok": False,
            "error": exc.message if isinstance(exc, VcamError) else f"the command failed ({type(exc).__name__}: {exc})",
            "hint": exc.hint if isinstance(exc, VcamError) else "see the daemon's log",
            "face": state.active,
            "swap": "on" if state.swap_enabled else "off",
            "mappings": state.mappings,
        }
    reply = {"ok": True, **reply, "faces": state.names}
    if cmd.get("status"):
        reply["status"] = state.read_status().as_dict()
    return reply


class ControlServer:
    """Serve control commands for ``state`` on the Unix socket ``path`` (``start()``/``stop()``);
    ``streams``: every stream's state by name, for a daemon running several."""

    def __init__(self, path: str | os.PathLike, state: RuntimeState, *, streams: dict[str, RuntimeState] | None = None) -> None:
        self.path = Path(path)
        self.state = state
        self.streams = dict(streams) if streams else None
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
        sock.listen(socket.SOMAXCONN)
        self._sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="vcam-ctl", daemon=True)
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
        try:
            if not os.path.lexists(parent):
                parent.mkdir(mode=0o700, parents=True)
                os.chmod(parent, 0o700)
        except OSError as exc:
            raise ControlError(
                f"cannot create {parent} for the control socket: {exc.strerror or exc}", hint=_FOLDER_HINT
            ) from None
        check_private_folder(parent)
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ControlError(
                f"cannot use {self.path} for the control socket: {exc.strerror or exc}", hint=_FOLDER_HINT
            ) from None
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

    # -- serving (one thread, one selector) -----------------------------------------------------
    def _serve(self) -> None:
        """Accept and answer every client from this one thread: a command takes microseconds, and
        one thread asks the frame loop for the GIL far less often than a thread per client would."""
        sel = selectors.DefaultSelector()
        listener = self._sock
        if listener is None:
            return
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, None)
        clients: dict[socket.socket, _Client] = {}
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.data is None:
                        self._accept(sel, listener, clients)
                    else:
                        self._read(sel, clients, key.fileobj)
                now = time.monotonic()
                for conn in [c for c, st in clients.items() if now - st.seen > CLIENT_IDLE_TIMEOUT]:
                    self._drop(sel, clients, conn)
        except Exception:  # never expected; local control ends, the daemon runs on
            log.exception("the control socket stopped serving")
        finally:
            for conn in list(clients):
                self._drop(sel, clients, conn)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, listener: socket.socket, clients: dict) -> None:
        # Take no more than MAX_CLIENTS at a time: the rest wait in the kernel's backlog.
        while len(clients) < MAX_CLIENTS:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                log.debug("control socket accept failed", exc_info=True)
                return
            uid = _peer_uid(conn)
            if self._uid is not None and uid is not None and uid not in (self._uid, 0):
                log.warning("control socket: refused a connection from uid %d", uid)
                try:
                    conn.settimeout(0.2)
                    conn.sendall(b'{"ok": false, "error": "permission denied"}\n')
                except OSError:
                    pass
                conn.close()
                continue
            conn.setblocking(False)
            clients[conn] = _Client()
            sel.register(conn, selectors.EVENT_READ, True)

    def _read(self, sel: selectors.BaseSelector, clients: dict, conn: socket.socket) -> None:
        st = clients.get(conn)
        if st is None:
            return
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, clients, conn)
            return
        st.seen = time.monotonic()
        try:
            if not chunk:  # the client closed its side: a last line without a newline still counts
                if st.buf.strip():
                    self._send(conn, self._reply_to(st.buf))
                self._drop(sel, clients, conn)
                return
            st.buf += chunk
            while b"\n" in st.buf:
                line, st.buf = st.buf.split(b"\n", 1)
                if line.strip():
                    self._send(conn, self._reply_to(line))
            if len(st.buf) > MAX_LINE:
                self._send(conn, b'{"ok": false, "error": "command too long"}\n')
                self._drop(sel, clients, conn)
        except OSError:  # gone, or not reading its replies
            self._drop(sel, clients, conn)

    @staticmethod
    def _send(conn: socket.socket, data: bytes) -> None:
        """A reply is a few hundred bytes: it fits the socket buffer of a client that reads them.
        One that lets replies pile up is dropped rather than stall everyone else."""
        sent = conn.send(data)
        if sent < len(data):
            raise BlockingIOError("the client does not read its replies")

    @staticmethod
    def _drop(sel: selectors.BaseSelector, clients: dict, conn: socket.socket) -> None:
        clients.pop(conn, None)
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _reply_to(self, line: bytes) -> bytes:
        try:
            cmd = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
            reply = {"ok": False, "error": "not JSON (or nested too deep): send one JSON object per line"}
        else:
            reply = handle_command(self.state, cmd, self.streams)
        return json.dumps(reply).encode() + b"\n"


def send_command(path: str | os.PathLike, cmd: dict, timeout: float = 30.0) -> dict:
    """Send one command to the daemon at ``path`` and return its reply.

    Retries while the daemon is busy (its connection backlog is full) until ``timeout``. Raises
    ControlError when nothing listens (with a hint to start `vcam run`), when the socket or its
    server belongs to someone else, on a timeout, when it stays busy, or when the
    daemon answers ``ok: false`` (its error and hint are passed on).
    """
    path = Path(path)
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        reply = _exchange(path, cmd, max(0.1, deadline - time.monotonic()))
        if reply is not None:
            break
        if time.monotonic() + pause >= deadline:
            raise ControlError(f"the vcam daemon at {path} stayed busy for {timeout:g}s", hint="retry in a moment")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the daemon refused the command"), hint=reply.get("hint"))
    return reply


def _exchange(path: Path, cmd: dict, timeout: float) -> dict | None:
    """One connection: the reply, or None when the daemon could not take it (a full backlog, or the
    connection closed on us unanswered): try again."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except BlockingIOError:  # EAGAIN: the listen backlog is full
            return None
        except (FileNotFoundError, ConnectionRefusedError):
            raise ControlError(f"no vcam daemon listens on {path}", hint=RUN_HINT) from None
        except PermissionError:
            raise ControlError(
                f"permission denied on {path}",
                hint="the control socket belongs to another user; run `vcam ctl` as the user running `vcam run`",
            ) from None
        except TimeoutError:
            raise ControlError(f"the vcam daemon at {path} did not answer", hint=RUN_HINT) from None
        except OSError as exc:
            raise ControlError(f"cannot reach the vcam daemon at {path}: {exc.strerror or exc}", hint=RUN_HINT) from None
        uid = _peer_uid(sock)
        me = os.getuid() if hasattr(os, "getuid") else None
        if me is not None and uid is not None and uid not in (me, 0):
            raise ControlError(f"the control socket {path} is served by uid {uid}, not you", hint=_FOLDER_HINT)
        buf = b""
        try:
            try:
                sock.sendall(json.dumps(cmd).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before reading (the daemon stopping, say): a reply may still be there
            while b"\n" not in buf:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except (BrokenPipeError, ConnectionResetError):
            if not buf.strip():
                return None  # closed on us unanswered: try again (until the timeout)
        except TimeoutError:
            raise ControlError(f"the vcam daemon at {path} did not answer within {timeout:g}s", hint=RUN_HINT) from None
        except OSError as exc:
            raise ControlError(f"control socket {path} failed: {exc.strerror or exc}", hint=RUN_HINT) from None
    if not buf.strip():
        raise ControlError(f"the vcam daemon at {path} closed the connection without answering", hint=RUN_HINT)
    try:
        return json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        raise ControlError(f"the vcam daemon at {path} answered something that is not JSON", hint=RUN_HINT) from None
