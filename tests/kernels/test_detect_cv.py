"""The CPU detector input (:func:`vcam.kernels.detect.detector_input_cv`, OpenCV) against its NumPy
reference: within ``CV_TOLERANCE`` levels on noise (the worst case) and every kind of region, a
fraction of a level on camera-like frames, and the same faces found by the detector either way."""

from __future__ import annotations

import numpy as np
import pytest

from vcam.kernels import detect
from vcam.kernels.detect import CV_TOLERANCE, detector_input_cv, detector_input_ref
from vcam.stages.demo import DemoClip, group_frame

MEAN = (104.0, 117.0, 123.0)


def _levels(got: np.ndarray, ref: np.ndarray, scale: float | tuple = 1.0) -> np.ndarray:
    assert np.isfinite(got).all(), "unwritten (NaN) elements left in the output"
    return np.abs(got.astype(np.float64) - ref) / np.max(scale)


def _rects(w: int, h: int) -> np.ndarray:
    return np.array(
        [
            [0, 0, max(w, h)],  # a full scan's letterbox (cv2.resize path)
            [100, 40, 320],  # whole-pixel crop, step 2 (resize path)
            [100.3, 40.7, 333.3],  # fractional (warpAffine path)
            [-50, -30, 200],  # straddling the top-left corner
            [w - 90, h - 70, 240],  # straddling the bottom-right corner
            [w + 10, 5, 100],  # outside: all padding
            [30.5, 20.25, 80],  # an upscale (step < 1)
        ],
        dtype=np.float64,
    )


@pytest.mark.parametrize("rgb,scale", [(False, 1.0), (True, (1 / 128, 1 / 64, 1 / 32))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cv_matches_the_reference_on_noise(rgb, scale, dtype):
    rng = np.random.default_rng(5)
    h, w = 359, 641
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    rects = _rects(w, h)
    ref = detector_input_ref(frame, rects, 160, MEAN, scale=scale, rgb=rgb)
    got = detector_input_cv(frame, rects, 160, MEAN, out=np.full(ref.shape, np.nan, dtype), scale=scale, rgb=rgb)
    lv = _levels(got, ref, scale)
    f16 = 0.25 if dtype == np.float16 else 0.0  # float16 of values up to ~150 levels
    assert lv.max() <= CV_TOLERANCE + f16, lv.max()
    assert lv.mean() <= 0.6, lv.mean()
    # Padding is exactly the normalised zero, as in the reference: the region outside the frame,
    # and the rows and columns of the corner regions that lie past the frame's edges.
    assert not got[5].any()
    assert not got[3, :, :10].any() and not got[3, :, :, :15].any()  # outputs before x = -0.5 or y = -0.5
    assert not got[4, :, 47:].any() and not got[4, :, :, 61:].any()


def test_cv_window_of_a_full_scan():
    """A full scan's window (the rows and columns that cover the frame) as the reference fills it."""
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    rect = np.array([[0.0, 0.0, 1280.0]])
    ref = detector_input_ref(frame, rect, 640, MEAN, out=np.empty((1, 3, 384, 640), np.float32))
    got = detector_input_cv(frame, rect, 640, MEAN, out=np.full((1, 3, 384, 640), np.nan, np.float32))
    assert _levels(got, ref).max() <= 0.51  # exact 2x: only the rounding of OpenCV's uint8 result
    assert not got[:, :, 360:].any()


def test_cv_on_a_camera_like_frame_is_within_a_level():
    frame = DemoClip(1280, 720).frame(17)
    rects = np.array([[690.0, 142.0, 456.0], [511.37, 80.9, 402.6], [0.0, 0.0, 1280.0]])
    ref = detector_input_ref(frame, rects, 160, MEAN)
    lv = _levels(detector_input_cv(frame, rects, 160, MEAN), ref)
    assert lv.max() <= 1.5 and lv.mean() <= 0.3, (lv.max(), lv.mean())


def test_the_cpu_front_is_the_cv_path():
    from vcam.ops import make_ops

    frame = DemoClip(320, 180).frame(3)
    rects = np.array([[10.3, 5.1, 150.7]])
    got = detect.detector_input(make_ops("cpu"), frame, rects, 64, MEAN)
    np.testing.assert_array_equal(got, detector_input_cv(frame, rects, 64, MEAN))


def test_same_faces_found_with_either_input(monkeypatch):
    """The detector finds the same faces (boxes within a pixel, scores within 0.01) on demo and group
    frames whether its input comes from OpenCV or the NumPy reference: full scans (coarse and, at
    1080p, the small-face tiles) and tracked regions."""
    from vcam.stages.detect import RetinaFaceDetector

    detector = RetinaFaceDetector()
    frames = [DemoClip(1280, 720).frame(i) for i in (0, 40, 90)] + [group_frame(1920, 1080, 12, 5, 60)]

    def found(frame):
        dets = detector.detect(frame)
        regions = np.array([[d.box[0] - 40, d.box[1] - 40, 2 * (d.box[2] - d.box[0])] for d in dets[:3]])
        per = detector.detect_regions(frame, regions) if len(regions) else []
        return dets, [d for ds in per for d in ds]

    with_cv = [found(f) for f in frames]
    monkeypatch.setattr(detect, "detector_input_cv", detector_input_ref)
    with_ref = [found(f) for f in frames]
    total = 0
    for (a_full, a_roi), (b_full, b_roi) in zip(with_cv, with_ref):
        for a, b in ((a_full, b_full), (a_roi, b_roi)):
            assert len(a) == len(b)
            for da, db in zip(sorted(a, key=lambda d: tuple(d.box)), sorted(b, key=lambda d: tuple(d.box))):
                np.testing.assert_allclose(da.box, db.box, atol=1.0)
                assert abs(da.score - db.score) <= 0.01
            total += len(a)
    assert total >= 2 * 3 + 12  # the faces are there to compare
