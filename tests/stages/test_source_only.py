"""Only the source's face reaches the paste (issue 40, item 3): whatever lies round the source's face
in its photo (a flat saturated backdrop, a busy one, the other people of a group photo picked with
``pick``) changes nothing in the output, for the classic swap (the source's pixels go through its face
weight only) and the neural swap (the source goes in as its identity latent only; what is pasted is
the model's output inside the target's own face).

Real components: the shipped portraits, scikit-image's colour wheel as the busy backdrop, the
embedded RetinaFace detector, stand-in neural models (the real architectures, random weights).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vcam import align
from vcam.models import registry, standin
from vcam.ops.numpy import NumpyOps
from vcam.stages import demo
from vcam.stages import mask as vmask
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.stages.swap import ClassicSwapper, paste_faces

GREEN, MAGENTA = (0, 255, 0), (255, 0, 255)


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector()


class _Fixed:
    """A detector that answers the detections it was given (so a recoloured photo keeps its face's
    points exactly: the test is about the swap, not the detector)."""

    def __init__(self, dets):
        self.dets = dets

    def detect(self, image):
        return list(self.dets)


def _outside(lm, shape):
    planes = vmask.half_planes(vmask.face_polygon(lm)).astype(np.float64)
    yy, xx = np.mgrid[: shape[0], : shape[1]].astype(np.float64)
    return np.max([nx * xx + ny * yy + c for nx, ny, c in planes if c > -1e29], axis=0)


def _group():
    """Two people in one photo: the astronaut (left, picked as 1) and Grace Hopper."""
    a, h = demo.portrait("astronaut"), demo.portrait("grace_hopper")
    return demo.compose(
        (960, 480), [(a, demo.placement((192, 160), (250, 230), 1.0, 4)), (h, demo.placement((256, 250), (700, 250), 0.9, -3))]
    )


def _busy(shape):
    import cv2
    from conftest import require

    try:
        import skimage.data
    except ImportError:
        require("scikit-image", "the busy background is skimage.data's colour wheel: pip install scikit-image")

    wheel = cv2.cvtColor(skimage.data.colorwheel(), cv2.COLOR_RGB2BGR)
    return cv2.resize(wheel, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)


@pytest.fixture(scope="module")
def sources(detector):
    """The group photo's first face, picked, then the same photo with everything round that face
    (backdrop, hair, clothes, the other person) flat green, flat magenta and the colour wheel."""
    group = _group()
    dets = sorted(detector.detect(group), key=lambda d: float(d.box[0]))
    assert len(dets) == 2
    fixed = _Fixed(dets)
    out = {"group": face_from_image(group, "group", detector=fixed, pick=1)}
    away = _outside(dets[0].landmarks.astype(np.float64), group.shape) >= 0
    for name, fill in (("green", GREEN), ("magenta", MAGENTA), ("busy", None)):
        img = group.copy()
        img[away] = fill if fill is not None else _busy(group.shape)[away]
        out[name] = face_from_image(img, name, detector=fixed, pick=1)
    return out


@pytest.fixture(scope="module")
def target(detector):
    frame = demo.DemoClip(640, 360, seconds=1.0).frame(5)
    lm = max(detector.detect(frame), key=lambda d: d.area).landmarks.astype(np.float64)
    return frame, lm, align.estimate(lm, "arcface_128", 128)[None]


def _classic(face, target, local_color=True):
    ops = NumpyOps()
    frame, lm, mats = target
    sw = ClassicSwapper(ops=ops, local_color=local_color)
    crops, mask = sw.swap(frame.copy(), mats, face)
    return paste_faces(ops, sw, frame.copy(), crops, mats, mask, 1, face, lm[None])


def test_the_classic_swap_pastes_the_picked_face_only(sources, target):
    """The picked face of a group photo, its surroundings flat green, flat magenta, a colour wheel or
    as they were (the other person beside): the same output frame, bit for bit; no green in it."""
    outs = {k: _classic(f, target) for k, f in sources.items()}
    for k in ("green", "magenta", "busy"):
        np.testing.assert_array_equal(outs[k], outs["group"], err_msg=k)
    frame = target[0]
    changed = np.any(outs["green"] != frame, axis=2)
    assert changed.sum() > 2000, "the face was not swapped"
    g = outs["green"].astype(np.int16)
    assert (g[..., 1] - np.maximum(g[..., 0], g[..., 2]))[changed].max() < 40


def test_a_group_photo_without_a_pick_is_refused(detector):
    from vcam.errors import FaceError

    with pytest.raises(FaceError, match="2 faces"):
        face_from_image(_group(), "group", detector=detector)


@pytest.fixture(scope="module")
def neural(tmp_path_factory):
    from vcam.engines import create_engine
    from vcam.stages.swap_neural import NeuralSwapper, read_emap

    d = tmp_path_factory.mktemp("models")
    path = standin.write("inswapper_128", d, tiny=True)
    engine = create_engine(path, backend="onnxruntime", device="cpu", max_batch=2)
    return NeuralSwapper(registry.get("inswapper_128"), engine, ops=NumpyOps(), max_faces=2, emap=read_emap(path))


def test_the_neural_swap_takes_only_the_identity_and_pastes_inside_the_target(sources, target, neural):
    """The neural swap on a stand-in inswapper (random weights: its output is noise, so the test is
    about what goes in and where it goes): the same identity with a green, magenta or busy
    surrounding gives the same frame bit for bit (no source pixel reaches the model or the paste),
    and with the face mask nothing outside the target's face outline changes."""
    frame, lm, mats = target
    emb = np.random.default_rng(0).normal(size=512).astype(np.float32)
    masker = vmask.create_masker(["box", "face"], neural.crop_size, ops=neural.ops, feather=0.06)
    box = np.array([[0, 0, 1, 1]], np.float32)
    outs = {}
    for k in ("green", "magenta", "busy"):
        face = neural.prepare(dataclasses.replace(sources[k], embeddings={neural.recogniser: emb}))
        m = mats * (neural.crop_size / 128.0)
        crops, mask = neural.swap(frame.copy(), m, face)
        mask = masker.masks(frame, m, lm[None], box, 1, mask)
        outs[k] = paste_faces(neural.ops, neural, frame.copy(), crops, m, mask, 1, face, lm[None])
    np.testing.assert_array_equal(outs["green"], outs["magenta"])
    np.testing.assert_array_equal(outs["green"], outs["busy"])
    changed = np.any(outs["green"] != frame, axis=2)
    assert changed.sum() > 2000, "the face was not swapped"
    assert _outside(lm, frame.shape)[changed].max() <= 3.0


def test_a_tight_green_crop_never_shows_in_a_clip(detector):
    """The issue's case through the pipeline (detection, tracking, masks, the dense classic paste
    with the local colour match): a source photo cropped tight round the astronaut's face (6 px round
    her 71 x 90 px face box, hair and backdrop flat green): no frame of a 12-frame demo clip shows green where
    it changed, and nothing changes outside the tracked face's outline."""
    from vcam.config import TrackConfig
    from vcam.pipeline.pipeline import Pipeline
    from vcam.stages.track import Tracker
    from vcam.state import Snapshot
    from vcam.types import Frame, PixelFormat

    img = demo.portrait("astronaut")
    d = max(detector.detect(img), key=lambda x: x.area)
    x0, y0, x1, y1 = (int(v) for v in d.box)
    tight = img[max(y0 - 6, 0) : y1 + 6, max(x0 - 6, 0) : x1 + 6].copy()
    lm = d.landmarks.astype(np.float64) - [max(x0 - 6, 0), max(y0 - 6, 0)]
    tight[_outside(lm, tight.shape) >= 0] = GREEN
    face = face_from_image(tight, "tight", detector=_Fixed([dataclasses.replace(d, landmarks=lm.astype(np.float32))]))
    ops = NumpyOps()
    sw = ClassicSwapper(ops=ops, max_faces=2)
    masker = vmask.create_masker(["box", "face"], 128, ops=ops, max_faces=2, feather=0.06)
    pipe = Pipeline(ops=ops, tracker=Tracker(detector, TrackConfig(), 2), swapper=sw, max_faces=2, masker=masker)
    clip = demo.DemoClip(640, 360, seconds=1.0)
    swapped = 0
    for i in range(12):
        frame = clip.frame(i)
        out, stats = pipe.process(Frame(frame.copy(), 640, 360, PixelFormat.BGR, 0.0, i), Snapshot(face, True, 0))
        swapped += stats.swapped
        changed = np.any(out != frame, axis=2)
        g = out.astype(np.int16)
        assert not changed.any() or (g[..., 1] - np.maximum(g[..., 0], g[..., 2]))[changed].max() < 40, i
        for t in pipe.last_tracks:
            changed &= _outside(np.asarray(t.landmarks, np.float64), frame.shape) > 3.0
        assert not changed.any(), f"frame {i}: a pixel outside the face changed"
    assert swapped >= 8
