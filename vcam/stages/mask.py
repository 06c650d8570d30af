"""Mask stage: what part of each swapped crop is pasted (NumPy references and the stage).

Every mask lives in the swapper's crop space, (F, S, S) float32 in [0, 1], and the paste mask is
their product (the smallest wins):

- ``box``: the feathered crop square (:func:`vcam.kernels.paste.box_mask`, padding per side), static;
- ``face``: a convex shape over brows-to-chin and cheek-to-cheek built from the face's landmarks
  (5 detector points, or 68 from a landmarker), feathered inwards, so it is exactly 0 outside;
- ``mouth``: an opening over the target's lips (from the mouth corners, or the 68-point outer lips)
  that keeps the target's own mouth;
- ``occlusion``: an occluder model (XSeg) on the crop: 0 where a hand or microphone covers the face;
- ``region``: a face-parser model (BiSeNet): 1 on the chosen classes (skin, brows, eyes, ...).

Shapes reach the kernels as half-planes (a convex polygon of at most :data:`MAX_EDGES` edges,
``nx * x + ny * y + c <= 0`` inside, unit normals), built on the host from the landmarks (a few
microseconds a face) and passed by value in the kernel's parameter block: no per-frame copy.

:func:`polygon_masks`, :func:`resample_masks` and :func:`parser_select` are the CPU twins of the
kernels in ``kernels/mask.cu`` and have their signatures. :class:`Masker` is the stage: it runs on an
:class:`~vcam.ops.Ops` object, so one class serves both devices; masks the config does not name are
never computed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from vcam.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

MAX_EDGES = 16  # edges per shape (kernels/mask.cu)
SHAPES = 2  # shapes per face: face (kept), mouth (cut out)

#: The face outline for 5 points, right half from chin to the top of the forehead, in a local frame:
#: ``u`` in eye distances along the eye line from the eye centre, ``v`` in eye-centre-to-mouth-centre
#: distances (so a tilted or turned face shears it with the landmarks). Mirrored for the left half.
_FACE_5 = np.array(
    [
        [0.00, 1.50],
        [0.45, 1.42],
        [0.80, 1.18],
        [0.98, 0.74],
        [1.04, 0.25],
        [1.00, -0.20],
        [0.85, -0.45],
        [0.50, -0.58],
        [0.00, -0.62],
    ]
)
_FACE_CENTRE_5 = np.array([0.0, 0.35])

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


def face_polygon(landmarks: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The face outline (V, 2) float64, convex, from 5 or 68 ``landmarks`` (P, 2) (any coordinates).

    5 points: :data:`_FACE_5` mapped by the eye line and the eye-to-mouth vector (an affine map, so
    the outline stays convex). 68 points: the hull of the jaw and the brows, the brows raised by a
    quarter of their distance to the nose tip (forehead). ``scale`` grows it around its centre.
    """
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    if lm.shape[0] == 5:
        origin, u, v = _local_frame(lm)
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


def _hull(pts: np.ndarray) -> np.ndarray:
    """Convex hull (counter-clockwise in y-up terms) of (N, 2) points, at most MAX_EDGES vertices:
    extra vertices are dropped where dropping cuts off the least area (the hull only shrinks)."""
    p = sorted(map(tuple, np.asarray(pts, np.float64)))
    if len(p) < 3:
        return np.asarray(p, np.float64)

    def cross(o: tuple, a: tuple, b: tuple) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list = []
    upper: list = []
    for q in p:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], q) <= 0:
            lower.pop()
        lower.append(q)
    for q in reversed(p):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], q) <= 0:
            upper.pop()
        upper.append(q)
    hull = lower[:-1] + upper[:-1]
    while len(hull) > MAX_EDGES:
        n = len(hull)
        cut = [abs(cross(hull[i - 1], hull[i], hull[(i + 1) % n])) for i in range(n)]
        hull.pop(int(np.argmin(cut)))
    return np.asarray(hull, np.float64)


def half_planes(polygon: np.ndarray) -> np.ndarray:
    """(MAX_EDGES, 3) float32 half-planes ``(nx, ny, c)`` of a convex ``polygon`` (V, 2), unit
    outward normals: the signed distance of a point is ``max(nx * x + ny * y + c)`` (negative
    inside). Unused rows are ``(0, 0, -1e30)``; zero-length edges are skipped."""
    poly = np.asarray(polygon, np.float64).reshape(-1, 2)
    out = np.zeros((MAX_EDGES, 3), np.float64)
    out[:, 2] = -1e30
    if poly.shape[0] < 3:
        out[0, 2] = 1e30  # empty shape: everything is outside
        return out.astype(np.float32)
    x, y = poly[:, 0], poly[:, 1]
    area2 = float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))  # > 0: counter-clockwise (y down: clockwise on screen)
    k = 0
    for i in range(poly.shape[0]):
        a, b = poly[i], poly[(i + 1) % poly.shape[0]]
        d = b - a
        length = float(np.hypot(d[0], d[1]))
        if length < 1e-9 or k >= MAX_EDGES:
            continue
        n = np.array([d[1], -d[0]]) / length  # right-hand normal: outward for area2 > 0
        if area2 < 0:
            n = -n
        out[k] = (n[0], n[1], -(n[0] * a[0] + n[1] * a[1]))
        k += 1
    if abs(area2) < 1e-9:
        out[:] = (0.0, 0.0, -1e30)
        out[0, 2] = 1e30
    return out.astype(np.float32)


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


_FACE_5_RING = np.concatenate([_FACE_5, _FACE_5[-2:0:-1] * [-1.0, 1.0]]) - _FACE_CENTRE_5  # (16, 2) about the centre
_ELLIPSE = np.stack(
    [np.cos(np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False)), np.sin(np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False))],
    1,
)


_FACE_PLANES = half_planes(_FACE_5_RING).astype(np.float64)
_MOUTH_PLANES = half_planes(_ELLIPSE).astype(np.float64)


def shape_params(
    landmarks_crop: np.ndarray,
    *,
    face: bool,
    mouth: bool,
    face_scale: float = 1.0,
    mouth_scale: float = 1.0,
    feather: float = 0.12,
) -> tuple[np.ndarray, np.ndarray]:
    """Half-planes (F, SHAPES, MAX_EDGES, 3) float32 and feathers (F, SHAPES) float32 (crop pixels)
    for :func:`polygon_masks` from landmarks in crop coordinates (F, P, 2), through the outlines
    :func:`face_polygon` and :func:`mouth_polygon` (the 68-point path; for 5 points the stage uses
    :func:`landmark_masks`, which computes the same shapes on the device). A shape not asked for
    gets no edges (covers everything) and feather 0."""
    lms = np.asarray(landmarks_crop, np.float64)
    f = lms.shape[0]
    planes = np.zeros((f, SHAPES, MAX_EDGES, 3), np.float32)
    planes[..., 2] = -1e30
    feathers = np.zeros((f, SHAPES), np.float32)
    for i in range(f):
        width = max(eye_mouth_distance(lms[i]) * float(feather), 0.0)
        if face:
            planes[i, 0] = half_planes(face_polygon(lms[i], face_scale))
            feathers[i, 0] = width
        if mouth:
            planes[i, 1] = half_planes(mouth_polygon(lms[i], mouth_scale))
            feathers[i, 1] = width * 0.5
    return planes, feathers


# -- NumPy references of kernels/mask.cu ----------------------------------------------------------
def polygon_masks(
    planes: np.ndarray, feathers: np.ndarray, base: np.ndarray, count: int, out: np.ndarray, mouth: bool = False
) -> np.ndarray:
    """``out[f] = base * cover(face) * (1 - cover(mouth) if mouth)`` for ``f < count``.

    ``planes`` (F, SHAPES, MAX_EDGES, 3) and ``feathers`` (F, SHAPES) from :func:`shape_params`;
    ``base`` (S, S) or (F, S, S) float32 (the box mask); ``out`` (F, S, S) float32. At a pixel centre
    (x, y), ``d = max_e(nx * x + ny * y + c)`` (float32, edges in order) and
    ``cover = clip(-d / feather, 0, 1)`` (``d < 0`` when the feather is 0): 0 on and outside the
    outline, 1 deeper inside than the feather.
    """
    size = out.shape[-1]
    grid = np.arange(size, dtype=np.float32)
    x, y = grid[None, :], grid[:, None]
    base = np.asarray(base, np.float32)
    for f in range(int(count)):
        m = (base[f] if base.ndim == 3 else base).copy()
        for k, keep in ((0, True), (1, False)):
            if k == 1 and not mouth:
                continue
            pl = planes[f, k].astype(np.float32)
            d = np.full((size, size), -np.inf, np.float32)
            for nx, ny, c in pl:
                if c <= np.float32(-1e29):
                    continue
                np.maximum(d, (nx * x + ny * y) + c, out=d)
            w = np.float32(feathers[f, k])
            if w > 0:
                cov = np.clip(-d / w, np.float32(0), np.float32(1))
            else:
                cov = (d < 0).astype(np.float32)
            m *= cov if keep else (np.float32(1) - cov)
        out[f] = m
    return out


def _local_planes() -> tuple[np.ndarray, np.ndarray]:
    """The local half-planes of the face outline and the mouth ellipse, (16, 3) float32 each."""
    return _FACE_PLANES.astype(np.float32), _MOUTH_PLANES.astype(np.float32)


def _mapped_planes(local: np.ndarray, cx, cy, a, b, c, d, empty_c: float) -> np.ndarray:
    """``local`` (16, 3) float32 half-planes mapped by ``p = (cx, cy) + [[a, b], [c, d]] q``, in the
    float32 operation order of ``kernels/mask.cu``: a local half-plane ``n . q + c <= 0`` becomes
    ``(A^-T n) . p + c - (A^-T n) . centre <= 0``, renormalised so its value is a distance. A
    degenerate map gives an empty shape (a first plane with ``c = empty_c = 1e30``: covers nothing)."""
    f32 = np.float32
    det = a * d - b * c
    out = np.empty((MAX_EDGES, 3), np.float32)
    if abs(det) < f32(1e-9):
        out[:] = (0.0, 0.0, -1e30)
        out[0, 2] = empty_c
        return out
    lx, ly, lc = local[:, 0], local[:, 1], local[:, 2]
    nx = (d * lx - c * ly) / det
    ny = (a * ly - b * lx) / det
    cw = (lc - nx * cx) - ny * cy
    norm = np.sqrt(nx * nx + ny * ny)
    out[:, 0] = nx / norm
    out[:, 1] = ny / norm
    out[:, 2] = cw / norm
    return out.astype(f32)


def landmark_masks(
    landmarks: np.ndarray,
    count: int,
    base: np.ndarray,
    out: np.ndarray,
    face: bool = True,
    mouth: bool = False,
    face_scale: float = 1.0,
    mouth_scale: float = 1.0,
    feather: float = 0.12,
) -> np.ndarray:
    """The face and mouth shapes of 5 crop-space ``landmarks`` (F, 5, 2) times ``base`` into ``out``
    (F, S, S), with the geometry computed per face in float32 (what ``kernels/mask.cu`` does on the
    device, so the host only passes the points): :func:`face_polygon` / :func:`mouth_polygon` as
    half-planes, then :func:`polygon_masks`."""
    f32 = np.float32
    n = int(count)
    lms = np.asarray(landmarks, np.float32).reshape(-1, 5, 2)
    fl, ml = _local_planes()
    planes = np.zeros((max(n, 1), SHAPES, MAX_EDGES, 3), np.float32)
    planes[..., 2] = -1e30
    feathers = np.zeros((max(n, 1), SHAPES), np.float32)
    fs, ms, fe, k = f32(face_scale), f32(mouth_scale), f32(feather), f32(0.35 / 0.6)
    half, cu, cv, w6 = f32(0.5), f32(_FACE_CENTRE_5[0]), f32(_FACE_CENTRE_5[1]), f32(0.6)
    for i in range(n):
        (x0, y0), (x1, y1), _, (x3, y3), (x4, y4) = lms[i]
        ex, ey = (x0 + x1) * half, (y0 + y1) * half
        mx, my = (x3 + x4) * half, (y3 + y4) * half
        vx, vy = mx - ex, my - ey
        width = np.sqrt(vx * vx + vy * vy) * fe
        if face:
            ux, uy = x1 - x0, y1 - y0
            cx = (ex + cu * ux) + cv * vx
            cy = (ey + cu * uy) + cv * vy
            planes[i, 0] = _mapped_planes(fl, cx, cy, ux * fs, vx * fs, uy * fs, vy * fs, 1e30)
            feathers[i, 0] = width
        if mouth:
            ax, ay = ((x4 - x3) * w6) * ms, ((y4 - y3) * w6) * ms
            planes[i, 1] = _mapped_planes(ml, mx, my, ax, -ay * k, ay, ax * k, 1e30)
            feathers[i, 1] = width * half
    return polygon_masks(planes, feathers, base, n, out, mouth)


def resample_masks(
    src: np.ndarray, count: int, out: np.ndarray, lo: float = 0.0, hi: float = 1.0, guard: np.ndarray | None = None
) -> np.ndarray:
    """``out[f] *= clip((bilinear(src[f]) - lo) / (hi - lo), 0, 1)`` for ``f < count``.

    ``src`` (F, Hs, Ws) float32 or float16 (a model's mask at its own size), ``out`` (F, S, S)
    float32, multiplied in place. Sampling at ``(x + 0.5) * Ws / S - 0.5`` with the edges clamped
    (OpenCV's INTER_LINEAR resize). A non-finite sample makes the value 0 (the target shows) and sets
    ``guard[f] = 1`` when ``guard`` is given.
    """
    size = out.shape[-1]
    hs, ws = src.shape[1], src.shape[2]

    def axis(n_src: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = (np.arange(size, dtype=np.float32) + np.float32(0.5)) * np.float32(n_src / size) - np.float32(0.5)
        pos = np.clip(pos, np.float32(0), np.float32(n_src - 1))
        i0 = np.floor(pos).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_src - 1)
        return i0, i1, (pos - i0).astype(np.float32)

    y0, y1, fy = axis(hs)
    x0, x1, fx = axis(ws)
    fx, fy = fx[None, :], fy[:, None]
    scale = np.float32(1.0 / (hi - lo)) if hi != lo else np.float32(1.0)
    for f in range(int(count)):
        s = np.asarray(src[f], np.float32)
        top = s[y0][:, x0] * (np.float32(1) - fx) + s[y0][:, x1] * fx
        bot = s[y1][:, x0] * (np.float32(1) - fx) + s[y1][:, x1] * fx
        v = top * (np.float32(1) - fy) + bot * fy
        bad = ~np.isfinite(v)
        v = np.clip((v - np.float32(lo)) * scale, np.float32(0), np.float32(1))
        v[bad] = 0
        if guard is not None and bad.any():
            guard[f] = 1
        out[f] *= v
    return out


def parser_select(logits: np.ndarray, count: int, classes: int, out: np.ndarray, guard: np.ndarray | None = None) -> np.ndarray:
    """``out[f] = 1`` where the arg-max class of ``logits[f]`` (F, C, H, W) is in the bit set
    ``classes`` (bit c = class c), else 0, for ``f < count``. Ties go to the lower class; a
    pixel with a non-finite logit is 0 and sets ``guard[f] = 1``."""
    for f in range(int(count)):
        x = np.asarray(logits[f], np.float32)
        bad = ~np.isfinite(x).all(axis=0)
        arg = np.argmax(np.where(np.isfinite(x), x, -np.inf), axis=0)
        keep = ((np.int64(classes) >> arg) & 1).astype(np.float32)
        keep[bad] = 0
        if guard is not None and bad.any():
            guard[f] = 1
        out[f] = keep
    return out


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
            crops = ops.warp_crops(frame, m, self.size, out=self._u8[:n])
            ops.xp.multiply(crops, 1.0 / 255.0, out=x)
        else:
            ops.warp_crops_normalized(frame, m, self.size, self._mean255, self._std255, self.spec.rgb, out=x)
        y = self.engine.run_device(feeds, stream=ops.stream)[0]
        if self._select is not None:
            sel = ops.parser_select(y, n, self.classes, self._select, self._guard)
            ops.resample_masks(sel, n, out, 0.0, 1.0, None)
        else:  # (N, S, S, 1) -> (N, S, S); sharpened like the peers do: values below 0.5 drop out
            ops.resample_masks(y.reshape(y.shape[0], self.size, self.size), n, out, 0.5, 1.0, self._guard)


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
        self.face_scale, self.mouth_scale, self.feather = float(face_scale), float(mouth_scale), float(feather)
        self.occluder = occluder
        self.parser = parser
        self.landmarker = landmarker
        self.name = "masks"
        s = self.crop_size
        self._out = ops.empty((self.max_faces, s, s), np.float32)
        self._copy = self.occluder is not None or self.parser is not None

    @property
    def active(self) -> bool:
        """Whether anything beyond the swapper's own mask is computed per frame."""
        return self.face or self.mouth or self._copy

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
        models: dict[str, bool] | None = None,
    ) -> Any:
        """Paste masks for ``n`` faces: ``base`` (the swapper's mask, (S, S) or (F, S, S)) times every
        configured mask. ``landmarks`` (F, 5, 2) and ``boxes`` (F, 4) are the tracks' (frame pixels).
        ``models``: ``{"occlusion": False}`` / ``{"region": False}`` skips that model mask this frame
        (the daemon's degradation under load)."""
        models = models or {}
        occluder = self.occluder if models.get("occlusion", True) else None
        parser = self.parser if models.get("region", True) else None
        if not (self.face or self.mouth or occluder is not None or parser is not None) or n == 0:
            return base
        ops = self.ops
        out = self._out[:n]
        if (self.face or self.mouth) and self.landmarker is None:  # geometry on the device from 5 points
            ops.landmark_masks(
                to_crop(np.asarray(landmarks, np.float64)[:n], mats[:n]),
                n,
                base,
                out,
                self.face,
                self.mouth,
                self.face_scale,
                self.mouth_scale,
                self.feather,
            )
        elif self.face or self.mouth:
            lms = np.asarray(landmarks, np.float64)[:n]
            if self.landmarker is not None:
                lms = np.asarray(self.landmarker.landmarks(frame, np.asarray(boxes)[:n], five=lms), np.float64)
            planes, feathers = shape_params(
                to_crop(lms, mats[:n]),
                face=self.face,
                mouth=self.mouth,
                face_scale=self.face_scale,
                mouth_scale=self.mouth_scale,
                feather=self.feather,
            )
            ops.polygon_masks(planes, feathers, base, n, out, self.mouth)
        else:
            if base.ndim == 3:
                out[...] = base[:n]
            else:
                out[...] = base[None]
        for model in (occluder, parser):
            if model is not None:
                model.apply(frame, mats[:n], self.crop_size, n, out)
        return out


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
    "MAX_EDGES",
    "Masker",
    "create_masker",
    "eye_mouth_distance",
    "face_polygon",
    "half_planes",
    "landmark_masks",
    "mouth_polygon",
    "parser_select",
    "polygon_masks",
    "region_bits",
    "resample_masks",
    "shape_params",
    "to_crop",
]
