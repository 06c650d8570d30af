"""Issue 40 item 2, steadiness: the head filter (vcam.stages.smoothing.HeadFilter) on made-up
detections, and the paste's jitter and lag on the real-photo steadiness scene
(benchmarks/precision_real.py: a still head and a moving one, ground truth from the composer)."""

from __future__ import annotations

import numpy as np
import pytest

from vcam.align import TEMPLATES
from vcam.stages.smoothing import HeadFilter

_FACE = TEMPLATES["arcface_112_v2"] * 150 + np.array([400.0, 300.0])  # a 150 px face's five points
_BOX = np.array([390.0, 270.0, 560.0, 470.0])


def _run(filt: HeadFilter, centres: np.ndarray, noise: float, seed: int = 0) -> np.ndarray:
    """The filtered landmarks' centre per frame for a face whose true centre moves by ``centres``
    (T, 2) offsets, detected with ``noise`` px of landmark noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i, c in enumerate(centres):
        lm = _FACE + c + rng.normal(0, noise, (5, 2))
        box = _BOX + np.tile(c, 2)
        got, _ = filt.reset(lm, box, 0.0) if i == 0 else filt(lm, box, i / 30)
        out.append(got.mean(axis=0))
    return np.array(out) - _FACE.mean(axis=0)


def test_a_still_heads_noise_is_averaged_away():
    still = np.zeros((150, 2))
    got = _run(HeadFilter(0.2, 2.0), still, noise=2.0)
    steps = np.linalg.norm(np.diff(got[20:], axis=0), axis=1)
    raw = np.linalg.norm(np.diff(np.random.default_rng(1).normal(0, 2.0, (150, 5, 2)).mean(axis=1), axis=0), axis=1)
    assert np.median(steps) < 0.2 * np.median(raw), (np.median(steps), np.median(raw))
    assert np.abs(got[20:]).max() < 1.5


@pytest.mark.parametrize("speed", [2.0, 9.0])  # px a frame
def test_a_head_moving_steadily_is_followed_without_lag(speed):
    """A plain low-pass trails a moving head by (1 - a) / a frames; the pose's own velocity does
    not: after a few frames the paste is where the head is, whatever the speed, from the start."""
    path = np.column_stack([speed * np.arange(90), np.zeros(90)])
    got = _run(HeadFilter(0.2, 2.0), path, noise=0.5)
    assert np.abs(got[5:, 0] - path[5:, 0]).max() < max(1.5, 0.3 * speed)
    assert abs(np.mean(got[30:, 0] - path[30:, 0])) < 0.2 * speed  # no lag: a fifth of a frame at most


def test_a_head_that_turns_back_is_caught_up_with():
    """A head swinging left and right (up to 9.3 px a frame): the filter stays within about a
    frame's motion of it where it turns back, and far closer on the way."""
    path = np.column_stack([140 * np.sin(np.arange(240) / 15), np.zeros(240)])
    err = np.abs(_run(HeadFilter(0.2, 2.0), path, noise=1.0)[10:, 0] - path[10:, 0])
    assert err.max() < 9.3 and np.median(err) < 3.0, (err.max(), np.median(err))


def test_the_box_and_landmarks_come_back_as_given_at_reset():
    lm, box = HeadFilter(0.2, 2.0).reset(_FACE, _BOX, 0.0)
    np.testing.assert_allclose(lm, _FACE, atol=1e-6)
    np.testing.assert_allclose(box, _BOX, atol=1e-6)


class _Recording:
    """The real detector, recording the regions each call was given and what they found."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[np.ndarray, list]] = []

    def detect(self, frame):
        return self.inner.detect(frame)

    def tiles(self, height, width):
        return self.inner.tiles(height, width)

    def small_faces(self, per_tile, height, width, *, others=()):
        return self.inner.small_faces(per_tile, height, width, others=others)

    def detect_regions(self, frame, rects):
        found = self.inner.detect_regions(frame, rects)
        self.calls.append((np.asarray(rects, np.float64).copy(), found))
        return found


def _scene(detector, centre_of, frames: int, seed: int = 3):
    """A portrait on grey with sensor noise, its face's centre at ``centre_of(i)``: (frame, face box) per frame."""
    from vcam.stages.demo import compose, face_box, placement, portrait, transform_box

    img = portrait("grace_hopper")
    fb = face_box(img, detector)
    anchor = ((fb[0] + fb[2]) / 2, (fb[1] + fb[3]) / 2)
    rng = np.random.default_rng(seed)
    for i in range(frames):
        m = placement(anchor, centre_of(i), 120.0 / float(fb[2] - fb[0]), 0.0)
        base = compose((640, 360), [(img, m)], (90, 90, 90)).astype(np.float32)
        yield np.clip(base + rng.normal(0, 4.0, base.shape) + 0.5, 0, 255).astype(np.uint8), transform_box(fb, m)


@pytest.fixture(scope="module")
def detector():
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.detections import DetectParams

    return RetinaFaceDetector(DetectParams(), roi_size=160)


def test_a_still_face_is_searched_through_one_crop_and_a_moving_one_is_followed(detector):
    """The detector's landmarks move with the crop it is given, so a still face's region stays put
    (its raw landmarks then move a few hundredths of a pixel where a region re-centred on each
    frame's box made them jump pixels); a moving face's region goes with it."""
    from vcam.stages.track import Tracker, TrackParams

    rec = _Recording(detector)
    tracker = Tracker(rec, TrackParams(rescan_every=1000), max_faces=2)
    raw = []
    for i, (frame, _) in enumerate(_scene(detector, lambda i: (320.0, 180.0), 30)):
        (track,) = tracker.update(frame, i)
        raw.append(tracker.last_matched[track.id].landmarks)
    rects = np.array([r[0] for r, _ in rec.calls[10:]])  # after the first frames, where the box settles
    assert len(rects) >= 15 and np.ptp(rects, axis=0).max() == 0.0, rects  # one crop, every frame
    assert np.median(np.abs(np.diff(np.array(raw[5:]), axis=0))) < 0.3

    rec.calls.clear()
    moving = Tracker(rec, TrackParams(rescan_every=1000), max_faces=2)
    for i, (frame, box) in enumerate(_scene(detector, lambda i: (200.0 + 6.0 * i, 180.0), 40)):
        (track,) = moving.update(frame, i)
        assert box_iou_1(track.box, box) > 0.6, i
    first, last = rec.calls[1][0][0], rec.calls[-1][0][0]
    assert last[0] - first[0] > 150  # the region went along (6 px a frame)


def test_a_full_scan_takes_a_tracked_faces_landmarks_from_its_region(detector):
    """A full scan sees a face coarser than its region does (its landmarks a few pixels off): on a
    scan frame a tracked face is updated with its region's detection, not the scan's."""
    from vcam.stages.track import Tracker, TrackParams

    rec = _Recording(detector)
    tracker = Tracker(rec, TrackParams(rescan_every=4, rolling=0), max_faces=2)
    scans = 0
    for i, (frame, _) in enumerate(_scene(detector, lambda i: (320.0, 180.0), 13)):
        before = len(rec.calls)
        (track,) = tracker.update(frame, i)
        if tracker.last_full_scan and i > 0:
            scans += 1
            rects, found = rec.calls[before]  # the tracks' own regions, queued with the scan
            assert len(rects) == 1 and found[0]
            np.testing.assert_array_equal(tracker.last_matched[track.id].landmarks, found[0][0].landmarks)
    assert scans == 3


def box_iou_1(a, b) -> float:
    from vcam.stages.detections import box_iou

    return float(box_iou(np.asarray(a, np.float64), np.asarray(b, np.float64))[0, 0])


@pytest.mark.slow
@pytest.mark.parametrize("size", ["1080p", "4K"])
def test_the_paste_is_steady_on_a_still_head_and_keeps_up_with_a_moving_one(size):
    """Issue 40's done-when on a short scene (1080p and 4K, real photographs around two real
    heads): on the still head the paste moves a median <= 0.3 px a frame relative to the head (in
    the frame's own pixels), no frame's jump over 2 px where the head moved under 2 px (either
    head), the moving head's paste lags by at most one frame."""
    from conftest import require

    try:
        import skimage.data  # noqa: F401
    except ImportError:
        require("scikit-image", "the steadiness scene is made of skimage.data's photographs: pip install scikit-image")
    from benchmarks.precision_real import steadiness

    r = steadiness("cpu", size, 80 if size == "1080p" else 60)
    assert r["still"]["median_px"] <= 0.3, r
    assert r["still"]["max_px_head_under_2px"] <= 2.0 and r["moving"]["max_px_head_under_2px"] <= 2.0, r
    assert abs(r["moving"]["lag_frames"]) <= 1.0, r


class _ArrayHeadFilter:
    """The head filter written over NumPy arrays, as it was before its Python-float form: the
    oracle of :func:`test_the_float_filter_is_the_array_filter`."""

    def __init__(self, min_cutoff: float, beta: float, shape_cutoff: float = 3.0, bias_cutoff: float = 0.3) -> None:
        self.min_cutoff, self.beta, self.shape_cutoff, self.bias_cutoff = min_cutoff, beta, shape_cutoff, bias_cutoff
        self._tpl = TEMPLATES["arcface_112_v2"]
        self._eyes = float(np.linalg.norm(self._tpl[1] - self._tpl[0]))
        self._pose = None

    @staticmethod
    def _alpha(dt: float, cutoff: float) -> float:
        return 1.0 / (1.0 + 1.0 / (2.0 * np.pi * cutoff * dt))

    def _split(self, landmarks, box):
        from vcam.align import apply, invert, umeyama

        pts = np.concatenate([np.asarray(landmarks, np.float64).reshape(5, 2), np.asarray(box, np.float64).reshape(2, 2)])
        m = umeyama(self._tpl, pts[:5])
        return apply(m, self._tpl), apply(invert(m), pts)

    def _join(self):
        from vcam.align import apply, umeyama

        pts = apply(umeyama(self._tpl, self._pose), self._shape)
        return pts[:5], np.concatenate([pts[5:].min(axis=0), pts[5:].max(axis=0)])

    def reset(self, landmarks, box, t):
        self._pose, self._shape = self._split(landmarks, box)
        self._vel, self._n, self._bias, self._t = np.zeros((5, 2)), 1, np.zeros(2), float(t)
        return self._join()

    def __call__(self, landmarks, box, t):
        if self._pose is None:
            return self.reset(landmarks, box, t)
        pose, shape = self._split(landmarks, box)
        dt = max(float(t) - self._t, 1e-3)
        self._t = float(t)
        guess = self._pose + self._vel * dt
        error = pose - guess
        self._bias += self._alpha(dt, self.bias_cutoff) * (error.mean(axis=0) - self._bias)
        side = max(float(np.linalg.norm(self._pose[1] - self._pose[0])) / self._eyes, 1.0)
        speed = (float(np.mean(np.linalg.norm(self._vel, axis=1))) + float(np.linalg.norm(self._bias)) / dt) / side
        a = self._alpha(dt, self.min_cutoff + self.beta * speed)
        b = a * a / (2.0 - a)
        self._n += 1
        n = self._n
        a, b = max(a, 2.0 * (2 * n - 1) / (n * (n + 1))), max(b, 6.0 / (n * (n + 1)))
        self._pose = guess + a * error
        self._vel = self._vel + b * error / dt
        self._shape = self._shape + self._alpha(dt, self.shape_cutoff) * (shape - self._shape)
        return self._join()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_float_filter_is_the_array_filter(seed):
    """The head filter keeps its points in Python floats (a third of the time a face on NumPy's
    small arrays); it is the array filter to rounding, through a still start, a steady pan, a jump,
    a turn and a reset."""
    rng = np.random.default_rng(seed)
    new, old = HeadFilter(0.2, 2.0), _ArrayHeadFilter(0.2, 2.0)
    t = 0.0
    for i in range(240):
        shift = np.array([3.0 * max(0, i - 40), 0.0]) + (120.0 if i >= 150 else 0.0)
        turn = 0.2 * np.sin(i / 20)
        rot = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
        lm = (_FACE - _FACE.mean(0)) @ rot.T + _FACE.mean(0) + shift + rng.normal(0, 1.5, (5, 2))
        box = _BOX + np.tile(shift, 2) + rng.normal(0, 2.0, 4)
        t += 1 / 30 if i % 17 else 1 / 15  # a dropped frame now and then
        if i == 200:
            got, want = new.reset(lm, box, t), old.reset(lm, box, t)
        else:
            got, want = new(lm, box, t), old(lm, box, t)
        np.testing.assert_allclose(got[0], want[0], atol=1e-9, rtol=0)
        np.testing.assert_allclose(got[1], want[1], atol=1e-9, rtol=0)
        assert got[0].shape == (5, 2) and got[1].shape == (4,) and got[0].dtype == np.float64
