"""Align stage: 5-point similarity transforms and the batched warp-crop (NumPy reference).

Convention: a matrix ``crop_from_frame`` (2, 3) maps frame pixel centres to crop pixel centres,
``[u, v] = M @ [x, y, 1]``; ``frame_from_crop`` is its inverse. Pixel centres are at integer
coordinates, origin top-left (OpenCV's convention).

:func:`warp_crops`, :func:`warp_crops_normalized` and :func:`crops_from_planar` are the CPU twins of
the kernels in ``kernels/warp.cu`` and have their signatures.
"""

from __future__ import annotations

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
    ``[[a, -b], [b, a]]`` and the least squares have a closed form (no SVD): with centred points,
    ``a = sum(s . d) / sum |s|^2`` and ``b = sum(s x d) / sum |s|^2``, the same matrix as Umeyama's
    SVD with its reflection fix. Summed in plain floats (a handful of points): a sixth of the time
    of the SVD on NumPy's small arrays, and it runs once per face per frame.
    """
    s = np.asarray(src, dtype=np.float64).tolist()
    d = np.asarray(dst, dtype=np.float64).tolist()
    n = len(s)
    msx, msy = sum(p[0] for p in s) / n, sum(p[1] for p in s) / n
    mdx, mdy = sum(p[0] for p in d) / n, sum(p[1] for p in d) / n
    var = dot = cross = 0.0
    for (sx, sy), (dx, dy) in zip(s, d):
        sx, sy, dx, dy = sx - msx, sy - msy, dx - mdx, dy - mdy
        var += sx * sx + sy * sy
        dot += sx * dx + sy * dy
        cross += sx * dy - sy * dx
    a, b = (dot / var, cross / var) if var > 0 else (1.0, 0.0)  # all source points equal: no rotation or scale
    return np.array([[a, -b, mdx - (a * msx - b * msy)], [b, a, mdy - (b * msx + a * msy)]], dtype=np.float64)


def estimate(landmarks: np.ndarray, template: str, size: int) -> np.ndarray:
    """``crop_from_frame`` (2, 3) float64 aligning 5 ``landmarks`` (5, 2) to ``template`` at ``size``."""
    try:
        tpl = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown alignment template {template!r}; known: {', '.join(TEMPLATES)}") from None
    return umeyama(landmarks, tpl * size)


def invert(m: np.ndarray) -> np.ndarray:
    """Inverse of a (2, 3) affine matrix (or a batch (F, 2, 3))."""
    m = np.asarray(m, dtype=np.float64)
    a = m[..., :2]
    t = m[..., 2:]
    ainv = np.linalg.inv(a)
    return np.concatenate([ainv, -ainv @ t], axis=-1)


def apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Apply a (2, 3) affine to points (N, 2)."""
    pts = np.asarray(pts, dtype=np.float64)
    return pts @ m[:, :2].T + m[:, 2]


def _bilinear_replicate(img: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Sample ``img`` (H, W, C) at float coords with replicate border; returns float32 (..., C)."""
    h, w = img.shape[:2]
    x = np.clip(x, 0.0, w - 1.0)
    y = np.clip(y, 0.0, h - 1.0)
    x0 = np.floor(x).astype(np.int32)
    y0 = np.floor(y).astype(np.int32)
    x1 = np.minimum(x0 + 1, w - 1)
    y1 = np.minimum(y0 + 1, h - 1)
    fx = (x - x0).astype(np.float32)[..., None]
    fy = (y - y0).astype(np.float32)[..., None]
    f = img.astype(np.float32, copy=False)
    top = f[y0, x0] * (1 - fx) + f[y0, x1] * fx
    bot = f[y1, x0] * (1 - fx) + f[y1, x1] * fx
    return top * (1 - fy) + bot * fy


def crop_grid(frame_from_crop: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Frame coordinates (size, size) x2 of every crop pixel centre under ``frame_from_crop``."""
    v, u = np.mgrid[0:size, 0:size].astype(np.float64)
    m = frame_from_crop
    x = m[0, 0] * u + m[0, 1] * v + m[0, 2]
    y = m[1, 0] * u + m[1, 1] * v + m[1, 2]
    return x, y


def _source_region(frame_from_crop: np.ndarray, size: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Frame rectangle (x0, y0, x1, y1), clipped, that every bilinear tap of the crop can touch."""
    corners = np.array([[0, 0], [size - 1, 0], [0, size - 1], [size - 1, size - 1]], dtype=np.float64)
    pts = apply(frame_from_crop, corners)
    x0 = int(np.clip(np.floor(pts[:, 0].min()) - 1, 0, width - 1))
    y0 = int(np.clip(np.floor(pts[:, 1].min()) - 1, 0, height - 1))
    x1 = int(np.clip(np.ceil(pts[:, 0].max()) + 2, x0 + 1, width))
    y1 = int(np.clip(np.ceil(pts[:, 1].max()) + 2, y0 + 1, height))
    return x0, y0, x1, y1


def warp_crops(frame: np.ndarray, crop_from_frame: np.ndarray, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """Batched warp-crop: bilinear, replicate border.

    ``frame``: (H, W, 3) uint8 BGR. ``crop_from_frame``: (F, 2, 3) float. Returns ``out``
    (F, size, size, 3) uint8 (allocated if None): crop pixel (u, v) of face f is the bilinear sample
    of the frame at ``inv(M_f) @ [u, v, 1]`` (coordinates clamped to the frame), then
    ``floor(x + 0.5)``.

    Only the frame region the crop can touch is read: it is converted to float32 and warped by
    OpenCV, whose float warp is plain bilinear (its uint8 warp rounds coordinates to 1/32 pixel).
    """
    import cv2

    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = np.empty((mats.shape[0], size, size, frame.shape[2]), dtype=np.uint8)
    h, w = frame.shape[:2]
    inv = invert(mats)
    for f in range(mats.shape[0]):
        x0, y0, x1, y1 = _source_region(inv[f], size, h, w)
        region = frame[y0:y1, x0:x1].astype(np.float32)
        m = inv[f].copy()  # region_from_crop
        m[:, 2] -= (x0, y0)
        res = cv2.warpAffine(
            region, m, (size, size), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE
        )
        res += 0.5
        np.clip(res, 0, 255, out=res)
        out[f] = res.astype(np.uint8)
    return out


def warp_crops_normalized(
    frame: np.ndarray,
    crop_from_frame: np.ndarray,
    size: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    rgb: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Batched warp-crop straight into a model input tensor.

    Returns ``out`` (F, 3, size, size) float32 (or float16 if ``out`` is float16):
    ``(sample - mean[c]) / std[c]`` with channels in RGB order if ``rgb`` (frame is BGR), sampled in
    0..255 units without rounding to uint8 first. ``mean``/``std`` are in 0..255 units.
    """
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = np.empty((mats.shape[0], 3, size, size), dtype=np.float32)
    inv = invert(mats)
    mean_a = np.asarray(mean, dtype=np.float32)
    std_a = np.asarray(std, dtype=np.float32)
    for f in range(mats.shape[0]):
        x, y = crop_grid(inv[f], size)
        s = _bilinear_replicate(frame, x, y)  # (S, S, 3) BGR float32
        if rgb:
            s = s[..., ::-1]
        out[f] = ((s - mean_a) / std_a).transpose(2, 0, 1).astype(out.dtype)
    return out


@dataclass(frozen=True)
class PlanarAffine:
    """How a model's planar image output maps to pixels, per model channel (see
    :func:`crops_from_planar`): ``value01 = output * out_scale + out_shift`` (clipped to [0, 1]);
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


def crops_from_planar(
    output: np.ndarray,
    inputs: np.ndarray,
    count: int,
    crops: np.ndarray,
    guard: np.ndarray,
    affine: PlanarAffine = PlanarAffine(),
    rgb: bool = True,
) -> np.ndarray:
    """Model output (F, 3, S, S) planar -> (F, S, S, 3) uint8 BGR ``crops`` for the first ``count``
    faces: ``floor(clip(output * out_scale + out_shift, 0, 1) * 255 + 0.5)`` per model channel, the
    channels reversed when ``rgb``. FP16 guard: a face whose output holds NaN/Inf gets its own input
    back (``inputs`` (F, 3, S, S), the model input, mapped by ``in_scale``/``in_shift``) and
    ``guard[f]`` grows by one. Twin of ``kernels/warp.cu`` crops_from_planar."""
    a = affine
    osc = np.asarray(a.out_scale, np.float32).reshape(3, 1, 1)
    osh = np.asarray(a.out_shift, np.float32).reshape(3, 1, 1)
    isc = np.asarray(a.in_scale, np.float32).reshape(3, 1, 1)
    ish = np.asarray(a.in_shift, np.float32).reshape(3, 1, 1)
    for f in range(count):
        o = np.asarray(output[f], dtype=np.float32)
        bad = not bool(np.isfinite(o).all())
        if bad:
            val = np.asarray(inputs[f], dtype=np.float32) * isc + ish
        else:
            val = np.clip(o * osc + osh, 0.0, 1.0) * np.float32(255.0)
        val = np.clip(np.floor(val + np.float32(0.5)), 0, 255).astype(np.uint8)
        crops[f] = (val[::-1] if rgb else val).transpose(1, 2, 0)
        guard[f] += int(bad)
    return crops
