"""`vcam ctl`: the local control socket (server, client, CLI) on a real Unix socket, and the
commands' tests over the loopback TCP transport too (Windows' own, :mod:`vcam.platform.transport`)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import WINDOWS, windows_lacks
from typer.testing import CliRunner

from vcam.cli.control import ctl_app
from vcam.config import Config
from vcam.control.client import send_command
from vcam.control.commands import BY_KEY
from vcam.control.local import ControlServer, handle_command
from vcam.errors import ControlError
from vcam.platform import transport
from vcam.state import RuntimeState, Status
from vcam.types import SourceFace


def solid_face(name: str, bgr: tuple[int, int, int]) -> SourceFace:
    img = np.empty((128, 128, 3), np.uint8)
    img[...] = bgr
    return SourceFace(name=name, image=img)


def make_state() -> RuntimeState:
    faces = {n: solid_face(n, c) for n, c in (("alice", (0, 0, 255)), ("bob", (255, 0, 0)), ("carol", (0, 255, 0)))}
    return RuntimeState(faces, active="alice")


@pytest.fixture(params=transport.KINDS)
def kind(request):
    """Each local transport this OS offers: the Unix socket (POSIX) and loopback TCP (all)."""
    if request.param == transport.UNIX and not hasattr(socket, "AF_UNIX"):
        pytest.skip("Unix domain sockets: not on Windows (its transport is loopback TCP)")
    return request.param


@pytest.fixture
def served(tmp_path, kind):
    state = make_state()
    path = tmp_path / "ctl" / "vcam.sock"
    server = ControlServer(path, state, transport=kind)
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
    with transport.connect(path, 2) as s:
        s.sendall(b'this is not json\n[1, 2]\n{"face": "carol"}\n')
        lines = b""
        while lines.count(b"\n") < 3:
            lines += s.recv(4096)
    replies = [json.loads(x) for x in lines.splitlines()]
    assert replies[0]["ok"] is False and replies[0]["error"].startswith("not JSON")
    assert replies[1]["ok"] is False and "JSON object" in replies[1]["error"]
    assert replies[2]["ok"] is True and replies[2]["face"] == "carol"


def _one_exchange(path, payload: bytes, close_write: bool = False) -> dict:
    with transport.connect(path, 5) as s:
        s.sendall(payload)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.endswith(b"\n"), data
    return json.loads(data)


def test_every_line_gets_a_reply(served, caplog):
    """Deeply nested JSON, a last command without a newline, numbers for booleans: always a reply."""
    path, state, _ = served
    deep = b"[" * 30000 + b"]" * 30000 + b"\n"
    reply = _one_exchange(path, deep)
    assert reply["ok"] is False and "nested too deep" in reply["error"]
    assert "RecursionError" not in caplog.text
    reply = _one_exchange(path, b'{"face": "bob"}', close_write=True)  # no trailing newline
    assert reply["ok"] is True and state.active == "bob"
    for value in (1, 0, 1.0, "1", None, [True]):
        reply = _one_exchange(path, json.dumps({"swap": value}).encode() + b"\n")
        assert reply["ok"] is False and "'swap' must be on, off or toggle" in reply["error"], value
    assert state.swap_enabled is True
    assert _one_exchange(path, b'{"swap": false}\n')["swap"] == "off"
    with pytest.raises(ValueError):
        state.set_swap(1)


def test_socket_is_private(served):
    path, _, server = served
    is_kind = stat.S_ISSOCK if server.transport == transport.UNIX else stat.S_ISREG  # TCP: the port and token file
    assert is_kind(os.lstat(path).st_mode)
    if os.name == "posix":  # Windows: no mode bits (the profile folder's ACL keeps others out)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700  # created by the server


def test_stop_removes_the_socket(tmp_path, kind):
    path = tmp_path / "vcam.sock"
    server = ControlServer(path, make_state(), transport=kind)
    server.start()
    assert path.exists()
    server.stop()
    assert not path.exists()
    server.stop()  # idempotent


def _left_by_a_killed_daemon(path, kind) -> None:
    """What a killed daemon leaves behind: the socket file nobody listens on, or the TCP control
    file of a process that has ended."""
    if kind == transport.UNIX:
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(path))
        dead.close()
        return
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({"port": 9, "token": "old", "pid": int(ended.stdout)}))
    path.chmod(0o600)


def test_stale_socket_is_replaced_and_a_live_one_refused(tmp_path, kind):
    path = tmp_path / "vcam.sock"
    _left_by_a_killed_daemon(path, kind)
    with pytest.raises(ControlError, match=r"no vcam daemon listens on"):
        send_command(path, {"face": "bob"}, timeout=2)
    first = ControlServer(path, make_state(), transport=kind)
    first.start()
    try:
        assert send_command(path, {"face": "bob"})["face"] == "bob"
        with pytest.raises(ControlError, match=r"another vcam is running") as info:
            ControlServer(path, make_state(), transport=kind).start()
        assert "[control] socket" in info.value.hint
        assert send_command(path, {"status": True})["face"] == "bob"  # the first one is untouched
    finally:
        first.stop()


@pytest.mark.parametrize(("kind", "what"), [(transport.UNIX, "a socket"), (transport.TCP, "a vcam control file")])
def test_a_regular_file_in_the_way_is_never_deleted(tmp_path, kind, what):
    path = tmp_path / "vcam.sock"
    path.write_text("user data")
    with pytest.raises(ControlError, match=rf"exists and is not {what}") as info:
        ControlServer(path, make_state(), transport=kind).start()
    assert info.value.message.endswith(f"is not {what}")
    assert path.read_text() == "user data"


def test_over_tcp_a_connection_without_the_token_is_dropped(tmp_path, caplog):
    """Loopback TCP: any local user can reach the port, only the user can read the token."""
    path, state = tmp_path / "vcam.sock", make_state()
    with ControlServer(path, state, transport=transport.TCP):
        _refuses_without_the_token(path, state, caplog)


def _refuses_without_the_token(path, state, caplog) -> None:
    port = transport.read_endpoint(path).port
    for first in (b'{"face": "bob"}\n', b"not-the-token\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(first + b'{"face": "bob"}\n')
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        assert json.loads(data) == {"ok": False, "error": "permission denied"}
    assert state.active == "alice" and "refused a connection without the token" in caplog.text
    assert send_command(path, {"face": "bob"})["face"] == "bob"  # the token's holder is served


def test_client_without_daemon_says_what_to_do(tmp_path):
    with pytest.raises(ControlError, match=r"no vcam daemon listens on") as info:
        send_command(tmp_path / "missing.sock", {"face": "bob"})
    assert "vcam run" in info.value.hint


# --- CLI -------------------------------------------------------------------------------------


def test_cli_switches_faces_and_prints_status_json(kind):
    state = make_state()
    path = Config().socket_path  # $XDG_RUNTIME_DIR/vcam.sock from the isolated test dirs
    runner = CliRunner()
    with ControlServer(path, state, transport=kind):  # the client goes by what it finds there
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
    cfg.write_text(f"[control]\nsocket = '{path}'\n")
    state = make_state()
    with ControlServer(path, state):
        res = CliRunner().invoke(ctl_app, ["face", "bob", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert state.active == "bob"


# --- pause and resume ------------------------------------------------------------------------


def test_pause_and_resume_over_the_socket(served):
    """``{"pause": true|false|"toggle"}`` sets the state's pause (the frame loop closes the camera:
    vcam.runtime.pause); every reply says ``paused``; anything else is refused and changes nothing."""
    path, state, _ = served
    assert send_command(path, {"status": True})["paused"] is False
    reply = send_command(path, {"pause": True})
    assert reply["ok"] and reply["paused"] is True and state.paused is True and state.snapshot().paused
    assert send_command(path, {"face": "bob"})["paused"] is True  # other commands leave it as it is
    assert send_command(path, {"pause": "toggle"})["paused"] is False and state.paused is False
    assert send_command(path, {"pause": "toggle"})["paused"] is True
    assert send_command(path, {"pause": False})["paused"] is False
    for bad in (1, 0, "yes", "on", None, [True]):
        with pytest.raises(ControlError, match="'pause' must be true, false or toggle"):
            send_command(path, {"pause": bad})
        assert handle_command(state, {"pause": bad})["paused"] is False and state.paused is False
    with pytest.raises(ValueError, match="pause must be true, false or toggle"):
        state.set_paused("on")


def test_pause_acts_on_every_stream_or_the_one_named():
    streams = {"a": make_state(), "b": make_state()}
    r = handle_command(streams["a"], {"pause": True}, streams)
    assert r["ok"] and {n: s["paused"] for n, s in r["streams"].items()} == {"a": True, "b": True}
    assert streams["a"].paused and streams["b"].paused
    r = handle_command(streams["a"], {"stream": "b", "pause": False}, streams)
    assert r["ok"] and r["stream"] == "b" and r["paused"] is False
    assert streams["a"].paused and not streams["b"].paused


def test_pause_wakes_state_listeners_once_per_change():
    state, seen = make_state(), []
    state.subscribe(lambda snap: seen.append(snap.paused))
    state.set_paused(True)
    state.set_paused(True)  # no change: nobody is told
    state.set_paused("toggle")
    assert seen == [True, False]


def test_cli_pause_and_resume(kind):
    state = make_state()
    path = Config().socket_path
    runner = CliRunner()
    with ControlServer(path, state, transport=kind):
        res = runner.invoke(ctl_app, ["pause"])
        assert res.exit_code == 0 and res.output.strip() == "paused", res.output
        assert state.paused is True
        data = json.loads(runner.invoke(ctl_app, ["status"]).stdout)
        assert data["paused"] is True
        res = runner.invoke(ctl_app, ["resume"])
        assert res.exit_code == 0 and res.output.strip() == "running", res.output
        assert state.paused is False


def test_cli_pause_names_each_stream_of_a_daemon_running_several():
    streams = {"a": make_state(), "b": make_state()}
    path = Config().socket_path
    runner = CliRunner()
    with ControlServer(path, streams["a"], streams=streams):
        res = runner.invoke(ctl_app, ["--stream", "b", "pause"])
        assert res.exit_code == 0 and res.output.strip() == "paused", res.output
        assert streams["b"].paused and not streams["a"].paused
        res = runner.invoke(ctl_app, ["pause"])
        assert res.exit_code == 0 and res.output.split() == ["a:", "paused", "b:", "paused"], res.output


# --- per-person mapping ----------------------------------------------------------------------


def mapping_state() -> RuntimeState:
    """make_state() with the map targets 'ann' and 'ben' (obs_harness.with_map_targets)."""
    from obs_harness import with_map_targets

    return with_map_targets(make_state())


def test_map_and_unmap_over_the_socket(tmp_path):
    state = mapping_state()
    path = tmp_path / "vcam.sock"
    with ControlServer(path, state):
        reply = send_command(path, {"map": {"target": "ann", "source": "bob"}})
        assert reply["mappings"] == {"ann": "bob"} and reply["face"] == "alice" and reply["faces"] == ["alice", "bob", "carol"]
        assert [(m.target.name, m.source.name) for m in state.snapshot().mapping] == [("ann", "bob")]
        reply = send_command(path, {"map": {"target": "ben", "source": "carol"}, "face": "carol"})
        assert reply["mappings"] == {"ann": "bob", "ben": "carol"} and reply["face"] == "carol"
        status = send_command(path, {"status": True})
        assert status["mappings"] == {"ann": "bob", "ben": "carol"} and "status" in status
        assert send_command(path, {"unmap": "ann"})["mappings"] == {"ben": "carol"}
        with pytest.raises(ControlError, match=r"^unknown face 'nobody'") as info:
            send_command(path, {"map": {"target": "ben", "source": "nobody"}})
        assert info.value.hint == "known faces: alice, bob, carol"
        with pytest.raises(ControlError, match=r"^unknown map target 'zoe'"):
            send_command(path, {"map": {"target": "zoe", "source": "bob"}})
        with pytest.raises(ControlError, match=r"^'ann' has no mapping") as info:
            send_command(path, {"unmap": "ann"})
        assert info.value.hint == "mapped targets: ben"
        for bad in ("ann", {"target": "ann"}, {"target": "ann", "source": 3}, {"target": "", "source": "bob"}):
            with pytest.raises(ControlError, match=r"'map' must be an object like"):
                send_command(path, {"map": bad})
        with pytest.raises(ControlError, match=r"'unmap' must be a target name"):
            send_command(path, {"unmap": ["ben"]})
        with pytest.raises(ControlError, match=r"unknown command key\(s\): mapping") as info:
            send_command(path, {"mapping": {}})
        # the commands, then the desk's settings from their table
        assert info.value.hint == "use face, swap, pause, map, unmap, status or " + ", ".join(BY_KEY)
        assert state.mappings == {"ben": "carol"}
        error = handle_command(state, {"unmap": "zoe"})  # error replies carry the mappings too
        assert error["ok"] is False and error["mappings"] == {"ben": "carol"}


def test_cli_map_unmap_and_status():
    state = mapping_state()
    runner = CliRunner()
    with ControlServer(Config().socket_path, state):
        res = runner.invoke(ctl_app, ["map", "ann", "bob"])
        assert res.exit_code == 0, res.output
        assert res.stdout.splitlines() == ["map: ann -> bob"]
        res = runner.invoke(ctl_app, ["map", "ben", "carol"])
        assert res.stdout.splitlines() == ["map: ann -> bob", "map: ben -> carol"]
        res = runner.invoke(ctl_app, ["status"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["mappings"] == {"ann": "bob", "ben": "carol"}
        res = runner.invoke(ctl_app, ["unmap", "ann"])
        assert res.exit_code == 0 and res.stdout.splitlines() == ["map: ben -> carol"]
        res = runner.invoke(ctl_app, ["unmap", "ben"])
        assert res.stdout.splitlines() == ["map: none (every face follows the default)"]
        res = runner.invoke(ctl_app, ["map", "ann", "nobody"])
        assert res.exit_code == ControlError.exit_code
        assert res.output.strip().splitlines() == ["error: unknown face 'nobody' (known faces: alice, bob, carol)"]


def test_cli_map_without_a_recogniser_says_how_to_turn_it_on():
    state = make_state()  # a run started without [[swap.map]]: no target loader
    with ControlServer(Config().socket_path, state):
        res = CliRunner().invoke(ctl_app, ["map", "ann", "bob"])
    assert res.exit_code == ControlError.exit_code
    assert res.output.strip().splitlines() == [
        "error: per-person mapping is off in this run (no recogniser is loaded) "
        "(start `vcam run` with --map TARGET=SOURCE or a [[swap.map]] entry in config.toml)"
    ]
    assert state.mappings == {}


def test_cli_status_names_nan_guard_counts_per_model():
    state = make_state()
    runner = CliRunner()
    with ControlServer(Config().socket_path, state):
        state.publish_status(Status(guarded={"inswapper_128": 0}))
        res = runner.invoke(ctl_app, ["status"])
        assert res.exit_code == 0 and "NaN guard" not in res.output  # zero counts say nothing
        state.publish_status(Status(guarded={"inswapper_128": 3, "gfpgan_1.4": 0}))
        res = runner.invoke(ctl_app, ["status"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"]["guarded"] == {"inswapper_128": 3, "gfpgan_1.4": 0}
    assert res.stderr.strip() == "note: NaN guard: inswapper_128 3 (faces passed through unswapped: the model produced NaN/Inf)"


def test_cli_status_says_a_remote_swapper_is_down():
    state = make_state()
    with ControlServer(Config().socket_path, state):
        note = "swapper: remote gpu-box:8001 down since 12:01:03"
        state.publish_status(Status(engines=(note,), guarded={"inswapper_128": 7}))
        res = CliRunner().invoke(ctl_app, ["status"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"]["engines"] == [note]
    assert res.stderr.strip().splitlines()[0] == f"note: {note}"


# --- other users -----------------------------------------------------------------------------


def _nobody_connects(path: str, payload: bytes, conn) -> None:
    """In a spawned interpreter: drop to uid/gid 65534 and try the socket; send (outcome, reply)."""
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(path)
            try:
                s.sendall(payload)
            except BrokenPipeError:
                pass  # refused and closed before we wrote: the refusal is still there to read
            conn.send(("connected", s.recv(4096)))
        except PermissionError:
            conn.send(("permission", b""))
        except ConnectionRefusedError:
            conn.send(("refused", b""))
    except BaseException as exc:  # report anything else to the parent
        conn.send(("error", repr(exc).encode()))


def _connect_as_nobody(path: Path, payload: bytes) -> tuple[str, bytes]:
    """A fresh interpreter that drops to uid/gid 65534 and tries the socket; returns (outcome, reply).
    Spawned, not forked: a forked child of a process with threads can deadlock on a lock one held."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_nobody_connects, args=(str(path), payload, child))
    proc.start()
    child.close()
    try:
        return parent.recv() if parent.poll(60) else ("error", b"no reply in 60 s")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


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


@pytest.mark.slow
def test_another_user_cannot_connect(open_dir):
    state = make_state()
    path = open_dir / "vcam.sock"
    with ControlServer(path, state):
        outcome, _ = _connect_as_nobody(path, b'{"face": "bob"}\n')
        assert outcome == "permission"
        assert state.active == "alice"
        assert send_command(path, {"face": "bob"})["face"] == "bob"  # the owner still can


@pytest.mark.slow
def test_peer_credentials_are_checked_even_if_the_mode_is_loosened(open_dir):
    state = make_state()
    path = open_dir / "vcam.sock"
    with ControlServer(path, state):
        os.chmod(path, 0o666)  # a user mistake: the server still refuses other uids
        outcome, reply = _connect_as_nobody(path, b'{"face": "bob"}\n')
        assert outcome == "connected"
        assert json.loads(reply) == {"ok": False, "error": "permission denied"}
        assert state.active == "alice"


@pytest.mark.slow
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


@pytest.mark.slow
def test_ctl_switches_faces_on_a_running_daemon(tmp_path):
    """The daemon on the demo clip starts the control server; `vcam ctl` switches its output."""
    from obs_harness import CapturingOutput, colour_pixels, demo_daemon_config, solid_faces

    from vcam.runtime.daemon import Daemon

    sock = tmp_path / "run" / "vcam.sock"
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f"[control]\nsocket = '{sock}'\n")
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


# --- load, hostile folders ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_backlog_is_one_busy_line_not_a_crash(tmp_path):
    """A daemon that does not accept (busy) with its queue full: the client waits, then says so."""
    path = tmp_path / "full.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    pending = []
    try:
        while True:  # fill the backlog
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(str(path))
            except BlockingIOError:
                c.close()
                break
            pending.append(c)
        t0, timeout = time.monotonic(), 1.0
        with pytest.raises(ControlError, match="stayed busy for 1s") as info:
            send_command(path, {"status": True}, timeout=timeout)
        assert time.monotonic() - t0 < 3 * timeout and info.value.hint == "retry in a moment"  # gave up, not hung
        cfg = tmp_path / "c.toml"
        cfg.write_text(f"[control]\nsocket = '{path}'\n")
        import vcam.control.client as client

        real_send = client.send_command
        try:  # the CLI as users run it (with a short timeout so the test is quick)
            client.send_command = lambda p, cmd, timeout=30.0: real_send(p, cmd, timeout=0.5)
            res = CliRunner().invoke(ctl_app, ["status", "--config", str(cfg)])
        finally:
            client.send_command = real_send
        assert res.exit_code == ControlError.exit_code
        assert res.output.strip().splitlines() == [f"error: the vcam daemon at {path} stayed busy for 0.5s (retry in a moment)"]
    finally:
        for c in pending:
            c.close()
        srv.close()


@pytest.mark.slow
def test_500_concurrent_clients_all_answered_while_frames_flow(tmp_path):
    """500 `vcam ctl`-style clients at once against a running daemon: each gets a reply or one clear
    busy line, and the frame loop keeps publishing."""
    import subprocess
    import sys

    from obs_harness import CapturingOutput, demo_daemon_config, solid_faces

    from benchmarks.control import CLIENTS
    from vcam.runtime.daemon import Daemon

    class Timed(CapturingOutput):
        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []

        def send(self, data):
            super().send(data)
            self.stamps.append(time.perf_counter())

    sock = tmp_path / "run" / "vcam.sock"
    cfg = demo_daemon_config(sock)
    cfg = cfg.replace(capture=type(cfg.capture)(**{**cfg.capture.__dict__, "pacing": "realtime"}))
    state = RuntimeState(solid_faces(("alice", "bob")), active="alice")
    out = Timed()
    daemon = Daemon(cfg, state=state, output=out)
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
        time.sleep(2.0)
        t_storm = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-c", CLIENTS, str(sock), "500"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=Path(__file__).resolve().parents[2],
        )
        t_end = time.perf_counter()
        assert p.returncode == 0, p.stderr[-2000:]  # no client crashed (a traceback would fail the script)
        results = json.loads(p.stdout)
        assert set(results) <= {"ok", "busy"}, {r: results.count(r) for r in set(results)}
        assert results.count("ok") >= 450, f"{results.count('ok')} ok of 500"
        stamps = np.array(out.stamps)
        before = np.diff(stamps[(stamps > t_storm - 2.0) & (stamps < t_storm)])
        during = np.diff(stamps[(stamps >= t_storm) & (stamps <= t_end)])
        p99_before, p99_during = np.percentile(before, 99), np.percentile(during, 99)
        print(
            f"publish gap p99: {p99_before * 1e3:.1f} ms before, {p99_during * 1e3:.1f} ms during 500 clients "
            f"({len(during)} frames in {t_end - t_storm:.1f}s)"
        )
        # The frame loop kept publishing: at least a quarter of the frames its rate before the storm
        # predicts for the storm's length (a fixed count failed when the 500 clients were done in
        # 0.4 s; half failed on two cores shared with other work, where the clients' process takes
        # a core's share from the daemon).
        expected = (t_end - t_storm) / float(np.median(before))
        assert len(during) >= max(3, 0.25 * expected - 1), (len(during), expected)
        # No long stall: a loop that waited on the control server would go without a frame for
        # about the storm's length. (Loose: a 2-core machine runs the 500 clients too.)
        assert p99_during < max(4 * p99_before, 0.25 * (t_end - t_storm)), (p99_during, p99_before, t_end - t_storm)
        assert daemon.summary.error is None
    finally:
        daemon.stop()


@windows_lacks("mode bits (a folder others can write)")
def test_a_socket_folder_others_can_write_is_refused(tmp_path, caplog):
    """A socket in a folder someone else can write could be swapped for theirs: local control is
    off with one warning, the daemon runs on."""
    import logging

    from obs_harness import CapturingOutput, demo_daemon_config, solid_faces

    from vcam.runtime.daemon import Daemon

    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(ControlError, match=r"is not private \(owner uid \d+, mode 0777\)"):
        ControlServer(folder / "vcam.sock", make_state()).start()
    caplog.set_level(logging.WARNING)
    d = Daemon(
        demo_daemon_config(folder / "vcam.sock"),
        state=RuntimeState(solid_faces(("alice",)), active="alice"),
        output=CapturingOutput(),
    )
    s = d.run(max_frames=5)
    assert s.frames_out == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("local control disabled: the control socket folder"), warnings
    assert not list(folder.iterdir())


def test_without_a_runtime_dir_the_socket_is_private_under_home(tmp_path, monkeypatch):
    """su, ssh, cron: no XDG_RUNTIME_DIR. Another user's /tmp/runtime-<uid> cannot stop vcam: the
    socket goes under the user's home, where `vcam ctl` finds it too."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = Config().socket_path
    home = os.environ["LOCALAPPDATA"] if WINDOWS else os.environ["XDG_STATE_HOME"]  # Windows: the profile's
    assert path == Path(home) / "vcam" / "run" / "vcam.sock"
    state = make_state()
    with ControlServer(path, state):
        res = CliRunner().invoke(ctl_app, ["face", "carol"])
        assert res.exit_code == 0, res.output
    assert state.active == "carol"
    if not WINDOWS:  # no mode bits there: the profile's ACL keeps the folder the user's
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def _hostile_child(home: str, conn) -> None:
    """In a spawned interpreter: become uid/gid 65534 with no runtime dir, start control, switch a face."""
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        for k in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
            os.environ.pop(k, None)
        os.environ["HOME"] = home
        path = Config().socket_path
        with ControlServer(path, make_state()):
            reply = send_command(path, {"face": "bob"}, timeout=5)
        conn.send(json.dumps({"path": str(path), "face": reply["face"]}))
    except BaseException as exc:
        conn.send(json.dumps({"error": repr(exc)}))


@pytest.mark.slow
def test_as_another_user_a_hostile_tmp_runtime_dir_changes_nothing(tmp_path):
    """Run as uid 65534 without XDG_RUNTIME_DIR while /tmp/runtime-65534 belongs to root (mode
    0700, so that user cannot even look inside): control starts under that user's home."""
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("needs root to switch to another user")
    import shutil

    hostile = Path("/tmp/runtime-65534")
    if hostile.exists():
        pytest.skip(f"{hostile} exists on this machine")
    hostile.mkdir(mode=0o700)
    home = Path(tempfile.mkdtemp(prefix="vcam-nobody-"))
    os.chown(home, 65534, 65534)
    # A fresh interpreter (spawned as root, then dropping to that user), not a fork of this one: a
    # forked child of a process with threads, such as torch's, can deadlock on a lock one held.
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_hostile_child, args=(str(home), child))
    try:
        proc.start()
        child.close()
        data = parent.recv() if parent.poll(60) else json.dumps({"error": "no reply in 60 s"})
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(home, ignore_errors=True)
        hostile.rmdir()
    got = json.loads(data)
    assert got.get("face") == "bob", got
    assert got["path"] == f"{home}/.local/state/vcam/run/vcam.sock"


# --- load: the connection cap, the idle timeout, slow face loads (issue 27) ---------------------


def _thread_cpu_ticks(native_id: int) -> int:
    """User + system CPU time of one thread of this process, in clock ticks."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)


def _cpu_over(seconds: float, native_id: int) -> tuple[int, int]:
    """CPU ticks the thread ``native_id`` used over ``seconds``, and those a busy loop in this
    process used over the same window (the yardstick: a thread that never waits)."""
    stop = threading.Event()
    spun: dict[str, int] = {}

    def busy() -> None:
        me = threading.get_native_id()
        start = _thread_cpu_ticks(me)
        while not stop.is_set():
            pass
        spun["ticks"] = _thread_cpu_ticks(me) - start

    before = _thread_cpu_ticks(native_id)
    t = threading.Thread(target=busy)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return _thread_cpu_ticks(native_id) - before, spun["ticks"]


@pytest.fixture
def many_files():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want < 2600:
        pytest.skip(f"needs about 2,600 open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_a_thousand_idle_connections_neither_spin_the_server_nor_lock_out_status(tmp_path, many_files, monkeypatch):
    """1,000 connections that never send a byte (far more than the cap): the control thread sleeps
    in select instead of spinning on a readable listener, and a new client still gets its status."""
    import vcam.control.local as local

    monkeypatch.setattr(local, "CLIENT_IDLE_TIMEOUT", 120.0)  # no help from the idle timeout here
    path = tmp_path / "ctl" / "vcam.sock"
    held: list[socket.socket] = []
    with ControlServer(path, make_state()) as server:
        try:
            for _ in range(1000):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                held.append(c)
                c.connect(str(path))
            time.sleep(0.5)  # let the server take (or give up on) what it will
            ctl, yardstick = _cpu_over(2.0, server._thread.native_id)
            assert yardstick >= 10, f"the busy loop got only {yardstick} ticks: the measurement means nothing"
            # A spinning control thread keeps up with the busy loop (both share the GIL); one that
            # waits in select uses next to nothing.
            assert ctl < 0.1 * yardstick, f"control thread: {ctl} ticks, a busy loop: {yardstick} ticks"
            reply = send_command(path, {"status": True}, timeout=10.0)
            assert reply["ok"] and "status" in reply
            assert len(server._clients) <= local.MAX_CLIENTS
        finally:
            for c in held:
                c.close()


def test_an_idle_connection_is_closed_and_a_talking_one_kept(tmp_path, monkeypatch, kind):
    import vcam.control.local as local

    monkeypatch.setattr(local, "CLIENT_IDLE_TIMEOUT", 0.5)
    path = tmp_path / "ctl" / "vcam.sock"
    with ControlServer(path, make_state(), transport=kind):
        t0 = time.monotonic()  # before the idle one connects: the server counts from its accept
        idle, talker = transport.connect(path, 30), transport.connect(path, 30)
        with idle, talker:
            idle.setblocking(False)
            closed_after = None
            while time.monotonic() - t0 < 20 and closed_after is None:
                talker.sendall(b'{"status": true}\n')  # a command every 0.1 s: never idle
                assert json.loads(talker.recv(65536).split(b"\n")[0])["ok"]
                try:
                    if idle.recv(1) == b"":
                        closed_after = time.monotonic() - t0
                except BlockingIOError:
                    pass
                time.sleep(0.1)
            assert closed_after is not None, "the idle connection was never closed"
            assert closed_after >= 0.5  # not before its time
            for _ in range(3):  # the talker outlived the idle one by more than a timeout
                time.sleep(0.2)
                talker.sendall(b'{"status": true}\n')
                assert json.loads(talker.recv(65536).split(b"\n")[0])["ok"]


def _slow_loader(seconds: float, started: threading.Event):
    def load(name: str) -> SourceFace:
        started.set()
        time.sleep(seconds)
        return solid_face(name, (9, 9, 9))

    return load


@pytest.mark.slow
def test_a_slow_face_load_does_not_delay_another_clients_status(served):
    path, state, _ = served
    load_s = 3.0
    started = threading.Event()
    state.set_loader(_slow_loader(load_s, started))
    result: dict = {}
    loading = threading.Thread(target=lambda: result.update(send_command(path, {"face": "dave"}, timeout=60)))
    t0 = time.monotonic()
    loading.start()
    try:
        assert started.wait(30)
        t1 = time.monotonic()
        assert send_command(path, {"status": True}, timeout=30)["ok"]
        assert send_command(path, {"face": "bob"}, timeout=30)["face"] == "bob"  # loaded already: not queued
        status_s = time.monotonic() - t1
        assert status_s < 0.25 * load_s, f"status took {status_s:.2f}s during a {load_s}s face load"
        assert loading.is_alive(), "the load finished first: the test proved nothing"
    finally:
        loading.join(60)
    assert result.get("ok") and result["face"] == "dave" and time.monotonic() - t0 >= load_s


@pytest.mark.slow
def test_at_the_cap_with_every_connection_loading_a_newcomer_hears_busy(served, monkeypatch):
    import vcam.control.local as local

    path, state, _ = served
    monkeypatch.setattr(local, "MAX_CLIENTS", 2)
    server = ControlServer(path.with_name("capped.sock"), state, transport=served[2].transport)
    started = threading.Event()
    state.set_loader(_slow_loader(3.0, started))
    loads = [threading.Thread(target=lambda n=n: send_command(server.path, {"face": n}, timeout=60)) for n in ("dave", "erin")]
    with server:
        for t in loads:
            t.start()
        try:
            assert started.wait(30)
            time.sleep(0.3)  # both connections are open, their commands in flight
            with pytest.raises(ControlError) as info:
                send_command(server.path, {"status": True}, timeout=1.0)
            said = f"{info.value.message} ({info.value.hint})"
            assert "busy" in said and "connection" in said and "vcam run" not in said, said
        finally:
            for t in loads:
                t.join(60)


def test_obs_hint_tells_a_hung_obs_from_a_switched_off_server():
    """Connection refused: enable the WebSocket server. Accepted and then silence: OBS is not
    answering, and enabling the server (it is on) would not help."""
    from vcam.config import ObsConfig
    from vcam.control.obs_scene import connect

    hung = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts (in the kernel), never answers the websocket handshake
    closed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
    try:
        with pytest.raises(ControlError) as refused:
            connect(ObsConfig(host="127.0.0.1", port=closed.getsockname()[1]), timeout=1.0)
        with pytest.raises(ControlError) as silent:
            connect(ObsConfig(host="127.0.0.1", port=hung.getsockname()[1]), timeout=1.0)
    finally:
        hung.close()
        closed.close()
    assert "Enable WebSocket server" not in silent.value.hint and "not answering" in silent.value.hint, silent.value.hint
    assert "timed out" in silent.value.message, silent.value.message
    assert "refused" in refused.value.message and "Enable WebSocket server" in refused.value.hint


# --- the desk's settings (vcam.control.commands) -------------------------------------------------


def test_settings_from_the_table_over_the_socket_and_the_cli(kind):
    """Each row of SETTINGS is a socket command and a `vcam ctl KEY VALUE` command: a setting the
    run offers changes (every reply carries ``settings``), a bad value or one the run does not offer
    is refused with the row's hint and changes nothing."""
    from vcam.control.commands import SETTINGS

    state = make_state()
    path = Config().socket_path
    runner = CliRunner()
    with ControlServer(path, state, transport=kind):
        for setting in SETTINGS:
            cmd = setting.key.replace("_", "-")
            value = {"switch": "on", "amount": 0.5, "choice": 1}[setting.kind]
            with pytest.raises(ControlError, match=f"{setting.label} is not available in this run") as info:
                send_command(path, {setting.key: value})
            assert info.value.hint == setting.hint
            args = ["set", "1"] if setting.kind == "choice" else [str(value)]
            res = runner.invoke(ctl_app, [cmd, *args])
            assert res.exit_code != 0 and "not available in this run" in res.output, res.output
            if setting.kind == "choice":  # a choice of the values the run lists (the cameras)
                state.offer(setting.key, 0, choices=lambda refresh: [(0, "cam a"), (1, "cam b")])
                reply = send_command(path, {setting.key: 1})
                assert reply["settings"][setting.key] == 1 and reply["choices"][setting.key] == [[0, "cam a"], [1, "cam b"]]
                res = runner.invoke(ctl_app, [cmd, "set", "cam a"])  # by its label too
                assert res.exit_code == 0 and res.output.strip() == f"{cmd}: 0 (cam a)", res.output
                res = runner.invoke(ctl_app, [cmd, "list"])
                assert res.exit_code == 0 and res.output.splitlines() == ["*  0  cam a", "   1  cam b"], res.output
                with pytest.raises(ControlError, match=f"no {setting.label} 7 in this run"):
                    send_command(path, {setting.key: 7})
                assert state.settings[setting.key] == 0
                continue
            state.offer(setting.key, False if setting.kind == "switch" else 1.0)
            if setting.kind == "switch":
                assert send_command(path, {setting.key: "toggle"})["settings"][setting.key] is True
                assert state.snapshot().settings[setting.key] is True
                res = runner.invoke(ctl_app, [cmd, "off"])
                assert res.exit_code == 0 and res.output.strip() == f"{cmd}: off", res.output
                bad, said = 1, "must be on, off or toggle"
            else:
                assert send_command(path, {setting.key: 0.25})["settings"][setting.key] == 0.25
                res = runner.invoke(ctl_app, [cmd, "0.75"])
                assert res.exit_code == 0 and res.output.strip() == f"{cmd}: 0.75", res.output
                bad, said = 2, "must be a number from 0 to 1"
            before = state.settings[setting.key]
            with pytest.raises(ControlError, match=said):
                send_command(path, {setting.key: bad})
            assert state.settings[setting.key] == before


def test_a_setting_changes_every_stream_or_the_one_named():
    from vcam.control.commands import SETTINGS

    key = SETTINGS[0].key
    streams = {"a": make_state(), "b": make_state()}
    for st in streams.values():
        st.offer(key, True)
    r = handle_command(streams["a"], {"stream": "b", key: False}, streams)
    assert r["ok"] and r["settings"] == {key: False} and streams["a"].settings[key] is True
    r = handle_command(streams["a"], {key: "toggle"}, streams)
    assert r["ok"] and {n: s["settings"][key] for n, s in r["streams"].items()} == {"a": False, "b": True}
