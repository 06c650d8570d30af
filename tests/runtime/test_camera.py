"""Camera selection on a real daemon (vcam.runtime.camera): no webcam here, so the machine's
cameras are a fake enumeration whose entries open the demo, a clip file and missing or misfit
inputs; the switch goes over the control socket (the path of `vcam ctl`, the panel and OBS)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from obs_harness import CapturingOutput, demo_daemon_config, face_x, solid_faces, steady_face_x, wait_for
from typer.testing import CliRunner

from vcam.cli.control import ctl_app
from vcam.control.client import send_command
from vcam.errors import ControlError
from vcam.runtime.camera import CameraChoice, Cameras
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import Mark
from vcam.state import RuntimeState

W, H, FPS = 320, 240, 30.0
BUDGET = 0.5


def write_clip(path, width: int, height: int, mirrored: bool) -> str:
    """The demo clip's first 60 frames as an mp4 (mirrored: the face on the other side)."""
    import cv2

    from vcam.stages.demo import DemoClip

    clip = DemoClip(width=width, height=height, fps=FPS)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (width, height))
    for i in range(60):
        frame = clip.frame(i)
        writer.write(np.ascontiguousarray(frame[:, ::-1] if mirrored else frame))
    writer.release()
    return str(path)


class Published:
    """Each published frame's (time, capture time, faces found, faces swapped): the round hook."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, mark: Mark) -> None:
        if mark.phase == "published" and mark.stats is not None:
            with self.lock:
                self.rows.append((mark.t, mark.t_capture, mark.stats.faces, mark.stats.swapped))

    def since(self, t: float) -> list[tuple[float, float, int, int]]:
        with self.lock:
            return [r for r in self.rows if r[0] >= t]


@pytest.fixture
def rig(tmp_path):
    clip = write_clip(tmp_path / "desk.mp4", W, H, mirrored=True)
    wide = write_clip(tmp_path / "wide.mp4", 2 * W, 2 * H, mirrored=False)
    listed = [
        CameraChoice(0, "studio cam", "pattern"),
        CameraChoice(1, "desk cam", clip),
        CameraChoice(2, "unplugged cam", str(tmp_path / "gone.mp4")),
        CameraChoice(3, "wide cam", wide),
    ]
    cfg = demo_daemon_config(tmp_path / "vcam.sock")
    cfg = cfg.replace(
        capture=replace(cfg.capture, pacing="realtime", fps=FPS),
        pipeline=replace(cfg.pipeline, max_latency=BUDGET),
    )
    state = RuntimeState(solid_faces(("alice",)), active="alice")
    out, hook = CapturingOutput(), Published()
    d = Daemon(cfg, state=state, output=out, hook=hook, cameras=lambda refresh: list(listed))
    d.start()
    try:
        assert d.ready.wait(60) and d.summary.error is None, d.summary.error
        yield cfg, d, out, hook
    finally:
        d.stop()
    assert d.summary.error is None


def test_a_stream_switches_camera_live_and_a_bad_camera_keeps_the_old_one(rig):
    cfg, d, out, hook = rig
    sock, st = cfg.socket_path, d.streams[0]
    reply = send_command(sock, {"camera": "list"})
    # the run's own input (the demo, no camera: -1) is a choice beside the machine's cameras
    assert reply["settings"]["camera"] == -1
    assert [n for n, _ in reply["choices"]["camera"]] == [-1, 0, 1, 2, 3]
    assert wait_for(lambda: face_x(out.last) is not None, 10)
    plain = steady_face_x(out)
    assert abs(plain - (W - 1 - plain)) > 20, plain  # off-centre: the mirrored clip's face is elsewhere
    old_source, old_cap = st.source, st.cap

    t_switch = time.perf_counter()
    reply = send_command(sock, {"camera": 1})
    assert reply["settings"]["camera"] == 1
    assert wait_for(lambda: d.cameras.switches, 10)
    assert wait_for(lambda: old_source.closed and not old_cap._thread.is_alive(), 10)  # the old camera closed
    assert type(st.source).__name__ == "VideoSource" and st.cap is not old_cap
    # the new camera's frames: the face on the other side
    assert wait_for(lambda: (x := face_x(out.last)) is not None and abs(x - (W - 1 - plain)) < abs(x - plain), 10)
    n = d.summary.frames_out
    assert wait_for(lambda: d.summary.frames_out > n + 20, 10)
    rows = hook.since(t_switch)
    # never a face left unswapped, never a frame over the budget unless counted late
    assert rows and all(swapped == faces for _, _, faces, swapped in rows), rows
    assert sum(1 for _, _, faces, _ in rows if faces) > 10
    over = sum(1 for t, tc, _, _ in rows if t - tc > BUDGET)
    assert over <= d.summary.published_late, (over, d.summary.published_late)

    # a camera that cannot be opened: one line, the old camera kept
    source = st.source
    with pytest.raises(ControlError, match=r"cannot switch to camera 2 \(unplugged cam\): input not found"):
        send_command(sock, {"camera": 2})
    # one of another size: refused (the pipeline and the output run at this one's)
    with pytest.raises(ControlError, match=r"camera 3 \(wide cam\): it gives 640x480 BGR, the stream runs at 320x240 BGR"):
        send_command(sock, {"camera": 3})
    with pytest.raises(ControlError, match="no camera 9 in this run"):
        send_command(sock, {"camera": 9})
    assert st.source is source and not source.closed and d.state.settings["camera"] == 1
    n = d.summary.frames_out
    assert wait_for(lambda: d.summary.frames_out > n + 10, 10)

    # `vcam ctl camera`: list marks the one in use, set goes back to the run's own input
    runner = CliRunner()
    res = runner.invoke(ctl_app, ["camera", "list", "--config", str(cfg_file(cfg, sock))])
    assert res.exit_code == 0 and "*  1  desk cam" in res.output, res.output
    res = runner.invoke(ctl_app, ["camera", "set", "demo", "--config", str(cfg_file(cfg, sock))])  # by its label
    assert res.exit_code == 0 and res.output.strip() == "camera: -1 (demo)", res.output
    assert wait_for(lambda: (x := face_x(out.last)) is not None and abs(x - plain) < abs(x - (W - 1 - plain)), 10)
    res = runner.invoke(ctl_app, ["camera", "set", "2", "--config", str(cfg_file(cfg, sock))])
    assert res.exit_code != 0 and "cannot switch to camera 2 (unplugged cam): input not found" in res.output


def cfg_file(cfg, sock):
    path = sock.parent / "vcam.toml"
    path.write_text(f"[control]\nsocket = '{sock}'\n")  # a literal string: a Windows path's backslashes stay
    return path


def test_a_paused_stream_is_not_switched(rig):
    cfg, d, _out, _hook = rig
    send_command(cfg.socket_path, {"pause": True})
    with pytest.raises(ControlError, match="stream s1 is paused") as info:
        send_command(cfg.socket_path, {"camera": 0})
    assert "resume it first" in (info.value.hint or "")
    assert d.state.settings["camera"] == -1


def test_the_platform_enumeration_lists_the_cameras_not_the_loopback_devices(tmp_path):
    """The default lister reads the platform's enumeration (sysfs here, a fake tree)."""
    from vcam import devices
    from vcam.runtime import camera

    root = tmp_path / "sys"
    for n, label, loop in ((0, "Integrated Camera", False), (2, "C920", False), (10, "FastSwap Cam", True)):
        node = root / f"video{n}"
        node.mkdir(parents=True)
        (node / "name").write_text(label + "\n")
        (node / "index").write_text("0\n")
        if loop:
            (node / "max_openers").write_text("10\n")
    got = camera.system_cameras(False, sysfs_root=root)
    assert got == [CameraChoice(0, "Integrated Camera", "webcam:0"), CameraChoice(2, "C920", "webcam:2")]
    assert Cameras(None).lister is camera.system_cameras  # type: ignore[arg-type]  # the default
    assert devices.SYSFS_ROOT != root
