"""The local control transport, both kinds on this machine: a Unix socket, and loopback TCP with a
per-run token in a file only the user can read (Windows' own)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from vcam.platform import transport


@pytest.fixture(params=transport.KINDS)
def kind(request):
    if request.param == transport.UNIX and not hasattr(socket, "AF_UNIX"):
        pytest.skip("Unix domain sockets: not on Windows (its transport is loopback TCP)")
    return request.param


def test_the_os_picks_its_kind():
    assert transport.default_kind(windows=True) == transport.TCP
    assert transport.default_kind(windows=False) == (transport.UNIX if hasattr(socket, "AF_UNIX") else transport.TCP)


def _echo_once(listener: transport.Listener, got: list[bytes]) -> None:
    conn = listener.accept()
    with conn:
        data = b""
        while data.count(b"\n") < (2 if listener.needs_token else 1):
            data += conn.recv(4096)
        *first, line = data.splitlines()
        got.append(first[0] if first else b"")
        conn.sendall(line.upper() + b"\n")


def test_a_client_reaches_the_listener_by_the_path_alone(tmp_path, kind):
    path = tmp_path / "vcam.sock"
    listener = transport.listen(path, kind)
    got: list[bytes] = []
    try:
        t = threading.Thread(target=_echo_once, args=(listener, got))
        t.start()
        with transport.connect(path, 5) as conn:
            conn.sendall(b"hello\n")
            assert conn.recv(4096) == b"HELLO\n"
        t.join(5)
        assert transport.is_endpoint(os.lstat(path), path, kind)
        assert transport.alive(path, kind)
    finally:
        listener.close()
    assert not path.exists()
    if kind == transport.TCP:
        assert listener.admits(got[0]) and not listener.admits(b"guess")  # the client sent the token first
    else:
        assert listener.admits(b"anything")  # a Unix socket needs no token: the peer's uid is checked


def test_the_tcp_control_file_is_private_and_names_port_token_and_pid(tmp_path):
    path = tmp_path / "vcam.sock"
    listener = transport.listen(path, transport.TCP)
    try:
        data = json.loads(path.read_text())
        assert set(data) == {"port", "token", "pid"} and data["pid"] == os.getpid()
        assert data["port"] == listener.sock.getsockname()[1] and listener.sock.getsockname()[0] == "127.0.0.1"
        assert len(data["token"]) >= 32
        if os.name == "posix":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        again = transport.listen(tmp_path / "other.sock", transport.TCP)
        try:
            assert json.loads((tmp_path / "other.sock").read_text())["token"] != data["token"]  # fresh per run
        finally:
            again.close()
    finally:
        listener.close()


def test_close_leaves_a_control_file_that_is_no_longer_its_own(tmp_path):
    path = tmp_path / "vcam.sock"
    listener = transport.listen(path, transport.TCP)
    path.write_text(json.dumps({"port": 9, "token": "newer", "pid": os.getpid()}))
    listener.close()
    assert json.loads(path.read_text())["token"] == "newer"


def test_a_control_file_of_an_ended_process_or_of_nobody_is_refused(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "vcam.sock"
    path.write_text(json.dumps({"port": 9, "token": "t", "pid": int(ended.stdout)}))
    assert transport.is_endpoint(os.lstat(path), path, transport.TCP) and not transport.alive(path, transport.TCP)
    with pytest.raises(ConnectionRefusedError, match=r"has ended"):
        transport.connect(path, 2)
    path.write_text("user data")
    assert not transport.is_endpoint(os.lstat(path), path, transport.TCP)
    with pytest.raises(ConnectionRefusedError, match=r"not a vcam control file"):
        transport.connect(path, 2)
    with pytest.raises(FileNotFoundError):
        transport.connect(tmp_path / "missing.sock", 2)


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="a file of another uid: needs root (and uids: not on Windows)"
)
def test_another_users_control_file_is_never_followed(tmp_path):
    path = tmp_path / "vcam.sock"
    path.write_text(json.dumps({"port": 9, "token": "t", "pid": os.getpid()}))
    os.chown(path, 4321, 4321)
    with pytest.raises(transport.ForeignPeer) as info:
        transport.connect(path, 2)
    assert info.value.uid == 4321


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the peer's uid of a TCP connection: Linux only, not on Windows or macOS"
)
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_loopback_peers_uid_is_asked_of_the_kernel_and_agrees_with_proc(host, monkeypatch):
    """One kernel lookup for the one socket (sock_diag), the same answer as /proc/net/tcp's table;
    a peer that is gone: None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        srv = socket.socket(family)
        srv.bind((host, 0))
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    with srv:
        srv.listen(4)
        client = socket.create_connection(srv.getsockname()[:2])
        conn, _ = srv.accept()
        with client, conn:
            local, peer = conn.getsockname()[:2], conn.getpeername()[:2]
            asked = transport._diag_uid(local, peer)
            if asked is transport._NO_DIAG:
                pytest.skip("netlink sock_diag is not allowed here (the /proc table is read instead)")
            assert asked == transport.tcp_peer_uid(local, peer) == os.getuid()
            gone = (peer[0], 1 if peer[1] != 1 else 2)
            assert transport._diag_uid(local, gone) is None and transport.tcp_peer_uid(local, gone) is None
            monkeypatch.setattr(transport, "_diag_uid", lambda *a: transport._NO_DIAG)  # /proc's table instead
            assert transport.tcp_peer_uid(local, peer) == os.getuid() and transport.tcp_peer_uid(local, gone) is None
