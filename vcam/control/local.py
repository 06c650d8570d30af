"""Local control socket: `vcam ctl` talks to a running daemon without OBS.

Protocol: the local transport of :mod:`vcam.platform.transport` (a Unix domain stream socket on
POSIX; loopback TCP with a per-run token on Windows); the client sends one JSON object per line and
gets one JSON object per line back.

    {"face": "alice"}            {"ok": true, "face": "alice", "swap": "on", "faces": [...]}
    {"swap": "toggle"}           {"ok": true, "face": "alice", "swap": "off", "faces": [...]}
    {"pause": true}              {"ok": true, ..., "paused": true}     (false resumes; "toggle")
    {"mirror": "toggle"}         {"ok": true, ..., "settings": {"mirror": true, ...}}
                                 (the desk's settings: vcam.control.commands.SETTINGS)
    {"camera": 2}                {"ok": true, ..., "settings": {"camera": 2, ...},
                                  "choices": {"camera": [[0, "Integrated Camera"], [2, "C920"]]}}
                                 ("list" lists the cameras again)
    {"status": true}             {"ok": true, ..., "status": {"fps_out": 29.9, ...}}
    {"face": "nobody"}           {"ok": false, "error": "unknown face 'nobody'", "hint": "known faces: ..."}
    {"map": {"target": "alice", "source": "grace"}}
                                 {"ok": true, ..., "mappings": {"alice": "grace"}}
    {"unmap": "alice"}           {"ok": true, ..., "mappings": {}}

Every reply carries ``paused``, ``settings`` (those this run offers) and ``mappings`` (target -> source face, see
:mod:`vcam.stages.mapping`). Paused (``vcam ctl pause``), the daemon closes the stream's camera (its
light goes off) and publishes a still card until ``{"pause": false}`` (``vcam ctl resume``); the
models stay loaded (:mod:`vcam.runtime.pause`).

Only the user can connect: the socket file is created with mode 0600 (umask set around ``bind``,
then ``chmod``), a parent directory created here gets 0700, a parent that someone else owns or can
write is refused (:func:`check_private_folder`), and each connection's peer uid is checked
(SO_PEERCRED) against ours as a second lock; the client checks the server's uid the same way. Over
loopback TCP the control file at the socket's path (port, token, pid) is readable by the user alone,
and a connection whose first line is not the token is dropped.

Load: one thread serves every client through a selector (a command takes microseconds, and one
thread competes for the GIL with the frame loop far less than a thread per client would). Commands
that may read a face image from disk (``map``, and ``face`` naming a face not loaded yet) run on a
second thread, the loader, one at a time and in order per client, so a slow load never delays
another client's ``status``.

At most ``MAX_CLIENTS`` connections are open at once. At the cap the server still accepts (so the
listening socket never stays readable and the loop never spins on it) and closes the connection
that has been idle longest to make room; a client whose command is in flight is never closed. Only
when every open connection has a command in flight is the newcomer answered
``{"ok": false, "busy": true, ...}`` and closed, and :func:`send_command` retries that, and a full
listen backlog, until its timeout, then says the daemon is busy. A connection that sends nothing
for ``CLIENT_IDLE_TIMEOUT`` seconds (and has no command in flight) is closed. Every line gets a
reply, whatever it holds (deeply nested JSON, a last line without a newline before the client
closes its side). A command only calls :class:`~vcam.state.RuntimeState` methods, so it never
blocks the frame loop.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from vcam.control import apply_command, short
from vcam.control.commands import BY_KEY
from vcam.errors import ControlError, VcamError
from vcam.platform import files
from vcam.platform import transport as _transport
from vcam.state import RuntimeState

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
MAX_CLIENTS = 256  # connections open at once (see _accept for what happens at the cap)
ACCEPT_RETRY = 0.5  # seconds the listener rests after accept failed (no file descriptors left)
CLIENT_IDLE_TIMEOUT = 10.0  # seconds without a byte from a client (and no command in flight): closed
RUN_HINT = "is `vcam run` running? Start it first, or point [control] socket at its socket"


@dataclass
class _Client:
    buf: bytes = b""
    seen: float = field(default_factory=time.monotonic)  # last byte received or reply sent
    busy: bool = False  # a command is with the loader thread (the connection is out of the selector)
    eof: bool = False  # the client closed its side
    hello: bool = False  # its first line must be the transport's token (loopback TCP), not read yet


def check_private_folder(folder: Path) -> None:
    """ControlError unless ``folder`` is a real directory that only we (or root, with the sticky bit,
    as /tmp) can change: a socket in a folder someone else controls could be replaced by theirs
    (:func:`vcam.platform.files.check_private_folder`)."""
    try:
        files.check_private_folder(folder)
    except NotADirectoryError:
        raise ControlError(f"{folder} is not a folder (the control socket goes in it)", hint=FOLDER_HINT) from None
    except files.NotPrivate as exc:
        raise ControlError(
            f"the control socket folder {folder} is not private (owner uid {exc.owner}, mode {exc.mode:04o})",
            hint=FOLDER_HINT,
        ) from None
    except OSError as exc:
        raise ControlError(f"cannot use {folder} for the control socket: {exc.strerror or exc}", hint=FOLDER_HINT) from None


FOLDER_HINT = "set [control] socket to a path in a folder only you can write, e.g. under your home"


COMMAND_KEYS = ("face", "swap", "pause", "map", "unmap", "status", "stream", *BY_KEY)


def apply_control(state: RuntimeState, cmd: dict) -> dict:
    """:func:`vcam.control.apply_command` plus the mapping commands, for both control channels:
    ``{"map": {"target": T, "source": S}}`` gives the person T the face S, ``{"unmap": T}`` drops
    that. Returns ``{"face": ..., "swap": ..., "mappings": {target: source}}``. Raises FaceError
    (unknown face or target) or ControlError (bad command, or mapping off in this run)."""
    unknown = set(cmd) - set(COMMAND_KEYS)
    if unknown:
        raise ControlError(
            f"unknown command key(s): {', '.join(sorted(map(str, unknown)))}",
            hint="use face, swap, pause, map, unmap, status or " + ", ".join(BY_KEY),
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


def handle_command(state: RuntimeState, cmd, streams: dict[str, RuntimeState] | None = None, *, page: bool = False) -> dict:
    """One request -> one reply (never raises). ``streams`` (a daemon running several streams):
    name -> state; ``{"stream": NAME, ...}`` acts on that stream, a command without it on every
    stream (the reply then carries ``streams``: each one's face, swap and mappings, and status).
    ``page``: the panel asks; an error's hint in the page's words (``VcamError.page_hint``)."""
    if not isinstance(cmd, dict):
        return {"ok": False, "error": 'a command is a JSON object like {"face": "NAME"}'}
    if streams:
        return _handle_streams(streams, cmd, page)
    if cmd.get("stream") is not None:
        return {
            "ok": False,
            "error": f"this daemon runs one stream, there is no stream {cmd['stream']!r}",
            "hint": "leave out --stream",
        }
    return _handle_one(state, cmd, page)


def _handle_streams(streams: dict[str, RuntimeState], cmd: dict, page: bool) -> dict:
    name = cmd.get("stream")
    if name is not None:
        if name not in streams:
            return {
                "ok": False,
                "error": f"no stream {name!r}",
                "hint": "streams of this daemon: " + ", ".join(streams),
            }
        reply = _handle_one(streams[name], cmd, page)
        reply["stream"] = name
        return reply
    replies = {n: _handle_one(st, cmd, page) for n, st in streams.items()}
    first = next(iter(replies.values()))
    bad = next((r for r in replies.values() if not r["ok"]), None)
    reply = dict(bad or first)
    reply["streams"] = {
        n: {k: r[k] for k in ("ok", "face", "swap", "paused", "settings", "choices", "mappings", "status", "error") if k in r}
        for n, r in replies.items()
    }
    return reply


def _handle_one(state: RuntimeState, cmd: dict, page: bool = False) -> dict:
    try:
        reply = apply_control(state, cmd)
    except Exception as exc:
        if not isinstance(exc, VcamError):  # a bug; the client still gets an answer
            log.exception("control command %s failed", short(repr(cmd)))
        return {
            "ok": False,
            "error": exc.message if isinstance(exc, VcamError) else f"the command failed ({type(exc).__name__}: {exc})",
            "hint": ((page and exc.page_hint) or exc.hint) if isinstance(exc, VcamError) else "see the daemon's log",
            "face": state.active,
            "swap": "on" if state.swap_enabled else "off",
            "paused": state.paused,
            "settings": state.settings,
            "choices": state.choices(),
            "mappings": state.mappings,
        }
    reply = {"ok": True, **reply, "faces": state.names}
    if cmd.get("status"):
        reply["status"] = state.read_status().as_dict()
    return reply


class ControlServer:
    """Serve control commands for ``state`` at ``path`` (``start()``/``stop()``); ``streams``: every
    stream's state by name, for a daemon running several. ``transport``: ``"unix"`` or ``"tcp"``
    (:mod:`vcam.platform.transport`), the OS's own when None."""

    def __init__(
        self,
        path: str | os.PathLike,
        state: RuntimeState,
        *,
        streams: dict[str, RuntimeState] | None = None,
        max_clients: int | None = None,
        idle_timeout: float | None = None,
        transport: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.transport = transport or _transport.default_kind()
        self.max_clients = max(1, MAX_CLIENTS if max_clients is None else max_clients)
        self.idle_timeout = CLIENT_IDLE_TIMEOUT if idle_timeout is None else idle_timeout
        busy = {"ok": False, "busy": True, "error": f"the daemon is busy: at its limit of {self.max_clients} connections"}
        self._busy_line = json.dumps(busy).encode() + b"\n"
        self._sel: selectors.BaseSelector | None = None
        self._clients: dict[socket.socket, _Client] = {}
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (conn, cmd) for the loader; None ends it
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # (conn, reply line) back from the loader
        self._wake_w: socket.socket | None = None
        self.state = state
        self.streams = dict(streams) if streams else None
        self._listener: _transport.Listener | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._listener is not None:
            return
        self._prepare_path()
        try:
            self._listener = _transport.listen(self.path, self.transport)
        except OSError as exc:
            raise ControlError(
                f"cannot create the control socket {self.path}: {exc.strerror or exc}",
                hint="set [control] socket to a path in a directory you own",
            ) from None
        self._stop.clear()
        self._jobs, self._done = queue.SimpleQueue(), queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="vcam-ctl", daemon=True)
        self._thread.start()
        log.info("control socket at %s", self.path)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._listener is not None:
            self._listener.close()  # the socket (or control file) goes with it, while it is ours
            self._listener = None

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
                f"cannot create {parent} for the control socket: {exc.strerror or exc}", hint=FOLDER_HINT
            ) from None
        check_private_folder(parent)
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ControlError(
                f"cannot use {self.path} for the control socket: {exc.strerror or exc}", hint=FOLDER_HINT
            ) from None
        if not _transport.is_endpoint(st, self.path, self.transport):
            raise ControlError(
                f"{self.path} exists and is not a {_transport.describe(self.transport)}",
                hint="move that file away or set [control] socket to another path",
            )
        if not files.mine(st):  # another user's (a shared, sticky folder): never ours to remove
            raise ControlError(
                f"{self.path} belongs to another user (uid {st.st_uid})", hint="set [control] socket to a path of your own"
            )
        if _transport.alive(self.path, self.transport):
            raise ControlError(
                f"another vcam is running (control socket {self.path} answers)",
                hint="stop it first, or give this one another [control] socket",
            )
        self.path.unlink()  # left behind by a daemon that died

    # -- serving (one thread, one selector) -----------------------------------------------------
    def _serve(self) -> None:
        """Accept and answer every client from this one thread: a command takes microseconds, and
        one thread asks the frame loop for the GIL far less often than a thread per client would.
        Commands that may read images (:meth:`_is_slow`) go to the loader thread instead."""
        listener = self._listener
        if listener is None:
            return
        sel = selectors.DefaultSelector()
        self._sel = sel
        self._clients = {}
        self._paused_until: float | None = None  # the listener is out of the selector until then
        wake_r, self._wake_w = socket.socketpair()
        wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        loader = threading.Thread(target=self._load_jobs, name="vcam-ctl-load", daemon=True)
        loader.start()
        listener.sock.setblocking(False)
        sel.register(listener.sock, selectors.EVENT_READ, _LISTENER)
        sel.register(wake_r, selectors.EVENT_READ, _WAKE)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.data is _LISTENER:
                        self._accept(listener)
                    elif key.data is _WAKE:
                        self._finish_jobs(wake_r)
                    else:
                        self._read(key.fileobj)
                now = time.monotonic()
                if self._paused_until is not None and now >= self._paused_until:
                    self._paused_until = None
                    sel.register(listener.sock, selectors.EVENT_READ, _LISTENER)
                for conn in self._expired(now):
                    self._drop(conn)
        except Exception:  # never expected; local control ends, the daemon runs on
            log.exception("the control socket stopped serving")
        finally:
            self._jobs.put(None)
            for conn in list(self._clients):
                self._drop(conn)
            sel.close()
            wake_r.close()
            self._wake_w.close()

    def _accept(self, listener: _transport.Listener) -> None:
        """Take every waiting connection. At the cap, the connection idle the longest (none with a
        command in flight) is closed to make room; when every one has a command in flight, the
        newcomer is told the daemon is busy. Either way the backlog empties, so the listener stops
        being readable: the loop never spins on it."""
        while True:
            try:
                conn = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, say: stop polling the listener for a moment
                log.debug("control socket accept failed", exc_info=True)
                self._sel.unregister(listener.sock)
                self._paused_until = time.monotonic() + ACCEPT_RETRY
                return
            uid = listener.foreign_uid(conn)
            if uid is not None:
                log.warning("control socket: refused a connection from uid %d", uid)
                _refuse(conn, _DENIED)
                continue
            if len(self._clients) >= self.max_clients:
                oldest = next((c for c, st in self._clients.items() if not st.busy), None)
                if oldest is None:
                    _refuse(conn, self._busy_line)
                    continue
                self._drop(oldest)
            conn.setblocking(False)
            self._clients[conn] = _Client(hello=listener.needs_token)
            self._sel.register(conn, selectors.EVENT_READ, True)

    def _touch(self, conn: socket.socket, st: _Client) -> None:
        """``conn`` was heard from (or answered) now: it moves to the end of ``_clients``, which is
        therefore ordered by ``seen``, the longest idle first (a cap or a timeout reads only its head)."""
        st.seen = time.monotonic()
        self._clients[conn] = self._clients.pop(conn)

    def _expired(self, now: float) -> list[socket.socket]:
        """The connections idle for longer than the idle timeout (none with a command in flight)."""
        out = []
        for c, st in self._clients.items():  # longest idle first: stop at the first one heard from lately
            if now - st.seen <= self.idle_timeout:
                break
            if not st.busy:
                out.append(c)
        return out

    def _read(self, conn: socket.socket) -> None:
        st = self._clients.get(conn)
        if st is None or st.busy:
            return
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        self._touch(conn, st)
        if chunk:
            st.buf += chunk
        else:  # the client closed its side: a last line without a newline still counts
            st.eof = True
        self._answer_lines(conn, st)

    def _answer_lines(self, conn: socket.socket, st: _Client) -> None:
        """Answer the complete lines in ``st.buf`` in order; a slow command is handed to the loader
        thread, and the connection is not read again until its reply is sent."""
        try:
            while not st.busy:
                if b"\n" in st.buf:
                    line, st.buf = st.buf.split(b"\n", 1)
                elif st.eof and st.buf.strip():
                    line, st.buf = st.buf, b""
                else:
                    break
                if not line.strip():
                    continue
                if st.hello:  # loopback TCP: the first line is the token, or the connection goes
                    if self._listener is None or not self._listener.admits(line):
                        log.warning("control: refused a connection without the token")
                        self._send(conn, _DENIED)
                        self._drop(conn)
                        return
                    st.hello = False
                    continue
                cmd = _parse(line)
                if self._is_slow(cmd):
                    st.busy = True
                    self._sel.unregister(conn)
                    self._jobs.put((conn, cmd))
                    return
                self._send(conn, self._reply_bytes(cmd))
            if st.eof:
                self._drop(conn)
            elif len(st.buf) > MAX_LINE:
                self._send(conn, b'{"ok": false, "error": "command too long"}\n')
                self._drop(conn)
        except OSError:  # gone, or not reading its replies
            self._drop(conn)

    def _load_jobs(self) -> None:
        """The loader thread: runs the commands that may read face images from disk, so that the
        selector thread keeps answering everyone else meanwhile."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, cmd = job
            self._done.put((conn, self._reply_bytes(cmd)))
            try:
                self._wake_w.send(b"!")
            except OSError:  # the wake-up pipe is full (a wake-up is pending anyway) or closed
                pass

    def _finish_jobs(self, wake_r: socket.socket) -> None:
        try:
            while wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, data = self._done.get_nowait()
            except queue.Empty:
                return
            st = self._clients.get(conn)
            if st is None:
                continue
            st.busy = False
            self._touch(conn, st)
            self._sel.register(conn, selectors.EVENT_READ, True)
            try:
                self._send(conn, data)
            except OSError:
                self._drop(conn)
                continue
            self._answer_lines(conn, st)

    @staticmethod
    def _send(conn: socket.socket, data: bytes) -> None:
        """A reply is a few hundred bytes: it fits the socket buffer of a client that reads them.
        One that lets replies pile up is dropped rather than stall everyone else."""
        sent = conn.send(data)
        if sent < len(data):
            raise BlockingIOError("the client does not read its replies")

    def _drop(self, conn: socket.socket) -> None:
        st = self._clients.pop(conn, None)
        if st is not None and not st.busy:  # a busy one is already out of the selector
            try:
                self._sel.unregister(conn)
            except (KeyError, ValueError):
                pass
        conn.close()

    def _reply_bytes(self, cmd) -> bytes:
        if cmd is _NOT_JSON:
            reply = {"ok": False, "error": "not JSON (or nested too deep): send one JSON object per line"}
        else:
            reply = handle_command(self.state, cmd, self.streams)
        return json.dumps(reply).encode() + b"\n"

    def _is_slow(self, cmd) -> bool:
        """Whether ``cmd`` may read a face image from disk (a mapping, or a face not loaded yet) or
        open a device (a camera switched, or the cameras listed again)."""
        if not isinstance(cmd, dict):
            return False
        if "map" in cmd or "camera" in cmd:
            return True
        face = cmd.get("face")
        if not isinstance(face, str) or face in ("next", "prev"):
            return False
        states = self.streams.values() if self.streams else (self.state,)
        return any(st.face(face) is None for st in states)


_LISTENER = "listener"
_WAKE = "wake"
_NOT_JSON = object()
_DENIED = b'{"ok": false, "error": "permission denied"}\n'


def _parse(line: bytes):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return _NOT_JSON


def _refuse(conn: socket.socket, line: bytes) -> None:
    """Answer one line on a connection we do not serve, then close it (never blocks)."""
    try:
        conn.setblocking(False)
        conn.send(line)
    except OSError:
        pass
    conn.close()
