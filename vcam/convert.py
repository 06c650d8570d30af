"""Convert stage: camera formats in, detector tensors, virtual-camera formats out (NumPy references).

Every function here is the CPU twin of a CUDA kernel in ``kernels/`` with the same signature; the GPU
versions are checked against these in the parity tests.

Colour: BT.601 limited range ("studio swing"), what webcams send for YUYV/NV12/I420 and what
virtual-camera consumers assume. Chroma for 4:2:0 output is the mean of each 2x2 block.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .types import PixelFormat

# BT.601 limited range, 8-bit.
_YC = 1.164383
_RV, _GU, _GV, _BU = 1.596027, -0.391762, -0.812968, 2.017232
_Y_R, _Y_G, _Y_B = 0.256788, 0.504129, 0.097906
_U_R, _U_G, _U_B = -0.148223, -0.290993, 0.439216
_V_R, _V_G, _V_B = 0.439216, -0.367788, -0.071427

DETECTOR_MEAN = (104.0, 117.0, 123.0)  # BGR, RetinaFace (biubug6)


def _yuv_to_bgr(y: np.ndarray, u: np.ndarray, v: np.ndarray, out: np.ndarray) -> np.ndarray:
    c = y.astype(np.float32) - 16.0
    d = u.astype(np.float32) - 128.0
    e = v.astype(np.float32) - 128.0
    out[..., 2] = np.clip(np.floor(_YC * c + _RV * e + 0.5), 0, 255)
    out[..., 1] = np.clip(np.floor(_YC * c + _GU * d + _GV * e + 0.5), 0, 255)
    out[..., 0] = np.clip(np.floor(_YC * c + _BU * d + 0.5), 0, 255)
    return out


def frame_shape(fmt: PixelFormat, width: int, height: int) -> tuple[int, ...]:
    """Array shape of a ``width`` x ``height`` frame in ``fmt`` (MJPEG: variable, returns ())."""
    fmt = PixelFormat(fmt)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        return (height, width, 3)
    if fmt is PixelFormat.GRAY:
        return (height, width)
    if fmt is PixelFormat.YUYV:
        return (height, width, 2)
    if fmt in (PixelFormat.NV12, PixelFormat.I420):
        return (height * 3 // 2, width)
    return ()


def to_bgr(data: np.ndarray, fmt: PixelFormat, width: int, height: int, out: np.ndarray | None = None) -> np.ndarray:
    """Convert a camera frame to (height, width, 3) uint8 BGR, written to ``out`` if given.

    Accepted: BGR, RGB, GRAY (H, W) or (H, W, 1), BGRA/RGBA as (H, W, 4) with fmt BGR/RGB,
    YUYV (H, W, 2) or flat, NV12/I420 (H*3/2, W) or flat (even width and height), MJPEG bytes.
    """
    fmt = PixelFormat(fmt)
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    if fmt is PixelFormat.MJPEG:
        import cv2

        img = cv2.imdecode(np.frombuffer(memoryview(data), dtype=np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise InputError("could not decode an MJPEG frame", hint="the camera sent a corrupt JPEG; try fourcc = 'YUYV'")
        if img.shape[:2] != (height, width):
            raise InputError(f"MJPEG frame is {img.shape[1]}x{img.shape[0]}, expected {width}x{height}")
        out[...] = img
        return out
    a = np.asarray(data)
    if a.dtype != np.uint8:
        raise InputError(f"frames must be uint8, got {a.dtype}")
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        if a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 1):
            out[...] = a.reshape(height, width, 1)
            return out
        if a.ndim != 3 or a.shape[:2] != (height, width) or a.shape[2] not in (3, 4):
            raise InputError(f"unexpected frame shape {a.shape} for {fmt.value} {width}x{height}")
        out[...] = a[..., 2::-1] if fmt is PixelFormat.RGB else a[..., :3]
        return out
    if fmt is PixelFormat.GRAY:
        out[...] = a.reshape(height, width, 1)
        return out
    if fmt is PixelFormat.YUYV:
        p = a.reshape(height, width // 2, 4)
        y = np.stack([p[..., 0], p[..., 2]], axis=-1).reshape(height, width)
        u = np.repeat(p[..., 1], 2, axis=1)
        v = np.repeat(p[..., 3], 2, axis=1)
        return _yuv_to_bgr(y, u, v, out)
    if fmt in (PixelFormat.NV12, PixelFormat.I420):
        if width % 2 or height % 2:
            raise InputError(f"{fmt.value} needs an even width and height, got {width}x{height}")
        flat = a.reshape(-1)
        y = flat[: width * height].reshape(height, width)
        ch, cw = height // 2, width // 2
        if fmt is PixelFormat.NV12:
            uv = flat[width * height :].reshape(ch, cw, 2)
            u, v = uv[..., 0], uv[..., 1]
        else:
            u = flat[width * height : width * height + ch * cw].reshape(ch, cw)
            v = flat[width * height + ch * cw :].reshape(ch, cw)
        u = u.repeat(2, axis=0).repeat(2, axis=1)
        v = v.repeat(2, axis=0).repeat(2, axis=1)
        return _yuv_to_bgr(y, u, v, out)
    raise InputError(f"unsupported input pixel format {fmt}")


def from_bgr(frame: np.ndarray, fmt: PixelFormat, out: np.ndarray | None = None) -> np.ndarray:
    """Convert (H, W, 3) uint8 BGR to an output format: RGB (H, W, 3), I420 or NV12 (H*3/2, W).

    4:2:0 formats need an even width and height (publish crops odd frames by one row/column).
    """
    fmt = PixelFormat(fmt)
    h, w = frame.shape[:2]
    if fmt is PixelFormat.BGR:
        if out is None:
            return frame.copy()
        out[...] = frame
        return out
    if fmt is PixelFormat.RGB:
        if out is None:
            out = np.empty((h, w, 3), dtype=np.uint8)
        out[...] = frame[..., ::-1]
        return out
    if fmt not in (PixelFormat.I420, PixelFormat.NV12):
        raise ValueError(f"unsupported output pixel format {fmt}")
    if w % 2 or h % 2:
        raise ValueError(f"{fmt.value} needs an even width and height, got {w}x{h}")
    if out is None:
        out = np.empty((h * 3 // 2, w), dtype=np.uint8)
    f = frame.astype(np.float32)
    b, g, r = f[..., 0], f[..., 1], f[..., 2]
    flat = out.reshape(-1)
    y = 16.0 + _Y_R * r + _Y_G * g + _Y_B * b
    flat[: w * h] = np.clip(np.floor(y + 0.5), 0, 255).reshape(-1)
    # 2x2 block means, then chroma.
    rb = r.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
    gb = g.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
    bb = b.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
    u = np.clip(np.floor(128.0 + _U_R * rb + _U_G * gb + _U_B * bb + 0.5), 0, 255).astype(np.uint8)
    v = np.clip(np.floor(128.0 + _V_R * rb + _V_G * gb + _V_B * bb + 0.5), 0, 255).astype(np.uint8)
    n = (h // 2) * (w // 2)
    if fmt is PixelFormat.I420:
        flat[w * h : w * h + n] = u.reshape(-1)
        flat[w * h + n :] = v.reshape(-1)
    else:
        uv = flat[w * h :].reshape(h // 2, w // 2, 2)
        uv[..., 0] = u
        uv[..., 1] = v
    return out


def detector_input(
    frame: np.ndarray,
    rects: np.ndarray,
    size: int,
    mean: tuple[float, float, float] = DETECTOR_MEAN,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Resize square regions of a BGR frame into one detector batch.

    ``frame``: (H, W, 3) uint8 BGR. ``rects``: (R, 3) float ``x0, y0, side`` — square regions in
    frame pixels (may extend past the frame). Returns ``out`` (R, 3, size, size) float32: input pixel
    (i, j) of region r samples the frame bilinearly at ``x = x0 + (j + 0.5) * side / size - 0.5``
    (likewise y), minus ``mean`` per BGR channel; samples outside the frame are 0 (i.e. the mean).
    A full-frame scan is one region ``(0, 0, max(H, W))`` (letterbox, padding right/bottom).
    Detections in input pixels map back with ``frame = x0 + (p + 0.5) * side / size - 0.5``.
    """
    rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    if out is None:
        out = np.empty((rects.shape[0], 3, size, size), dtype=np.float32)
    h, w = frame.shape[:2]
    mean_a = np.asarray(mean, dtype=np.float32)
    f = frame.astype(np.float32)
    j = np.arange(size, dtype=np.float64)
    for r, (x0, y0, side) in enumerate(rects):
        s = side / size
        xs = x0 + (j + 0.5) * s - 0.5
        ys = y0 + (j + 0.5) * s - 0.5
        xi = np.clip(xs, 0, w - 1)
        yi = np.clip(ys, 0, h - 1)
        xa = np.floor(xi).astype(np.int64)
        ya = np.floor(yi).astype(np.int64)
        xb = np.minimum(xa + 1, w - 1)
        yb = np.minimum(ya + 1, h - 1)
        fx = (xi - xa).astype(np.float32)[None, :, None]
        fy = (yi - ya).astype(np.float32)[:, None, None]
        top = f[ya][:, xa] * (1 - fx) + f[ya][:, xb] * fx
        bot = f[yb][:, xa] * (1 - fx) + f[yb][:, xb] * fx
        val = top * (1 - fy) + bot * fy - mean_a
        valid = ((xs >= -0.5) & (xs <= w - 0.5))[None, :] & ((ys >= -0.5) & (ys <= h - 0.5))[:, None]
        val *= valid[..., None]
        out[r] = val.transpose(2, 0, 1)
    return out
