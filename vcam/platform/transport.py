"""The local control transport: how ``vcam ctl`` reaches the daemon of the same user, one JSON
object per line each way, over either kind:

``unix`` (the POSIX default): a Unix domain stream socket at the ``[control] socket`` path, mode 0600
from its creation (umask around ``bind``, then ``chmod``); each side checks the other's uid
(SO_PEERCRED, where the OS has it) as a second lock, root's excepted.

``tcp`` (the Windows default, which has no Unix sockets for asyncio or selectors; on POSIX when
asked): a socket listening on 127.0.0.1 at a port the OS picks, and at the ``[control] socket`` path
a small JSON file ``{"port", "token", "pid"}`` that only the user can read (a fresh random token per
run). The client reads it and sends the token as its first line; the server drops a connection whose
first line is anything else. A file whose pid no longer runs is stale.

The client needs no setting: :func:`connect` goes by what it finds at the path (a socket, or a
file). Errors are OSErrors as sockets raise them (``FileNotFoundError``, ``ConnectionRefusedError``,
``PermissionError``, ``TimeoutError``...), and :class:`ForeignPeer` for another user's server."""

from __future__ import annotations

import errno
import hmac
import json
import os
import secrets
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from vcam.platform import WINDOWS, files, process

UNIX = "unix"
TCP = "tcp"
KINDS = (UNIX, TCP)
LOOPBACK = "127.0.0.1"


def default_kind(*, windows: bool = WINDOWS) -> str:
    """``unix`` where the OS has Unix sockets and is not Windows, else ``tcp``."""
    return TCP if windows or not hasattr(socket, "AF_UNIX") else UNIX


def describe(kind: str) -> str:
    """What lives at the path for ``kind``, for messages: "socket" or "vcam control file"."""
    return "socket" if kind == UNIX else "vcam control file"


class ForeignPeer(OSError):
    """The other end of a connection, or the control file, belongs to another user."""

    def __init__(self, uid: int) -> None:
        super().__init__(f"served by uid {uid}")
        self.uid = uid


@dataclass(frozen=True)
class Endpoint:
    """A ``tcp`` daemon's control file: where it listens, its token, its PID."""

    port: int
    token: str
    pid: int


def read_endpoint(path: Path) -> Endpoint | None:
    """The control file at ``path``, or None when it is missing, unreadable or not one of ours."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    port, token, pid = data.get("port"), data.get("token"), data.get("pid")
    if not (isinstance(port, int) and 0 < port < 65536 and isinstance(token, str) and token and isinstance(pid, int)):
        return None
    return Endpoint(port, token, pid)


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket; None where the OS cannot tell."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _proc_net_address(host: str, port: int) -> str | None:
    """``host``:``port`` as /proc/net/tcp{,6} writes it (each 32-bit word in host byte order, hex)."""
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return None
    words = "".join("%08X" % struct.unpack("=I", packed[i : i + 4])[0] for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


_NO_DIAG = object()  # the kernel's socket diagnostics cannot be asked here: read /proc instead


def _diag_uid(local: tuple, peer: tuple) -> object:
    """The uid of the socket whose address is ``peer`` and whose peer is ``local``, asked of Linux's
    sock_diag for that one socket (a hash lookup, about 40 us; /proc/net/tcp is a text table of every
    socket, 48 ms a read with 2,000 open). None when there is no such socket; ``_NO_DIAG`` when the
    kernel cannot be asked (not Linux, or netlink not allowed)."""
    if not hasattr(socket, "AF_NETLINK"):
        return _NO_DIAG
    family = socket.AF_INET6 if ":" in str(peer[0]) else socket.AF_INET
    try:
        src, dst = (socket.inet_pton(family, str(a)).ljust(16, b"\0") for a in (peer[0], local[0]))
    except OSError:
        return None
    # struct inet_diag_req_v2 (family, protocol, ext, pad, states) + inet_diag_sockid (ports big-endian,
    # addresses, interface, cookie "none"), after a netlink header: type SOCK_DIAG_BY_FAMILY (20), flags
    # NLM_F_REQUEST (one socket, no dump).
    sockid = struct.pack("!HH", int(peer[1]), int(local[1])) + src + dst + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as nl:  # NETLINK_SOCK_DIAG
            nl.settimeout(1.0)
            nl.sendto(struct.pack("=IHHII", 16 + len(req), 20, 1, 1, 0) + req, (0, 0))
            data = nl.recv(8192)
    except OSError:
        return _NO_DIAG
    if len(data) < 16 + 72 or struct.unpack_from("=H", data, 4)[0] != 20:
        return None  # NLMSG_ERROR: no such socket (the other end has closed)
    return struct.unpack_from("=I", data, 16 + 64)[0]  # inet_diag_msg's uid


def tcp_peer_uid(local: tuple, peer: tuple) -> int | None:
    """The uid owning the other end of a TCP connection on this machine (a loopback peer), from
    Linux's socket diagnostics, else /proc/net/tcp{,6}: the socket whose local address is ``peer``
    and remote one ``local``. None elsewhere, for a peer on another machine, or when it is gone."""
    uid = _diag_uid(local, peer)
    if uid is not _NO_DIAG:
        return uid if isinstance(uid, int) else None
    mine, theirs = _proc_net_address(str(local[0]), int(local[1])), _proc_net_address(str(peer[0]), int(peer[1]))
    if mine is None or theirs is None:
        return None
    table = "/proc/net/tcp6" if len(theirs) > 13 else "/proc/net/tcp"
    try:
        with open(table, encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    at = text.find(f" {theirs} {mine} ")
    if at < 0:
        return None
    fields = text[at : text.find("\n", at)].split()
    try:
        return int(fields[6])  # local, remote, st, tx:rx, tr:when, retrnsmt, uid
    except (IndexError, ValueError):
        return None


def _foreign(uid: int | None) -> bool:
    me = files.my_uid()
    return me is not None and uid is not None and uid not in (me, 0)


class Listener:
    """A listening endpoint made by :func:`listen`; ``sock`` goes into a selector as is."""

    def __init__(self, kind: str, path: Path, sock: socket.socket, token: str | None) -> None:
        self.kind, self.path, self.sock = kind, path, sock
        self._token = token.encode() if token is not None else None

    @property
    def needs_token(self) -> bool:
        """Whether each connection's first line must be the token (:meth:`admits`)."""
        return self._token is not None

    def accept(self) -> socket.socket:
        conn, _ = self.sock.accept()
        return conn

    def foreign_uid(self, conn: socket.socket) -> int | None:
        """The peer's uid when it is neither ours nor root's (``unix``); else None."""
        if self.kind != UNIX:
            return None
        uid = peer_uid(conn)
        return uid if _foreign(uid) else None

    def admits(self, first_line: bytes) -> bool:
        """Whether a connection's first line is the token (always, for a kind without one)."""
        return self._token is None or hmac.compare_digest(first_line.strip(), self._token)

    def close(self) -> None:
        """Stop listening and remove the endpoint at the path while it is still this one's."""
        self.sock.close()
        try:
            if self.kind == UNIX:
                ours = stat.S_ISSOCK(os.lstat(self.path).st_mode)
            else:
                found = read_endpoint(self.path)
                ours = found is not None and self._token is not None and found.token.encode() == self._token
            if ours:
                self.path.unlink()
        except FileNotFoundError:
            pass


def server_socket(family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket for a server to bind: POSIX lets it rebind a port in TIME_WAIT (SO_REUSEADDR);
    Windows, where SO_REUSEADDR would let another process bind the same port beside it, keeps the
    port to itself (SO_EXCLUSIVEADDRUSE)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    if WINDOWS and hasattr(socket, "SO_EXCLUSIVEADDRUSE"):
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_EXCLUSIVEADDRUSE"), 1)  # noqa: B009
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def port_taken(exc: OSError) -> bool:
    """Whether a failed bind means the port is someone else's: EADDRINUSE, or on Windows an access
    error (a port another socket holds exclusively answers WSAEACCES)."""
    return exc.errno == errno.EADDRINUSE or (WINDOWS and exc.errno == errno.EACCES)


def listen(path: Path, kind: str | None = None) -> Listener:
    """Listen for the daemon's clients at ``path`` (its folder exists and was checked private; no
    file is there). Raises OSError."""
    kind = kind or default_kind()
    if kind == UNIX:
        return _listen_unix(path)
    if kind != TCP:
        raise ValueError(f"unknown control transport {kind!r} (one of {', '.join(KINDS)})")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if hasattr(socket, "SO_EXCLUSIVEADDRUSE"):  # Windows: nobody binds the port beside us
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_EXCLUSIVEADDRUSE"), 1)  # noqa: B009
        sock.bind((LOOPBACK, 0))
        sock.listen(socket.SOMAXCONN)
        token = secrets.token_urlsafe(32)
        info = {"port": sock.getsockname()[1], "token": token, "pid": os.getpid()}
        files.write_private(path, (json.dumps(info) + "\n").encode())
    except BaseException:
        sock.close()
        raise
    return Listener(TCP, path, sock, token)


def _listen_unix(path: Path) -> Listener:
    sock = socket.socket(getattr(socket, "AF_UNIX"), socket.SOCK_STREAM)  # noqa: B009
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(socket.SOMAXCONN)
    return Listener(UNIX, path, sock, None)


def is_endpoint(st: os.stat_result, path: Path, kind: str) -> bool:
    """Whether the file at ``path`` (``st`` from ``lstat``) is an endpoint of ``kind`` (a socket; a
    control file of ours), so one left by a dead daemon may be replaced; anything else never is."""
    if kind == UNIX:
        return stat.S_ISSOCK(st.st_mode)
    return stat.S_ISREG(st.st_mode) and read_endpoint(path) is not None


def alive(path: Path, kind: str) -> bool:
    """Whether the endpoint at ``path`` answers (a daemon runs there); something odd answering
    counts as alive (never delete it)."""
    if kind == TCP:
        found = read_endpoint(path)
        if found is None or not process.alive(found.pid):
            return False
        try:
            socket.create_connection((LOOPBACK, found.port), timeout=1.0).close()
        except (ConnectionRefusedError, TimeoutError):
            return False
        except OSError:
            return True
        return True
    with socket.socket(getattr(socket, "AF_UNIX"), socket.SOCK_STREAM) as probe:  # noqa: B009
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
        return True


def connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the daemon at ``path`` ready for commands: the server's uid checked
    (``unix``), the token sent (``tcp``); ``timeout`` is set on the socket. A path that is neither a
    socket nor a live control file raises ConnectionRefusedError, a missing one FileNotFoundError,
    another user's server :class:`ForeignPeer`."""
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode):
        return _connect_tcp(path, st, timeout)
    if not hasattr(socket, "AF_UNIX"):
        raise ConnectionRefusedError(f"{path} is not a vcam control file")
    sock = socket.socket(getattr(socket, "AF_UNIX"), socket.SOCK_STREAM)  # noqa: B009
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
        uid = peer_uid(sock)
        if _foreign(uid):
            assert uid is not None
            raise ForeignPeer(uid)
    except BaseException:
        sock.close()
        raise
    return sock


def _connect_tcp(path: Path, st: os.stat_result, timeout: float) -> socket.socket:
    if not files.mine(st):  # someone else's file could send our commands to their port
        raise ForeignPeer(st.st_uid)
    found = read_endpoint(path)
    if found is None:
        raise ConnectionRefusedError(f"{path} is not a vcam control file")
    if not process.alive(found.pid):
        raise ConnectionRefusedError(f"the daemon of {path} (pid {found.pid}) has ended")
    sock = socket.create_connection((LOOPBACK, found.port), timeout=timeout)
    try:
        sock.sendall(found.token.encode() + b"\n")
    except BaseException:
        sock.close()
        raise
    return sock
