"""Mask stage: what part of each swapped crop is pasted.

Every mask lives in the swapper's crop space, (F, S, S) float32 in [0, 1], and the paste mask is
their product (the smallest wins):

- ``box``: the feathered crop square (:func:`vcam.kernels.paste.box_mask`, padding per side), static;
- ``face``: a convex shape over brows-to-chin and cheek-to-cheek built from the face's landmarks
  (5 detector points, or 68 from a landmarker), feathered inwards, so it is exactly 0 outside;
- ``mouth``: an opening over the target's lips (from the mouth corners, or the 68-point outer lips)
  that keeps the target's own mouth;
- ``eyes``: openings over the target's eyes (lids included) that keep the target's own eyes: with
  68 points by how far they are shut or cast down (:func:`eye_strength`), with 5 always;
- ``occlusion``: an occluder model (XSeg) on the crop: 0 where a hand or microphone covers the face;
- ``region``: a face-parser model (BiSeNet): 1 on the chosen classes (skin, brows, eyes, ...).

Shapes reach the kernels (:mod:`vcam.kernels.mask`) as half-planes, built on the host from the
landmarks (a few microseconds a face) and passed by value in the kernel's parameter block: no
per-frame copy. :class:`Masker` is the stage: it runs on an
:class:`~vcam.ops.Ops` object, so one class serves both devices; masks the config does not name are
never computed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vcam.errors import ConfigError, ModelError
from vcam.kernels import mask as masks
from vcam.kernels import warp
from vcam.kernels.mask import _FACE_5_RING, _FACE_CENTRE_5, MAX_EDGES, SHAPE_KINDS, _hull, half_planes

log = logging.getLogger(__name__)

#: The landmark shapes a mask type may name (the model masks aside).
SHAPE_TYPES = ("face", "mouth", "eyes")

# 68-point layout (iBUG 300-W): jaw 0-16, brows 17-26, nose 27-35, eyes 36-47, outer lips 48-59.
_JAW = np.arange(0, 17)
_BROWS = np.arange(17, 27)
_NOSE_TIP = 30
_OUTER_LIPS = np.arange(48, 60)


# -- shapes (host) --------------------------------------------------------------------------------
def _local_frame(lm5: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(origin, u axis scaled by the eye distance, v axis = eye centre -> mouth centre) of 5 points."""
    eyes = (lm5[0] + lm5[1]) / 2
    mouth = (lm5[3] + lm5[4]) / 2
    return eyes, lm5[1] - lm5[0], mouth - eyes


#: A face's nose tip in front of its eyes' plane, in eye distances, as a 5-point detector sees it
#: (RetinaFace's nose point on a near-profile face, 60 degrees, lies 0.6 eye distances off: 0.35;
#: a mean face measures about 0.5, the detector's point sits behind the tip). A 5-point face
#: whose nose tip lies ``a`` eye distances off the eyes' midpoint along the eye line is turned by a
#: yaw of ``tan = a / NOSE_DEPTH`` (weak perspective: a point of depth ``z`` moves ``z tan`` eye
#: distances along the eye line, the eye distance itself shrinks with the cosine).
NOSE_DEPTH = 0.35
#: Yaw (its tangent) taken as frontal: the 5-point outline moves only by the part beyond this, so a
#: frontal face keeps the device kernel's outline (:func:`vcam.kernels.mask.landmark_masks`)
#: exactly and a turning face's outline moves continuously.
YAW_FRONTAL = 0.15
#: The largest yaw tangent the outline follows (about 60 degrees).
YAW_MAX = 1.7
#: Depth of the 5-point outline's vertices (eye distances, in front of the eyes' plane): the chin and
#: the forehead's middle a little in front, the cheeks' silhouette behind.
_RING_DEPTH = 0.1 - 0.7 * (np.abs(_FACE_5_RING[:, 0]) / np.abs(_FACE_5_RING[:, 0]).max()) ** 1.5
#: Far-side outline vertices stay this many eye distances beyond the far eye and the nose tip (no
#: outline folds over the features it wraps).
_FAR_MARGIN = 0.2


def yaw(landmarks: np.ndarray) -> float:
    """The yaw of 5 points beyond :data:`YAW_FRONTAL`, as a signed tangent (0 for a frontal face;
    positive: the nose tip towards the second eye), from the nose tip's offset along the eye line."""
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    origin, u, _ = _local_frame(lm)
    a = float(np.dot(lm[2] - origin, u)) / max(float(np.dot(u, u)), 1e-12)
    t = a / NOSE_DEPTH
    return float(np.sign(t) * min(max(abs(t) - YAW_FRONTAL, 0.0), YAW_MAX))


def _posed_ring(lm5: np.ndarray) -> np.ndarray:
    """The 5-point outline in the face's local frame (u: eye distances from the eyes' midpoint, v:
    eye-to-mouth distances), each vertex moved along the eye line by its depth times the yaw; on
    the far side never past the far eye or the nose tip (plus :data:`_FAR_MARGIN`)."""
    ring = _FACE_5_RING + _FACE_CENTRE_5
    t = yaw(lm5)
    if t == 0.0:
        return ring
    origin, u, _ = _local_frame(lm5)
    a = abs(float(np.dot(lm5[2] - origin, u)) / max(float(np.dot(u, u)), 1e-12))
    side = np.sign(t)
    x = ring[:, 0] + _RING_DEPTH * t
    far = ring[:, 0] * side > 0
    floor = np.minimum(ring[:, 0] * side, max(0.5, a) + _FAR_MARGIN)
    x[far] = side * np.maximum(x[far] * side, floor[far])
    return np.stack([x, ring[:, 1]], 1)


#: Two points of a mean face's midline, (u, v, depth) in the local frame of :func:`_posed_ring`:
#: the nose's bridge between the eyes and the philtrum between the nose tip and the mouth.
_MIDLINE = np.array([[0.0, -0.1, 0.25], [0.0, 0.8, 0.35]])


def midline(lm5: np.ndarray) -> np.ndarray:
    """The nose bridge and philtrum (2, 2) float64 of 5 points, moved by their depth times the yaw
    (:func:`yaw`): tied on both sides of the classic warp, they keep a turned face's nose and lip
    straight where the nose tip alone would bend them."""
    lm = np.asarray(lm5, np.float64).reshape(5, 2)
    origin, u, v = _local_frame(lm)
    x = _MIDLINE[:, 0] + _MIDLINE[:, 2] * yaw(lm)
    return origin + x[:, None] * u + _MIDLINE[:, 1:2] * v


def face_ring(lm5: np.ndarray) -> np.ndarray:
    """The 16 vertices (16, 2) float64 of the 5-point outline in order, posed (:func:`_posed_ring`),
    not hulled: the classic warp ties them vertex for vertex to the source's."""
    lm = np.asarray(lm5, np.float64).reshape(5, 2)
    origin, u, v = _local_frame(lm)
    ring = _posed_ring(lm)
    return origin + ring[:, :1] * u + ring[:, 1:] * v


def face_polygon(landmarks: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The face outline (V, 2) float64, convex, from 5 or 68 ``landmarks`` (P, 2) (any coordinates).

    5 points: :data:`vcam.kernels.mask._FACE_5` mapped by the eye line and the eye-to-mouth vector (an affine map, so
    the outline stays convex); a turned face's (:func:`yaw`) vertices moved by their depth, so the
    outline follows the visible face (the near cheek wider, the far one narrower; its hull). 68
    points: the hull of the jaw and the brows, the brows raised by a quarter of their distance to
    the nose tip (forehead). ``scale`` grows it around its centre.
    """
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    if lm.shape[0] == 5:
        origin, u, v = _local_frame(lm)
        if yaw(lm) != 0.0:
            pts = _hull(face_ring(lm))
            centre = pts.mean(0)
            return centre + (pts - centre) * float(scale)
        centre = origin + _FACE_CENTRE_5[0] * u + _FACE_CENTRE_5[1] * v
        pts = centre + _FACE_5_RING[:, :1] * u + _FACE_5_RING[:, 1:] * v
    elif lm.shape[0] == 68:
        brows = lm[_BROWS] + (lm[_BROWS] - lm[_NOSE_TIP]) * 0.25
        pts = _hull(np.concatenate([lm[_JAW], brows]))
        centre = pts.mean(0)
    else:
        raise ValueError(f"face masks need 5 or 68 landmarks, got {lm.shape[0]}")
    return centre + (pts - centre) * float(scale)


def mouth_polygon(landmarks: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The mouth opening (V, 2) float64, convex, from 5 or 68 ``landmarks``.

    5 points: an ellipse over the mouth corners widened by 20%, 0.7 corner distances high,
    leaning with the corner line (16 vertices). 68 points: the outer lips' hull grown by 15%.
    ``scale`` grows it around its centre.
    """
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    if lm.shape[0] == 5:
        left, right = lm[3], lm[4]
        centre = (left + right) / 2
        along = (right - left) * 0.6  # half-width: the corners plus 20%
        across = np.array([-along[1], along[0]]) * (0.35 / 0.6)  # half-height: 35% of the corner distance
        t = np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False)
        pts = centre + np.cos(t)[:, None] * along + np.sin(t)[:, None] * across
    elif lm.shape[0] == 68:
        pts = _hull(lm[_OUTER_LIPS])
        centre = pts.mean(0)
        pts = centre + (pts - centre) * 1.15
    else:
        raise ValueError(f"mouth masks need 5 or 68 landmarks, got {lm.shape[0]}")
    return centre + (pts - centre) * float(scale)


#: The eye aspect ratio (the lids' gap over the eye's width, 68 points) of an open eye and of a shut
#: or downcast one: between them the target's eyes show by the share the ratio has fallen.
EYE_OPEN, EYE_SHUT = 0.24, 0.15
_EYES_68 = (np.arange(36, 42), np.arange(42, 48))


def eye_polygons(landmarks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The openings (16, 2) float64 over each eye, lids and lashes included, of 5 or 68 points: an
    ellipse along the eye's corner line, 0.8 eye widths long and 0.45 high each side of the eye's
    centre (5 points: the eye point, the eye's width taken as 0.45 eye distances)."""
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    t = np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False)
    out = []
    for side in (0, 1):
        if lm.shape[0] == 68:
            pts = lm[_EYES_68[side]]
            centre, along = pts.mean(0), pts[3] - pts[0]
        elif lm.shape[0] == 5:
            centre, along = lm[side], (lm[1] - lm[0]) * 0.45
        else:
            raise ValueError(f"eye masks need 5 or 68 landmarks, got {lm.shape[0]}")
        across = np.array([-along[1], along[0]])
        out.append(centre + np.cos(t)[:, None] * along * 0.8 + np.sin(t)[:, None] * across * 0.45)
    return out[0], out[1]


def eye_strength(landmarks: np.ndarray) -> float:
    """How much of the target's eyes shows, 0..1: 68 points, by the mean eye aspect ratio between
    :data:`EYE_OPEN` (0) and :data:`EYE_SHUT` (1); 5 points carry no lids: always 1 (the eye mask
    then keeps the target's eyes, as the mouth mask keeps its mouth)."""
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    if lm.shape[0] != 68:
        return 1.0
    ratios = []
    for idx in _EYES_68:
        p = lm[idx]
        gap = np.hypot(*(p[1] - p[5])) + np.hypot(*(p[2] - p[4]))
        ratios.append(gap / max(2 * float(np.hypot(*(p[3] - p[0]))), 1e-6))
    return float(np.clip((EYE_OPEN - float(np.mean(ratios))) / (EYE_OPEN - EYE_SHUT), 0.0, 1.0))


def to_crop(landmarks: np.ndarray, crop_from_frame: np.ndarray) -> np.ndarray:
    """Frame points (F, P, 2) into each face's crop (F, P, 2) with ``crop_from_frame`` (F, 2, 3)."""
    lm = np.asarray(landmarks, np.float64)
    m = np.asarray(crop_from_frame, np.float64).reshape(-1, 2, 3)
    return np.einsum("fij,fpj->fpi", m[:, :, :2], lm) + m[:, None, :, 2]


def eye_mouth_distance(landmarks: np.ndarray) -> float:
    """Distance from the eye centre to the mouth centre (5 points, or the 68-point equivalents)."""
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    if lm.shape[0] == 68:
        eyes = (lm[36:42].mean(0) + lm[42:48].mean(0)) / 2
        mouth = (lm[48] + lm[54]) / 2
    else:
        eyes, mouth = (lm[0] + lm[1]) / 2, (lm[3] + lm[4]) / 2
    return float(np.hypot(*(mouth - eyes)))


def shape_params(
    landmarks_crop: np.ndarray,
    *,
    face: bool,
    mouth: bool,
    face_scale: float = 1.0,
    mouth_scale: float = 1.0,
    feather: float = 0.12,
) -> tuple[np.ndarray, np.ndarray]:
    """Half-planes (F, SHAPE_KINDS, MAX_EDGES, 3) float32 and feathers (F, SHAPE_KINDS) float32 (crop pixels)
    for :func:`vcam.kernels.mask.polygon_masks` from landmarks in crop coordinates (F, P, 2), through the outlines
    :func:`face_polygon` and :func:`mouth_polygon` (the 68-point path; for 5 points the stage uses
    :func:`vcam.kernels.mask.landmark_masks`, which computes the same shapes on the device). A shape not asked for
    gets no edges (covers everything) and feather 0."""
    lms = np.asarray(landmarks_crop, np.float64)
    f = lms.shape[0]
    planes = np.zeros((f, SHAPE_KINDS, MAX_EDGES, 3), np.float32)
    planes[..., 2] = -1e30
    feathers = np.zeros((f, SHAPE_KINDS), np.float32)
    for i in range(f):
        width = max(eye_mouth_distance(lms[i]) * float(feather), 0.0)
        if face:
            planes[i, 0] = half_planes(face_polygon(lms[i], face_scale))
            feathers[i, 0] = width
        if mouth:
            planes[i, 1] = half_planes(mouth_polygon(lms[i], mouth_scale))
            feathers[i, 1] = width * 0.5
    return planes, feathers


# -- the stage ------------------------------------------------------------------------------------
def _crop_scale(mats: np.ndarray, src: int, dst: int) -> np.ndarray:
    """``crop_from_frame`` matrices of a ``src``-pixel crop re-expressed for a ``dst``-pixel crop of the
    same region (pixel centres: ``x' = (x + 0.5) * dst / src - 0.5``)."""
    k = dst / src
    out = np.asarray(mats, np.float64).reshape(-1, 2, 3) * k
    out[:, :, 2] += 0.5 * k - 0.5
    return out


class _ModelMask:
    """A mask model (occluder or parser) on an engine: its crop is the swapper's crop at the model's
    size, its output is resampled into the swapper's crop and multiplied into the paste mask."""

    def __init__(self, spec: Any, engine: Any, ops: Any, max_faces: int, classes: int = 0) -> None:
        self.spec = spec
        self.name = spec.name
        self.engine = engine
        self.ops = ops
        self.size = int(spec.size)
        self.classes = int(classes)
        self._input = engine.inputs[0].name
        self._nhwc = len(spec.inputs[0].shape) == 4 and spec.inputs[0].shape[-1] == 3
        self._mean255, self._std255 = spec.input_mean_std_255
        s = self.size
        self._u8 = ops.empty((max_faces, s, s, 3), np.uint8) if self._nhwc else None
        self._select = ops.empty((max_faces, s, s), np.float32) if spec.kind == "parser" else None
        self._guard = ops.empty((max_faces,), np.int32)

    def guarded(self) -> int:
        return int(self.ops.to_host(self._guard).sum())

    def apply(self, frame: Any, mats: np.ndarray, crop_size: int, n: int, out: Any) -> None:
        ops = self.ops
        m = _crop_scale(mats, crop_size, self.size)
        feeds = self.engine.input_buffers(n)
        x = feeds[self._input]
        if self._nhwc:  # XSeg: NHWC, BGR / 255
            crops = warp.warp_crops(ops, frame, m, self.size, out=self._u8[:n])
            ops.xp.multiply(crops, 1.0 / 255.0, out=x)
        else:
            warp.warp_crops_normalized(ops, frame, m, self.size, self._mean255, self._std255, self.spec.rgb, out=x)
        y = self.engine.run_device(feeds, stream=ops.stream)[0]
        if self._select is not None:
            sel = masks.parser_select(ops, y, n, self.classes, self._select, self._guard)
            masks.resample_masks(ops, sel, n, out, 0.0, 1.0, None)
        else:  # (N, S, S, 1) -> (N, S, S); sharpened like the peers do: values below 0.5 drop out
            masks.resample_masks(ops, y.reshape(y.shape[0], self.size, self.size), n, out, 0.5, 1.0, self._guard)


class Masker:
    """The mask stage (see the module docstring): ``masks(frame, mats, landmarks, n, swapper_mask)``
    returns the (F, S, S) paste masks in the ops' memory, valid until the next call.

    ``types``: the config's mask names. ``box``: the (S, S) box mask (with the swapper's own mask
    folded in by the swapper, as before); ``landmarker``: optional, gives 68 points per face from
    the frame. Built by :func:`create_masker`.
    """

    def __init__(
        self,
        types: Sequence[str],
        crop_size: int,
        *,
        ops: Any,
        max_faces: int = 8,
        face_scale: float = 1.0,
        mouth_scale: float = 1.0,
        feather: float = 0.12,
        occluder: _ModelMask | None = None,
        parser: _ModelMask | None = None,
        landmarker: Any = None,
    ) -> None:
        self.types = tuple(types)
        self.ops = ops
        self.crop_size = int(crop_size)
        self.max_faces = int(max_faces)
        self.face = "face" in self.types
        self.mouth = "mouth" in self.types
        self.eyes = "eyes" in self.types
        self.face_scale, self.mouth_scale, self.feather = float(face_scale), float(mouth_scale), float(feather)
        self.occluder = occluder
        self.parser = parser
        self.landmarker = landmarker
        self.name = "masks"
        #: The landmarker's points (n, 68, 2) of the last :meth:`masks` call (frame pixels), or None.
        self.last_landmarks: np.ndarray | None = None
        s = self.crop_size
        self._out = ops.empty((self.max_faces, s, s), np.float32)
        self._eyes = ops.empty((self.max_faces, s, s), np.float32) if self.eyes else None
        self._ones = ops.asarray(np.ones((s, s), np.float32)) if self.eyes else None
        self._copy = self.occluder is not None or self.parser is not None

    @property
    def active(self) -> bool:
        """Whether anything beyond the swapper's own mask is computed per frame."""
        return self.face or self.mouth or self.eyes or self._copy

    def guarded_by_model(self) -> dict[str, int]:
        return {m.name: m.guarded() for m in (self.occluder, self.parser) if m is not None}

    def masks(
        self,
        frame: Any,
        mats: np.ndarray,
        landmarks: np.ndarray,
        boxes: np.ndarray,
        n: int,
        base: Any,
        models: Mapping[str, bool] | None = None,
    ) -> Any:
        """Paste masks for ``n`` faces: ``base`` (the swapper's mask, (S, S) or (F, S, S)) times every
        configured mask. ``landmarks`` (F, 5, 2) and ``boxes`` (F, 4) are the tracks' (frame pixels).
        ``models``: ``{"occlusion": False}`` / ``{"region": False}`` skips that model mask this frame
        (the daemon's degradation under load, the desk's occlusion switch); ``{"mouth": True|False}``
        turns the mouth mask on or off this frame whatever the types (the desk's mouth switch)."""
        models = models or {}
        mouth = bool(models.get("mouth", self.mouth))
        self.last_landmarks = None
        eyes = bool(models.get("eyes", self.eyes))
        occluder = self.occluder if models.get("occlusion", True) else None
        parser = self.parser if models.get("region", True) else None
        if not (self.face or mouth or eyes or occluder is not None or parser is not None) or n == 0:
            return base
        ops = self.ops
        out = self._out[:n]
        lms = np.asarray(landmarks, np.float64)[:n]
        if self.landmarker is not None and (self.face or mouth or eyes):
            lms = np.asarray(self.landmarker.landmarks(frame, np.asarray(boxes)[:n], five=lms), np.float64)
            self.last_landmarks = lms
        posed = self.face and self.landmarker is None and any(yaw(p) != 0.0 for p in lms)
        if (self.face or mouth) and self.landmarker is None and not posed:  # geometry on the device from 5 points
            masks.landmark_masks(
                ops,
                to_crop(np.asarray(landmarks, np.float64)[:n], mats[:n]),
                n,
                base,
                out,
                self.face,
                mouth,
                self.face_scale,
                self.mouth_scale,
                self.feather,
            )
        elif self.face or mouth:
            planes, feathers = shape_params(
                to_crop(lms, mats[:n]),
                face=self.face,
                mouth=mouth,
                face_scale=self.face_scale,
                mouth_scale=self.mouth_scale,
                feather=self.feather,
            )
            masks.polygon_masks(ops, planes, feathers, base, n, out, mouth)
        else:
            if base.ndim == 3:
                out[...] = base[:n]
            else:
                out[...] = base[None]
        for model in (occluder, parser):
            if model is not None:
                model.apply(frame, mats[:n], self.crop_size, n, out)
        if eyes:
            self._eye_openings(to_crop(lms, mats[:n]), n, out)
        return out

    def _eye_openings(self, lms_crop: np.ndarray, n: int, out: Any) -> None:
        """``out *= 1 - strength * eyes``: the target's eyes (:func:`eye_polygons`) show through the
        paste by each face's :func:`eye_strength` (two launches of the shape kernel, one per eye,
        each ``1 - eye`` over the last; then one blend by the strengths)."""
        ops = self.ops
        strength = np.array([eye_strength(p) for p in lms_crop], np.float32)
        if not strength.any():
            return
        planes = np.zeros((n, SHAPE_KINDS, MAX_EDGES, 3), np.float32)
        planes[..., 2] = -1e30
        feathers = np.zeros((n, SHAPE_KINDS), np.float32)
        shut = self._eyes[:n]
        base = self._ones
        for side in (0, 1):
            for i in range(n):
                planes[i, 1] = half_planes(eye_polygons(lms_crop[i])[side])
                feathers[i, 1] = eye_mouth_distance(lms_crop[i]) * max(self.feather, 0.06) * 0.5
            masks.polygon_masks(ops, planes, feathers, base, n, shut, True)
            base = shut
        if strength.min() == 1.0:  # the 5-point case: no strengths to upload
            out *= shut
            return
        keep = ops.asarray(strength)[:, None, None]
        out *= (1 - keep) + keep * shut


def region_bits(regions: Sequence[str]) -> int:
    """The parser class bit set of region names (see the registry's ``PARSER_CLASSES``)."""
    from vcam.models import registry

    table = getattr(registry, "PARSER_CLASSES", None)
    if not table:
        raise ModelError("no face-parser class table in the registry", hint="update fastswap-cam")
    bits = 0
    for r in regions:
        if r not in table:
            raise ConfigError(f"unknown face region '{r}'", hint="choose from: " + ", ".join(table))
        for c in table[r]:
            bits |= 1 << int(c)
    return bits


def create_masker(
    types: Sequence[str],
    crop_size: int,
    *,
    ops: Any,
    max_faces: int = 8,
    occluder: tuple[Any, Any] | None = None,
    parser: tuple[Any, Any] | None = None,
    regions: Sequence[str] = (),
    landmarker: Any = None,
    face_scale: float = 1.0,
    mouth_scale: float = 1.0,
    feather: float = 0.0,
) -> Masker:
    """The mask stage of ``types``: ``occluder``/``parser``: the (spec, engine) of the occlusion and
    region models, opened by the caller (:mod:`vcam.runtime.roles`); ``regions``: the parser's face
    regions kept; ``landmarker``: a :class:`~vcam.stages.landmark.Landmarker` for the face and mouth
    shapes."""
    types = list(types)
    occ = _ModelMask(*occluder, ops, max_faces) if "occlusion" in types and occluder is not None else None
    par = None
    if "region" in types and parser is not None:
        par = _ModelMask(*parser, ops, max_faces, classes=region_bits(regions))
    return Masker(
        types,
        crop_size,
        ops=ops,
        max_faces=max_faces,
        face_scale=face_scale,
        mouth_scale=mouth_scale,
        feather=feather,
        occluder=occ,
        parser=par,
        landmarker=landmarker,
    )


__all__ = [
    "Masker",
    "create_masker",
    "EYE_OPEN",
    "EYE_SHUT",
    "SHAPE_TYPES",
    "eye_mouth_distance",
    "eye_polygons",
    "eye_strength",
    "NOSE_DEPTH",
    "YAW_FRONTAL",
    "YAW_MAX",
    "face_polygon",
    "face_ring",
    "midline",
    "yaw",
    "mouth_polygon",
    "region_bits",
    "shape_params",
    "to_crop",
]
