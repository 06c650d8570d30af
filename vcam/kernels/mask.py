"""Mask kernels (``kernels/mask.cu``): the face and mouth shapes of the paste mask, and the masks of
the occluder and parser models resampled into the swapper's crop.

Shapes reach the kernels as half-planes (a convex polygon of at most :data:`MAX_EDGES` edges,
``nx * x + ny * y + c <= 0`` inside, unit normals), passed by value in the kernel's parameter block:
no per-frame copy. Each kernel has a NumPy reference (``<name>_ref``: the CPU path and the test
oracle), a CUDA launch with the same arguments after ``ops``, and a front ``<name>(ops, ...)`` that
picks one by the ops' device. The stage that builds the masks is :mod:`vcam.stages.mask`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device, scratch

MAX_EDGES = 16  # edges per shape (kernels/mask.cu)
SHAPE_KINDS = 2  # shapes per face: face (kept), mouth (cut out)

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

MASK_FACES = 8  # faces per launch of the shape kernel (kernels/mask.cu)
#: Mirrors ``struct Shapes`` of kernels/mask.cu (passed by value).
SHAPES = np.dtype(
    {
        "names": ["planes", "feather", "count", "mouth"],
        "formats": [("f4", (MASK_FACES, SHAPE_KINDS, MAX_EDGES, 3)), ("f4", (MASK_FACES, SHAPE_KINDS)), "i4", "i4"],
    },
    align=True,
)
LM_FACES = 32  # faces per launch of the landmark shape kernel
#: Mirrors ``struct Landmarks`` of kernels/mask.cu (passed by value).
LANDMARKS = np.dtype(
    {
        "names": [
            "lm",
            "face_local",
            "mouth_local",
            "centre_u",
            "centre_v",
            "face_scale",
            "mouth_scale",
            "feather",
            "across",
            "count",
            "face",
            "mouth",
        ],
        "formats": [
            ("f4", (LM_FACES, 10)),
            ("f4", (MAX_EDGES, 3)),
            ("f4", (MAX_EDGES, 3)),
            "f4",
            "f4",
            "f4",
            "f4",
            "f4",
            "f4",
            "i4",
            "i4",
            "i4",
        ],
    },
    align=True,
)


# -- NumPy references ------------------------------------------------------------------------------


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


_FACE_5_RING = np.concatenate([_FACE_5, _FACE_5[-2:0:-1] * [-1.0, 1.0]]) - _FACE_CENTRE_5  # (16, 2) about the centre
_ELLIPSE = np.stack(
    [np.cos(np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False)), np.sin(np.linspace(0, 2 * np.pi, MAX_EDGES, endpoint=False))],
    1,
)


_FACE_PLANES = half_planes(_FACE_5_RING).astype(np.float64)
_MOUTH_PLANES = half_planes(_ELLIPSE).astype(np.float64)


def polygon_masks_ref(
    planes: np.ndarray, feathers: np.ndarray, base: np.ndarray, count: int, out: np.ndarray, mouth: bool = False
) -> np.ndarray:
    """``out[f] = base * cover(face) * (1 - cover(mouth) if mouth)`` for ``f < count``.

    ``planes`` (F, SHAPE_KINDS, MAX_EDGES, 3) and ``feathers`` (F, SHAPE_KINDS) from :func:`vcam.stages.mask.shape_params`;
    ``base`` (S, S) or (F, S, S) float32 (the box mask); ``out`` (F, S, S) float32. At a pixel centre
    (x, y), ``d = max_e(nx * x + ny * y + c)`` (float32, edges in order) and
    ``cover = clip(-d / feather, 0, 1)`` (``d < 0`` when the feather is 0): 0 on and outside the
    outline, 1 deeper inside than the feather.
    """
    size = out.shape[-1]
    grid = np.arange(size, dtype=np.float32)
    x, y = grid[None, :], grid[:, None]
    base = np.asarray(base, np.float32)
    edge = np.empty((size, size), np.float32)  # one edge's distances, reused (the same sums in place)
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
                np.add(nx * x, ny * y, out=edge)
                edge += c
                np.maximum(d, edge, out=d)
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


def landmark_masks_ref(
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
    device, so the host only passes the points): :func:`vcam.stages.mask.face_polygon` / :func:`vcam.stages.mask.mouth_polygon` as
    half-planes, then :func:`polygon_masks_ref`."""
    f32 = np.float32
    n = int(count)
    lms = np.asarray(landmarks, np.float32).reshape(-1, 5, 2)
    fl, ml = _local_planes()
    planes = np.zeros((max(n, 1), SHAPE_KINDS, MAX_EDGES, 3), np.float32)
    planes[..., 2] = -1e30
    feathers = np.zeros((max(n, 1), SHAPE_KINDS), np.float32)
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
    return polygon_masks_ref(planes, feathers, base, n, out, mouth)


def resample_masks_ref(
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


def parser_select_ref(
    logits: np.ndarray, count: int, classes: int, out: np.ndarray, guard: np.ndarray | None = None
) -> np.ndarray:
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


# -- CUDA launches ---------------------------------------------------------------------------------
def _landmark_params() -> np.ndarray:
    """The landmark kernel's parameter block with its constant fields filled (the local outlines)."""
    p = np.zeros(1, dtype=LANDMARKS)
    p["face_local"][0], p["mouth_local"][0] = _local_planes()
    p["centre_u"][0], p["centre_v"][0] = _FACE_CENTRE_5
    p["across"][0] = 0.35 / 0.6
    return p


def _no_guard(ops: Any) -> Any:
    """A device buffer the kernels write their guard flags to when the caller keeps none."""
    return scratch(ops, "mask.no_guard", lambda: ops.empty((32,), np.int32))


# -- fronts: one per kernel, by device -------------------------------------------------------------
def polygon_masks(
    ops: Any, planes: np.ndarray, feathers: np.ndarray, base: Any, count: int, out: Any, mouth: bool = False
) -> Any:
    """Face/mouth shapes (host half-planes) times ``base`` into ``out`` (F, S, S) float32
    (:func:`polygon_masks_ref`)."""
    if not on_device(ops):
        return polygon_masks_ref(planes, feathers, base, count, out, mouth)
    # Face/mouth shapes times ``base`` into ``out`` (F, S, S) float32; shapes by value, one launch
    # per 8 faces (see :func:`polygon_masks_ref`).
    n = int(count)
    size = int(out.shape[-1])
    per_face = base.ndim == 3
    planes = np.asarray(planes, np.float32)
    feathers = np.asarray(feathers, np.float32)
    for s in range(0, n, MASK_FACES):
        k = min(MASK_FACES, n - s)
        p = np.zeros(1, dtype=SHAPES)
        p["planes"][0, :k] = planes[s : s + k]
        p["feather"][0, :k] = feathers[s : s + k]
        p["count"][0] = k
        p["mouth"][0] = int(bool(mouth))
        launch(
            ops,
            "mask",
            "polygon_masks",
            (_grid(size * size), k),
            (base[s:] if per_face else base, np.int32(size * size if per_face else 0), np.int32(size), p, out[s:]),
        )
    return out


def landmark_masks(
    ops: Any,
    landmarks: np.ndarray,
    count: int,
    base: Any,
    out: Any,
    face: bool = True,
    mouth: bool = False,
    face_scale: float = 1.0,
    mouth_scale: float = 1.0,
    feather: float = 0.12,
) -> Any:
    """Face/mouth shapes from 5 crop-space points (F, 5, 2) times ``base`` into ``out``
    (:func:`landmark_masks_ref`)."""
    if not on_device(ops):
        return landmark_masks_ref(landmarks, count, base, out, face, mouth, face_scale, mouth_scale, feather)
    # Face/mouth shapes from 5 crop-space points (F, 5, 2), geometry on the device: the host
    # fills one cached parameter block (see :func:`landmark_masks_ref`); one launch per 32 faces.
    n = int(count)
    size = int(out.shape[-1])
    per_face = base.ndim == 3
    p = scratch(ops, "mask.landmarks", _landmark_params)
    p["face_scale"][0], p["mouth_scale"][0], p["feather"][0] = face_scale, mouth_scale, feather
    p["face"][0], p["mouth"][0] = int(bool(face)), int(bool(mouth))
    lms = np.asarray(landmarks, np.float32).reshape(-1, 10)
    for s in range(0, n, LM_FACES):
        k = min(LM_FACES, n - s)
        p["lm"][0, :k] = lms[s : s + k]
        p["count"][0] = k
        grid = (_grid(size * size), k)
        args = (base[s:] if per_face else base, np.int32(size * size if per_face else 0), np.int32(size), p, out[s:])
        launch(ops, "mask", "landmark_masks", grid, args, fixed=grid)
    return out


def resample_masks(ops: Any, src: Any, count: int, out: Any, lo: float = 0.0, hi: float = 1.0, guard: Any = None) -> Any:
    """``out *= clip((bilinear(src) - lo) / (hi - lo), 0, 1)`` per face (:func:`resample_masks_ref`)."""
    if not on_device(ops):
        return resample_masks_ref(src, count, out, lo, hi, guard)
    # ``out *= clip((bilinear(src) - lo) / (hi - lo), 0, 1)`` per face (see :func:`resample_masks_ref`).
    cp = ops.xp
    n = int(count)
    if n <= 0:
        return out
    size = int(out.shape[-1])
    hs, ws = int(src.shape[1]), int(src.shape[2])
    src = src if src.flags.c_contiguous else cp.ascontiguousarray(src)
    kernel = "resample_masks_f16" if src.dtype == cp.float16 else "resample_masks_f32"
    if src.dtype not in (cp.float16, cp.float32):
        src = src.astype(cp.float32)
    scale = np.float32(1.0 / (hi - lo)) if hi != lo else np.float32(1.0)
    launch(
        ops,
        "mask",
        kernel,
        (_grid(size * size), n),
        (
            src,
            np.int32(hs),
            np.int32(ws),
            np.float32(hs / size),
            np.float32(ws / size),
            np.int32(n),
            np.int32(size),
            np.float32(lo),
            scale,
            guard if guard is not None else _no_guard(ops),
            np.int32(guard is not None),
            out,
        ),
    )
    return out


def parser_select(ops: Any, logits: Any, count: int, classes: int, out: Any, guard: Any = None) -> Any:
    """Arg-max class in the bit set ``classes`` -> 1, else 0 (:func:`parser_select_ref`)."""
    if not on_device(ops):
        return parser_select_ref(logits, count, classes, out, guard)
    # Arg-max class in the bit set ``classes`` -> 1, else 0 (see :func:`parser_select_ref`).
    cp = ops.xp
    n = int(count)
    if n <= 0:
        return out
    logits = logits if logits.flags.c_contiguous else cp.ascontiguousarray(logits)
    kernel = "parser_select_f16" if logits.dtype == cp.float16 else "parser_select_f32"
    hw = int(logits.shape[2]) * int(logits.shape[3])
    launch(
        ops,
        "mask",
        kernel,
        (_grid(hw), n),
        (
            logits,
            np.int32(logits.shape[1]),
            np.int32(hw),
            np.int32(n),
            np.int64(classes),
            guard if guard is not None else _no_guard(ops),
            out,
        ),
    )
    return out


__all__ = [
    "LANDMARKS",
    "MAX_EDGES",
    "SHAPES",
    "SHAPE_KINDS",
    "half_planes",
    "landmark_masks",
    "landmark_masks_ref",
    "parser_select",
    "parser_select_ref",
    "polygon_masks",
    "polygon_masks_ref",
    "resample_masks",
    "resample_masks_ref",
]
