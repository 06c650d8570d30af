"""Decode stage (issue 9 item 6): a camera's MJPG, replayed from a real Motion-JPEG file, decoded in
the capture thread, on the CPU (OpenCV) and on the GPU (nvJPEG), with the latency clock started
before the decode; broken JPEGs skipped; the daemon's output equal to that of the same frames
decoded beforehand."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest
from conftest import host
from media import Recorder, write_clip

from benchmarks.mjpeg import write_mjpeg
from vcam.config import CaptureConfig
from vcam.config_file import build
from vcam.errors import DeviceError, InputError
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import pixelate
from vcam.stages import decode, demo
from vcam.stages.capture import MAX_CORRUPT, CaptureThread, open_source
from vcam.stages.sources import DemoSource, VideoSource
from vcam.types import Frame, PixelFormat

W, H, N = 320, 240, 24


@pytest.fixture(scope="module")
def mjpeg_clip(tmp_path_factory):
    """24 frames of a moving face as a Motion-JPEG file, and its JPEGs decoded by OpenCV."""
    clip = demo.DemoClip(width=W, height=H, fps=30, seconds=N / 30, seed=5)
    path = tmp_path_factory.mktemp("mjpeg") / "camera.avi"
    jpegs = write_mjpeg(path, [clip.frame(i) for i in range(N)])
    decoded = [cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR) for j in jpegs]
    return path, jpegs, decoded


def _frame(jpeg: bytes, seq: int = 0, t: float = 1.0) -> Frame:
    return Frame(data=np.frombuffer(jpeg, np.uint8), width=W, height=H, fmt=PixelFormat.MJPEG, t_capture=t, seq=seq)


def _diff_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float((d > 8).mean())


# -- the source ------------------------------------------------------------------------------------


def test_a_motion_jpeg_file_is_delivered_as_a_camera_sends_mjpg(mjpeg_clip):
    path, jpegs, _ = mjpeg_clip
    with VideoSource(path, realtime=False, compressed=True) as src:
        assert (src.fmt, src.width, src.height) == (PixelFormat.MJPEG, W, H)
        frames = []
        while (f := src.read()) is not None:
            frames.append(f)
    assert [f.seq for f in frames] == list(range(N))
    assert all(f.fmt is PixelFormat.MJPEG and (f.width, f.height) == (W, H) for f in frames)
    assert [bytes(f.data) for f in frames] == jpegs  # the JPEGs as stored, not re-encoded
    assert all(f.data.flags.writeable for f in frames)
    # without compressed delivery the same file is decoded to BGR as before
    with VideoSource(path, realtime=False) as plain:
        first = plain.read()
    assert first.fmt is PixelFormat.BGR and first.data.shape == (H, W, 3)


@pytest.mark.slow
def test_the_replayed_camera_keeps_its_frame_rate_and_loops(mjpeg_clip):
    path, _, _ = mjpeg_clip
    src = open_source(
        CaptureConfig(input=str(path), pacing="realtime", loop=True), compressed=True
    )  # realtime: paced at the file's 30 fps
    with src:
        t0 = time.perf_counter()
        frames = [src.read() for _ in range(N + 6)]
        took = time.perf_counter() - t0
    assert all(f.fmt is PixelFormat.MJPEG for f in frames)
    assert [f.seq for f in frames] == list(range(N + 6))  # looped past the end, still counting
    assert took >= (N + 4) / 30 * 0.9, f"{N + 6} frames in {took:.2f} s: not paced at 30 fps"


def test_other_codecs_are_decoded_even_when_compressed_frames_are_asked_for(tmp_path):
    path = tmp_path / "h264.mp4"
    write_clip(path, 3)
    with VideoSource(path, realtime=False, compressed=True) as src:
        f = src.read()
    assert f.fmt is PixelFormat.BGR and f.data.shape == (48, 64, 3)


# -- the decoders ----------------------------------------------------------------------------------


def test_open_decoder_picks_the_device_and_refuses_what_cannot_work(ops):
    auto = decode.open_decoder("auto", ops)
    assert auto.device == ("cuda" if ops.device == "cuda" else "cpu")
    assert decode.open_decoder("cpu", ops).device == "cpu"
    if ops.device == "cpu":
        with pytest.raises(DeviceError, match="needs the CUDA pipeline") as err:
            decode.open_decoder("gpu", ops)
        assert "decode = 'cpu'" in err.value.hint
    with pytest.raises(InputError, match="unknown"):
        decode.open_decoder("fast", ops)


def test_decoded_frames_keep_their_arrival_time_and_match_opencv(ops, mjpeg_clip):
    _, jpegs, decoded = mjpeg_clip
    dec = decode.open_decoder("auto", ops)
    for i in (0, 7, N - 1):
        out = dec.decode(_frame(jpegs[i], seq=i, t=123.5 + i))
        assert (out.fmt, out.width, out.height, out.seq, out.t_capture) == (PixelFormat.BGR, W, H, i, 123.5 + i)
        if dec.device == "cuda":
            dec.stream.synchronize()
        got = host(ops, out.data)
        if dec.device == "cpu":
            np.testing.assert_array_equal(got, decoded[i])
        else:  # nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's
            mean, far = _diff_stats(got, decoded[i])
            assert mean <= 1.5 and far <= 0.03, f"frame {i}: mean diff {mean:.2f}, {far:.2%} of values off by > 8"


def test_a_broken_jpeg_is_a_corrupt_frame_on_both_devices(ops, mjpeg_clip):
    _, jpegs, _ = mjpeg_clip
    dec = decode.open_decoder("auto", ops)
    for junk in (b"\xff\xd8not a jpeg at all" * 10, jpegs[0][:40]):
        with pytest.raises(decode.CorruptFrame):
            dec.decode(_frame(junk))
    assert dec.decode(_frame(jpegs[1], seq=1)).seq == 1  # and the next good one decodes


class _Jpegs:
    """A source of MJPEG frames from a list, None entries being broken JPEGs."""

    width, height, fps, fmt = W, H, 30.0, PixelFormat.MJPEG

    def __init__(self, jpegs: list[bytes | None]) -> None:
        self.jpegs = list(jpegs)
        self.seq = 0

    def read(self) -> Frame | None:
        if self.seq >= len(self.jpegs):
            return None
        j = self.jpegs[self.seq] or b"\xff\xd8\xff\xe0broken"
        self.seq += 1
        return _frame(j, seq=self.seq - 1, t=time.perf_counter())

    def close(self) -> None:
        pass


def test_the_capture_thread_skips_broken_jpegs_and_gives_up_on_a_broken_camera(mjpeg_clip):
    _, jpegs, decoded = mjpeg_clip
    src = _Jpegs([jpegs[0], None, jpegs[2], None, None, jpegs[5]])
    cap = CaptureThread(src, lossless=True, stage=decode.CpuJpegDecoder().decode).start()
    got = []
    while (f := cap.get(timeout=5)) is not None:
        got.append(f)
    assert [f.seq for f in got] == [0, 2, 5] and cap.corrupt == 3
    np.testing.assert_array_equal(got[1].data, decoded[2])
    dead = CaptureThread(_Jpegs([None] * (MAX_CORRUPT + 5)), lossless=True, stage=decode.CpuJpegDecoder().decode).start()
    with pytest.raises(InputError, match=f"{MAX_CORRUPT} corrupt frames in a row") as err:
        while dead.get(timeout=5) is not None:
            pass
    assert "fourcc = 'YUYV'" in err.value.hint


@pytest.mark.gpu
def test_jpegs_nvjpeg_refuses_go_to_opencv_and_such_a_camera_to_the_cpu(ops, mjpeg_clip, monkeypatch, caplog):
    if ops.device != "cuda":
        pytest.skip("the GPU decoder's fallback")
    _, jpegs, decoded = mjpeg_clip
    dec = decode.open_decoder("gpu", ops)

    def refuse(*a, **kw):
        raise RuntimeError("Error while decoding JPEG images: unsupported")

    monkeypatch.setattr(dec, "_decode_jpeg", refuse)
    with caplog.at_level("WARNING", logger="vcam.stages.decode"):
        for i in range(decode.FALLBACK_AFTER + 2):
            out = dec.decode(_frame(jpegs[i], seq=i))
            assert isinstance(out.data, np.ndarray) and out.seq == i  # a host frame, OpenCV's
            np.testing.assert_array_equal(out.data, decoded[i])
    assert dec.fallbacks == decode.FALLBACK_AFTER and "decoding them on the CPU" in caplog.text
    with pytest.raises(decode.CorruptFrame):  # what neither decodes is still a corrupt frame
        dec.decode(_frame(b"\xff\xd8junk" * 20))


@pytest.mark.gpu
def test_the_device_ring_never_hands_out_a_buffer_the_pipeline_holds(ops):
    if ops.device != "cuda":
        pytest.skip("the device ring is the GPU decoder's")
    ring = ops.device_ring((4, 4, 3), 4)
    first = ring.take()
    ring.claim(first, ops.stream)
    taken = [ring.take() for _ in range(9)]
    assert first not in taken and set(taken) == set(range(4)) - {first}
    ring.release(first, ops.stream)
    assert first in [ring.take() for _ in range(4)]


# -- through the daemon ----------------------------------------------------------------------------


class _Decoded:
    """The clip's JPEGs decoded beforehand, as a clip for :class:`DemoSource`."""

    def __init__(self, frames: list[np.ndarray]) -> None:
        self.frames, self.width, self.height, self.fps, self.n_frames = frames, W, H, 30.0, len(frames)

    def frame(self, i: int) -> np.ndarray:
        return self.frames[i]


@pytest.mark.slow
def test_the_daemon_decodes_mjpg_in_the_capture_thread_as_if_decoded_before(device, mjpeg_clip, tmp_path):
    """``vcam run`` on the Motion-JPEG file (decoded in the capture thread: OpenCV on the CPU,
    nvJPEG on CUDA) publishes every frame, as the same daemon does with the JPEGs decoded
    beforehand by OpenCV: equal on the CPU, within the two decoders' difference on CUDA."""
    path, _, decoded = mjpeg_clip
    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), demo.portrait("astronaut"))
    cfg = build(
        {
            "capture": {"input": str(path), "width": W, "height": H, "pacing": "fast", "loop": False},
            "pipeline": {"device": device},
            "swap": {"source": str(photo)},
        }
    )
    rec = Recorder()
    daemon = Daemon(cfg, output=rec, control=False)
    daemon.run()
    stream = daemon.streams[0]
    assert stream.source.fmt is PixelFormat.MJPEG
    assert stream.decoder.device == device and stream.cap.corrupt == 0
    assert daemon.summary.frames_out == N and len(rec.got) == N, daemon.summary.line()
    before = Recorder()
    Daemon(cfg, output=before, source=DemoSource(_Decoded(decoded), loop=False, realtime=False), control=False).run()
    assert len(before.got) == N
    # the swap happened
    assert np.abs(rec.got[5].astype(np.int16) - decoded[5]).max() > 50
    for i, (a, b) in enumerate(zip(rec.got, before.got)):
        if device == "cpu":
            np.testing.assert_array_equal(a, b, err_msg=f"frame {i}")
        else:
            # the two decoders' own difference (nvJPEG against OpenCV, the test of the decoder
            # above): outside the face the output is the input, so it carries that difference
            mean, far = _diff_stats(a, b)
            assert mean <= 1.5 and far <= 0.03, f"frame {i}: mean diff {mean:.2f}, {far:.2%} of values off by > 8"


@pytest.mark.slow
def test_a_live_mjpg_camera_is_early_frames_decoded_on_the_cpu_then_decoded_on_the_device(device, mjpeg_clip, tmp_path):
    """A camera (the file replayed at 30 fps): while the models load its JPEGs are decoded on the
    CPU and published pixelated; then the capture thread decodes them on the pipeline's device."""
    path, _, decoded = mjpeg_clip
    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), demo.portrait("astronaut"))
    cfg = build(
        {
            "capture": {"input": str(path), "width": W, "height": H, "pacing": "realtime", "loop": True},
            "pipeline": {"device": device, "max_latency": 0},
            "swap": {"source": str(photo)},
        }
    )
    rec = Recorder()
    # no early swap: on CUDA its CPU pipeline (decoding on the CPU) would swap these 12 frames
    daemon = Daemon(cfg, output=rec, control=False, early_swap=False)
    daemon.run(max_frames=12)
    s, stream = daemon.summary, daemon.streams[0]
    assert s.frames_out == 12 and len(rec.got) == s.early_frames + 12, s.line()
    assert stream.decoder.device == device and stream.cap.stage == stream.decoder.decode
    if device == "cuda":
        assert stream.decoder.decoded >= 12
    for got in rec.got[: s.early_frames]:  # early frames: the camera's JPEGs decoded by OpenCV, pixelated
        assert any(np.array_equal(got, pixelate(d)) for d in decoded)
