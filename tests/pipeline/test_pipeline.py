"""The pipeline end to end with the real detector and tracker, on every device (the ``ops``
fixture: NumPy always, CUDA where present): geometry, pass-through, formats; and, on CUDA, one
upload and one download per frame and the same output as the CPU within one level."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from vcam import align
from vcam.config import Config, TrackConfig
from vcam.errors import FaceError
from vcam.kernels import paste as blend
from vcam.pipeline.pipeline import Pipeline
from vcam.stages.demo import DemoClip, compose, portrait
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.stages.swap import ClassicSwapper, IdentitySwapper, SolidSwapper, make_builtin
from vcam.stages.track import Tracker
from vcam.state import RuntimeState, Snapshot
from vcam.types import Frame, PixelFormat, SourceFace

ASSETS = Path(__file__).resolve().parents[2] / "vcam" / "assets"


@pytest.fixture(scope="module")
def detector(ops):
    return RetinaFaceDetector(Config().detect, roi_size=Config().track.roi_size, ops=ops, device=ops.device)


@pytest.fixture(scope="module")
def photo_detector():
    return RetinaFaceDetector(Config().detect, roi_size=Config().track.roi_size)


def make_pipeline(detector, swapper, cfg=None, out_fmt=PixelFormat.BGR):
    cfg = cfg or Config()
    tracker = Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces)
    return Pipeline(ops=detector.ops, tracker=tracker, swapper=swapper, out_fmt=out_fmt, max_faces=cfg.pipeline.max_faces)


def frames_of(clip, n, step=1):
    for i in range(0, n * step, step):
        img = clip.frame(i)
        yield Frame(img, img.shape[1], img.shape[0], PixelFormat.BGR, 0.0, i)


def state_with(face):
    st = RuntimeState()
    if face is not None:
        st.add_face(face, activate=True)
    return st


@pytest.fixture(scope="module")
def source_face(photo_detector):
    return face_from_image(portrait("astronaut"), "astronaut", swappers=[ClassicSwapper()], detector=photo_detector)


def boxes_for(pipe, height, width):
    """Paste boxes of the faces the pipeline tracked in its last frame."""
    sw = pipe.swapper
    mats = [align.estimate(t.landmarks, sw.template, sw.crop_size) for t in pipe.last_tracks]
    return blend.paste_boxes(np.array(mats), sw.crop_size, height, width) if mats else np.zeros((0, 4), int)


@pytest.mark.slow
def test_identity_swapper_round_trips_within_interpolation_error(detector, source_face):
    # Two bilinear resamplings (warp, then paste) blur a sharp face by themselves: at a 1:1 crop
    # the round trip costs ~3 grey levels. A crop that oversamples the ~140 px paste box over 5x
    # (768 px) brings pure interpolation error under 1, so any geometric error (a shifted or
    # mis-scaled paste) would show far above the bound.
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=2.0)
    pipe = make_pipeline(detector, IdentitySwapper(crop_size=768, ops=detector.ops))
    st = state_with(source_face)
    checked = 0
    for fr in frames_of(clip, 30, step=2):
        src = fr.data.copy()
        out, stats = pipe.process(fr, st.snapshot())
        if not stats.swapped:
            continue
        for x0, y0, x1, y1 in boxes_for(pipe, 360, 640):
            diff = np.abs(out[y0:y1, x0:x1].astype(np.int16) - src[y0:y1, x0:x1]).mean()
            assert diff <= 1.0, diff
            checked += 1
    assert checked >= 25


def test_solid_swapper_changes_only_the_paste_box(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=2.0)
    pipe = make_pipeline(detector, SolidSwapper(crop_size=128, ops=detector.ops))
    st = state_with(source_face)
    swapped = 0
    for fr in frames_of(clip, 10, step=5):
        src = fr.data.copy()
        out, stats = pipe.process(fr, st.snapshot())
        changed = np.any(out != src, axis=2)
        inside = np.zeros_like(changed)
        for x0, y0, x1, y1 in boxes_for(pipe, 360, 640):
            inside[y0:y1, x0:x1] = True
        assert not np.any(changed & ~inside)
        if stats.swapped:
            swapped += 1
            assert changed.sum() > 0.3 * inside.sum()
    assert swapped >= 9


def test_pass_through_without_source_face_or_with_swap_off(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    no_face = RuntimeState()
    off = state_with(source_face)
    off.set_swap("off")
    for st in (no_face, off):
        for fr in frames_of(clip, 3):
            src = fr.data.copy()
            out, stats = pipe.process(fr, st.snapshot())
            assert stats.faces == 1 and stats.swapped == 0
            np.testing.assert_array_equal(out, src)


def test_classic_swap_changes_the_face(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    st = state_with(source_face)
    fr = next(frames_of(clip, 1))
    src = fr.data.copy()
    out, stats = pipe.process(fr, st.snapshot())
    assert stats.swapped == 1
    ((x0, y0, x1, y1),) = boxes_for(pipe, 360, 640)
    assert np.abs(out[y0:y1, x0:x1].astype(np.int16) - src[y0:y1, x0:x1]).mean() > 5.0


def test_frame_with_ten_faces_swaps_at_most_max_faces(detector, source_face):
    cfg = Config()
    cfg = cfg.replace(pipeline=type(cfg.pipeline)(max_faces=8), track=TrackConfig(rescan_every=1))
    a, g = portrait("astronaut"), portrait("grace_hopper")
    items = []
    for k in range(10):  # a 5 x 2 grid of portraits, faces about 90 px wide
        img = a if k % 2 else g
        s = 300.0 / img.shape[0]
        col, row = k % 5, k // 5
        m = np.array([[s, 0, col * 256 + (256 - s * img.shape[1]) / 2], [0, s, row * 360 + 30]], dtype=np.float64)
        items.append((img, m))
    frame = compose((1280, 720), items, background=None)
    pipe = make_pipeline(detector, SolidSwapper(ops=detector.ops), cfg)
    out, stats = pipe.process(Frame(frame, 1280, 720, PixelFormat.BGR, 0.0, 0), state_with(source_face).snapshot())
    assert stats.faces == 8
    assert stats.swapped == 8


def test_grayscale_and_odd_size_frames(detector, source_face):
    clip = DemoClip(width=641, height=361, fps=30.0, seconds=1.0)
    import cv2

    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops), out_fmt=PixelFormat.I420)
    st = state_with(source_face)
    img = clip.frame(0)
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    out, stats = pipe.process(Frame(gray, 641, 361, PixelFormat.GRAY, 0.0, 0), st.snapshot())
    assert out.shape == (360 * 3 // 2, 640)
    assert stats.swapped == 1
    out, stats = pipe.process(Frame(img, 641, 361, PixelFormat.BGR, 0.0, 1), st.snapshot())
    assert out.shape == (540, 640)


def test_source_photo_without_face_is_refused(photo_detector):
    blank = np.full((300, 300, 3), 127, np.uint8)
    with pytest.raises(FaceError, match="no face found in source photo 'blank'"):
        face_from_image(blank, "blank", swappers=[ClassicSwapper()], detector=photo_detector)


def test_a_new_frame_size_rebuilds_the_buffers(detector, source_face):
    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops), out_fmt=PixelFormat.I420)
    st = state_with(source_face)
    for w, h in ((640, 360), (480, 270), (640, 360)):
        img = DemoClip(width=w, height=h, fps=30.0, seconds=1.0).frame(0)
        out, stats = pipe.process(Frame(img, w, h, PixelFormat.BGR, 0.0, 0), st.snapshot())
        assert out.shape == (h * 3 // 2, w) and stats.swapped == 1


# -- CUDA: copies per frame and parity with the CPU ----------------------------------------------
def _scene(w=640, h=480):
    import cv2

    img = cv2.imread(str(ASSETS / "grace_hopper.jpg"))
    bg = np.full((h, w, 3), 90, np.uint8)
    face = cv2.resize(img, (h * img.shape[1] // img.shape[0], h))[:, : w // 2]
    bg[:, w // 4 : w // 4 + face.shape[1]] = face
    return bg


class _Counting:
    def __init__(self, det):
        self.det, self.calls = det, 0

    def detect(self, f):
        self.calls += 1
        return self.det.detect(f)

    def detect_regions(self, f, r):
        self.calls += 1
        return self.det.detect_regions(f, r)


@pytest.mark.gpu
def test_one_upload_one_download_per_frame(detector):
    """Per frame: one upload, one download of the output, one readback per detector call."""
    ops = detector.ops
    if ops.device != "cuda":
        pytest.skip("counts host<->device copies: CUDA only")
    from vcam.kernels import convert

    cfg = Config()
    h, w = 480, 640
    raw = convert.from_bgr_ref(_scene(w, h), PixelFormat.NV12)
    counting = _Counting(detector)
    pipe = Pipeline(
        ops=ops,
        tracker=Tracker(counting, cfg.track, cfg.pipeline.max_faces),
        swapper=ClassicSwapper(ops=ops),
        out_fmt=PixelFormat.I420,
    )
    snap = Snapshot(face=SourceFace(name="src", image=_scene(w, h)[60:400, 200:460]), swap_enabled=True, version=0)
    swapped = 0
    for seq in range(6):
        before, calls = ops.transfers.snapshot(), counting.calls
        out, stats = pipe.process(Frame(raw, w, h, PixelFormat.NV12, 0.0, seq), snap)
        up, down = ops.transfers.h2d - before[0], ops.transfers.d2h - before[1]
        det_calls = counting.calls - calls
        assert up == 1, f"frame {seq}: {up} uploads"
        assert det_calls >= 1
        assert down == 1 + det_calls, f"frame {seq}: {down} downloads for {det_calls} detector calls"
        assert out.shape == (h * 3 // 2, w)
        swapped += stats.swapped
    assert swapped >= 5, "the face in the scene was not tracked and swapped"
    assert det_calls == 1 and down == 2  # steady state: one ROI pass per frame


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("predict", [False, True])
def test_frames_submitted_ahead_equal_frames_one_at_a_time(detector, source_face, predict):
    """Frame N+1 submitted before frame N is collected (on CUDA: its convert and detection on the
    front stream while N swaps and pastes on the compute stream, each slot its own converted frame;
    with prediction, N's own detection also runs beside N's swap and must read N before its
    paste-back) gives exactly the outputs of one frame at a time: no frame reads or overwrites
    another's pixels, no detection sees a pasted face."""
    clip = DemoClip(width=1280, height=720, fps=30.0, seconds=1.0)
    snap = state_with(source_face).snapshot()
    frames = list(frames_of(clip, 16))
    serial = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    serial.predict = predict
    want = [serial.process(f, snap)[0].copy() for f in frames]
    if predict:
        assert serial.predicted >= 12
    ahead = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    ahead.predict = predict
    got, pending = [], None
    for f in frames:
        slot = ahead.submit(f, snap)
        if pending is not None:
            got.append(ahead.collect(pending)[0].copy())
        pending = slot
    got.append(ahead.collect(pending)[0].copy())
    assert len(got) == len(want)
    changed = 0
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"frame {i}: differs by up to {np.abs(a.astype(np.int16) - b).max()} levels"
        changed += bool(np.abs(b.astype(np.int16) - frames[i].data).max() > 20)
    assert changed >= 14, "the face was not swapped"


@pytest.mark.slow
@pytest.mark.parametrize("fmts", [("NV12", "I420"), ("BGR", "BGR"), ("YUYV", "NV12")])
def test_frames_moved_in_bands_equal_whole_frames(detector, source_face, fmts):
    """``[pipeline] band`` (the default): a predicted frame's band (the rows its faces' crops cover)
    is uploaded and converted first and swapped, the other rows follow beside the swap and are
    converted out and downloaded before the paste-back ends. The outputs, one at a time and with
    the next frame submitted ahead, and the tracks are exactly those of whole frames; a face
    filter that asks for the host frame gets the whole converted frame."""
    from vcam.kernels import convert

    in_fmt, out_fmt = PixelFormat(fmts[0]), PixelFormat(fmts[1])
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    snap = state_with(source_face).snapshot()
    frames = []
    for i in range(14):
        img = clip.frame(i)
        data = img if in_fmt is PixelFormat.BGR else convert.from_bgr_ref(img, PixelFormat.I420)
        if in_fmt is PixelFormat.YUYV:  # (H, W, 2): Y0 U Y1 V per pair, from the I420 planes
            y, u, v = data[:360], data[360:450].reshape(180, 320), data[450:].reshape(180, 320)
            pairs = np.empty((360, 320, 4), np.uint8)
            pairs[..., 0], pairs[..., 2] = y[:, 0::2], y[:, 1::2]
            pairs[..., 1], pairs[..., 3] = np.repeat(u, 2, 0), np.repeat(v, 2, 0)
            data = pairs.reshape(360, 640, 2)
        elif in_fmt is PixelFormat.NV12:
            data = convert.from_bgr_ref(img, PixelFormat.NV12)
        frames.append(Frame(data, 640, 360, in_fmt, 0.0, i))
    seen: dict[str, list] = {}

    def run(band, ahead=False, name=""):
        hosts = seen.setdefault(name, [])

        def keep_host(tracks, host_frame):
            hosts.append(host_frame().copy())
            return tracks

        pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops), out_fmt=out_fmt)
        pipe.predict, pipe.band = True, band
        if name:
            pipe.face_filter = keep_host
        outs, pending = [], None
        for i, f in enumerate(frames):
            if not ahead:
                outs.append(pipe.process(f, snap)[0].copy())
            else:
                slot = pipe.submit(f, snap)
                if pending is not None:
                    outs.append(pipe.collect(pending)[0].copy())
                pending = slot
            # Wait for the detection as the daemon does between frames (settle: then the next frame
            # is planned and moves in bands; on CUDA a frame whose detection is still running moves
            # whole); ahead, every other frame, so banded and whole frames overlap.
            while (not ahead or i % 2) and not pipe.settle():
                pass
        if ahead:
            outs.append(pipe.collect(pending)[0].copy())
        pipe.launch_detection()
        pipe.synchronize()
        while not pipe.settle():
            pass
        # The last frame's detection as matched to the tracks (settle also predicts the tracks of a
        # next frame, which moves their boxes: compare what the detections made of them).
        return outs, pipe, sorted((k, d.box.copy()) for k, d in pipe.tracker.last_matched.items())

    whole, p0, tracks0 = run(False)
    assert p0.banded == 0 and p0.predicted >= 10
    transfers = detector.ops.transfers
    for label, kw in (("one at a time", {}), ("ahead", {"ahead": True}), ("host frame", {"name": "band"})):
        up, up_bytes = transfers.h2d, transfers.h2d_bytes
        outs, pipe, tracks = run(True, **kw)
        least = 5 if kw.get("ahead") else 10
        assert pipe.banded >= least, f"{label}: only {pipe.banded} of {len(frames)} frames moved in bands"
        if detector.ops.device == "cuda":  # every byte of every frame uploaded once, one upload a frame
            assert transfers.h2d - up == len(frames), label
            assert transfers.h2d_bytes - up_bytes == sum(f.data.nbytes for f in frames), label
        for i, (a, b) in enumerate(zip(whole, outs)):
            assert np.array_equal(a, b), f"{label}: frame {i} differs by up to {np.abs(a.astype(int) - b).max()} levels"
        assert [i for i, _ in tracks] == [i for i, _ in tracks0], label
        for (_, a), (_, b) in zip(tracks0, tracks):
            np.testing.assert_array_equal(a, b)
    run(False, name="whole")
    assert len(seen["band"]) == len(seen["whole"]) >= 12
    for i, (a, b) in enumerate(zip(seen["band"], seen["whole"])):
        assert np.array_equal(a, b), f"the host frame of frame {i} differs"
    changed = sum(bool(np.abs(o.astype(int) - w).max()) for o, w in zip(whole, whole[1:]))
    assert changed >= 10


def test_mjpeg_frames_on_the_cpu_move_whole(photo_detector, source_face):
    """A JPEG has no rows to move apart: the CPU pipeline decodes MJPEG frames whole, prediction
    and bands on."""
    import cv2

    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    snap = state_with(source_face).snapshot()
    pipe = make_pipeline(photo_detector, ClassicSwapper())
    pipe.predict = True
    swapped = 0
    for i in range(8):
        jpeg = cv2.imencode(".jpg", clip.frame(i))[1].reshape(-1)
        out, stats = pipe.process(Frame(jpeg, 640, 360, PixelFormat.MJPEG, 0.0, i), snap)
        assert out.shape == (360, 640, 3)
        swapped += stats.swapped
    assert pipe.banded == 0 and pipe.predicted >= 5 and swapped >= 7


def test_the_band_covers_the_crops_and_is_even(detector, source_face):
    """The band is the rows of every face's crop (one crop pixel wider), two more each way, rounded
    out to even rows and clipped to the frame; none when it would be most of the frame."""
    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    sw = pipe.swapper
    lm = np.array([[300, 150], [340, 150], [320, 175], [305, 195], [335, 195]], np.float32)
    from vcam.types import Track

    def band(*offsets_y, height=360):
        tracks = [Track(id=i, box=np.zeros(4, np.float32), landmarks=lm + [0, dy], score=1.0) for i, dy in enumerate(offsets_y)]
        return pipe._band_rows(tracks, height)

    y0, y1 = band(0)
    assert y0 % 2 == 0 and y1 % 2 == 0
    inv = align.invert(align.estimate(lm, sw.template, sw.crop_size))
    ys = align.apply(inv, np.array([[0, 0], [sw.crop_size, 0], [0, sw.crop_size], [sw.crop_size, sw.crop_size]]))[:, 1]
    assert y0 <= ys.min() - 2 and y1 >= ys.max() + 2 and y1 - y0 <= ys.max() - ys.min() + 2 * 20
    top = band(-140)
    assert top is not None and top[0] == 0
    assert band(-150, 150) is None  # two faces far apart: most of the frame
    assert band(-110, height=120) is None  # one face filling a small frame


@pytest.mark.slow
def test_settling_the_pending_detection_between_frames_changes_nothing(detector, source_face):
    """:meth:`Pipeline.settle` (the daemon calls it while it waits for the next frame) applies the
    last predicted frame's detection before the next frame comes instead of at its start, and the
    daemon queues that detection only once the frame is collected (``detect_now=False``, then
    :meth:`Pipeline.launch_detection`; or nobody does, and the next frame's start queues it): the
    outputs, the predicted frames and the tracks are those of the pipeline that does neither."""
    import time

    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    snap = state_with(source_face).snapshot()
    frames = list(frames_of(clip, 14))
    runs = {}
    for mode in ("plain", "settle", "launch after collect, settle", "launch at the next frame"):
        pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
        pipe.predict = True
        outs, settled = [], 0
        for f in frames:
            later = mode.startswith("launch")
            outs.append(pipe.collect(pipe.submit(f, snap, detect_now=not later))[0].copy())
            if mode == "launch after collect, settle":
                pipe.launch_detection()
            if mode.endswith("settle"):
                pending = pipe.planner.step is not None
                deadline = time.monotonic() + 2.0
                while not pipe.settle():  # on CUDA the detection may still run on the back stream
                    assert time.monotonic() < deadline, "the pending detection never arrived"
                    time.sleep(0.0005)
                assert pipe.planner.step is None
                settled += pending
        pipe.launch_detection()
        while not pipe.settle():  # the last frame's detection, for all (then compare the tracks)
            time.sleep(0.0005)
        runs[mode] = (outs, pipe.predicted, [(t.id, t.box.copy()) for t in pipe.tracker.tracks], settled)
    outs, predicted, tracks, _ = runs.pop("plain")
    for mode, (outs_s, predicted_s, tracks_s, settled) in runs.items():
        assert predicted == predicted_s >= 10, mode
        assert settled >= 10 or not mode.endswith("settle"), mode
        for i, (a, b) in enumerate(zip(outs, outs_s)):
            assert np.array_equal(a, b), f"{mode}: frame {i} differs"
        assert [i for i, _ in tracks] == [i for i, _ in tracks_s], mode
        for (_, a), (_, b) in zip(tracks, tracks_s):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.gpu
def test_prediction_swaps_every_frame_without_waiting_and_stays_on_the_face(detector, source_face):
    """[track] predict on (the default on CUDA): after the first frames every frame is swapped with
    the tracks predicted for it while its detection runs, as many faces are swapped as when each
    frame waits, and the boxes swapped stay on the face (IoU with that frame's own detection)."""
    from vcam.stages.detections import box_iou

    clip = DemoClip(width=1280, height=720, fps=30.0, seconds=1.5)
    snap = state_with(source_face).snapshot()
    frames = list(frames_of(clip, 40))
    results = {}
    for predict in (False, True):
        pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
        pipe.predict = predict
        swapped, boxes, detected = [], {}, {}
        for f in frames:
            out, stats = pipe.process(f, snap)
            swapped.append(stats.swapped)
            boxes[f.seq] = {t.id: t.box.copy() for t in pipe.last_tracks if t.missed == 0}
            if pipe.tracker.last_seq is not None:
                detected[pipe.tracker.last_seq] = {k: d.box for k, d in pipe.tracker.last_matched.items()}
        ious = [
            float(box_iou(b.reshape(1, 4), detected[seq][tid].reshape(1, 4))[0, 0])
            for seq, faces in boxes.items()
            for tid, b in faces.items()
            if tid in detected.get(seq, {})
        ]
        results[predict] = (swapped, pipe.predicted, ious)
    (sync_swapped, sync_predicted, sync_iou), (swapped, predicted, iou) = results[False], results[True]
    assert sync_predicted == 0 and predicted >= len(frames) - 3, predicted
    assert swapped == sync_swapped
    assert len(iou) >= len(frames) - 3 and np.mean(iou) >= 0.88 and min(iou) >= 0.75, (np.mean(iou), min(iou))
    assert np.mean(iou) >= np.mean(sync_iou) - 0.05  # one frame of prediction costs little over the smoothing


class _SameTracks:
    """Gives both pipelines the same tracks per frame: the CPU detector's faces on that frame."""

    def __init__(self, det, per_frame):
        from vcam.runtime.bench import FixedTracker

        self.last_full_scan = False
        self._fixed = {seq: FixedTracker(det, faces) for seq, faces in per_frame.items()}

    def update(self, frame, seq, t=None):
        return self._fixed[seq].update(frame, seq)


@pytest.mark.gpu
@pytest.mark.parametrize("swapper", ["classic", "identity"])
def test_gpu_matches_cpu_on_the_demo_clip(detector, photo_detector, swapper):
    """The acceptance check: the demo clip through the pipeline on both devices, BGR in and out,
    within one level (same tracks on both)."""
    ops = detector.ops
    if ops.device != "cuda":
        pytest.skip("compares CUDA with the CPU")
    from vcam.ops.numpy import NumpyOps

    clip = DemoClip(width=1280, height=720, fps=30.0, seconds=2.0)
    seqs = list(range(0, 60, 12))
    frames = {i: clip.frame(i) for i in seqs}
    per_frame = {i: [d.landmarks.astype(np.float64) for d in photo_detector.detect(frames[i])] for i in seqs}
    assert all(per_frame.values()), "the demo face was not found"
    cpu_ops = NumpyOps()
    cpu_sw, gpu_sw = make_builtin(swapper, ops=cpu_ops), make_builtin(swapper, ops=ops)
    face = face_from_image(portrait("astronaut"), "astronaut", swappers=[cpu_sw], detector=photo_detector)
    snap = Snapshot(face=face, swap_enabled=True, version=0)
    cpu = Pipeline(ops=cpu_ops, tracker=_SameTracks(photo_detector, per_frame), swapper=cpu_sw)
    gpu = Pipeline(ops=ops, tracker=_SameTracks(detector, per_frame), swapper=gpu_sw)
    for i in seqs:
        ref, rs = cpu.process(Frame(frames[i].copy(), 1280, 720, PixelFormat.BGR, 0.0, i), snap)
        got, gs = gpu.process(Frame(frames[i].copy(), 1280, 720, PixelFormat.BGR, 0.0, i), snap)
        assert rs.swapped == gs.swapped == len(per_frame[i])
        d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        # the classic swap samples at float32 warp coordinates on the device: a few levels on a handful of
        # values, where its source weight's ramp (0.02 of the face, two pixels here) meets a coordinate a
        # hundredth of a pixel apart (3 levels on up to 64 values of 2.8 million on the H200)
        worst, few = (3, 150) if swapper == "classic" else (1, 50)
        assert d.max() <= worst and (d > 1).sum() <= few, f"frame {i}: max {d.max()} on {int((d > 1).sum())} values"
        if swapper == "classic":
            assert np.abs(ref.astype(np.int16) - frames[i]).max() > 20  # the face really changed


@pytest.mark.gpu
def test_gpu_detector_finds_what_the_cpu_detector_finds(detector, photo_detector):
    if detector.ops.device != "cuda":
        pytest.skip("compares CUDA with the CPU")
    scene = _scene()
    ref = photo_detector.detect(scene)
    got = detector.detect(detector.ops.asarray(scene))
    assert ref and len(got) == len(ref)
    for a, b in zip(got, ref):
        assert np.abs(a.box - b.box).max() < 1.0
        assert np.abs(a.landmarks - b.landmarks).max() < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("predict", [False, True])
def test_a_fast_face_is_swapped_once_and_nowhere_else(detector, source_face, predict):
    """A face jumping about 60% of its size a frame (every 9th frame of the demo clip): with or
    without prediction (the default on CUDA) it stays one track, one face is swapped per frame, and
    nothing changes outside that track's face (no stale track left where the face was, no second
    track started beside it: before, a predicted frame's detection that fell outside the match
    gate started a new track and the old one was swapped for two more frames, pasting up to three
    faces)."""
    from vcam.stages import mask as vmask

    clip = DemoClip(width=1280, height=720, fps=30.0, seconds=2.0, face="astronaut", seed=1)
    snap = state_with(source_face).snapshot()
    pipe = make_pipeline(detector, ClassicSwapper(ops=detector.ops))
    pipe.predict = predict
    ids = set()
    for f in frames_of(clip, 7, step=9):
        src = f.data.copy()
        out, stats = pipe.process(f, snap)
        assert stats.swapped == 1 and len(pipe.last_tracks) == 1, [(t.id, t.box) for t in pipe.last_tracks]
        ids.add(pipe.last_tracks[0].id)
        changed = np.abs(np.asarray(out).astype(np.int16) - src).max(axis=2) > 0
        outline = np.round(vmask.face_polygon(pipe.last_tracks[0].landmarks, 1.15)).astype(np.int32)
        near = np.zeros(changed.shape, np.uint8)
        cv2.fillConvexPoly(near, outline, 1)
        assert not changed[near == 0].any(), f"frame {f.seq}: {int(changed[near == 0].sum())} pixels changed off the face"
    assert ids == {1}
    if predict:
        assert pipe.predicted >= 4


def test_desk_stages_lay_the_switches_over_the_degraders_choice():
    from vcam.pipeline.pipeline import desk_stages

    on = {"enhancer": True, "occlusion": False}
    assert desk_stages(on, {}) is on  # nothing set: the degrader's own dict, no copy per frame
    got = desk_stages(on, {"enhancer": False, "occlusion_mask": True, "mouth_mask": True, "mirror": True})
    assert got == {"enhancer": False, "occlusion": False, "mouth": True}  # off under load stays off
    assert desk_stages({}, {"enhancer": True, "mouth_mask": False}) == {"enhancer": True, "mouth": False}


def test_the_mirror_setting_flips_the_published_frame(detector, source_face):
    """Mirror on: every published frame is the unmirrored pipeline's frame flipped left to right
    (the swap itself unchanged); off again: as before."""
    clip = DemoClip(width=320, height=240, fps=30.0, seconds=1.0)
    plain = make_pipeline(detector, SolidSwapper(crop_size=128, ops=detector.ops))
    flip = make_pipeline(detector, SolidSwapper(crop_size=128, ops=detector.ops))
    st, mirrored = state_with(source_face), state_with(source_face)
    mirrored.offer("mirror", True)
    swapped = 0
    for fr in frames_of(clip, 6, step=4):
        want, stats = plain.process(fr, st.snapshot())
        got, _ = flip.process(fr, mirrored.snapshot())
        np.testing.assert_array_equal(got, want[:, ::-1])
        swapped += stats.swapped
    assert swapped >= 5
    mirrored.set_setting("mirror", False)
    fr = next(frames_of(clip, 1))
    np.testing.assert_array_equal(flip.process(fr, mirrored.snapshot())[0], plain.process(fr, st.snapshot())[0])


class _Enhancer:
    """Records what the pipeline asks of a face enhancer (and changes nothing)."""

    name = "fake-enhancer"

    def __init__(self) -> None:
        self.calls: list[float | None] = []

    def enhance(self, img, lms, *, amount=None):
        self.calls.append(amount)
        return img

    def guarded(self) -> int:
        return 0


def test_the_enhancer_switch_and_amount_reach_the_enhancer(detector, source_face):
    """The desk's enhancer switch skips the face enhancer for the frames that carry it off; its
    amount goes to the enhancer with each frame; the degrader's choice still counts."""
    cfg = Config()
    enh = _Enhancer()
    pipe = Pipeline(
        ops=detector.ops,
        tracker=Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces),
        swapper=SolidSwapper(crop_size=128, ops=detector.ops),
        enhancer=enh,
    )
    st = state_with(source_face)
    clip = DemoClip(width=320, height=240, fps=30.0, seconds=1.0)
    frames = frames_of(clip, 4, step=4)
    st.offer("enhancer", True)
    st.offer("enhancer_amount", 0.8)
    pipe.process(next(frames), st.snapshot())
    st.set_setting("enhancer_amount", 0.3)
    pipe.process(next(frames), st.snapshot())
    assert enh.calls == [0.8, 0.3]
    st.set_setting("enhancer", False)
    pipe.process(next(frames), st.snapshot())
    assert enh.calls == [0.8, 0.3]
    st.set_setting("enhancer", True)
    pipe.stages_on["enhancer"] = False  # the degrader turned it off under load
    pipe.process(next(frames), st.snapshot())
    assert enh.calls == [0.8, 0.3]
