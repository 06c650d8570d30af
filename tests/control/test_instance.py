"""One daemon per control socket, and never a hand on another user's files."""

from __future__ import annotations

import os
import re
import socket

import pytest
from conftest import demo_run, vcam_cli, windows_lacks

from vcam.config import Config
from vcam.control.instance import AlreadyRunning, InstanceLock
from vcam.control.local import ControlServer
from vcam.errors import ControlError
from vcam.state import RuntimeState


def test_a_second_lock_on_the_same_socket_names_the_holder(tmp_path):
    first = InstanceLock(tmp_path / "vcam.sock")
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning, match=rf"another vcam \(pid {os.getpid()}\) is running"):
            InstanceLock(tmp_path / "vcam.sock").acquire()
        InstanceLock(tmp_path / "other.sock").acquire()  # another socket: its own daemon
    finally:
        first.close()
    again = InstanceLock(tmp_path / "vcam.sock")
    again.acquire()  # released: the next daemon takes it
    again.close()


#: A live run: the demo to the virtual camera (the locks come before the camera is opened, so the
#: refusal shows where there is no v4l2loopback too).
LIVE = ["run", "--input", "demo", "--output", "vcam", "--frames", "3", "--device", "cpu", "--quiet"]


def test_a_second_vcam_run_is_refused_in_one_line_naming_the_first():
    # This process holds the lock of the default socket, as a running daemon would.
    held = InstanceLock(Config().socket_path)
    held.acquire()
    try:
        res = vcam_cli(*LIVE)
        # A run with neither a camera nor a virtual camera goes ahead beside it, leaving the socket alone.
        beside = vcam_cli("-v", *demo_run())
    finally:
        held.close()
    assert res.returncode == ControlError.exit_code, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {os.getpid()}" in errors[0] and "Traceback" not in res.stderr
    assert "stopped:" not in res.stdout + res.stderr  # it never started
    assert beside.returncode == 0, beside.stderr
    assert "frames published of 3" in beside.stderr and "leaves the control socket and OBS to any live vcam" in beside.stderr
    assert not Config().socket_path.exists()


@windows_lacks("Unix sockets, uids and os.chown")
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0, reason="needs root to make a socket owned by another user")
def test_another_users_stale_socket_is_left_alone_and_the_video_goes_on(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o1777)  # a sticky shared folder, like /tmp
    path = folder / "vcam.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # a stale socket (nothing listens)
    os.chown(path, 65534, 65534)
    with pytest.raises(ControlError, match="belongs to another user"):
        ControlServer(path, RuntimeState()).start()
    assert path.exists()  # not ours: never unlinked
    # A run pointed at it: one warning, no local control, every frame still published.
    lock = folder / "vcam.sock.lock"
    lock.touch()
    os.chown(lock, 65534, 65534)
    os.chmod(lock, 0o600)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[control]\nsocket = '{path}'\n")
    res = vcam_cli(*demo_run("--config", str(cfg)))
    assert res.returncode == 0, res.stderr
    published = re.search(r"(\d+) frames published of 3", res.stdout + res.stderr)
    assert published and int(published.group(1)) >= 1, res.stderr  # the video went on
    assert "Traceback" not in res.stderr and path.exists()
    assert lock.read_bytes() == b""  # the other user's lock file: not written either


def test_an_obs_scene_lock_names_the_holder_and_the_scene(tmp_path):
    first = InstanceLock.for_obs_scene(tmp_path, "localhost", 4455, "FastSwap Faces")
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning, match=rf"pid {os.getpid()}\) drives the OBS scene 'FastSwap Faces' on 127.0.0.1:4455"):
            InstanceLock.for_obs_scene(tmp_path, "127.0.0.1", 4455, "FastSwap Faces").acquire()  # the same OBS
        other = InstanceLock.for_obs_scene(tmp_path, "127.0.0.1", 4455, "FastSwap Faces (cam2)")
        other.acquire()  # another scene: its own daemon
        other.close()
        elsewhere = InstanceLock.for_obs_scene(tmp_path, "127.0.0.1", 4456, "FastSwap Faces")
        elsewhere.acquire()  # another OBS
        elsewhere.close()
    finally:
        first.close()


def test_a_second_run_on_another_socket_but_the_same_obs_scene_is_refused(tmp_path):
    # This process drives the default OBS scene, as a running daemon with OBS control would.
    held = InstanceLock.for_obs_scene(Config().socket_path.parent, "127.0.0.1", 4455, "FastSwap Faces")
    held.acquire()
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f"[control]\nsocket = '{tmp_path / 'own.sock'}'\n[obs]\nenabled = true\nport = 4455\n")
        res = vcam_cli(*LIVE, "--config", str(cfg))
        assert res.returncode == ControlError.exit_code, res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"pid {os.getpid()}" in errors[0] and "FastSwap Faces" in errors[0], res.stderr
        assert "Traceback" not in res.stderr and "stopped:" not in res.stdout + res.stderr  # it never started
        # A conversion (no camera, no virtual camera) with the same config goes ahead: no OBS control.
        res = vcam_cli(*demo_run("--config", str(cfg)))
        assert res.returncode == 0, res.stderr
        assert "frames published of 3" in res.stdout + res.stderr
        assert not (tmp_path / "own.sock").exists()
        # Given its own scene, a live run goes ahead (OBS itself is absent here: control retries
        # quietly). In process with an output of the test's: no virtual camera needed.
        cfg.write_text(cfg.read_text() + 'scene = "FastSwap Faces (second)"\n')
        from obs_harness import CapturingOutput, demo_daemon_config

        from vcam import config_file
        from vcam.runtime.daemon import Daemon

        d = Daemon(demo_daemon_config(tmp_path / "own.sock", obs=config_file.load(cfg).obs), output=CapturingOutput())
        assert d.run(max_frames=3).frames_out == 3
        assert d.instance_lock is None  # released at its end
    finally:
        held.close()
