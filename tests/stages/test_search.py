"""The rolling search beside the frame (:class:`vcam.stages.search.SearchWorker`, ``[track] search``):
the worker's hand-over, and the tracker with it on real frames (the embedded RetinaFace): new faces
as soon as inline, small faces of issue 11 kept, no scheduled full scan and no search in the frame's
own detector call, the same tracks on every run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from vcam.config import Config
from vcam.pipeline.pipeline import Pipeline
from vcam.stages.demo import face_box, faces_scene, gradient, portrait
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.detections import DetectParams
from vcam.stages.search import SearchWorker
from vcam.stages.swap import SolidSwapper
from vcam.stages.track import Tracker, TrackParams
from vcam.state import Snapshot
from vcam.types import Detection, Frame, PixelFormat, SourceFace

W, H = 1920, 1080
MAGENTA = np.array([255, 0, 255])


class _Gated:
    """A detector whose coarse scan waits for ``gate`` and reports the frame's first pixel."""

    def __init__(self):
        self.gate = threading.Event()
        self.calls = 0

    def detect_coarse(self, frame):
        self.gate.wait(5.0)
        self.calls += 1
        if frame[0, 0, 0] == 255:
            raise RuntimeError("bad frame")
        return [Detection(np.array([0, 0, 10, 10], np.float32), np.zeros((5, 2), np.float32), float(frame[0, 0, 0]) / 100)]


def test_worker_hands_the_faces_over_max_lag_frames_later_and_waits_then():
    det = _Gated()
    worker = SearchWorker(det, max_lag=2, wait=True)
    frame = np.full((4, 4, 3), 7, np.uint8)
    assert worker.submit(frame, 10, "coarse")
    frame[...] = 9  # the worker searches its own copy
    assert worker.busy and not worker.submit(frame, 11, "coarse")  # one search at a time
    det.gate.set()
    assert worker.collect(11) is None  # too young, even if done: the same frames on any machine
    seq, faces = worker.collect(12)
    assert seq == 10 and abs(faces[0].score - 0.07) < 1e-6 and not worker.busy
    assert worker.collect(13) is None  # nothing submitted
    # Waited for at its age; a failed search raises in the collecting thread.
    det.gate.clear()
    late = worker.late  # the first may have waited a moment for the thread
    worker.submit(np.full((4, 4, 3), 255, np.uint8), 20, "coarse")
    threading.Timer(0.05, det.gate.set).start()
    with pytest.raises(RuntimeError, match="bad frame"):
        worker.collect(22)
    assert worker.late == late + 1 and worker.searches == 2
    worker.submit(frame, 30, "coarse")
    worker.drop()  # a new source: forgotten, and a new search may start
    assert not worker.busy and worker.submit(frame, 31, "coarse")
    worker.close()
    with pytest.raises(ValueError):
        SearchWorker(det, max_lag=0)


def test_without_wait_a_late_search_is_taken_when_done_and_the_frame_goes_on():
    det = _Gated()
    worker = SearchWorker(det, max_lag=2)  # the daemon's: never holds a frame up
    frame = np.full((4, 4, 3), 5, np.uint8)
    worker.submit(frame, 0, "coarse")
    assert worker.collect(2) is None and worker.collect(3) is None  # due, not done: the frames go on
    assert worker.late == 2 and worker.busy and not worker.submit(frame, 3, "coarse")
    det.gate.set()
    for _ in range(500):  # the search ends; the next frame takes it
        got = worker.collect(4)
        if got is not None:
            break
        threading.Event().wait(0.01)
    assert got is not None and got[0] == 0 and not worker.busy
    worker.close()


@pytest.fixture(scope="module")
def grace():
    img = portrait("grace_hopper")
    return img, face_box(img, RetinaFaceDetector())


class _Counting:
    """The real detector, recording the tracker's calls."""

    def __init__(self, inner):
        self.inner, self.full, self.coarse, self.rects = inner, 0, 0, []
        self.cfg = inner.cfg

    def detect(self, frame):
        self.full += 1
        return self.inner.detect(frame)

    def detect_coarse(self, frame):
        self.coarse += 1
        return self.inner.detect_coarse(frame)

    def detect_regions(self, frame, rects):
        self.rects.append(np.asarray(rects).copy())
        return self.inner.detect_regions(frame, rects)

    def tiles(self, height, width):
        return self.inner.tiles(height, width)

    def small_faces(self, per_tile, height, width, *, others=()):
        return self.inner.small_faces(per_tile, height, width, others=others)


def _entering(grace, n=40, at=10):
    bg = gradient(W, H)
    out = []
    for i in range(n):
        faces = [(120.0, (500.0, 540.0))]
        if i >= at:  # a small face (50 px: only the tiles see it) appears far from the first
            faces.append((50.0, (1500.0, 300.0)))
        out.append(faces_scene((W, H), *grace, faces, bg))
    return out


@pytest.mark.slow
def test_tracker_with_the_worker_finds_a_new_small_face_as_soon_and_runs_the_same_every_time(grace):
    frames = _entering(grace)
    runs = []
    for _ in range(2):
        main = _Counting(RetinaFaceDetector(DetectParams(), 160))
        worker = SearchWorker(RetinaFaceDetector(DetectParams(), 160, threads=1), wait=True)
        tracker = Tracker(main, TrackParams(rescan_every=30, rolling=5), search=worker)
        boxes, first = [], None
        for i, (frame, _) in enumerate(frames):
            tracks = tracker.update(frame, i)
            boxes.append([t.box.round(1).tolist() for t in tracks])
            small = [t for t in tracks if abs((t.box[0] + t.box[2]) / 2 - 1500) < 40]
            if i >= 10 and small and first is None:
                first = i
        worker.close()
        runs.append(boxes)
        # Found by the worker's tiles (coarse and tiles over 3 frames, taken 2 frames late) and
        # confirmed within the 5 frames of issue 11, as inline.
        assert first is not None and first - 10 <= 5, first
        # One full scan (the first frame); every other frame one region call with no tiles in it.
        assert main.full == 1 and main.coarse == 0
        assert all(len(r) <= 2 for r in main.rects), [len(r) for r in main.rects]
        assert worker.searches >= (len(frames) - 1) // 3
    assert runs[0] == runs[1]  # the worker's timing changes nothing


@pytest.fixture(scope="module")
def pipeline_run():
    cfg = Config()
    snap = Snapshot(face=SourceFace(name="x", image=np.zeros((128, 128, 3), np.uint8)), swap_enabled=True, version=0)

    def go(frames):
        from vcam.ops import make_ops

        ops = make_ops("cpu")
        det = RetinaFaceDetector(cfg.detect, cfg.track.roi_size, max_regions=16)
        worker = SearchWorker(RetinaFaceDetector(cfg.detect, cfg.track.roi_size, max_regions=16, threads=1), wait=True)
        tracker = Tracker(det, TrackParams(), cfg.pipeline.max_faces, search=worker)
        pipe = Pipeline(ops=ops, tracker=tracker, swapper=SolidSwapper(ops=ops), out_fmt=PixelFormat.BGR)
        hits = []
        for i, (frame, truth) in enumerate(frames):
            out, _ = pipe.process(Frame(frame, W, H, PixelFormat.BGR, 0.0, i), snap)
            row = []
            for box in truth:
                cx, cy = int((box[0] + box[2]) / 2), int((box[1] + box[3]) / 2)
                row.append(0 <= cx < W and 0 <= cy < H and bool((out[cy, cx] == MAGENTA).all()))
            hits.append(row)
        worker.close()
        return hits

    return go


@pytest.mark.slow
def test_with_the_worker_a_45px_face_in_1080p_is_swapped_in_nearly_every_frame(grace, pipeline_run):
    """Issue 11's small face, with the search beside the frame (tests/stages/test_small_faces.py: in it)."""
    bg = gradient(W, H)
    frames = [faces_scene((W, H), *grace, [(45.0, (300 + 25 * i, 500 + 30 * np.sin(i / 3)))], bg) for i in range(40)]
    hits = [row[0] for row in pipeline_run(frames)]
    assert sum(hits) >= 0.95 * len(hits), f"swapped in {sum(hits)} of {len(hits)} frames"


@pytest.mark.slow
def test_with_the_worker_a_face_entering_while_another_is_tracked_is_swapped_within_five_frames(grace, pipeline_run):
    hits = pipeline_run(_entering(grace, n=30))
    assert all(row[0] for row in hits[1:]), "the first face was lost"
    first = next((i for i in range(10, 30) if hits[i][1]), None)
    assert first is not None and first - 10 <= 5, f"the new face was first swapped {first} (entered at 10)"
