"""The CPU path (issue 9): OpenCV colour conversions against the NumPy references, and non-camera
sources read on demand under ``--fast`` (nothing produced is thrown away).

Tolerance of the OpenCV twins: OpenCV converts YUV -> BGR in 20-bit fixed point and BGR -> Y with
its own rounded BT.601 table, where the references compute in float32 and round with floor(x + 0.5).
Measured over random frames from 2x2 to 1920x1080 (every Y, U and V value, footroom included): the
results differ by at most 1 level (``CV_LEVELS``); channel shuffles are exact.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from fractions import Fraction

import av
import cv2
import numpy as np
import pytest

from vcam.config import CaptureConfig, Config, Duration
from vcam.errors import InputError
from vcam.kernels import convert
from vcam.ops.numpy import NumpyOps
from vcam.runtime.daemon import Daemon
from vcam.stages import capture
from vcam.types import PixelFormat

CV_LEVELS = 1  # OpenCV's fixed point vs the float references, measured (see the module docstring)

YUV = ("YUYV", "NV12", "I420")
# Even sizes for every format, and an odd height for YUYV (4:2:0 needs both even: see the error test).
YUV_CASES = [(fmt, w, h) for fmt in YUV for w, h in [(2, 2), (64, 48), (98, 130), (1280, 720)]] + [
    ("YUYV", 34, 17),
    ("YUYV", 2, 3),
]


def _diff(a, b) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


# -- YUV -> BGR ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,w,h", YUV_CASES)
def test_yuv_to_bgr_within_one_level_of_the_reference(fmt, w, h):
    pf = PixelFormat(fmt)
    rng = np.random.default_rng(w * 31 + h)
    data = rng.integers(0, 256, convert.frame_shape(pf, w, h), dtype=np.uint8)  # footroom included
    out = np.full((h, w, 3), 77, np.uint8)
    got = convert.to_bgr_cv(data, pf, w, h, out=out)
    assert got is out
    assert _diff(got, convert.to_bgr_ref(data, pf, w, h)) <= CV_LEVELS
    flat = convert.to_bgr_cv(data.reshape(-1), pf, w, h)  # flat buffers are accepted too
    assert _diff(flat, got) == 0


@pytest.mark.parametrize("fmt", YUV)
def test_footroom_luma_is_converted_as_the_reference_does(fmt):
    """OpenCV converts max(Y, 16); the reference converts Y below 16 as it is (darker than black,
    clipped to 0 only where the sum is negative): Y 0 with V 255 is red 184, not OpenCV's 203."""
    w, h = 8, 4
    pf = PixelFormat(fmt)
    y = np.full((h, w), 100, np.uint8)
    y[1, 3] = 0
    y[2, 6] = 12
    u, v = np.full((h, w), 128, np.uint8), np.full((h, w), 255, np.uint8)
    data = _pack(pf, y, u, v)
    ref = convert.to_bgr_ref(data, pf, w, h)
    got = convert.to_bgr_cv(data, pf, w, h)
    assert abs(int(got[1, 3, 2]) - 184) <= CV_LEVELS and ref[1, 3, 2] == 184
    raw = cv2.cvtColor(data.reshape(h * 3 // 2, w) if fmt != "YUYV" else data, _cv_code(pf))
    assert _diff(raw, ref) > 10  # what the footroom pass repairs
    assert _diff(got, ref) <= CV_LEVELS


@pytest.mark.parametrize("fmt", YUV)
def test_a_dark_frame_is_converted_by_the_reference(fmt):
    """Most of the frame below Y 16: repairing pixel by pixel would cost more than the reference."""
    w, h = 64, 48
    pf = PixelFormat(fmt)
    rng = np.random.default_rng(5)
    y = rng.integers(0, 16, (h, w), dtype=np.uint8)
    u, v = rng.integers(0, 256, (2, h, w), dtype=np.uint8)
    data = _pack(pf, y, u, v)
    np.testing.assert_array_equal(convert.to_bgr_cv(data, pf, w, h), convert.to_bgr_ref(data, pf, w, h))


def _pack(pf: PixelFormat, y, u, v) -> np.ndarray:
    """A frame in ``pf`` from full-size Y, U, V planes (chroma taken from each block's first pixel)."""
    h, w = y.shape
    if pf is PixelFormat.YUYV:
        packed = np.empty((h, w, 2), np.uint8)
        packed[..., 0] = y
        packed[:, 0::2, 1] = u[:, 0::2]
        packed[:, 1::2, 1] = v[:, 0::2]
        return packed
    cu, cv = u[0::2, 0::2], v[0::2, 0::2]
    if pf is PixelFormat.NV12:
        chroma = np.stack([cu, cv], -1).reshape(-1)
    else:
        chroma = np.concatenate([cu.reshape(-1), cv.reshape(-1)])
    return np.concatenate([y.reshape(-1), chroma]).reshape(h * 3 // 2, w)


def _cv_code(pf: PixelFormat) -> int:
    return {
        PixelFormat.YUYV: cv2.COLOR_YUV2BGR_YUYV,
        PixelFormat.NV12: cv2.COLOR_YUV2BGR_NV12,
        PixelFormat.I420: cv2.COLOR_YUV2BGR_I420,
    }[pf]


def test_opencv_uses_bt601_limited_range():
    """Y 16 black, Y 235 white, neutral chroma grey, and a saturated red: the same convention as ours."""
    w, h = 4, 2
    nv12 = np.full((h * 3 // 2, w), 128, np.uint8)
    nv12[:h, :2], nv12[:h, 2:] = 16, 235
    got = convert.to_bgr_cv(nv12, PixelFormat.NV12, w, h)
    assert got[:, :2].max() == 0 and got[:, 2:].min() == 255
    # BT.601 limited-range red (R 255, G 0, B 0) is Y 81, U 90, V 240.
    red = np.array([81, 81, 81, 81, 90, 240], np.uint8).reshape(3, 2)
    assert _diff(convert.to_bgr_cv(red, PixelFormat.NV12, 2, 2), np.array([0, 0, 255], np.uint8)[None, None]) <= 1


@pytest.mark.parametrize("w,h", [(64, 48), (33, 17)])
@pytest.mark.parametrize("fmt,channels", [("BGR", 3), ("RGB", 3), ("BGR", 4), ("RGB", 4), ("GRAY", 0)])
def test_channel_shuffles_are_exact(fmt, channels, w, h):
    rng = np.random.default_rng(w + channels)
    shape = (h, w, channels) if channels else (h, w)
    data = rng.integers(0, 256, shape, dtype=np.uint8)
    pf = PixelFormat(fmt)
    out = np.full((h, w, 3), 77, np.uint8)
    got = convert.to_bgr_cv(data, pf, w, h, out=out)
    assert got is out
    np.testing.assert_array_equal(got, convert.to_bgr_ref(data, pf, w, h))


def test_the_references_errors_and_edge_cases_are_kept():
    with pytest.raises(InputError, match="NV12 needs an even width and height, got 33x16"):
        convert.to_bgr_cv(np.zeros((24, 33), np.uint8), PixelFormat.NV12, 33, 16)
    with pytest.raises(InputError, match="frames must be uint8"):
        convert.to_bgr_cv(np.zeros((4, 4, 3), np.float32), PixelFormat.BGR, 4, 4)
    with pytest.raises(InputError, match="unexpected frame shape"):
        convert.to_bgr_cv(np.zeros((4, 5, 3), np.uint8), PixelFormat.BGR, 4, 4)
    img = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    jpeg = cv2.imencode(".jpg", img)[1].reshape(-1)
    np.testing.assert_array_equal(
        convert.to_bgr_cv(jpeg, PixelFormat.MJPEG, 24, 16), convert.to_bgr_ref(jpeg, PixelFormat.MJPEG, 24, 16)
    )
    # An ``out`` OpenCV cannot write into (a strided view) is filled by the reference.
    nv12 = np.random.default_rng(2).integers(16, 236, (24, 16), dtype=np.uint8)
    big = np.zeros((16, 32, 3), np.uint8)
    view = big[:, ::2]
    assert convert.to_bgr_cv(nv12, PixelFormat.NV12, 16, 16, out=view) is view
    assert _diff(view, convert.to_bgr_ref(nv12, PixelFormat.NV12, 16, 16)) <= CV_LEVELS


# -- BGR -> 4:2:0 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("w,h", [(2, 2), (64, 48), (34, 18), (98, 130), (1920, 1080)])
@pytest.mark.parametrize("fmt", ["I420", "NV12"])
def test_bgr_to_420_within_one_level_of_the_reference(fmt, w, h):
    pf = PixelFormat(fmt)
    frame = np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ref = convert.from_bgr_ref(frame, pf)
    out = np.full(ref.shape, 77, np.uint8)
    got = convert.from_bgr_cv(frame, pf, out=out)
    assert got is out
    assert _diff(got, ref) <= CV_LEVELS


@pytest.mark.parametrize("fmt", ["I420", "NV12"])
def test_420_chroma_is_the_mean_of_each_block(fmt):
    """One red pixel in a black 2x2 block: the chroma is that of the block's mean colour (OpenCV's
    own BGR -> I420 would sample a single pixel of the block)."""
    pf = PixelFormat(fmt)
    frame = np.zeros((2, 2, 3), np.uint8)
    frame[1, 1] = (0, 0, 255)
    got = convert.from_bgr_cv(frame, pf)
    mean = np.full((1, 1, 3), (0, 0, 64), np.uint8)  # (0 + 0 + 0 + 255) / 4, rounded
    block = cv2.transform(mean, convert._UV_MAT).reshape(-1)  # the reference's U, V
    assert _diff(got[2:].reshape(-1), block) <= CV_LEVELS
    assert _diff(got, convert.from_bgr_ref(frame, pf)) <= CV_LEVELS
    assert _diff(cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420)[2:].reshape(-1)[:1], block[:1]) > 5


def test_from_bgr_keeps_the_references_behaviour():
    frame = np.random.default_rng(3).integers(0, 256, (18, 34, 3), dtype=np.uint8)
    for pf in (PixelFormat.BGR, PixelFormat.RGB):
        np.testing.assert_array_equal(convert.from_bgr_cv(frame, pf), convert.from_bgr_ref(frame, pf))
    with pytest.raises(ValueError, match="I420 needs an even width and height, got 33x18"):
        convert.from_bgr_cv(frame[:, :33], PixelFormat.I420)


def test_numpy_ops_convert_through_opencv():
    ops = NumpyOps()
    rng = np.random.default_rng(4)
    nv12 = rng.integers(0, 256, (72, 64), dtype=np.uint8)
    np.testing.assert_array_equal(
        convert.to_bgr(ops, nv12, PixelFormat.NV12, 64, 48), convert.to_bgr_cv(nv12, PixelFormat.NV12, 64, 48)
    )
    frame = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    np.testing.assert_array_equal(convert.from_bgr(ops, frame, PixelFormat.I420), convert.from_bgr_cv(frame, PixelFormat.I420))


# -- on-demand delivery ----------------------------------------------------------------------------
class Counted:
    """A source that counts what it produced."""

    def __init__(self, source):
        self.source, self.produced = source, 0
        for k in ("width", "height", "fps", "fmt"):
            setattr(self, k, getattr(source, k))

    def read(self):
        frame = self.source.read()
        self.produced += frame is not None
        return frame

    def close(self):
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _clip(path, n=40, w=64, h=48):
    with av.open(str(path), mode="w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            vf = av.VideoFrame.from_ndarray(np.full((h, w, 3), 6 * i, np.uint8), format="bgr24")
            vf.pts, vf.time_base = i, Fraction(1, 25)
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)


def _small_demo(width, height, fps):
    from vcam.stages.demo import DemoClip

    return DemoClip(width, height, fps=fps, seconds=2.0)


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the capture thread made no progress"
        threading.Event().wait(0.002)


@pytest.mark.parametrize("kind", ["demo", "pattern", "video", "image"])
def test_fast_sources_are_read_on_demand(tmp_path, kind):
    """``--fast`` to a live output (null here): every frame taken in order, the source read exactly
    one frame ahead of the consumer (the next frame waiting in the slot, one more being held), never
    spinning to produce frames that are thrown away."""
    inp = {"demo": "demo", "pattern": "pattern", "video": str(tmp_path / "clip.mp4"), "image": str(tmp_path / "still.png")}[kind]
    if kind == "video":
        _clip(tmp_path / "clip.mp4")
    if kind == "image":
        cv2.imwrite(inp, np.full((48, 64, 3), 90, np.uint8))
    cfg = CaptureConfig(input=inp, width=64, height=48, fps=25.0, pacing="fast", loop=True)
    delivery = capture.plan_delivery(cfg, "null")
    assert delivery.lossless and not delivery.realtime
    src = Counted(capture.open_source(cfg, delivery=delivery, demo_clip_factory=_small_demo))
    taken = []
    with capture.CaptureThread(src, lossless=delivery.lossless) as cap:
        for _ in range(6):
            taken.append(cap.get(timeout=10).seq)
            _wait_for(lambda: src.produced >= len(taken) + 2)  # the read-ahead has happened...
        assert src.produced == len(taken) + 2  # ...and nothing beyond it
        assert cap.dropped == 0 and cap.delivered == len(taken) + 1
    assert taken == list(range(6))


@pytest.mark.slow
def test_realtime_sources_keep_the_newest_frame(tmp_path):
    """``--realtime``: frame-timed, the newest frame wins, replaced frames counted (as a camera)."""
    cfg = CaptureConfig(input="pattern", width=32, height=16, fps=400.0, pacing="realtime")
    delivery = capture.plan_delivery(cfg, "null")
    assert delivery.realtime and not delivery.lossless
    src = Counted(capture.open_source(cfg, delivery=delivery))
    with capture.CaptureThread(src, lossless=delivery.lossless) as cap:
        _wait_for(lambda: src.produced >= 8)
        first = cap.get(timeout=5)
        # Frames 0..6 at least were put in the slot before this get; all but the newest were replaced.
        assert first.seq >= 6 and cap.dropped >= 6 and cap.taken == 1


def test_daemon_publishes_every_frame_the_pattern_produced_with_fast():
    """`vcam run --input pattern --fast --output null`: no frame is produced to be discarded."""
    cfg = Config()
    cfg = cfg.replace(
        capture=replace(cfg.capture, input="pattern", width=96, height=64, pacing="fast"),
        pipeline=replace(cfg.pipeline, device="cpu", max_latency=Duration(0)),
        output=replace(cfg.output, target="null"),
    )
    src = Counted(capture.open_source(cfg.capture, delivery=capture.plan_delivery(cfg.capture, "null")))
    s = Daemon(cfg, source=src, control=False).run(max_frames=30)
    assert s.frames_in == s.frames_out == 30 and s.dropped_capture == 0
    assert 30 <= src.produced <= 32  # at most the frames in flight when the run stopped
