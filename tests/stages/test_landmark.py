"""Landmark stage: 2dfan4 and fan_68_5 stand-ins end to end on every ops object (NumPy always, CUDA
where present), on onnxruntime and the torch graph path; the crop recipe checked exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CountingEngine, need_torch
from onnx import numpy_helper

from vcam import config_file as vconfig
from vcam.align import TEMPLATES, apply, estimate
from vcam.engines import TensorInfo, create_engine
from vcam.errors import ModelError
from vcam.models import registry, standin
from vcam.models.download import crc32_text
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo
from vcam.stages.landmark import BOX_SIDE, Landmarker, box_crops

ASSETS = Path(demo.__file__).parents[1] / "assets"
# Three faces' boxes (x1, y1, x2, y2) in a 480 x 640 frame, well inside it with their crops.
BOXES = np.array([[120.0, 110.0, 240.0, 250.0], [330.0, 140.0, 420.0, 230.0], [250.0, 260.0, 330.0, 350.0]])


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """Stand-ins placed by hand with their .hash files, as a user would."""
    d = tmp_path_factory.mktemp("models")
    for name in ("2dfan4", "fan_68_5"):
        p = standin.write(name, d)
        (d / registry.get(name).hash_file).write_text(crc32_text(p.read_bytes()))
    return d


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    import cv2

    img = cv2.imread(str(ASSETS / "grace_hopper.jpg"))
    assert img is not None
    return np.ascontiguousarray(cv2.resize(img, (640, 480)))


@pytest.fixture(scope="module", params=["onnxruntime", "torch"])
def backend(request, ops) -> str:
    if request.param == "torch":
        need_torch()
    elif ops.device == "cuda":
        pytest.skip("onnxruntime takes host buffers; the CUDA ops run the torch (or TensorRT) engine")
    return request.param


def landmarker(models_dir: Path, name: str, ops, backend: str, max_faces: int = 8) -> Landmarker:
    engine = create_engine(models_dir / f"{name}.onnx", backend=backend, device=ops.device, max_batch=max_faces)
    return Landmarker(name, CountingEngine(engine), ops=ops, max_faces=max_faces)


def on_device(ops, a: np.ndarray):
    return ops.asarray(np.ascontiguousarray(a)) if ops.device != "cpu" else a


class CountingReadback:
    """The ops object with its readbacks counted."""

    def __init__(self, ops) -> None:
        self.ops, self.readbacks = ops, 0

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def readback(self, arrays):
        self.readbacks += 1
        return self.ops.readback(arrays)


# -- the crop recipe ------------------------------------------------------------------------------
def test_box_crop_is_facefusions_translation_and_scale():
    mats = box_crops(BOXES, 256)
    w = np.maximum(BOXES[:, 2] - BOXES[:, 0], BOXES[:, 3] - BOXES[:, 1])
    np.testing.assert_allclose(mats[:, 0, 0], BOX_SIDE / w)
    np.testing.assert_allclose(mats[:, 1, 1], BOX_SIDE / w)
    assert not mats[:, 0, 1].any() and not mats[:, 1, 0].any()
    centres = (BOXES[:, :2] + BOXES[:, 2:]) / 2
    for m, c, side in zip(mats, centres, w):
        np.testing.assert_allclose(apply(m, c[None]), [[128.0, 128.0]], atol=1e-9)  # box centre -> crop centre
        np.testing.assert_allclose(apply(m, (c + [side / 2, 0])[None])[0, 0] - 128.0, BOX_SIDE / 2)  # long side -> 195 px
    # a box shifted by (dx, dy) gives the same crop of the shifted frame
    shifted = box_crops(BOXES + [7.0, -5.0, 7.0, -5.0], 256)
    np.testing.assert_allclose(shifted[:, :, :2], mats[:, :, :2])
    np.testing.assert_allclose(shifted[:, :, 2], mats[:, :, 2] - mats[:, :, :2] @ np.array([7.0, -5.0]))
    # a degenerate box is clipped to one pixel, never divided by zero
    assert np.isfinite(box_crops(np.array([[5.0, 5.0, 5.0, 5.0]]), 256)).all()


class FixedPoints:
    """An engine whose 2dfan4 output is the same chosen heatmap points for every face."""

    backend, device, precision, max_batch, name = "fixed", "cpu", "fp32", 8, "fixed"

    def __init__(self, points: np.ndarray) -> None:
        self.points = np.asarray(points, np.float32)
        self.inputs = [TensorInfo("input", (1, 3, 256, 256), "float32")]
        self.outputs = [
            TensorInfo("heatmaps", (1, 68, 64, 64), "float32"),
            TensorInfo("landmarks_xyscore", (1, 68, 3), "float32"),
        ]

    def describe(self) -> str:
        return "fixed"

    def input_buffers(self, n, shapes=None):
        return {"input": np.zeros((n, 3, 256, 256), np.float32)}

    def run_device(self, feeds, stream=None):
        n = feeds["input"].shape[0]
        xys = np.concatenate([self.points, np.ones((68, 1), np.float32)], axis=1)
        return [np.zeros((n, 68, 64, 64), np.float32), np.repeat(xys[None], n, axis=0)]


def test_heatmap_points_map_back_to_frame_pixels(frame):
    """Golden: heatmap (32, 32) is the crop centre, the box centre; heatmap (0, 0) is the crop's
    corner, half the crop side (128 / scale frame pixels) up and left of it. The points output is
    found by name, wherever the engine lists it."""
    pts = np.zeros((68, 2), np.float32)
    pts[1] = 32.0
    pts[2] = (48.0, 16.0)
    lm = Landmarker("2dfan4", FixedPoints(pts))
    got = lm.landmarks(frame, BOXES)
    assert got.shape == (3, 68, 2) and got.dtype == np.float32
    scale = BOX_SIDE / np.maximum(BOXES[:, 2] - BOXES[:, 0], BOXES[:, 3] - BOXES[:, 1])
    centre = (BOXES[:, :2] + BOXES[:, 2:]) / 2
    np.testing.assert_allclose(got[:, 1], centre, atol=1e-4)
    np.testing.assert_allclose(got[:, 0], centre - 128.0 / scale[:, None], atol=1e-4)
    np.testing.assert_allclose(got[:, 2], centre + np.array([64.0, -64.0]) / scale[:, None], atol=1e-4)
    np.testing.assert_array_equal(lm.scores, np.ones((3, 68), np.float32))


# -- 2dfan4 stand-in end to end -------------------------------------------------------------------
@pytest.mark.slow
def test_landmarks_end_to_end_in_one_call(models_dir, frame, ops, backend):
    counted = CountingReadback(ops)
    lm = landmarker(models_dir, "2dfan4", counted, backend)
    got = lm.landmarks(on_device(ops, frame), BOXES)
    assert got.shape == (3, 68, 2) and got.dtype == np.float32 and np.isfinite(got).all()
    assert lm.engine.calls == [(3, 3, 256, 256)] and counted.readbacks == 1  # all faces at once
    # every point inside its face's crop (the heatmap spans the crop)
    half = 128.0 * np.maximum(BOXES[:, 2] - BOXES[:, 0], BOXES[:, 3] - BOXES[:, 1]) / BOX_SIDE
    centre = (BOXES[:, :2] + BOXES[:, 2:]) / 2
    assert (np.abs(got - centre[:, None]) <= half[:, None, None] + 1e-3).all()
    assert lm.scores.shape == (3, 68) and ((lm.scores >= 0) & (lm.scores <= 1)).all()
    # one face at a time gives the same points
    for f in range(3):
        np.testing.assert_allclose(lm.landmarks(on_device(ops, frame), BOXES[f : f + 1])[0], got[f], atol=2e-3)
    assert lm.landmarks(on_device(ops, frame), np.zeros((0, 4))).shape == (0, 68, 2)


def test_more_faces_than_one_call_takes(models_dir, frame, ops, backend):
    lm = landmarker(models_dir, "2dfan4", ops, backend, max_faces=2)
    got = lm.landmarks(on_device(ops, frame), BOXES)
    assert lm.engine.calls == [(2, 3, 256, 256), (1, 3, 256, 256)]
    one = landmarker(models_dir, "2dfan4", ops, backend).landmarks(on_device(ops, frame), BOXES)
    np.testing.assert_allclose(got, one, atol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("shift", [(24, 16), (-13, 9)])
def test_points_follow_the_face(models_dir, frame, ops, backend, shift):
    """The frame translated by whole pixels and the boxes with it: the crops are the same pixels,
    so even random weights give the same heatmap points, and the frame points move by the shift."""
    dx, dy = shift
    moved = np.zeros_like(frame)
    h, w = frame.shape[:2]
    moved[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = frame[
        max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
    ]
    lm = landmarker(models_dir, "2dfan4", ops, backend)
    before = lm.landmarks(on_device(ops, frame), BOXES)
    after = lm.landmarks(on_device(ops, moved), BOXES + [dx, dy, dx, dy])
    np.testing.assert_allclose(after - before, np.broadcast_to([dx, dy], before.shape), atol=2e-3)
    assert np.abs(before[0] - before[1]).max() > 1.0  # and the points are not the same everywhere


# -- fan_68_5 -------------------------------------------------------------------------------------
def test_from_five_maps_through_the_unit_template(models_dir, ops, backend):
    """The stand-in is a fixed affine combination of its 5 points (weights summing to 1), so the
    whole round trip (into the unit ffhq_512 frame and back) must give those combinations of the
    frame points."""
    lm = landmarker(models_dir, "fan_68_5", ops, backend)
    w = numpy_helper.to_array(
        next(i for i in onnx.load(str(models_dir / "fan_68_5.onnx")).graph.initializer if i.name == "weights")
    )
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)
    tpl = TEMPLATES["ffhq_512"]
    five = np.stack([tpl * 180 + [100, 80], tpl * 120 + [400, 200], (tpl * 90) @ np.array([[0.96, 0.28], [-0.28, 0.96]]) + 300])
    five[0, 3] += [3.0, -2.0]  # not exactly a template face
    got = lm.from_five(five)
    assert got.shape == (3, 68, 2) and got.dtype == np.float32
    assert lm.engine.calls == [(3, 5, 2)]
    np.testing.assert_allclose(got, np.einsum("pk,fkc->fpc", w, five), rtol=1e-5, atol=1e-2)
    np.testing.assert_allclose(lm.landmarks(None, np.zeros((3, 4)), five=five), got)
    # the model sees the points in the unit template frame
    unit = apply(estimate(five[1], "ffhq_512", 1), five[1])
    np.testing.assert_allclose(unit, tpl, atol=1e-6)


# -- errors and assembly ----------------------------------------------------------------------------
def test_wrong_kinds_and_calls_are_model_errors(models_dir, frame, tmp_path):
    xseg = create_engine(standin.write("xseg_1", tmp_path))
    with pytest.raises(ModelError, match="xseg_1 is an occluder, not a landmarker") as err:
        Landmarker("xseg_1", xseg)
    assert "2dfan4" in err.value.hint and "fan_68_5" in err.value.hint
    fan = Landmarker("fan_68_5", create_engine(models_dir / "fan_68_5.onnx"))
    with pytest.raises(ModelError, match="fan_68_5 maps 5 detector points to 68") as err:
        fan.landmarks(frame, BOXES)
    assert "from_five" in err.value.hint
    image = Landmarker("2dfan4", create_engine(models_dir / "2dfan4.onnx"))
    with pytest.raises(ModelError, match="2dfan4 finds landmarks in the image, not from 5 points"):
        image.from_five(np.zeros((1, 5, 2)))


def test_create_landmarker_from_config(models_dir, frame):
    cfg = vconfig.build(
        {"models": {"dir": str(models_dir)}, "pipeline": {"backend": "onnxruntime", "device": "cpu", "max_faces": 4}}
    )
    store = model_store(cfg, progress=False)
    lm = build_role("landmarker", cfg, name="2dfan4", store=store)
    assert lm.name == "2dfan4" and lm.max_faces == 4 and lm.engine.backend == "onnxruntime"
    assert "2dfan4: onnxruntime" in lm.describe()
    assert lm.landmarks(frame, BOXES[:2]).shape == (2, 68, 2)
    with pytest.raises(ModelError, match="bisenet_resnet_34 is a parser, not a landmarker"):
        build_role("landmarker", cfg, name="bisenet_resnet_34", store=store)
    with pytest.raises(ModelError, match="unknown model '2dfan5'"):
        build_role("landmarker", cfg, name="2dfan5", store=store)
