"""The desk's settings in a running daemon: what a run offers from its config, and a setting sent
over the control socket (the path of `vcam ctl`, the panel and OBS custom events) changing the
published frames."""

from __future__ import annotations

import numpy as np
import pytest
from obs_harness import CapturingOutput, demo_daemon_config, face_x, solid_faces, steady_face_x, wait_for

from vcam.control.client import send_command
from vcam.errors import ControlError
from vcam.runtime.daemon import Daemon
from vcam.state import RuntimeState


def _started(cfg):
    """A daemon of ``cfg`` started on its own thread with the solid face 'alice' active, ready."""
    state = RuntimeState(solid_faces(("alice",)), active="alice")
    out = CapturingOutput()
    daemon = Daemon(cfg, state=state, output=out)
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
    except BaseException:
        daemon.stop()
        raise
    return state, out, daemon


def test_a_daemon_offers_its_settings_and_mirror_flips_what_it_publishes(tmp_path):
    cfg = demo_daemon_config(tmp_path / "vcam.sock")
    state, out, daemon = _started(cfg)
    try:
        # [mask] types box, face: the mouth switch (off), mirror, record and the camera (live: the
        # demo, no camera: -1); no enhancer, occluder, OBS or panel (before/after).
        assert state.settings == {"mouth_mask": False, "mirror": False, "record": False, "camera": -1}
        with pytest.raises(ControlError, match="enhancer is not available in this run") as info:
            send_command(cfg.socket_path, {"enhancer": "on"})
        assert "[swap] enhancer" in (info.value.hint or "")
        assert wait_for(lambda: out.frames > 5 and face_x(out.last) is not None, 10)
        plain = steady_face_x(out)
        width = out.last.shape[1]
        assert abs(plain - (width - 1 - plain)) > 20, plain  # off-centre: its mirror image is elsewhere
        assert send_command(cfg.socket_path, {"mirror": "on"})["settings"]["mirror"] is True
        # the demo's face moves a little: mirrored, it sits about where its mirror image would
        assert wait_for(lambda: (x := face_x(out.last)) is not None and abs(x - (width - 1 - plain)) < abs(x - plain), 10)
        assert send_command(cfg.socket_path, {"mirror": "toggle"})["settings"]["mirror"] is False
        assert wait_for(lambda: (x := face_x(out.last)) is not None and abs(x - plain) < abs(x - (width - 1 - plain)), 10)
    finally:
        daemon.stop()
    assert daemon.summary.error is None


def test_frames_made_without_the_pipeline_are_mirrored_too():
    """The early frames and the frames of a shed swap (:func:`vcam.runtime.rounds.early_frame`) follow
    the mirror setting as the pipeline's frames do."""
    from vcam.config import Config
    from vcam.runtime.rounds import Stream, early_frame
    from vcam.types import Frame, PixelFormat

    img = np.zeros((24, 32, 3), np.uint8)
    img[:, :8] = (0, 0, 255)  # red on the left
    state = RuntimeState()
    st = Stream("s1", Config(), state, output=CapturingOutput(32, 24))
    frame = Frame(img, 32, 24, PixelFormat.BGR, 0.0, 0)
    np.testing.assert_array_equal(early_frame(st, frame, pixelated=False), img)
    state.offer("mirror", True)
    np.testing.assert_array_equal(early_frame(st, frame, pixelated=False), img[:, ::-1])
    blocks = early_frame(st, frame, pixelated=True)
    assert blocks[:, -4:, 2].min() > 200 and blocks[:, :4, 2].max() < 50  # the red blocks on the right


def test_record_on_and_off_makes_a_file_of_what_was_published(tmp_path):
    """`vcam ctl record on` then off: a new file in [output] record_dir holding the published (swapped)
    frames; a second recording is a second file; a stop at shutdown finishes an open one."""
    from dataclasses import replace

    import av

    cfg = demo_daemon_config(tmp_path / "vcam.sock")
    cfg = cfg.replace(output=replace(cfg.output, record_dir=str(tmp_path / "rec")))
    (tmp_path / "rec").mkdir()
    state, out, daemon = _started(cfg)
    try:
        assert send_command(cfg.socket_path, {"record": "on"})["settings"]["record"] is True
        n = out.frames
        assert wait_for(lambda: out.frames > n + 15, 10)
        assert send_command(cfg.socket_path, {"record": "toggle"})["settings"]["record"] is False
        assert wait_for(lambda: len(list((tmp_path / "rec").glob("vcam-s1-*.mp4"))) == 1, 10)
        state.set_setting("record", True)  # a second one, left open until the daemon stops
        n = out.frames
        assert wait_for(lambda: out.frames > n + 5, 10)
    finally:
        daemon.stop()
    # in the order they were finished (two started within a second are NAME.mp4 and NAME-2.mp4)
    files = sorted((tmp_path / "rec").glob("vcam-s1-*.mp4"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2, list((tmp_path / "rec").iterdir())
    with av.open(str(files[0])) as container:
        frames = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    assert len(frames) >= 10
    assert face_x(frames[-1]) is not None  # the swapped face (alice's colour) is in the recording


def test_a_recording_that_cannot_start_says_why_and_turns_the_switch_off(tmp_path, caplog):
    from vcam.config import Config
    from vcam.runtime.record import Recorder
    from vcam.runtime.rounds import Stream

    state = RuntimeState()
    state.offer("record", True)
    st = Stream("s1", Config(), state, output=CapturingOutput(32, 24))
    rec = Recorder(tmp_path / "no-such-folder", 30.0)
    rec.offer(st, np.zeros((24, 32, 3), np.uint8))
    assert state.settings["record"] is False and not rec.files
    said = [r.getMessage() for r in caplog.records if "cannot record to" in r.getMessage()]
    assert len(said) == 1 and "does not exist" in said[0]
    rec.offer(st, np.zeros((24, 32, 3), np.uint8))  # off now: nothing more is tried
    assert len([r for r in caplog.records if "cannot record to" in r.getMessage()]) == 1
