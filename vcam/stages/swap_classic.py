"""The classic swap's dense warp (host side): control points from the landmarks, the source's image
pyramid with its face weight, and the per-face warp grid the render kernel
(:mod:`vcam.kernels.classic`) interpolates.

The warp is a thin-plate spline from the target's control points (crop pixels) to the source's
(source pixels). Control points, index for index on both sides:

- 68 landmarks (a landmarker on both sides): the eye corners, nose, mouth and lips, every other jaw
  point, the brows raised by a quarter of their distance to the nose tip (the forehead line of
  :func:`vcam.stages.mask.face_polygon`), and that outline pushed out by 35% from its centre (a
  ring that keeps the warp calm outside the face);
- 5 points (the detector's): the 5 points, the nose bridge and philtrum of
  :func:`~vcam.stages.mask.midline`, the 16-point face outline of :func:`~vcam.stages.mask.face_ring`
  and the same outline grown by 35%. A turned face's midline and outline move by a mean face's
  depth times its yaw (:func:`~vcam.stages.mask.yaw`), so the warp turns the source's face with it
  (a straight nose, the far cheek narrower) instead of bending it round the nose tip.

A face with 68 points on one side and 5 on the other uses the 5 points (the 68's eye centres, nose
tip and mouth corners).
"""

from __future__ import annotations

import math

import numpy as np

from vcam.kernels import classic
from vcam.kernels.mask import polygon_masks_ref
from vcam.stages import mask as vmask


def face_region(
    landmarks: np.ndarray, size: int, *, margin: float = 0.0, scale: float = 1.0, feather: float = 0.12
) -> np.ndarray:
    """Face-region weight (size, size) float32 in [0, 1] from landmarks in crop pixels (5 or 68, (P, 2)).

    The face outline of :func:`vcam.stages.mask.face_polygon` drawn with :func:`vcam.kernels.mask.polygon_masks_ref`,
    moved ``margin`` pixels inwards and feathered inwards by ``feather`` eye-to-mouth distances: 0
    on and outside the moved outline, 1 deeper inside than the feather.
    """
    lm = np.asarray(landmarks, np.float64).reshape(1, -1, 2)
    planes, feathers = vmask.shape_params(lm, face=True, mouth=False, face_scale=scale, feather=feather)
    edges = planes[0, 0]
    live = edges[:, 2] > np.float32(-1e29)
    edges[live, 2] += np.float32(margin)  # unit normals: + margin moves every edge inwards
    out = np.empty((1, size, size), np.float32)
    polygon_masks_ref(planes, feathers, np.ones((size, size), np.float32), 1, out)
    return out[0]


#: Levels of the source pyramid (each half the size of the one before), at most.
MAX_LEVELS = 5
#: Feather of the source's face weight (eye-to-mouth distances), inwards from :data:`SOURCE_MARGIN`:
#: narrow, as the target's face mask (:mod:`vcam.stages.mask`) feathers the paste already.
SOURCE_FEATHER = 0.02
#: Level pixels between the source's face outline and its weight's zero line: the least for which no
#: bilinear tap of a weighted pixel (1.41 px on a diagonal) reads a level pixel whose area average
#: (0.71 px) or the face bank's own warp reaches past the outline (2.0 lets a recoloured backdrop
#: through, tests/stages/test_swap_classic.py; 2.5 lets one level through at one pixel where the face
#: bank's 512 px crop enlarged a group photo's face 2.3 times, tests/stages/test_source_only.py).
#: The warp maps the target's outline onto the source's, so the weight is 1 over the target's face
#: up to about a frame pixel or two from its outline; with
#: 3 level pixels and a feather of 0.04 before, the product of this ramp and the face mask's left
#: the outer band of the face ellipse unchanged (issue 29: the jaw sides and the chin); 3 with the
#: narrow feather keeps the band's weight above 0.45 (tests/stages/test_swap_detail.py).
SOURCE_MARGIN = 3.0
#: The 68 landmarks the spline is tied to (a 45-point system: a larger one costs more than it
#: gives, and small solves stay off the BLAS threads): every other jaw point, the brows' ends and
#: middles, the eye corners, the nose's bridge, tip and wings, the mouth's corners and middles.
_JAW = np.arange(0, 17, 2)
_BROWS = np.array([0, 2, 4, 5, 7, 9])
_INNER = np.array([36, 39, 42, 45, 27, 30, 31, 35, 48, 51, 54, 57, 62, 66])
#: Growth of the outer ring of control points.
RING = 1.35


def five_from_68(lm: np.ndarray) -> np.ndarray:
    """The 5 detector points (eyes, nose tip, mouth corners) of 68 landmarks."""
    lm = np.asarray(lm, np.float64).reshape(68, 2)
    return np.stack([lm[36:42].mean(0), lm[42:48].mean(0), lm[30], lm[48], lm[54]])


def plausible(lm68: np.ndarray, lm5: np.ndarray, tol: float = 0.3) -> bool:
    """Do 68 landmarks agree with 5 points of the same face (eyes, nose tip, mouth corners within
    ``tol`` eye distances)? A landmarker that lost the face (or a stand-in model) does not."""
    five = np.asarray(lm5, np.float64).reshape(5, 2)
    eye = float(np.hypot(*(five[1] - five[0])))
    return bool(np.all(np.hypot(*(five_from_68(lm68) - five).T) <= tol * max(eye, 1e-6)))


def source_68(landmarker: object, image: np.ndarray, lm5: np.ndarray) -> np.ndarray | None:
    """The source's 68 landmarks from ``landmarker`` (:class:`~vcam.stages.landmark.Landmarker`) on
    ``image`` (host BGR), its box from the 5 points' face outline; None when they are not
    :func:`plausible`."""
    outline = vmask.face_polygon(lm5, 1.0)
    box = np.concatenate([outline.min(0), outline.max(0)])[None]
    ops = landmarker.ops  # type: ignore[attr-defined]
    with ops.activate():
        frame = ops.asarray(np.ascontiguousarray(image))
    lm68 = np.asarray(landmarker.landmarks(frame, box, five=np.asarray(lm5, np.float32)[None]), np.float64)[0]  # type: ignore[attr-defined]
    return lm68 if plausible(lm68, lm5) else None


def posed(target: np.ndarray, source: np.ndarray) -> bool:
    """Whether either face of a pair (5 or 68 points each) is turned (:func:`vcam.stages.mask.yaw`):
    the pair's control points then carry the midline and the warp is checked for folds."""
    return any(vmask.yaw(p if np.shape(p)[0] == 5 else five_from_68(p)) != 0.0 for p in (target, source))


def control_points(lm: np.ndarray, midline: bool = True) -> np.ndarray:
    """Control points (K, 2) float64 of 5 or 68 landmarks (see the module docstring); ``midline``
    False: a 5-point face without its midline (a frontal pair's, as before the pose work)."""
    lm = np.asarray(lm, np.float64).reshape(-1, 2)
    if lm.shape[0] == 68:
        brows = (lm[17:27] + (lm[17:27] - lm[30]) * 0.25)[_BROWS]
        outline = np.concatenate([lm[_JAW], brows])
        centre = outline.mean(0)
        return np.concatenate([lm[_INNER], outline, centre + (outline - centre) * RING])
    if lm.shape[0] == 5:
        outline = vmask.face_ring(lm)  # vertex for vertex, posed by the face's yaw
        centre = outline.mean(0)  # the 5-point outline is a centred ring: its mean is its centre
        mid = vmask.midline(lm) if midline else np.empty((0, 2))
        return np.concatenate([lm, mid, outline, centre + (outline - centre) * RING])
    raise ValueError(f"the classic swap needs 5 or 68 landmarks, got {lm.shape[0]}")


def matched(target: np.ndarray, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``target`` and ``source`` landmarks with the same layout (68 where both have 68, else 5)."""
    t = np.asarray(target, np.float64).reshape(-1, 2)
    s = np.asarray(source, np.float64).reshape(-1, 2)
    if t.shape[0] != s.shape[0]:
        t = five_from_68(t) if t.shape[0] == 68 else t
        s = five_from_68(s) if s.shape[0] == 68 else s
    return t, s


def source_levels(image: np.ndarray, landmarks: np.ndarray, margin: float = SOURCE_MARGIN) -> list[np.ndarray]:
    """The source pyramid: level k is ``image`` (S, S, 3) uint8 at ``S / 2**k`` (area averages), as
    (s, s, 4) uint8 B, G, R and the source's face weight (255: 1; its face region, ``margin`` level
    pixels inside the outline and feathered inwards by :data:`SOURCE_FEATHER`: no bilinear tap of a
    weighted pixel reaches outside the source's face)."""
    import cv2

    size = int(image.shape[0])
    lm = np.asarray(landmarks, np.float64).reshape(-1, 2)
    levels, img = [], np.asarray(image, np.float32)
    for _ in range(MAX_LEVELS):
        s = img.shape[0]
        pts = (lm + 0.5) * (s / size) - 0.5
        out = np.empty((s, s, 4), np.uint8)
        out[..., :3] = np.clip(img + np.float32(0.5), 0, 255)
        out[..., 3] = np.floor(face_region(pts, s, margin=margin, feather=SOURCE_FEATHER) * 255 + 0.5)
        levels.append(out)
        if s < 64:
            break
        img = cv2.resize(img, (s // 2, s // 2), interpolation=cv2.INTER_AREA)
    return levels


def fit_samples(image: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """:data:`~vcam.kernels.classic.FIT_SAMPLES` BGR colours (float32) of the source's face: the
    colours at evenly spaced ranks of lightness among the face pixels (``weight`` > 0.5), so dark
    brows and bright highlights weigh as much as the skin."""
    px = np.asarray(image, np.float32).reshape(-1, 3)[np.asarray(weight).reshape(-1) > 0.5]
    if px.shape[0] == 0:
        px = np.asarray(image, np.float32).reshape(-1, 3)
    order = np.argsort(px @ np.array([0.114, 0.587, 0.299], np.float32), kind="stable")
    pick = order[np.linspace(0, len(order) - 1, classic.FIT_SAMPLES).round().astype(int)]
    return np.ascontiguousarray(px[pick], np.float32)


def face_bounds(lm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (min, max) corners of :func:`vcam.stages.mask.face_polygon` of 5 or 68 landmarks (scale 1),
    without building the 68 points' hull (its corners are those of the points it wraps)."""
    lm = np.asarray(lm, np.float64).reshape(-1, 2)
    if lm.shape[0] == 68:
        pts = np.concatenate([lm[:17], lm[17:27] + (lm[17:27] - lm[30]) * 0.25])
    else:
        pts = vmask.face_polygon(lm, 1.0)
    return pts.min(0), pts.max(0)


#: How far a turned face's inner control points (eyes, nose, mouth, midline) may follow the target
#: when the full warp folds: tried in turn, the first without a fold is kept; 0 moves them with
#: the face's outline (an affine map of the source's), which cannot fold inside the outline.
FOLD_STEPS = (1.0, 0.7, 0.4, 0.0)
#: Cells of the fold check per side (over the face's box).
FOLD_CELLS = 16


def _inner_count(dst: np.ndarray) -> int:
    """How many leading control points are the face's inner ones (the rest: its outline and ring)."""
    return {7 + 2 * 16: 7, 5 + 2 * 16: 5}.get(dst.shape[0], len(_INNER))


def folds(dst: np.ndarray, src: np.ndarray, outline: np.ndarray) -> int:
    """Cells of a :data:`FOLD_CELLS` grid over ``outline`` (the target's face polygon) whose centre
    lies inside it and whose image under the spline ``dst`` -> ``src`` is turned over (a
    non-positive Jacobian: the warp folds the source's face there)."""
    lo, hi = outline.min(0), outline.max(0)
    k = FOLD_CELLS
    xs, ys = np.linspace(lo[0], hi[0], k + 1), np.linspace(lo[1], hi[1], k + 1)
    gx, gy = np.meshgrid(xs, ys)
    pts = np.stack([gx.ravel(), gy.ravel()], 1)
    g = classic.tps_eval(dst, classic.tps_fit(dst, src), pts).reshape(k + 1, k + 1, 2)
    ex, ey = g[:-1, 1:] - g[:-1, :-1], g[1:, :-1] - g[:-1, :-1]  # a cell's x and y edges in the source
    det = ex[..., 0] * ey[..., 1] - ex[..., 1] * ey[..., 0]
    cx, cy = (gx[:-1, :-1] + gx[1:, 1:]) / 2, (gy[:-1, :-1] + gy[1:, 1:]) / 2
    planes = vmask.half_planes(outline).astype(np.float64)
    live = planes[:, 2] > -1e29
    dist = np.max(planes[live, :1, None] * cx[None] + planes[live, 1:2, None] * cy[None] + planes[live, 2:, None], 0)
    return int(np.count_nonzero((det <= 0) & (dist < 0)))


def unfolded(dst: np.ndarray, src: np.ndarray, outline: np.ndarray) -> np.ndarray:
    """``dst`` with its inner control points moved towards where the outline's affine map puts the
    source's, by the first :data:`FOLD_STEPS` fraction that leaves no :func:`folds`; unchanged when
    the full warp does not fold."""
    if folds(dst, src, outline) == 0:
        return dst
    m = _inner_count(dst)
    rim_s = np.concatenate([src[m:], np.ones((src.shape[0] - m, 1))], 1)
    aff = np.linalg.lstsq(rim_s, dst[m:], rcond=None)[0]  # (3, 2): the source's rim onto the target's
    moved = np.concatenate([src[:m], np.ones((m, 1))], 1) @ aff
    for step in FOLD_STEPS[1:]:
        out = dst.copy()
        out[:m] = moved + step * (dst[:m] - moved)
        if step == 0.0 or folds(out, src, outline) == 0:
            return out
    return dst


def warp_grid(
    target_crop: np.ndarray,
    source: np.ndarray,
    crop_from_frame: np.ndarray,
    sizes: list[int],
    source_points: dict[tuple[int, bool], np.ndarray] | None = None,
) -> tuple[np.ndarray, tuple[float, float, float], int]:
    """The warp grid of one face: (its :data:`~vcam.kernels.classic.SPLINE` record (a (1,) array;
    :func:`~vcam.kernels.classic.tps_nodes` gives the grid, in the chosen level's pixels), (origin
    x, origin y, nodes per crop pixel), level). ``target_crop``: the target's landmarks in crop pixels; ``source``: the
    source's in level-0 pixels (same layout, :func:`matched`); ``sizes``: the pyramid's sides;
    ``source_points``: a dict the caller keeps per source, filled here with ``control_points(source)``
    per layout (they change only with
    the source). The level is the one whose pixels are at most twice as dense as the frame's (no
    aliasing, no detail lost)."""
    turned = posed(target_crop, source)
    dst = control_points(target_crop, turned)
    key = (int(np.shape(source)[0]), turned)
    cache = {} if source_points is None else source_points
    if key not in cache:
        cache[key] = control_points(source, turned)
    src = cache[key]
    if turned:  # a turned face: a warp that folds is limited (a frontal pair: never checked)
        dst = unfolded(dst, src, vmask.face_polygon(target_crop))
    if np.shape(target_crop)[0] == 5:  # the outline follows the 5 points in the control points
        inner = _inner_count(dst)
        outline = dst[inner : inner + (dst.shape[0] - inner) // 2]
        lo, hi = outline.min(0), outline.max(0)
    else:
        lo, hi = face_bounds(target_crop)
    (a, b, _), (c, d, _) = np.asarray(crop_from_frame, np.float64).reshape(2, 3).tolist()
    crop_per_frame = math.sqrt(abs(a * d - b * c))
    ds, ss = dst - dst.mean(0), src - src.mean(0)
    spread = math.sqrt(float(np.vdot(ss, ss)) / max(float(np.vdot(ds, ds)), 1e-9))  # source px per crop px
    ratio = spread * crop_per_frame  # source px per frame px
    level = min(max(math.floor(math.log2(max(ratio, 1e-6))), 0), len(sizes) - 1)
    box = (lo[0] - 4.0, lo[1] - 4.0, hi[0] + 4.0, hi[1] + 4.0)
    spline, ox, oy, inv = classic.tps_spline(dst, src, box, scale=sizes[level] / sizes[0])
    return spline, (ox, oy, inv), level


__all__ = [
    "FOLD_STEPS",
    "MAX_LEVELS",
    "SOURCE_FEATHER",
    "SOURCE_MARGIN",
    "face_region",
    "control_points",
    "posed",
    "fit_samples",
    "face_bounds",
    "five_from_68",
    "folds",
    "unfolded",
    "matched",
    "plausible",
    "source_68",
    "source_levels",
    "warp_grid",
]
