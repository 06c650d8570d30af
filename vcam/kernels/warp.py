"""Warp kernels (``kernels/warp.cu``): batched warp-crops of faces out of a frame, and model outputs
back to uint8 crops.

Convention (:mod:`vcam.align`): a matrix ``crop_from_frame`` (2, 3) maps frame pixel centres to crop
pixel centres. Each kernel has a NumPy reference (``<name>_ref``: the CPU path and the test oracle),
a CUDA launch with the same arguments after ``ops``, and one front ``<name>(ops, ...)`` that picks
between them by the ops' device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.align import PlanarAffine, apply, invert
from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device

MAX_FACES = 32  # faces per launch (kernels/warp.cu, kernels/paste.cu); larger batches loop

#: Mirrors ``struct Faces`` of kernels/warp.cu (passed by value).
FACES = np.dtype(
    {"names": ["frame_from_crop", "mean", "std", "count"], "formats": [("f8", (MAX_FACES, 6)), ("f4", (3,)), ("f4", (3,)), "i4"]},
    align=True,
)
#: Mirrors ``struct Affine`` of kernels/warp.cu (passed by value).
AFFINE = np.dtype(
    {
        "names": ["out_scale", "out_shift", "in_scale", "in_shift"],
        "formats": [("f4", (3,)), ("f4", (3,)), ("f4", (3,)), ("f4", (3,))],
    },
    align=True,
)


# -- NumPy references ------------------------------------------------------------------------------
def bilinear_replicate(img: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
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


def warp_crops_ref(frame: np.ndarray, crop_from_frame: np.ndarray, size: int, out: np.ndarray | None = None) -> np.ndarray:
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


def warp_crops_cv(frame: np.ndarray, crop_from_frame: np.ndarray, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`warp_crops_ref` through OpenCV's uint8 warp, for the CPU's estimates (the crops of the
    colour statistics and of the local colour match, 64 and 32 pixels). It reads the frame where it is
    instead of converting the region a crop reaches to float32: a 32-pixel crop of a 250-pixel face
    in 0.013 ms, not 0.07-0.2. The same
    1/32-pixel positions as the float warp; its weights in fixed point and its rounding leave a pixel
    within :data:`CV_LEVELS` of the reference (2,000 random warps of noise, 0.05-4x, any angle)."""
    import cv2

    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = np.empty((mats.shape[0], size, size, frame.shape[2]), dtype=np.uint8)
    inv = invert(mats)
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for f in range(mats.shape[0]):
        out[f] = cv2.warpAffine(frame, inv[f], (size, size), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    return out


#: :func:`warp_crops_cv` against :func:`warp_crops_ref`, in levels (the weights' fixed point).
CV_LEVELS = 1


def warp_crops_normalized_ref(
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
        s = bilinear_replicate(frame, x, y)  # (S, S, 3) BGR float32
        if rgb:
            s = s[..., ::-1]
        out[f] = ((s - mean_a) / std_a).transpose(2, 0, 1).astype(out.dtype)
    return out


def crops_from_planar_ref(
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


# -- CUDA launches ---------------------------------------------------------------------------------
#: The warps with a ``_rec`` twin (a parameter record's pointer, :mod:`vcam.kernels.records`): the
#: swap network's input, which a per-frame graph replays.
RECORDED = frozenset({"warp_crops_norm_f32", "warp_crops_norm_f16"})


def _faces(mats: np.ndarray, mean: Any = (0.0, 0.0, 0.0), std: Any = (1.0, 1.0, 1.0)) -> np.ndarray:
    p = np.zeros(1, dtype=FACES)
    if mats.shape[0]:
        p["frame_from_crop"][0, : mats.shape[0]] = invert(mats).reshape(-1, 6)
    p["mean"][0] = mean
    p["std"][0] = std
    p["count"][0] = mats.shape[0]
    return p


# -- fronts: one per kernel, by device -------------------------------------------------------------


def _launch_per_face_batch(
    ops: Any,
    kernel: str,
    frame: Any,
    mats: np.ndarray,
    size: int,
    out: Any,
    mean: Any = (0.0, 0.0, 0.0),
    std: Any = (1.0, 1.0, 1.0),
    *extra: Any,
) -> None:
    """Launch a warp kernel once per :data:`MAX_FACES` faces: ``(frame, w, h, faces, size, *extra,
    out rows)``, ``mean``/``std`` packed with the faces' matrices."""
    h, w = frame.shape[:2]
    for s in range(0, mats.shape[0], MAX_FACES):
        m = mats[s : s + MAX_FACES]
        args = (frame, np.int32(w), np.int32(h), _faces(m, mean, std), np.int32(size), *extra, out[s : s + m.shape[0]])
        grid = (_grid(size * size), m.shape[0])
        launch(ops, "warp", kernel, grid, args, fixed=grid if kernel in RECORDED else None)


def warp_crops(ops: Any, frame: Any, crop_from_frame: np.ndarray, size: int, out: Any = None, exact: bool = True) -> Any:
    """(H, W, 3) uint8 BGR -> (F, size, size, 3) uint8 crops (:func:`warp_crops_ref`); ``exact``
    False lets the CPU take :func:`warp_crops_cv` (within :data:`CV_LEVELS`; a device is exact)."""
    if not on_device(ops):
        if not exact:
            return warp_crops_cv(np.ascontiguousarray(frame), crop_from_frame, size, out=out)
        return warp_crops_ref(frame, crop_from_frame, size, out=out)
    # (H, W, 3) uint8 BGR -> (F, size, size, 3) uint8 crops; one launch per 32 faces.
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = ops.xp.empty((mats.shape[0], size, size, 3), dtype=ops.xp.uint8)
    _launch_per_face_batch(ops, "warp_crops_u8", frame, mats, size, out)
    return out


def warp_crops_normalized(
    ops: Any, frame: Any, crop_from_frame: np.ndarray, size: int, mean: tuple, std: tuple, rgb: bool = True, out: Any = None
) -> Any:
    """Crops straight into a model input (F, 3, size, size) (:func:`warp_crops_normalized_ref`)."""
    if not on_device(ops):
        return warp_crops_normalized_ref(frame, crop_from_frame, size, mean, std, rgb, out=out)
    # Warp straight into a model input (F, 3, size, size) float32/float16 (after ``out``).
    cp = ops.xp
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = cp.empty((mats.shape[0], 3, size, size), dtype=cp.float32)
    kernel = "warp_crops_norm_f16" if out.dtype == cp.float16 else "warp_crops_norm_f32"
    _launch_per_face_batch(ops, kernel, frame, mats, size, out, mean, std, np.int32(bool(rgb)))
    return out


def crops_from_planar(
    ops: Any,
    output: Any,
    inputs: Any,
    count: int,
    crops: Any,
    guard: Any,
    affine: PlanarAffine = PlanarAffine(),
    rgb: bool = True,
) -> Any:
    """Model output (F, 3, S, S) -> uint8 BGR crops with the NaN guard (:func:`crops_from_planar_ref`)."""
    if not on_device(ops):
        return crops_from_planar_ref(output, inputs, count, crops, guard, affine, rgb)
    # Model output (F, 3, S, S) -> uint8 BGR crops with the NaN guard; one block per face.
    cp = ops.xp
    if count <= 0:
        return crops
    kernel = "crops_from_planar_{}_{}".format(*("f16" if a.dtype == cp.float16 else "f32" for a in (output, inputs)))
    p = np.zeros(1, dtype=AFFINE)
    for field in AFFINE.names:
        p[field][0] = getattr(affine, field)
    launch(
        ops,
        "warp",
        kernel,
        (int(count),),
        (
            cp.ascontiguousarray(output),
            inputs,
            np.int32(count),
            np.int32(output.shape[-1]),
            p,
            np.int32(bool(rgb)),
            crops,
            guard,
        ),
        block=(512,),
    )
    return crops


__all__ = [
    "AFFINE",
    "FACES",
    "MAX_FACES",
    "bilinear_replicate",
    "crop_grid",
    "crops_from_planar",
    "crops_from_planar_ref",
    "warp_crops",
    "warp_crops_normalized",
    "warp_crops_normalized_ref",
    "warp_crops_ref",
]
