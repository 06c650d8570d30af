"""The panel's before/after view (the ``before_after`` setting): the preview shows the camera as it
came beside the swapped picture, and the published output never carries the before frame."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from obs_harness import COLOURS, CapturingOutput, demo_daemon_config, solid_faces, wait_for

from vcam.control.client import send_command
from vcam.panel.preview import WIDTH
from vcam.runtime.daemon import Daemon
from vcam.state import RuntimeState


def alice_pixels(bgr) -> int:
    """How many pixels are in alice's solid colour (the swapped face's)."""
    want = np.array(COLOURS["alice"], np.int16)
    return int((np.abs(bgr.astype(np.int16) - want).max(axis=2) < 40).sum())


class EveryFrame(CapturingOutput):
    """Keeps, for every frame sent, its shape and its count of alice-coloured pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tuple[int, ...], int]] = []
        self.lock = threading.Lock()

    def send(self, data) -> None:
        super().send(data)
        with self.lock:
            self.seen.append((tuple(np.shape(data)), alice_pixels(np.asarray(data))))


def next_preview(tap, after: int) -> tuple[int, np.ndarray]:
    import cv2

    assert wait_for(lambda: tap.frames.get("s1", (0, b""))[0] > after, 10)
    version, jpeg = tap.frames["s1"]
    return version, cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)


def test_before_after_shows_the_input_beside_the_swap_in_the_preview_only(tmp_path):
    cfg = demo_daemon_config(tmp_path / "vcam.sock")
    cfg = cfg.replace(panel=replace(cfg.panel, port=0, host="127.0.0.1"))
    state = RuntimeState(solid_faces(("alice",)), active="alice")
    out = EveryFrame()
    d = Daemon(cfg, state=state, output=out, panel=True, announce=lambda line: None)
    d.start()
    try:
        assert d.ready.wait(60) and d.summary.error is None, d.summary.error
        assert state.settings["before_after"] is False  # offered with the panel, off
        tap = d.up.panel.panel.tap
        tap.watch("s1")  # what an open page with its preview on does
        version, shown = next_preview(tap, 0)
        assert shown.shape[1] == WIDTH  # the published picture alone

        with out.lock:
            first = len(out.seen)
        assert send_command(cfg.socket_path, {"before_after": "on"})["settings"]["before_after"] is True
        pairs = 0
        for _ in range(5):  # side by side: the camera as it came (no swapped face), then the swapped picture
            version, shown = next_preview(tap, version)
            if shown.shape[1] == WIDTH and pairs == 0:
                continue  # taken before the switch was seen
            assert shown.shape[1] == 2 * WIDTH, shown.shape
            pairs += 1
            left, right = shown[:, :WIDTH], shown[:, WIDTH:]
            assert alice_pixels(right) > 100 and alice_pixels(left) < 10, (alice_pixels(left), alice_pixels(right))
        assert pairs >= 3, pairs
        n = d.summary.frames_out
        assert wait_for(lambda: d.summary.frames_out > n + 20, 10)
        assert send_command(cfg.socket_path, {"before_after": "off"})["settings"]["before_after"] is False
        # Frames begun before the switch (their input kept) and published after it are shown alone:
        # past the one job the encoder may hold from before, the published picture alone, at once.
        version, shown = next_preview(tap, version)
        for _ in range(3):
            version, shown = next_preview(tap, version)
            assert shown.shape[1] == WIDTH, shown.shape
    finally:
        d.stop()
    assert d.summary.error is None
    with out.lock:
        during = out.seen[first:]
    # The output, all the while before/after was on: the output's own size, every frame swapped
    # (the demo's face is in every frame), never the camera as it came.
    assert len(during) > 20
    assert all(shape == (240, 320, 3) for shape, _ in during), {shape for shape, _ in during}
    assert all(n > 100 for _, n in during), [n for _, n in during]


def test_a_daemon_without_the_panel_does_not_offer_before_after(tmp_path):
    from vcam.errors import ControlError

    cfg = demo_daemon_config(tmp_path / "vcam.sock")
    d = Daemon(cfg, state=RuntimeState(solid_faces(("alice",)), active="alice"), output=CapturingOutput())
    d.start()
    try:
        assert d.ready.wait(60) and d.summary.error is None, d.summary.error
        with pytest.raises(ControlError, match="before/after is not available in this run") as info:
            send_command(cfg.socket_path, {"before_after": "on"})
        assert "[panel]" in (info.value.hint or "")
        assert d.rounds.before is None
    finally:
        d.stop()


def test_a_frame_kept_before_the_switch_goes_off_is_published_alone():
    """A frame begun with before/after on (its input kept) and published after the switch went off
    is offered to the preview without its frame number, so the encoder shows it alone: no pair
    after "off", however many frames were in flight."""
    from types import SimpleNamespace

    from vcam.runtime.panel import _wire_frames
    from vcam.types import PixelFormat

    offered, kept = [], []
    tap = SimpleNamespace(
        offer=lambda name, data, fmt, counter, slack, seq=-1: offered.append(seq),
        wants_before=lambda name: True,
        keep_before=lambda name, seq, data, fmt, mirrored=False: kept.append(seq),
    )
    server = SimpleNamespace(tap=tap, source=None)
    state = RuntimeState(solid_faces(("alice",)), active="alice")
    st = SimpleNamespace(
        name="main",
        state=state,
        summary=SimpleNamespace(frames_in=0),
        pipeline=SimpleNamespace(ring=3),
        output=SimpleNamespace(fmt=PixelFormat.BGR),
        shown_seq=-1,
    )
    d = SimpleNamespace(rounds=SimpleNamespace(tap=None, before=None), assembly=None, streams=[st])
    _wire_frames(d, server)
    frame = SimpleNamespace(seq=7, data=np.zeros((4, 4, 3), np.uint8), fmt=PixelFormat.BGR)
    state.set_setting("before_after", True)
    d.rounds.before(st, frame)  # begun with the switch on: its input kept
    st.shown_seq = 7
    d.rounds.tap(st, frame.data)  # published while on: paired
    state.set_setting("before_after", False)
    d.rounds.tap(st, frame.data)  # a frame of the same number published after "off": alone
    assert kept == [7] and offered == [7, -1]
