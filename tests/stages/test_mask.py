"""The mask stage: shapes from landmarks, model masks, their CUDA twins, and what reaches the paste."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from vcam import align
from vcam.config import Config
from vcam.config_file import build
from vcam.errors import ConfigError
from vcam.kernels import mask as kmask
from vcam.kernels import paste as blend
from vcam.models import registry, standin
from vcam.runtime.roles import build_masker
from vcam.stages import mask

S = 128
TEMPLATE = align.TEMPLATES["arcface_128"] * S


def _inside(poly: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Signed distance of points to a polygon (positive inside), by OpenCV: an independent oracle."""
    contour = np.asarray(poly, np.float32).reshape(-1, 1, 2)
    return np.array([cv2.pointPolygonTest(contour, (float(x), float(y)), True) for x, y in pts])


def _grid(size: int) -> np.ndarray:
    ys, xs = np.mgrid[0:size, 0:size]
    return np.stack([xs.ravel(), ys.ravel()], 1).astype(np.float64)


def _tilted_landmarks(angle: float = 20.0, scale: float = 0.9, shift=(3.0, -4.0)) -> np.ndarray:
    c = np.array([S / 2, S / 2])
    t = np.deg2rad(angle)
    rot = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]) * scale
    return (TEMPLATE - c) @ rot.T + c + np.asarray(shift)


@pytest.mark.parametrize("angle", [0.0, 25.0, -40.0])
def test_face_shape_covers_the_landmarks_and_is_zero_outside(angle):
    lm = _tilted_landmarks(angle)
    poly = mask.face_polygon(lm)
    assert (_inside(poly, lm) > 5).all()  # eyes, nose and mouth well inside
    planes, feathers = mask.shape_params(lm[None], face=True, mouth=False)
    out = np.zeros((1, S, S), np.float32)
    kmask.polygon_masks_ref(planes, feathers, np.ones((S, S), np.float32), 1, out)
    dist = _inside(poly, _grid(S)).reshape(S, S)
    assert out[0][dist < 0].max() == 0.0  # nothing outside the outline
    assert (out[0][dist > feathers[0, 0] + 1] == 1.0).all()  # full weight deeper than the feather
    # the brows-to-chin span: above the eyes by a third of the eye-to-mouth distance, below the mouth too
    d = mask.eye_mouth_distance(lm)
    eyes, mouth = (lm[0] + lm[1]) / 2, (lm[3] + lm[4]) / 2
    up = (eyes - mouth) / np.linalg.norm(eyes - mouth)
    assert _inside(poly, [eyes + up * 0.35 * d])[0] > 0
    assert _inside(poly, [mouth - up * 0.35 * d])[0] > 0


def test_68_point_shapes_follow_jaw_brows_and_lips():
    rng = np.random.default_rng(1)
    t = np.linspace(np.pi * 0.1, np.pi * 0.9, 17)
    jaw = np.stack([64 - 45 * np.cos(t), 60 + 50 * np.sin(t)], 1)
    brows = np.stack([np.linspace(30, 98, 10), np.full(10, 40.0)], 1)
    rest = rng.uniform(50, 78, (41, 2))
    lm = np.concatenate([jaw, brows, rest])
    lm[30] = (64, 70)  # nose tip
    lips = np.stack(
        [
            64 + 14 * np.cos(np.linspace(0, 2 * np.pi, 12, endpoint=False)),
            95 + 6 * np.sin(np.linspace(0, 2 * np.pi, 12, endpoint=False)),
        ],
        1,
    )
    lm[48:60] = lips
    face = mask.face_polygon(lm)
    assert len(face) <= kmask.MAX_EDGES
    # at most 16 edges: vertices dropped for that cut the outline by little (the hull only shrinks)
    assert (_inside(face, jaw[2:-2]) > -2.0).all()
    assert _inside(face, [(64.0, 60.0)])[0] > 25
    mouth = mask.mouth_polygon(lm)
    assert (_inside(mouth, lips) > 0).all()  # grown by 15%: every lip point strictly inside


def test_mouth_mask_keeps_the_target_mouth_untouched():
    """A synthetic face with known mouth corners: pasting a solid swap with face+mouth masks leaves
    every pixel inside the mouth opening (less its feather) exactly as it was."""
    from vcam.ops.numpy import NumpyOps

    ops = NumpyOps()
    frame = np.full((200, 240, 3), 90, np.uint8)
    lm = TEMPLATE * 1.2 + np.array([50.0, 30.0])  # the face in the frame
    cv2.ellipse(frame, tuple(int(v) for v in (lm[3] + lm[4]) / 2), (20, 8), 0, 0, 360, (10, 10, 200), -1)  # lips
    before = frame.copy()
    mats = align.estimate(lm, "arcface_128", S)[None]
    crops = np.full((1, S, S, 3), 255, np.uint8)
    masker = mask.Masker(["box", "face", "mouth"], S, ops=ops, max_faces=2)
    m = masker.masks(frame, mats, lm[None], np.array([[0, 0, 1, 1]], np.float32), 1, blend.box_mask(S))
    blend.paste_back(ops, frame, crops, mats, m, 1)
    # the mouth opening in frame pixels, shrunk by its feather (crop pixels mapped by the scale)
    poly = mask.mouth_polygon(lm)
    feather = mask.eye_mouth_distance(lm) * masker.feather * 0.5
    dist = _inside(poly, _grid(240)[: 200 * 240]).reshape(200, 240)
    keep = dist > feather + 1.5
    assert keep.sum() > 150
    assert np.array_equal(frame[keep], before[keep])
    changed = np.abs(frame.astype(int) - before.astype(int)).max(axis=2) > 0
    face = _inside(mask.face_polygon(lm), _grid(240)[: 200 * 240]).reshape(200, 240)
    assert changed[(face > 10) & (dist < -5)].mean() > 0.95  # the rest of the face is swapped
    assert not changed[face < -1].any()  # nothing outside the face outline


def test_box_padding_cuts_the_sides():
    m = blend.box_mask(S, 0.3, (0, 0, 40, 0))
    assert m[int(S * 0.6) + 15 :].max() < 0.01  # the cut edge, softened by the blur (sigma 4.75 px)
    assert m[S // 3, S // 2] > 0.99
    assert np.array_equal(blend.box_mask(S, 0.3), blend.box_mask(S, 0.3, (0, 0, 0, 0)))


def test_masks_not_asked_cost_nothing():
    from vcam.ops.numpy import NumpyOps

    base = blend.box_mask(S)
    masker = mask.Masker(["box"], S, ops=NumpyOps())
    assert not masker.active
    assert masker.masks(np.zeros((10, 10, 3), np.uint8), np.zeros((1, 2, 3)), TEMPLATE[None], np.zeros((1, 4)), 1, base) is base


def test_mask_flags_and_config_errors(tmp_path):
    cfg = build({"mask": {"types": "box,face,mouth", "box_padding": [0, 5, 10, 5]}})
    assert cfg.mask.types == ["box", "face", "mouth"]
    with pytest.raises(ConfigError, match=r"\[mask\] types.*'teeth' is not one"):
        build({"mask": {"types": ["box", "teeth"]}})
    with pytest.raises(ConfigError, match="4 numbers"):
        build({"mask": {"box_padding": [1, 2]}})
    with pytest.raises(ConfigError, match="unknown face region"):
        mask.region_bits(["skin", "beard"])


# -- kernels vs references --------------------------------------------------------------------------
@pytest.mark.parametrize("size,count", [(37, 3), (128, 9)])
def test_polygon_masks_parity(ops, size, count):
    rng = np.random.default_rng(size)
    lms = np.stack([_tilted_landmarks(a, 0.9, (0, 0)) * size / S for a in rng.uniform(-40, 40, count)])
    planes, feathers = mask.shape_params(lms, face=True, mouth=True, feather=0.15)
    feathers[0, 1] = 0.0  # a hard edge too
    for base in (blend.box_mask(size), rng.uniform(0, 1, (count, size, size)).astype(np.float32)):
        want = kmask.polygon_masks_ref(planes, feathers, base, count, np.zeros((count, size, size), np.float32), True)
        out = ops.empty((count, size, size), np.float32)
        with ops.activate():
            got = ops.to_host(kmask.polygon_masks(ops, planes, feathers, ops.asarray(base), count, out, True))
        np.testing.assert_allclose(got, want, atol=1e-3)
        assert want.max() > 0.99 and want.min() == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_resample_masks_parity(ops, dtype):
    rng = np.random.default_rng(3)
    src = rng.uniform(-0.2, 1.2, (3, 61, 61)).astype(dtype)
    src[2, 5, 7] = np.nan
    base = rng.uniform(0.5, 1, (3, 37, 37)).astype(np.float32)
    guard = np.zeros(3, np.int32)
    want = kmask.resample_masks_ref(src, 3, base.copy(), 0.5, 1.0, guard)
    assert guard.tolist() == [0, 0, 1]
    # the reference is OpenCV's INTER_LINEAR resize (an independent oracle) where all is finite
    cv = cv2.resize(src[0].astype(np.float32), (37, 37), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_allclose(want[0], base[0] * np.clip((cv - 0.5) * 2, 0, 1), atol=1e-4)
    out = ops.asarray(base.copy())
    g = ops.empty((3,), np.int32)
    with ops.activate():
        got = ops.to_host(kmask.resample_masks(ops, ops.asarray(src), 3, out, 0.5, 1.0, g))
    np.testing.assert_allclose(got, want, atol=1e-3)
    assert ops.to_host(g).tolist() == [0, 0, 1]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_parser_select_parity(ops, dtype):
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 19, 33, 35)).astype(dtype)
    logits[1, 3, 4, 5] = np.inf
    bits = mask.region_bits(["skin", "nose", "lips"])
    guard = np.zeros(2, np.int32)
    want = kmask.parser_select_ref(logits, 2, bits, np.zeros((2, 33, 35), np.float32), guard)
    arg = np.argmax(logits.astype(np.float32), axis=1)
    keep = np.isin(arg, [c for r in ("skin", "nose", "lips") for c in registry.PARSER_CLASSES[r]])
    assert np.array_equal(want[0] > 0, keep[0])
    assert guard.tolist() == [0, 1] and want[1, 4, 5] == 0
    g = ops.empty((2,), np.int32)
    out = ops.empty((2, 33, 35), np.float32)
    with ops.activate():
        got = ops.to_host(kmask.parser_select(ops, ops.asarray(logits), 2, bits, out, g))
    np.testing.assert_array_equal(got, want)
    assert ops.to_host(g).tolist() == [0, 1]


# -- model masks end to end -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mask-models")
    for name in ("xseg_1", "bisenet_resnet_34"):
        standin.write(name, d, tiny=True)
    return d


def _cfg(models, types, **mask_kw):
    return Config().replace(
        models=build({"models": {"dir": str(models)}}).models,
        mask=build({"mask": {"types": types, **mask_kw}}).mask,
    )


@pytest.mark.slow
@pytest.mark.parametrize("types", ["box,occlusion", "box,region", "box,face,mouth,occlusion,region"])
def test_model_masks_run_end_to_end(ops, device, models, types):
    if (ops.device == "cpu") != (device == "cpu"):
        pytest.skip("one device per run")
    from vcam.stages import demo

    cfg = _cfg(models, types)
    masker = build_masker(cfg, S, ops=ops, device=device)
    frame = demo.portrait("grace_hopper")
    frame = np.ascontiguousarray(frame[: frame.shape[0] // 2 * 2, : frame.shape[1] // 2 * 2])
    from vcam.stages.detect import RetinaFaceDetector

    det = RetinaFaceDetector(Config().detect, 160, backend="onnxruntime").detect(frame)[0]
    lm = np.stack([det.landmarks, det.landmarks + 3])
    mats = np.stack([align.estimate(x, "arcface_128", S) for x in lm])
    base = blend.box_mask(S)
    with ops.activate():
        dev = ops.asarray(frame)
        got = ops.to_host(masker.masks(dev, mats, lm, np.stack([det.box, det.box]), 2, ops.asarray(base)))
    assert got.shape == (2, S, S) and np.isfinite(got).all()
    assert got.max() <= 1.0 and got.min() >= 0.0
    assert (got <= base[None] + 1e-6).all()  # a mask only ever removes
    assert masker.guarded_by_model() == {
        m: 0 for m in (["xseg_1"] if "occlusion" in types else []) + (["bisenet_resnet_34"] if "region" in types else [])
    }
    if ops.device == "cpu":
        return
    from vcam.ops.numpy import NumpyOps

    ref = build_masker(cfg, S, ops=NumpyOps(), device="cpu")
    want = ref.masks(frame, mats, lm, np.stack([det.box, det.box]), 2, base)
    np.testing.assert_allclose(got, want, atol=0.02)  # different engines (torch FP32 on CUDA vs onnxruntime)


@pytest.mark.parametrize("landmarker", ["2dfan4", "fan_68_5"])
def test_dense_landmarks_shape_the_face_and_mouth(ops, device, tmp_path, landmarker):
    """With a landmarker configured, the face and mouth shapes come from its 68 points."""
    if (ops.device == "cpu") != (device == "cpu"):
        pytest.skip("one device per run")
    from vcam.stages import demo
    from vcam.stages.detect import RetinaFaceDetector

    standin.write(landmarker, tmp_path, tiny=True)
    cfg = _cfg(tmp_path, "box,face,mouth", landmarker=landmarker)
    masker = build_masker(cfg, S, ops=ops, device=device)
    assert masker.landmarker is not None
    frame = np.ascontiguousarray(demo.portrait("grace_hopper"))
    det = RetinaFaceDetector(Config().detect, 160, backend="onnxruntime").detect(frame)[0]
    lm, box = det.landmarks[None], det.box[None]
    mats = align.estimate(det.landmarks, "arcface_128", S)[None]
    base = blend.box_mask(S)
    with ops.activate():
        dev = ops.asarray(frame)
        got = ops.to_host(masker.masks(dev, mats, lm, box, 1, ops.asarray(base)))
        dense = masker.landmarker.landmarks(dev, box, five=lm)
    assert dense.shape == (1, 68, 2)
    planes, feathers = mask.shape_params(mask.to_crop(dense, mats), face=True, mouth=True, feather=masker.feather)
    want = kmask.polygon_masks_ref(planes, feathers, base, 1, np.zeros((1, S, S), np.float32), True)
    np.testing.assert_allclose(got, want, atol=1e-3)
    five, _ = mask.shape_params(mask.to_crop(lm, mats), face=True, mouth=True)
    assert not np.allclose(planes, five)  # not the 5-point shapes


@pytest.mark.parametrize(
    "size,count,face,mouth", [(37, 3, True, True), (128, 40, True, True), (64, 2, False, True), (64, 2, True, False)]
)
def test_landmark_masks_parity(ops, size, count, face, mouth):
    """The 5-point shapes computed on the device equal the host-built half-planes path and the reference."""
    rng = np.random.default_rng(size + count)
    lms = np.stack([_tilted_landmarks(a, 0.9, (0, 0)) * size / S for a in rng.uniform(-40, 40, count)]).astype(np.float32)
    lms[-1] = lms[-1, :1]  # a degenerate face (every point the same): the face covers nothing
    base = blend.box_mask(size)
    kw = dict(face_scale=1.1, mouth_scale=0.8, feather=0.15)
    want = kmask.landmark_masks_ref(lms, count, base, np.zeros((count, size, size), np.float32), face, mouth, **kw)
    planes, feathers = mask.shape_params(lms[:-1], face=face, mouth=mouth, **kw)
    hosted = kmask.polygon_masks_ref(planes, feathers, base, count - 1, np.zeros((count - 1, size, size), np.float32), mouth)
    np.testing.assert_allclose(want[:-1], hosted, atol=1e-4)
    assert want[-1].max() == (0.0 if face else base.max())
    out = ops.empty((count, size, size), np.float32)
    with ops.activate():
        got = ops.to_host(kmask.landmark_masks(ops, lms, count, ops.asarray(base), out, face, mouth, **kw))
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_the_desk_mouth_switch_turns_the_mouth_mask_on_and_off_per_frame():
    """``models={"mouth": ...}`` (the desk's mouth switch, vcam.pipeline.pipeline.desk_stages): a
    face mask turned mouth-on equals the face+mouth masker, and a face+mouth masker turned mouth-off
    equals the face-only one."""
    from vcam.ops.numpy import NumpyOps

    ops = NumpyOps()
    lm = TEMPLATE * 1.2 + np.array([50.0, 30.0])
    mats = align.estimate(lm, "arcface_128", S)[None]
    frame, box = np.zeros((200, 240, 3), np.uint8), np.array([[0, 0, 1, 1]], np.float32)
    face = mask.Masker(["box", "face"], S, ops=ops)
    both = mask.Masker(["box", "face", "mouth"], S, ops=ops)

    def m(masker, models=None):
        return np.array(masker.masks(frame, mats, lm[None], box, 1, blend.box_mask(S), models=models))

    assert not np.array_equal(m(face), m(both))  # the mouth opening differs
    np.testing.assert_array_equal(m(face, {"mouth": True}), m(both))
    np.testing.assert_array_equal(m(both, {"mouth": False}), m(face))
    np.testing.assert_array_equal(m(both, {}), m(both))
