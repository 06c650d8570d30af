"""`vcam ctl`: the local control socket (server, client, CLI) on a real Unix socket."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vcam.cli.control import ctl_app
from vcam.config import Config
from vcam.control.local import ControlServer, send_command
from vcam.errors import ControlError
from vcam.state import RuntimeState, Status
from vcam.types import SourceFace


def solid_face(name: str, bgr: tuple[int, int, int]) -> SourceFace:
    img = np.empty((128, 128, 3), np.uint8)
    img[...] = bgr
    return SourceFace(name=name, image=img)


def make_state() -> RuntimeState:
    faces = {n: solid_face(n, c) for n, c in (("alice", (0, 0, 255)), ("bob", (255, 0, 0)), ("carol", (0, 255, 0)))}
    return RuntimeState(faces, active="alice")


@pytest.fixture
def served(tmp_path):
    state = make_state()
    path = tmp_path / "ctl" / "vcam.sock"
    server = ControlServer(path, state)
    server.start()
    yield path, state, server
    server.stop()


def test_commands_change_the_runtime_state(served):
    path, state, _ = served
    assert send_command(path, {"face": "bob"})["face"] == "bob"
    assert state.active == "bob"
    assert send_command(path, {"face": "next"})["face"] == "carol"
    assert send_command(path, {"face": "next"})["face"] == "alice"  # wraps around, sorted by name
    assert send_command(path, {"face": "prev"})["face"] == "carol"
    reply = send_command(path, {"swap": "toggle"})
    assert reply["swap"] == "off" and state.swap_enabled is False
    assert send_command(path, {"swap": "on"})["swap"] == "on"
    assert reply["faces"] == ["alice", "bob", "carol"]


def test_status_reports_live_numbers(served):
    path, state, _ = served
    state.publish_status(Status(fps_out=29.5, latency_p50_ms=41.0, frames_out=123))
    reply = send_command(path, {"status": True})
    assert reply["face"] == "alice" and reply["swap"] == "on"
    assert reply["status"]["fps_out"] == 29.5
    assert reply["status"]["frames_out"] == 123


def test_unknown_face_is_reported_and_the_server_keeps_serving(served):
    path, state, _ = served
    with pytest.raises(ControlError, match=r"unknown face 'nobody'") as info:
        send_command(path, {"face": "nobody"})
    assert "alice, bob, carol" in (info.value.hint or "")
    assert state.active == "alice"
    with pytest.raises(ControlError, match=r"'swap' must be on, off or toggle, got 'sideways'"):
        send_command(path, {"swap": "sideways"})
    with pytest.raises(ControlError, match=r"unknown command key\(s\): volume"):
        send_command(path, {"volume": 3})
    assert send_command(path, {"face": "bob"})["face"] == "bob"


def test_bad_lines_get_an_error_reply(served):
    path, _, _ = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(path))
        s.sendall(b'this is not json\n[1, 2]\n{"face": "carol"}\n')
        lines = b""
        while lines.count(b"\n") < 3:
            lines += s.recv(4096)
    replies = [json.loads(x) for x in lines.splitlines()]
    assert replies[0] == {"ok": False, "error": "not JSON: send one JSON object per line"}
    assert replies[1]["ok"] is False and "JSON object" in replies[1]["error"]
    assert replies[2]["ok"] is True and replies[2]["face"] == "carol"


def test_socket_is_private(served):
    path, _, _ = served
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700  # created by the server


def test_stop_removes_the_socket(tmp_path):
    path = tmp_path / "vcam.sock"
    server = ControlServer(path, make_state())
    server.start()
    assert path.exists()
    server.stop()
    assert not path.exists()
    server.stop()  # idempotent


def test_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "vcam.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a killed daemon leaves behind
    first = ControlServer(path, make_state())
    first.start()
    try:
        assert send_command(path, {"face": "bob"})["face"] == "bob"
        with pytest.raises(ControlError, match=r"another vcam is running") as info:
            ControlServer(path, make_state()).start()
        assert "[control] socket" in info.value.hint
        assert send_command(path, {"status": True})["face"] == "bob"  # the first one is untouched
    finally:
        first.stop()


def test_a_regular_file_in_the_way_is_never_deleted(tmp_path):
    path = tmp_path / "vcam.sock"
    path.write_text("user data")
    with pytest.raises(ControlError, match=r"exists and is not a socket"):
        ControlServer(path, make_state()).start()
    assert path.read_text() == "user data"


def test_client_without_daemon_says_what_to_do(tmp_path):
    with pytest.raises(ControlError, match=r"no vcam daemon listens on") as info:
        send_command(tmp_path / "missing.sock", {"face": "bob"})
    assert "vcam run" in info.value.hint


# --- CLI -------------------------------------------------------------------------------------


def test_cli_switches_faces_and_prints_status_json():
    state = make_state()
    path = Config().socket_path  # $XDG_RUNTIME_DIR/vcam.sock from the isolated test dirs
    runner = CliRunner()
    with ControlServer(path, state):
        res = runner.invoke(ctl_app, ["face", "carol"])
        assert res.exit_code == 0, res.output
        assert "face: carol" in res.output
        assert state.active == "carol"
        res = runner.invoke(ctl_app, ["swap", "off"])
        assert res.exit_code == 0 and "swap: off" in res.output
        assert state.swap_enabled is False
        res = runner.invoke(ctl_app, ["status"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert data["face"] == "carol" and data["swap"] == "off" and "fps_out" in data["status"]
        res = runner.invoke(ctl_app, ["face", "nobody"])
        assert res.exit_code == ControlError.exit_code
        assert "unknown face 'nobody'" in res.output


def test_cli_without_daemon_exits_with_the_hint():
    res = CliRunner().invoke(ctl_app, ["face", "bob"])
    assert res.exit_code == ControlError.exit_code
    assert "no vcam daemon listens on" in res.output and "vcam run" in res.output


def test_cli_uses_the_config_file_socket(tmp_path):
    path = tmp_path / "custom.sock"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[control]\nsocket = "{path}"\n')
    state = make_state()
    with ControlServer(path, state):
        res = CliRunner().invoke(ctl_app, ["face", "bob", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert state.active == "bob"


# --- other users -----------------------------------------------------------------------------


def _connect_as_nobody(path: Path, payload: bytes) -> tuple[str, bytes]:
    """Fork a child that drops to uid/gid 65534 and tries the socket; returns (outcome, reply)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(str(path))
                s.sendall(payload)
                data = s.recv(4096)
                os.write(w, b"connected:" + data)
            except PermissionError:
                os.write(w, b"permission:")
            except ConnectionRefusedError:
                os.write(w, b"refused:")
        except BaseException as exc:  # report anything else to the parent
            os.write(w, b"error:" + repr(exc).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    outcome, _, reply = b"".join(chunks).partition(b":")
    return outcome.decode(), reply


@pytest.fixture
def open_dir():
    """A world-searchable directory, so only the socket's own mode keeps other users out."""
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("needs root to switch to another user")
    d = Path(tempfile.mkdtemp(prefix="vcam-ctl-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def test_another_user_cannot_connect(open_dir):
    state = make_state()
    path = open_dir / "vcam.sock"
    with ControlServer(path, state):
        outcome, _ = _connect_as_nobody(path, b'{"face": "bob"}\n')
        assert outcome == "permission"
        assert state.active == "alice"
        assert send_command(path, {"face": "bob"})["face"] == "bob"  # the owner still can


def test_peer_credentials_are_checked_even_if_the_mode_is_loosened(open_dir):
    state = make_state()
    path = open_dir / "vcam.sock"
    with ControlServer(path, state):
        os.chmod(path, 0o666)  # a user mistake: the server still refuses other uids
        outcome, reply = _connect_as_nobody(path, b'{"face": "bob"}\n')
        assert outcome == "connected"
        assert json.loads(reply) == {"ok": False, "error": "permission denied"}
        assert state.active == "alice"


def test_commands_never_wait_on_the_frame_loop(served):
    """A frame loop reading snapshots sees each switch from its next frame on."""
    path, state, _ = served
    seen: list[str] = []
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            snap = state.snapshot()
            seen.append(snap.face.name if snap.face else "-")
            time.sleep(0.002)

    t = threading.Thread(target=loop)
    t.start()
    try:
        for name in ("bob", "carol", "alice", "bob"):
            send_command(path, {"face": name})
            n = len(seen)
            deadline = time.monotonic() + 2
            while len(seen) <= n + 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert seen[-1] == name
    finally:
        stop.set()
        t.join()


def test_ctl_switches_faces_on_a_running_daemon(tmp_path):
    """The daemon on the demo clip starts the control server; `vcam ctl` switches its output."""
    from obs_harness import CapturingOutput, colour_pixels, demo_daemon_config, solid_faces

    from vcam.daemon import Daemon

    sock = tmp_path / "run" / "vcam.sock"
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f'[control]\nsocket = "{sock}"\n')
    state = RuntimeState(solid_faces(("alice", "bob")), active="alice")
    out = CapturingOutput()
    daemon = Daemon(demo_daemon_config(sock), state=state, output=out)
    daemon.start()
    runner = CliRunner()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error

        def shows(name: str) -> bool:
            n = out.frames
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if out.frames > n + 2 and colour_pixels(out.last, name) > 200:
                    return True
                time.sleep(0.02)
            return False

        assert shows("alice")
        res = runner.invoke(ctl_app, ["face", "bob", "--config", str(cfg_file)])
        assert res.exit_code == 0, res.output
        assert shows("bob") and colour_pixels(out.last, "alice") < 20
        res = runner.invoke(ctl_app, ["face", "next", "--config", str(cfg_file)])
        assert res.exit_code == 0 and "face: alice" in res.output
        assert shows("alice")
        res = runner.invoke(ctl_app, ["status", "--config", str(cfg_file)])
        status = json.loads(res.stdout)
        assert status["face"] == "alice" and status["faces"] == ["alice", "bob"]
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
    finally:
        daemon.stop()
    assert not sock.exists()  # removed at shutdown
