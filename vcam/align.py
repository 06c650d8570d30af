"""Alignment geometry: 5-point similarity transforms and how model outputs map to pixels.

Convention: a matrix ``crop_from_frame`` (2, 3) maps frame pixel centres to crop pixel centres,
``[u, v] = M @ [x, y, 1]``; ``frame_from_crop`` is its inverse. Pixel centres are at integer
coordinates, origin top-left (OpenCV's convention).

The pixel work over these matrices (the batched warp-crop and its CUDA kernels) is in
:mod:`vcam.kernels.warp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Five points: left eye, right eye, nose, left mouth corner, right mouth corner.
_ARCFACE_112_V2 = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float64,
)
_ARCFACE_112_V1 = np.array(
    [[39.7300, 51.1380], [72.2700, 51.1380], [56.0000, 68.4930], [42.4630, 87.0100], [69.5370, 87.0100]],
    dtype=np.float64,
)
_FFHQ_512 = np.array(
    [
        [0.37691676, 0.46864664],
        [0.62285697, 0.46912813],
        [0.50123859, 0.61331904],
        [0.39308822, 0.72541100],
        [0.61150205, 0.72490465],
    ],
    dtype=np.float64,
)

# Normalised to [0, 1] of the crop side, so one template serves every crop size.
TEMPLATES: dict[str, np.ndarray] = {
    "arcface_112_v2": _ARCFACE_112_V2 / 112.0,
    "arcface_112_v1": _ARCFACE_112_V1 / 112.0,
    # InsightFace norm_crop2(..., 128): the 112 points shifted by 8 px in x, on a 128 grid.
    "arcface_128": (_ARCFACE_112_V2 + np.array([8.0, 0.0])) / 128.0,
    "ffhq_512": _FFHQ_512,
}


def umeyama(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) mapping ``src`` to ``dst``.

    ``src``, ``dst``: (N, 2). Returns the (2, 3) float64 matrix ``M`` minimising
    ``sum |M @ [src, 1] - dst|^2`` (Umeyama 1991, no reflection). In 2-D the scaled rotation is
    ``[[a, -b], [b, a]]`` and the least squares have a closed form (no SVD): see :func:`similarity`.
    """
    a, b, tx, ty = similarity(np.asarray(src, dtype=np.float64).tolist(), np.asarray(dst, dtype=np.float64).tolist())
    return np.array([[a, -b, tx], [b, a, ty]], dtype=np.float64)


def similarity(src: Sequence[Sequence[float]], dst: Sequence[Sequence[float]]) -> tuple[float, float, float, float]:
    """:func:`umeyama`'s ``(a, b, tx, ty)`` for points given as (x, y) pairs of Python floats: with
    centred points, ``a = sum(s . d) / sum |s|^2`` and ``b = sum(s x d) / sum |s|^2``, the same matrix
    as Umeyama's SVD with its reflection fix. Summed in plain floats (a handful of points): a sixth
    of the time of the SVD on NumPy's small arrays; it runs for every face of every frame."""
    n = len(src)
    msx, msy = sum(p[0] for p in src) / n, sum(p[1] for p in src) / n
    mdx, mdy = sum(p[0] for p in dst) / n, sum(p[1] for p in dst) / n
    var = dot = cross = 0.0
    for (sx, sy), (dx, dy) in zip(src, dst):
        sx, sy, dx, dy = sx - msx, sy - msy, dx - mdx, dy - mdy
        var += sx * sx + sy * sy
        dot += sx * dx + sy * dy
        cross += sx * dy - sy * dx
    a, b = (dot / var, cross / var) if var > 0 else (1.0, 0.0)  # all source points equal: no rotation or scale
    return a, b, mdx - (a * msx - b * msy), mdy - (b * msx + a * msy)


def estimate(landmarks: np.ndarray, template: str, size: int) -> np.ndarray:
    """``crop_from_frame`` (2, 3) float64 aligning 5 ``landmarks`` (5, 2) to ``template`` at ``size``."""
    try:
        tpl = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown alignment template {template!r}; known: {', '.join(TEMPLATES)}") from None
    return umeyama(landmarks, tpl * size)


def invert(m: np.ndarray) -> np.ndarray:
    """Inverse of a (2, 3) affine matrix (or a batch (F, 2, 3)). A matrix, and each of a batch of
    up to :data:`FEW`, is inverted in Python floats (the 2 x 2 inverse written out: a fifth of the
    time of NumPy's on small matrices); a singular one raises ``LinAlgError`` as NumPy's does."""
    m = np.asarray(m, dtype=np.float64)
    if m.shape == (2, 3):
        return np.array(_invert(m.tolist()), dtype=np.float64)
    if m.ndim == 3 and m.shape[1:] == (2, 3) and m.shape[0] <= FEW:
        return np.array([_invert(x) for x in m.tolist()], dtype=np.float64).reshape(m.shape)
    a = m[..., :2]
    t = m[..., 2:]
    ainv = np.linalg.inv(a)
    return np.concatenate([ainv, -ainv @ t], axis=-1)


#: Batches of up to this many matrices are inverted one by one in floats (:func:`invert`).
FEW = 8


def _invert(m: list[list[float]]) -> list[list[float]]:
    (a, b, tx), (c, d, ty) = m
    det = a * d - b * c
    if det == 0.0:
        raise np.linalg.LinAlgError("Singular matrix")
    ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
    return [[ia, ib, -(ia * tx + ib * ty)], [ic, id_, -(ic * tx + id_ * ty)]]


def apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Apply a (2, 3) affine to points (N, 2)."""
    pts = np.asarray(pts, dtype=np.float64)
    return pts @ m[:, :2].T + m[:, 2]


@dataclass(frozen=True)
class PlanarAffine:
    """How a model's planar image output maps to pixels, per model channel (see
    :func:`vcam.kernels.warp.crops_from_planar`): ``value01 = output * out_scale + out_shift`` (clipped to [0, 1]);
    the NaN guard reads the model input back as ``pixel = input * in_scale + in_shift``."""

    out_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    out_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)
    in_scale: tuple[float, float, float] = (255.0, 255.0, 255.0)
    in_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def for_model(cls, mean: tuple[float, ...], std: tuple[float, ...], output: str) -> PlanarAffine:
        """``mean``/``std`` in 0..1 units (the model input is ``(pixel/255 - mean) / std``);
        ``output``: ``unit`` (already [0, 1]), ``mean_std`` (undo mean/std) or ``tanh`` ([-1, 1])."""
        m = tuple(float(v) for v in mean)
        s = tuple(float(v) for v in std)
        if output == "mean_std":
            out_scale, out_shift = s, m
        elif output == "tanh":
            out_scale, out_shift = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
        else:
            out_scale, out_shift = (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)
        return cls(out_scale, out_shift, tuple(v * 255.0 for v in s), tuple(v * 255.0 for v in m))
