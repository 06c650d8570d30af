"""Pose and eyes (issue 40, item 4): a turned face keeps its proportions under the classic warp
(its outline and midline follow the yaw, the warp never folds over the face), and the eye mask
keeps the target's own eyes, by how far they are shut or cast down where 68 points say so.

Real photographs: the shipped portraits and scikit-image's ``camera`` (a man looking down into a
camera, near profile). The three-quarter face is made: the astronaut's frontal photo turned by a
depth model (``tests/media.py`` ``turned``), said so here.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from media import face68, turned

from vcam import align
from vcam.kernels import paste as blend
from vcam.kernels import warp
from vcam.ops.numpy import NumpyOps
from vcam.stages import demo, swap_classic
from vcam.stages import mask as vmask
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.swap import ClassicSwapper, paste_faces
from vcam.types import SourceFace

S = 128


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector()


def _face(detector, img):
    d = max(detector.detect(img), key=lambda x: x.area)
    return d.landmarks.astype(np.float64), np.asarray(d.box, np.float32)


def _source(detector, name):
    img = demo.portrait(name)
    lm, _ = _face(detector, img)
    m = align.estimate(lm, "arcface_128", S)
    return SourceFace(name, warp.warp_crops_ref(img, m[None], S)[0], landmarks=align.apply(m, lm).astype(np.float32))


def _swap(detector, frame, face, types=("box", "face"), landmarker=None, local_color=True):
    ops = NumpyOps()
    lm, box = _face(detector, frame)
    mats = align.estimate(lm, "arcface_128", S)[None]
    sw = ClassicSwapper(ops=ops, local_color=local_color)
    masker = vmask.create_masker(list(types), S, ops=ops, feather=0.06, landmarker=landmarker)
    crops, m = sw.swap(frame.copy(), mats, face)
    out = frame.copy()
    m = masker.masks(out, mats, lm[None], box[None], 1, m)
    return paste_faces(ops, sw, out, crops, mats, m, 1, face, lm[None], masker.last_landmarks), lm


def _camera():
    from conftest import require

    try:
        import skimage.data
    except ImportError:
        require("scikit-image", "the real photograph is skimage.data's camera man: pip install scikit-image")

    grey = cv2.cvtColor(skimage.data.camera(), cv2.COLOR_GRAY2BGR)
    return cv2.resize(grey, (1024, 1024), interpolation=cv2.INTER_CUBIC)


def test_frontal_faces_keep_the_plain_outline(detector):
    """The shipped portraits are frontal: no yaw, so their outline (and the device kernel's mask
    path) is exactly what it was."""
    for name in demo.PORTRAITS:
        lm, _ = _face(detector, demo.portrait(name))
        assert vmask.yaw(lm) == 0.0
        ring = vmask.face_ring(lm)
        planes = vmask.half_planes(vmask.face_polygon(lm))
        assert ring.shape == (16, 2) and (planes[:, 2] > -1e29).sum() >= 12


@pytest.mark.parametrize("degrees", [35.0, 45.0])
def test_a_turned_face_swapped_with_itself_comes_back_closer(detector, monkeypatch, degrees):
    """The astronaut turned by ``degrees`` (a depth model) swapped with her own frontal photo: inside
    her face the swap differs from the turned target by at least 20% less than a warp that takes
    every face as frontal (the warp of before, in the same run). The geometry alone: without the
    local colour match, which brings both closer."""
    astro = demo.portrait("astronaut")
    frame = turned(astro, _face(detector, astro)[0], degrees)
    src = _source(detector, "astronaut")

    def err():
        out, lm = _swap(detector, frame, src, local_color=False)
        zone = np.zeros(frame.shape[:2], np.uint8)
        cv2.fillConvexPoly(zone, np.round(vmask.face_polygon(lm, 0.85)).astype(np.int32), 1)
        return float(np.abs(out.astype(np.int16) - frame)[zone > 0].mean()), lm

    posed, lm = err()
    assert vmask.yaw(lm) > 0.1
    monkeypatch.setattr(vmask, "YAW_MAX", 0.0)
    plain, _ = err()
    assert posed < 0.8 * plain, (posed, plain)


def test_the_warp_never_folds_over_a_near_profile_face(detector):
    """The camera man (near profile, his nose tip past his far eye): the warp of a frontal source
    onto him folds where it follows his points fully; the one the swap uses does not."""
    lm, _ = _face(detector, _camera())
    mats = align.estimate(lm, "arcface_128", S)[None]
    tgt = vmask.to_crop(lm[None], mats)[0]
    src = np.asarray(_source(detector, "astronaut").landmarks, np.float64)
    assert swap_classic.posed(tgt, src)
    dst, s = swap_classic.control_points(tgt), swap_classic.control_points(src)
    outline = vmask.face_polygon(tgt)
    used = swap_classic.unfolded(dst, s, outline)
    assert swap_classic.folds(used, s, outline) == 0
    # and the outline follows the visible face: its centre is off the eyes' midpoint, away from the nose
    eyes = (tgt[0] + tgt[1]) / 2
    assert (outline.mean(0) - eyes)[0] * (tgt[2] - eyes)[0] < 0


def _eye_frame():
    frame = np.full((200, 240, 3), 90, np.uint8)
    lm = align.TEMPLATES["arcface_128"] * S * 1.2 + np.array([50.0, 30.0])
    for eye in lm[:2]:
        cv2.ellipse(frame, tuple(int(v) for v in eye), (9, 5), 0, 0, 360, (30, 200, 30), -1)
    return frame, lm


def _solid_paste(types, frame, lm, landmarker=None):
    ops = NumpyOps()
    out = frame.copy()
    mats = align.estimate(lm, "arcface_128", S)[None]
    masker = vmask.Masker(list(types), S, ops=ops, max_faces=2, feather=0.06, landmarker=landmarker)
    m = masker.masks(out, mats, lm[None], np.array([[0, 0, 1, 1]], np.float32), 1, blend.box_mask(S))
    blend.paste_back(ops, out, np.full((1, S, S, 3), 255, np.uint8), mats, m, 1)
    return out


def test_the_eye_mask_keeps_the_targets_eyes():
    """5 points: with ``eyes`` the pixels of the target's eyes stay as they were, the rest of the
    face is swapped as before."""
    frame, lm = _eye_frame()
    with_eyes = _solid_paste(("box", "face", "eyes"), frame, lm)
    without = _solid_paste(("box", "face"), frame, lm)
    for eye in lm[:2]:
        x, y = (int(round(v)) for v in eye)
        assert np.array_equal(with_eyes[y - 2 : y + 3, x - 4 : x + 5], frame[y - 2 : y + 3, x - 4 : x + 5])
        assert (without[y, x] == 255).all()
    mouth = tuple(int(round(v)) for v in (lm[3] + lm[4]) / 2)
    assert (with_eyes[mouth[1], mouth[0]] == without[mouth[1], mouth[0]]).all()


class _Points:
    """A landmarker that answers given 68 points (the shape of :class:`~vcam.stages.landmark.Landmarker`)."""

    def __init__(self, points):
        self.points = points

    def landmarks(self, frame, boxes, five=None):
        return self.points[None]


def _lids(lm68, open_share):
    """``lm68`` with each eye's lids moved to ``open_share`` of their gap."""
    out = lm68.copy()
    for idx in (np.arange(36, 42), np.arange(42, 48)):
        c = out[idx].mean(0)
        out[idx] = c + (out[idx] - c) * [1.0, open_share]
    return out


def test_the_eyes_show_as_far_as_they_are_shut():
    """68 points: open eyes (aspect ratio 0.3) are swapped as without the eye mask; shut ones (0.05)
    are kept; half-shut ones (0.195) half."""
    frame, lm = _eye_frame()
    base = face68(lm)
    ratio = (np.hypot(*(base[37] - base[41])) + np.hypot(*(base[38] - base[40]))) / (2 * np.hypot(*(base[39] - base[36])))
    without = _solid_paste(("box", "face"), frame, lm, _Points(base))
    x, y = (int(round(v)) for v in base[36:42].mean(0))
    got = {}
    for want in (0.3, 0.195, 0.05):
        pts = _lids(base, want / ratio)
        assert vmask.eye_strength(pts) == pytest.approx(np.clip((0.24 - want) / 0.09, 0, 1), abs=0.01)
        got[want] = _solid_paste(("box", "face", "eyes"), frame, lm, _Points(pts))[y, x].astype(int)
    assert np.array_equal(got[0.3], without[y, x])
    assert np.array_equal(got[0.05], frame[y, x])
    assert np.abs(got[0.195] - (frame[y, x].astype(int) + without[y, x]) / 2).max() <= 3


def test_a_downcast_real_face_keeps_its_own_eyes(detector):
    """The camera man looks down into his viewfinder: swapped with the astronaut's open eyes, his own
    eyes show with the eye mask; without it they are replaced."""
    frame = _camera()
    src = _source(detector, "astronaut")
    with_eyes, lm = _swap(detector, frame, src, ("box", "face", "eyes"))
    without, _ = _swap(detector, frame, src)
    near = np.round(lm[0]).astype(int)  # the near eye (the far one sits at the face's edge)
    patch = np.s_[near[1] - 2 : near[1] + 3, near[0] - 3 : near[0] + 4]
    assert np.abs(with_eyes[patch].astype(int) - frame[patch]).max() <= 2
    assert np.abs(without[patch].astype(int) - frame[patch]).mean() > 10


@pytest.mark.parametrize("points", [5, 68])
def test_eye_and_turned_face_masks_alike_on_each_device(ops, points):
    """The eye openings (5 points: always; 68: half-shut lids) and a turned face's outline (host
    half-planes) give the same masks on the device as NumPy's."""
    from conftest import host

    frame, lm = _eye_frame()
    turned5 = lm.copy()
    turned5[2, 0] += 0.3 * np.hypot(*(lm[1] - lm[0]))  # the nose tip off the midline: a yaw
    assert vmask.yaw(turned5) > 0
    landmarker = _Points(_lids(face68(lm), 0.6)) if points == 68 else None
    mats = align.estimate(turned5, "arcface_128", S)[None]
    box = np.array([[0, 0, 1, 1]], np.float32)
    got = []
    for o in (NumpyOps(), ops):
        masker = vmask.Masker(["box", "face", "eyes"], S, ops=o, max_faces=2, feather=0.06, landmarker=landmarker)
        dev = o.asarray(frame.copy()) if o.device != "cpu" else frame.copy()
        got.append(host(o, masker.masks(dev, mats, turned5[None], box, 1, o.asarray(blend.box_mask(S)))))
    assert got[0].max() > 0.99 and got[0].min() == 0.0
    np.testing.assert_allclose(got[1], got[0], atol=2e-5)
