"""Capture stage: real files written with PyAV/OpenCV, the real decoders, and the capture thread."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from media import write_clip

from vcam.config import CaptureConfig
from vcam.errors import InputError
from vcam.stages.capture import CaptureThread, open_source
from vcam.stages.sources import DemoSource, ImageSource, PatternSource, VideoSource, read_image
from vcam.types import Frame, PixelFormat


def drain(src, limit: int = 10_000) -> list[Frame]:
    out = []
    while len(out) < limit:
        f = src.read()
        if f is None:
            break
        out.append(f)
    return out


def cfg(**kw) -> CaptureConfig:
    return CaptureConfig(**{"pacing": "fast", "loop": False, **kw})


class FakeClock:
    """Deterministic clock: ``sleep`` advances time and records the request."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.t += dt


# -- video files -------------------------------------------------------------------------------


def test_video_file_frames_arrive_in_order_as_bgr(tmp_path):
    path = tmp_path / "clip.mp4"
    written = write_clip(path, 12)
    with open_source(cfg(input=str(path))) as src:
        assert isinstance(src, VideoSource)
        assert (src.width, src.height, src.fmt, src.fps) == (64, 48, PixelFormat.BGR, 25.0)
        frames = drain(src)
    assert len(frames) == 12
    assert [f.seq for f in frames] == list(range(12))
    for f, w in zip(frames, written):
        assert f.data.shape == (48, 64, 3) and f.data.dtype == np.uint8 and f.data.flags.c_contiguous
        assert (f.width, f.height, f.fmt) == (64, 48, PixelFormat.BGR)
        assert np.abs(f.data.astype(int) - w.astype(int)).mean() < 6
    stamps = [f.t_capture for f in frames]
    assert stamps == sorted(stamps)


def test_video_loop_restarts_and_keeps_counting(tmp_path):
    path = tmp_path / "clip.mp4"
    written = write_clip(path, 5)
    with open_source(cfg(input=str(path), loop=True)) as src:
        frames = drain(src, limit=13)
    assert len(frames) == 13  # never ends while looping
    assert [f.seq for f in frames] == list(range(13))
    for i, f in enumerate(frames):
        assert np.abs(f.data.astype(int) - written[i % 5].astype(int)).mean() < 6


def test_a_looped_video_opens_its_next_pass_ahead_in_a_thread(tmp_path, monkeypatch):
    """The last second of a pass opens the next one and decodes its first frame in a thread: the
    wrap's read opens nothing (the frames lost no time to the loop); the frames go on in order, and
    a close with a pass opened ahead closes that one too."""
    import threading

    path = tmp_path / "clip.mp4"
    written = write_clip(path, 40, fps=25)
    opened: list[str] = []
    real_open = VideoSource._open_container

    def counted(self):
        opened.append(threading.current_thread().name)
        return real_open(self)

    monkeypatch.setattr(VideoSource, "_open_container", counted)
    src = VideoSource(path, loop=True, realtime=False)
    frames = [src.read() for _ in range(40)]  # the first pass: the second one opened during its last second
    assert opened == ["MainThread", "vcam-video-next"] and src._next is not None
    frames += [src.read() for _ in range(40)]  # the wrap opens nothing; the third pass is opened ahead in turn
    assert opened == ["MainThread", "vcam-video-next", "vcam-video-next"] and src._next is not None
    for i, f in enumerate(frames):
        assert f.seq == i and np.abs(f.data.astype(int) - written[i % 40].astype(int)).mean() < 6, i
    ahead = src._next
    src.close()
    assert src._next is None and not ahead._thread.is_alive() and ahead._got is None


def test_video_realtime_pacing_follows_timestamps(tmp_path):
    path = tmp_path / "clip.mp4"
    write_clip(path, 6, fps=25)
    fake = FakeClock()
    with VideoSource(path, realtime=True, clock=fake.clock, sleep=fake.sleep) as src:
        frames = drain(src)
    assert len(frames) == 6
    # First frame at once, then one sleep per frame of 1/25 s each (the clock only moves in sleep).
    assert fake.sleeps == pytest.approx([0.04] * 5)


def test_video_fast_mode_never_sleeps(tmp_path):
    path = tmp_path / "clip.mp4"
    write_clip(path, 6)
    fake = FakeClock()
    with VideoSource(path, realtime=False, clock=fake.clock, sleep=fake.sleep) as src:
        assert len(drain(src)) == 6
    assert fake.sleeps == []


def test_loop_pacing_continues_across_the_wrap(tmp_path):
    path = tmp_path / "clip.mp4"
    write_clip(path, 3, fps=25)
    fake = FakeClock()
    with VideoSource(path, loop=True, realtime=True, clock=fake.clock, sleep=fake.sleep) as src:
        drain(src, limit=7)
    assert fake.sleeps == pytest.approx([0.04] * 6)


def test_grayscale_video_is_delivered_as_gray(tmp_path):
    path = tmp_path / "gray.mkv"
    written = write_clip(path, 4, codec="ffv1", pix_fmt="gray", gray=True)
    with open_source(cfg(input=str(path))) as src:
        assert src.fmt is PixelFormat.GRAY
        frames = drain(src)
    assert len(frames) == 4
    for f, w in zip(frames, written):
        assert f.fmt is PixelFormat.GRAY and f.data.shape == (48, 64)
        np.testing.assert_array_equal(f.data, w)  # ffv1 is lossless


def test_odd_size_video(tmp_path):
    path = tmp_path / "odd.mkv"
    written = write_clip(path, 3, width=129, height=73, codec="ffv1", pix_fmt="bgr0")
    with open_source(cfg(input=str(path))) as src:
        assert (src.width, src.height) == (129, 73)
        frames = drain(src)
    assert len(frames) == 3
    for f, w in zip(frames, written):
        assert f.data.shape == (73, 129, 3) and (f.width, f.height) == (129, 73)
        np.testing.assert_array_equal(f.data, w)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"input not found: .*nope\.mp4") as ei:
        open_source(cfg(input=str(tmp_path / "nope.mp4")))
    assert "webcam" in ei.value.hint and "demo" in ei.value.hint


def test_corrupt_video_random_bytes(tmp_path):
    path = tmp_path / "bad.mp4"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InputError, match=r"cannot read video .*bad\.mp4") as ei:
        open_source(cfg(input=str(path)))
    assert "re-export" in ei.value.hint
    assert path.read_bytes()[:4]  # the user's file is untouched


def test_truncated_video(tmp_path):
    path = tmp_path / "cut.mp4"
    write_clip(path, 10)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # mp4 index (moov) is at the end: gone
    with pytest.raises(InputError, match=r"video .*cut\.mp4"):
        src = open_source(cfg(input=str(path)))
        drain(src)


def test_directory_input(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        open_source(cfg(input=str(tmp_path)))


# -- images ------------------------------------------------------------------------------------


def test_image_source_repeats_the_still(tmp_path):
    img = np.random.default_rng(1).integers(0, 256, (31, 45, 3), dtype=np.uint8)
    path = tmp_path / "still.png"
    cv2.imwrite(str(path), img)
    with open_source(cfg(input=str(path), fps=12.0)) as src:
        assert isinstance(src, ImageSource)
        assert (src.width, src.height, src.fps, src.fmt) == (45, 31, 12.0, PixelFormat.BGR)
        frames = drain(src, limit=4)
    assert [f.seq for f in frames] == [0, 1, 2, 3]
    for f in frames:
        np.testing.assert_array_equal(f.data, img)
    frames[0].data[:] = 0  # each frame is the consumer's own copy
    np.testing.assert_array_equal(frames[1].data, img)


def test_image_realtime_pacing(tmp_path):
    path = tmp_path / "still.png"
    cv2.imwrite(str(path), np.zeros((8, 8, 3), np.uint8))
    fake = FakeClock()
    with ImageSource(path, fps=10.0, realtime=True, clock=fake.clock, sleep=fake.sleep) as src:
        drain(src, limit=4)
    assert fake.sleeps == pytest.approx([0.1] * 3)


def test_grayscale_image_is_gray(tmp_path):
    img = np.arange(21 * 33, dtype=np.uint32).reshape(21, 33).astype(np.uint8)
    path = tmp_path / "gray.png"
    cv2.imwrite(str(path), img)
    with open_source(cfg(input=str(path))) as src:
        f = src.read()
    assert f.fmt is PixelFormat.GRAY and f.data.shape == (21, 33)
    np.testing.assert_array_equal(f.data, img)


def test_rgba_and_16bit_images(tmp_path):
    rgba = np.zeros((10, 12, 4), np.uint8)
    rgba[..., 2] = 200
    rgba[..., 3] = 128
    cv2.imwrite(str(tmp_path / "a.png"), rgba)
    data, fmt = read_image(tmp_path / "a.png")
    assert fmt is PixelFormat.BGR and data.shape == (10, 12, 3) and (data[..., 2] == 200).all()
    deep = np.full((5, 6), 0x8000, np.uint16)
    cv2.imwrite(str(tmp_path / "d.png"), deep)
    data, fmt = read_image(tmp_path / "d.png")
    assert fmt is PixelFormat.GRAY and data.dtype == np.uint8 and (data == 0x80).all()


def test_odd_size_image(tmp_path):
    img = np.random.default_rng(2).integers(0, 256, (721, 1281, 3), dtype=np.uint8)
    path = tmp_path / "odd.png"
    cv2.imwrite(str(path), img)
    with open_source(cfg(input=str(path))) as src:
        f = src.read()
    assert (f.width, f.height) == (1281, 721)
    np.testing.assert_array_equal(f.data, img)


def test_garbage_jpg(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(b"this is not a jpeg at all" * 40)
    with pytest.raises(InputError, match=r"cannot decode image .*photo\.jpg") as ei:
        open_source(cfg(input=str(path)))
    assert "PNG or JPEG" in ei.value.hint


def test_truncated_jpg(tmp_path):
    img = np.random.default_rng(3).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    path = tmp_path / "cut.jpg"
    path.write_bytes(buf.tobytes()[: len(buf) * 2 // 3])
    with pytest.raises(InputError, match=r"image .*cut\.jpg is truncated"):
        open_source(cfg(input=str(path)))


def test_complete_jpg_passes_the_truncation_check(tmp_path):
    img = np.full((40, 50, 3), 90, np.uint8)
    path = tmp_path / "fine.jpg"
    cv2.imwrite(str(path), img)
    data, fmt = read_image(path)
    assert fmt is PixelFormat.BGR and np.abs(data.astype(int) - 90).max() <= 2


def test_empty_image(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="cannot decode image"):
        open_source(cfg(input=str(path)))


# -- synthetic sources --------------------------------------------------------------------------


def test_pattern_source_moves_and_has_the_configured_size():
    with open_source(cfg(input="pattern", width=1281, height=721)) as src:
        assert isinstance(src, PatternSource)
        frames = drain(src, limit=3)
    assert [f.seq for f in frames] == [0, 1, 2]
    for f in frames:
        assert f.data.shape == (721, 1281, 3) and f.fmt is PixelFormat.BGR and f.data.dtype == np.uint8
    assert not np.array_equal(frames[0].data, frames[1].data)
    packed = frames[0].data.astype(np.uint32) @ np.array([1, 256, 65536], np.uint32)
    assert len(np.unique(packed)) > 8  # colourful, not flat
    np.testing.assert_array_equal(PatternSource(1281, 721).render(1), frames[1].data)  # deterministic


def test_pattern_realtime_pacing():
    fake = FakeClock()
    with PatternSource(32, 16, fps=20.0, realtime=True, clock=fake.clock, sleep=fake.sleep) as src:
        drain(src, limit=3)
    assert fake.sleeps == pytest.approx([0.05, 0.05])


class TinyClip:
    """A stand-in with DemoClip's interface (width, height, fps, n_frames, frame(i))."""

    def __init__(self, width: int, height: int, fps: float, n: int = 4) -> None:
        self.width, self.height, self.fps, self.n_frames = width, height, fps, n

    def frame(self, i: int) -> np.ndarray:
        return np.full((self.height, self.width, 3), i, np.uint8)


def test_demo_source_with_injected_clip_loops_or_ends():
    made = {}

    def factory(**kw):
        made.update(kw)
        return TinyClip(**kw)

    with open_source(cfg(input="demo", width=40, height=30, fps=15.0), demo_clip_factory=factory) as src:
        assert isinstance(src, DemoSource) and made == {"width": 40, "height": 30, "fps": 15.0}
        assert len(drain(src)) == 4
    with open_source(cfg(input="demo", width=40, height=30, loop=True), demo_clip_factory=factory) as src:
        frames = drain(src, limit=9)
    assert [int(f.data[0, 0, 0]) for f in frames] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [f.seq for f in frames] == list(range(9))


def test_demo_source_with_the_real_clip():
    from vcam.stages.demo import DemoClip

    with open_source(cfg(input="demo", width=161, height=91, fps=10.0, loop=False)) as src:
        assert isinstance(src.clip, DemoClip)
        f = src.read()
    assert f.data.shape == (91, 161, 3) and f.fmt is PixelFormat.BGR and f.data.std() > 5


# -- webcams (no camera needed: discovery comes from a fake sysfs tree) -------------------------


def _sysfs(root: Path, nodes: dict[int, tuple[str, bool]]) -> Path:
    base = root / "video4linux"
    for n, (name, loop) in nodes.items():
        d = base / f"video{n}"
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        if loop:
            (d / "max_openers").write_text("10\n")
        else:
            (d / "index").write_text("0\n")
    return base


def test_absent_camera_index_names_the_cameras_that_exist(tmp_path):
    root = _sysfs(tmp_path, {0: ("Integrated Camera", False), 4: ("USB Cam", False), 10: ("FastSwap Cam", True)})
    with pytest.raises(InputError, match=r"camera 57 not found") as ei:
        open_source(cfg(input="webcam:57"), sysfs_root=root)
    assert ei.value.message == "camera 57 not found; cameras here: 0 (Integrated Camera), 4 (USB Cam)"
    assert "vcam devices" in ei.value.hint


def test_absent_camera_when_there_are_none(tmp_path):
    with pytest.raises(InputError, match=r"camera 0 not found; cameras here: none") as ei:
        open_source(cfg(input="webcam"), sysfs_root=tmp_path / "empty")
    assert "--input demo" in ei.value.hint


def test_virtual_camera_is_refused_as_input(tmp_path):
    root = _sysfs(tmp_path, {0: ("Integrated Camera", False), 10: ("FastSwap Cam", True)})
    with pytest.raises(InputError, match=r"camera 10 is the virtual camera 'FastSwap Cam'"):
        open_source(cfg(input="webcam:10"), sysfs_root=root)


def test_listed_camera_that_cannot_be_opened(tmp_path):
    # sysfs lists video57 but /dev/video57 does not exist here: OpenCV's V4L2 backend fails for real.
    root = _sysfs(tmp_path, {57: ("Ghost Cam", False)})
    with pytest.raises(InputError, match=r"camera 57 could not be opened"):
        open_source(cfg(input="webcam:57"), sysfs_root=root)


def test_bad_camera_spec():
    with pytest.raises(InputError, match=r"bad camera index in 'webcam:front'"):
        open_source(cfg(input="webcam:front"))


# -- capture thread ----------------------------------------------------------------------------


class ListSource:
    """A finite source following the Source protocol; optionally raises after ``fail_after`` frames
    or waits on ``gate`` before each frame."""

    def __init__(
        self, n: int, *, fail_after: int | None = None, exc: BaseException | None = None, gate: threading.Semaphore | None = None
    ) -> None:
        self.width, self.height, self.fps, self.fmt = 8, 4, 30.0, PixelFormat.BGR
        self.n, self.i = n, 0
        self.fail_after, self.exc, self.gate = fail_after, exc, gate
        self.closed = 0

    def read(self):
        if self.gate is not None:
            self.gate.acquire()
        if self.fail_after is not None and self.i >= self.fail_after:
            raise self.exc
        if self.i >= self.n:
            return None
        f = Frame(np.full((4, 8, 3), self.i, np.uint8), 8, 4, PixelFormat.BGR, float(self.i), self.i)
        self.i += 1
        return f

    def close(self):
        self.closed += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_newest_frame_wins_and_drops_are_counted():
    src = ListSource(10)
    cap = CaptureThread(src).start()
    assert cap.join(5)  # the whole source was read while nobody consumed
    f = cap.get(timeout=1)
    assert f.seq == 9  # the newest
    assert cap.dropped == 9 and cap.delivered == 10 and cap.taken == 1
    assert cap.get(timeout=1) is None  # then clean EOF
    assert cap.finished and src.closed == 1
    cap.stop()
    assert src.closed == 1


def test_slow_consumer_sees_increasing_seqs_and_accounting_adds_up():
    gate = threading.Semaphore(0)
    src = ListSource(30, gate=gate)
    seen = []
    with CaptureThread(src) as cap:
        for step in range(10):
            for _ in range(3):  # three frames arrive per consumer read
                gate.release()
            while cap.delivered < 3 * (step + 1):
                threading.Event().wait(0.001)
            seen.append(cap.get(timeout=5).seq)
        gate.release()
        assert cap.get(timeout=5) is None
    assert seen == [3 * k + 2 for k in range(10)]
    assert cap.dropped == 20 and cap.delivered == cap.taken + cap.dropped == 30
    assert cap.real_fps > 0


def test_input_error_reaches_the_consumer():
    err = InputError("camera 0 stopped delivering frames", hint="check the cable")
    cap = CaptureThread(ListSource(100, fail_after=2, exc=err)).start()
    cap.join(5)
    assert cap.get(timeout=1).seq == 1  # the last good frame first
    with pytest.raises(InputError, match="camera 0 stopped delivering frames") as ei:
        cap.get(timeout=1)
    assert ei.value is err
    cap.stop()


def test_other_exceptions_are_wrapped():
    cap = CaptureThread(ListSource(100, fail_after=0, exc=RuntimeError("driver exploded"))).start()
    with pytest.raises(InputError, match="capture failed: RuntimeError\\('driver exploded'\\)") as ei:
        cap.get(timeout=5)
    assert isinstance(ei.value.__cause__, RuntimeError)
    cap.stop()


def test_get_times_out_with_none_while_the_source_is_alive():
    gate = threading.Semaphore(0)
    src = ListSource(5, gate=gate)
    cap = CaptureThread(src).start()
    assert cap.get(timeout=0.01) is None and not cap.finished
    cap.stop(timeout=0.05)  # the thread is blocked in read(); stop returns after the join timeout
    gate.release()
    assert cap.join(5) and cap.finished


def test_stop_ends_an_endless_source_and_closes_it(tmp_path):
    src = PatternSource(16, 16, fps=1000.0, realtime=False)
    cap = CaptureThread(src).start()
    assert cap.get(timeout=5) is not None
    cap.stop()
    assert cap.join(0) and src._closed
    assert cap.get(timeout=0.01) is None


def test_capture_thread_with_a_real_video(tmp_path):
    path = tmp_path / "clip.mp4"
    write_clip(path, 8)
    cap = CaptureThread(open_source(cfg(input=str(path)))).start()
    assert cap.join(10)
    frames = []
    while (f := cap.get(timeout=1)) is not None:
        frames.append(f)
    assert len(frames) == 1 and frames[0].seq == 7 and cap.dropped == 7


@pytest.mark.parametrize(
    "inp,pacing,target,frames,expect",
    [
        ("webcam", "fast", "file:o.mp4", None, dict(realtime=True, lossless=False, loop=True)),  # a camera is live
        ("clip.mp4", "auto", "file:o.mp4", None, dict(realtime=False, lossless=True, loop=False)),  # converting
        ("clip.mp4", "auto", "vcam", None, dict(realtime=True, lossless=False, loop=True)),
        ("clip.mp4", "realtime", "file:o.mp4", None, dict(realtime=True, lossless=False, loop=True)),  # --realtime
        ("demo", "fast", "null", None, dict(realtime=False, lossless=True, loop=True)),  # --fast, a benchmark
        ("still.png", "auto", "file:o.mp4", None, dict(lossless=True, still_frames=1)),
        ("still.png", "auto", "file:o.mp4", 5, dict(lossless=True, still_frames=5)),
        ("still.png", "auto", "window", None, dict(realtime=True, still_frames=None)),
    ],
)
def test_plan_delivery(inp, pacing, target, frames, expect):
    from vcam.config import CaptureConfig
    from vcam.stages.capture import plan_delivery

    got = plan_delivery(CaptureConfig(input=inp, pacing=pacing), target, frames)
    assert {k: getattr(got, k) for k in expect} == expect


# -- reading into the caller's buffer (the GPU path's pinned staging) --------------------------


def _sources(tmp_path: Path) -> dict:
    path = tmp_path / "clip.mp4"
    write_clip(path, 4, width=64, height=48)
    still = tmp_path / "still.png"
    cv2.imwrite(str(still), np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    return {
        "video": lambda: open_source(cfg(input=str(path))),
        "image": lambda: open_source(cfg(input=str(still)), delivery=None),
        "pattern": lambda: PatternSource(64, 48, realtime=False),
        "demo": lambda: open_source(cfg(input="demo", width=64, height=48), demo_clip_factory=TinyClip),
    }


@pytest.mark.parametrize("kind", ["video", "image", "pattern", "demo"])
def test_read_into_writes_the_frame_into_the_given_buffer(tmp_path, kind):
    """``read_into(buf)`` is ``read()`` with the pixels in ``buf`` (the frame's data is ``buf``
    itself, the same pixels, frame numbers and format), so the GPU path's upload needs no copy;
    a buffer of another shape is left alone and the frame keeps its own array."""
    make = _sources(tmp_path)[kind]
    with make() as plain, make() as into:
        for _ in range(3):
            buf = np.zeros((48, 64, 3), np.uint8)
            a, b = plain.read(), into.read_into(buf)
            assert b.data is buf and np.array_equal(a.data, b.data)
            assert (a.seq, a.fmt, a.width, a.height) == (b.seq, b.fmt, b.width, b.height)
        other = np.zeros((10, 10, 3), np.uint8)
        c = into.read_into(other)
        assert c.data is not other and c.data.shape == (48, 64, 3) and not other.any()


def test_read_into_gives_a_still_image_its_own_copy_when_the_buffer_does_not_fit(tmp_path):
    """A still image's frames never share the source's array (the consumer may write into them),
    with or without a buffer to read into."""
    still = tmp_path / "still.png"
    cv2.imwrite(str(still), np.full((48, 64, 3), 7, np.uint8))
    with open_source(cfg(input=str(still))) as src:
        f1 = src.read_into(np.zeros((2, 2, 3), np.uint8))
        f1.data[:] = 0
        f2 = src.read()
    assert f2.data.min() == 7


def test_capture_thread_reads_each_frame_into_the_target_buffer():
    """With ``target`` the capture thread has the source write each frame into the buffer it
    gives (a ring here), in order, every frame delivered (lossless)."""
    ring = [np.zeros((30, 40, 3), np.uint8) for _ in range(3)]
    given = []

    def target() -> np.ndarray:
        given.append(ring[len(given) % len(ring)])
        return given[-1]

    src = DemoSource(TinyClip(width=40, height=30, fps=30.0), loop=False, realtime=False)
    cap = CaptureThread(src, lossless=True, target=target).start()
    frames = []
    while (f := cap.get(timeout=2)) is not None:
        frames.append((f.data is given[f.seq], int(f.data[0, 0, 0])))
    assert frames == [(True, i) for i in range(4)]
