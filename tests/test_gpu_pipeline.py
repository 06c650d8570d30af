"""The GPU pipeline: one upload, one download and the detection readback per frame; the same frames
as the CPU pipeline (classic swap) within one level; the embedded detector on the GPU finds the same
faces as on onnxruntime. Needs CuPy, PyTorch with CUDA and a GPU; skips with the reason elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import require
from vcam.types import Frame, PixelFormat, SourceFace

pytestmark = pytest.mark.gpu
ASSETS = Path(__file__).resolve().parent.parent / "vcam" / "assets"


@pytest.fixture(scope="module")
def gpu():
    from vcam.gpu import available

    ok, why = available()
    if not ok:
        require("gpu", why)
    try:
        import torch
    except ImportError as exc:
        require("gpu", f"torch does not import ({exc})")
    if not torch.cuda.is_available():
        require("gpu", "torch sees no CUDA device")
    import cupy

    return cupy


def _scene(w=640, h=480):
    import cv2

    img = cv2.imread(str(ASSETS / "grace_hopper.jpg"))
    bg = np.full((h, w, 3), 90, np.uint8)
    face = cv2.resize(img, (h * img.shape[1] // img.shape[0], h))[:, : w // 2]
    bg[:, w // 4 : w // 4 + face.shape[1]] = face
    return bg


def _snap(image):
    from vcam.state import Snapshot

    return Snapshot(face=SourceFace(name="src", image=image), swap_enabled=True, version=0)


class _Counting:
    def __init__(self, det):
        self.det, self.calls = det, 0

    def detect(self, f):
        self.calls += 1
        return self.det.detect(f)

    def detect_regions(self, f, r):
        self.calls += 1
        return self.det.detect_regions(f, r)


def _gpu_pipeline(cfg, w, h, tracker_of, transfers=None):
    import cupy

    from vcam.gpu.pipeline import GpuClassicSwapper, GpuPipeline, GpuRetinaFace, Transfers

    xfer = transfers or Transfers()
    stream = cupy.cuda.Stream(non_blocking=True)
    det = GpuRetinaFace(cfg.detect, cfg.track.roi_size, fp16=False, transfers=xfer, stream=stream)
    tracker = tracker_of(det)
    sw = GpuClassicSwapper(cfg.swap.crop_size, cfg.swap.color_match, max_faces=cfg.pipeline.max_faces)
    pipe = GpuPipeline(cfg, tracker=tracker, swapper=sw, width=w, height=h, in_fmt=PixelFormat.NV12,
                       out_fmt=PixelFormat.I420, transfers=xfer, stream=stream)
    return pipe, xfer, det


def test_one_upload_one_download_per_frame(gpu):
    from vcam import convert
    from vcam.config import Config
    from vcam.track import Tracker

    cfg = Config()
    h, w = 480, 640
    scene = _scene(w, h)
    raw = convert.from_bgr(scene, PixelFormat.NV12)
    counting = {}

    def tracker_of(det):
        counting["det"] = _Counting(det)
        return Tracker(counting["det"], cfg.track, cfg.pipeline.max_faces)

    pipe, xfer, _ = _gpu_pipeline(cfg, w, h, tracker_of)
    snap = _snap(_scene(w, h)[60:400, 200:460])
    swapped = 0
    for seq in range(6):
        before, calls = xfer.snapshot(), counting["det"].calls
        out, stats = pipe.process(Frame(raw, w, h, PixelFormat.NV12, 0.0, seq), snap)
        up, down = xfer.h2d - before[0], xfer.d2h - before[1]
        det_calls = counting["det"].calls - calls
        assert up == 1, f"frame {seq}: {up} uploads"
        assert det_calls >= 1
        assert down == 1 + det_calls, f"frame {seq}: {down} downloads for {det_calls} detector calls"
        assert out.shape == (h * 3 // 2, w)
        swapped += stats.swapped
    assert swapped >= 5, "the face in the scene was not tracked and swapped"
    # Steady state: one ROI pass per frame, so exactly 1 up, 2 down (output + detections).
    assert det_calls == 1 and down == 2


def test_gpu_pipeline_matches_cpu_pipeline(gpu):
    from vcam import convert
    from vcam.bench import FixedTracker
    from vcam.config import Config
    from vcam.detect import RetinaFaceDetector
    from vcam.pipeline import Pipeline
    from vcam.swap import ClassicSwapper

    cfg = Config()
    h, w = 480, 640
    scene = _scene(w, h)
    cpu_det = RetinaFaceDetector(cfg.detect, cfg.track.roi_size)
    dets = cpu_det.detect(scene)
    assert dets, "no face in the test scene"
    faces = [d.landmarks.astype(np.float64) for d in dets]
    snap = _snap(_scene(w, h)[60:400, 200:460])
    cpu = Pipeline(cfg, tracker=FixedTracker(cpu_det, faces), swapper=ClassicSwapper(cfg.swap.crop_size), out_fmt=PixelFormat.I420)
    gpu_pipe, _, gdet = _gpu_pipeline(cfg, w, h, lambda det: FixedTracker(det, faces))
    rng = np.random.default_rng(3)
    for seq in range(3):
        frame_bgr = np.clip(scene.astype(np.int16) + rng.integers(-3, 4, scene.shape), 0, 255).astype(np.uint8)
        raw = convert.from_bgr(frame_bgr, PixelFormat.NV12)
        ref, _ = cpu.process(Frame(raw, w, h, PixelFormat.NV12, 0.0, seq), snap)
        got, st = gpu_pipe.process(Frame(raw, w, h, PixelFormat.NV12, 0.0, seq), snap)
        assert st.swapped == len(faces)
        d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        assert d.max() <= 1, f"frame {seq}: max {d.max()}, >1 on {float((d > 1).mean()):.4%}"
        base = convert.from_bgr(convert.to_bgr(raw, PixelFormat.NV12, w, h), PixelFormat.I420)
        assert (ref != base).sum() > 100  # the swap changed the face
    # The GPU detector (FP32 torch) finds the same faces as onnxruntime.
    import cupy

    gd = gdet.detect(cupy.asarray(scene))
    assert len(gd) == len(dets)
    for a, b in zip(gd, dets):
        assert np.abs(a.box - b.box).max() < 1.0
        assert np.abs(a.landmarks - b.landmarks).max() < 1.0


class _SameTracks:
    """Gives both pipelines the same tracks per frame: the CPU detector's faces on that frame."""

    def __init__(self, det, per_frame):
        from vcam.bench import FixedTracker

        self.det, self.per_frame, self.last_full_scan = det, per_frame, False
        self._fixed = {seq: FixedTracker(det, faces) for seq, faces in per_frame.items()}

    def update(self, frame, seq, t=None):
        return self._fixed[seq].update(frame, seq)


@pytest.mark.parametrize("swapper", ["classic", "identity"])
def test_gpu_pipeline_matches_cpu_pipeline_on_demo_clip(gpu, swapper):
    """The acceptance check: the demo clip through both pipelines, BGR in and out, within one level."""
    from dataclasses import replace

    from vcam.config import Config
    from vcam.daemon import face_from_image
    from vcam.demo import DemoClip, portrait
    from vcam.detect import RetinaFaceDetector
    from vcam.gpu import stages
    from vcam.pipeline import Pipeline
    from vcam.state import Snapshot
    from vcam.swap import make_swapper

    cfg = Config()
    cfg = cfg.replace(swap=replace(cfg.swap, swapper=swapper))
    clip = DemoClip(width=1280, height=720, fps=30.0, seconds=2.0)
    cpu_det = RetinaFaceDetector(cfg.detect, cfg.track.roi_size)
    seqs = list(range(0, 60, 12))
    frames = {i: clip.frame(i) for i in seqs}
    per_frame = {i: [d.landmarks.astype(np.float64) for d in cpu_det.detect(frames[i])] for i in seqs}
    assert all(per_frame.values()), "the demo face was not found"
    cpu_sw = make_swapper(swapper, crop_size=cfg.swap.crop_size)
    face = face_from_image(portrait("astronaut"), "astronaut", swapper=cpu_sw, detector=cpu_det)
    snap = Snapshot(face=face, swap_enabled=True, version=0)
    cpu = Pipeline(cfg, tracker=_SameTracks(cpu_det, per_frame), swapper=cpu_sw, out_fmt=PixelFormat.BGR)
    xfer, stream = stages.make_context()
    gdet = stages.make_detector(cfg, transfers=xfer, stream=stream)
    gpu_pipe = stages.make_pipeline(cfg, tracker=_SameTracks(gdet, per_frame), swapper=stages.make_swapper(cfg),
                                    width=1280, height=720, in_fmt=PixelFormat.BGR, out_fmt=PixelFormat.BGR,
                                    transfers=xfer, stream=stream)
    for i in seqs:
        ref, rs = cpu.process(Frame(frames[i].copy(), 1280, 720, PixelFormat.BGR, 0.0, i), snap)
        got, gs = gpu_pipe.process(Frame(frames[i].copy(), 1280, 720, PixelFormat.BGR, 0.0, i), snap)
        assert rs.swapped == gs.swapped == len(per_frame[i])
        d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        assert d.max() <= 1, f"frame {i}: max {d.max()} on {int((d > 1).sum())} values"
        if swapper == "classic":
            assert np.abs(ref.astype(np.int16) - frames[i]).max() > 20  # the face really changed


def test_daemon_runs_on_cuda(gpu, tmp_path):
    """`vcam run --device cuda` end to end on the demo clip: frames flow, faces are swapped."""
    from dataclasses import replace

    from vcam.config import Config, Duration
    from vcam.daemon import Daemon
    from vcam.publish import NullOutput

    cfg = Config()
    cfg = cfg.replace(capture=replace(cfg.capture, input="demo", realtime=False),
                      pipeline=replace(cfg.pipeline, device="cuda", fp16=True, max_latency=Duration(0)),
                      output=replace(cfg.output, target="null"))
    out = NullOutput(1280, 720, 30.0, fmt=PixelFormat.I420)
    d = Daemon(cfg, output=out, control=False)
    s = d.run(max_frames=60)
    assert s.device == "cuda" and s.frames_out == 60 and out.frames == 60
