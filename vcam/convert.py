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


def check_420_output(fmt: PixelFormat, width: int, height: int) -> None:
    """ValueError unless ``fmt`` is a 4:2:0 output format and the size is even (both twins check this)."""
    if fmt not in (PixelFormat.I420, PixelFormat.NV12):
        raise ValueError(f"unsupported output pixel format {fmt}")
    if width % 2 or height % 2:
        raise ValueError(f"{fmt.value} needs an even width and height, got {width}x{height}")


def from_bgr(frame: np.ndarray, fmt: PixelFormat, out: np.ndarray | None = None) -> np.ndarray:
    """Convert (H, W, 3) uint8 BGR to an output format: RGB (H, W, 3), I420 or NV12 (H*3/2, W).

    Y = round(16 + 0.256788 R + 0.504129 G + 0.097906 B); U and V from the 2x2 block means of
    R, G, B with the BT.601 limited-range coefficients. 4:2:0 formats need an even width and height
    (publish crops odd frames by one row/column). The GPU kernel computes this in float; this CPU
    version uses OpenCV's fixed-point arithmetic and agrees within 1.
    """
    import cv2

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
        cv2.cvtColor(frame, cv2.COLOR_BGR2RGB, dst=out)
        return out
    check_420_output(fmt, w, h)
    if out is None:
        out = np.empty((h * 3 // 2, w), dtype=np.uint8)
    flat = out.reshape(-1)
    y = cv2.transform(frame, _Y_MAT)  # (H, W) uint8, rounded and saturated
    flat[: w * h] = y.reshape(-1)
    small = cv2.resize(frame, (w // 2, h // 2), interpolation=cv2.INTER_AREA)  # 2x2 means, rounded
    uv = cv2.transform(small, _UV_MAT)  # (H/2, W/2, 2) uint8, rounded and saturated
    n = (h // 2) * (w // 2)
    if fmt is PixelFormat.I420:
        flat[w * h : w * h + n] = uv[..., 0].reshape(-1)
        flat[w * h + n :] = uv[..., 1].reshape(-1)
    else:
        flat[w * h :] = uv.reshape(-1)
    return out


# BGR -> Y and BGR -> (U, V) as cv2.transform matrices (last column: offset).
_Y_MAT = np.array([[_Y_B, _Y_G, _Y_R, 16.0]], dtype=np.float32)
_UV_MAT = np.array([[_U_B, _U_G, _U_R, 128.0], [_V_B, _V_G, _V_R, 128.0]], dtype=np.float32)


def _sample_axis(start: float, step: float, count: int, n: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps of the first ``count`` outputs along one axis of :func:`detector_input`.

    Returns ``(k0, k1, a, b, f)``: output indices ``k0:k1`` sample inside the frame (the rest are
    padding), and for those, the two source indices ``a``, ``b`` and the weight ``f`` of ``b``.
    """
    c = start + (np.arange(count, dtype=np.float64) + 0.5) * step - 0.5
    inside = np.flatnonzero((c >= -0.5) & (c <= n - 0.5))
    if inside.size == 0:
        empty = np.empty(0, dtype=np.intp)
        return 0, 0, empty, empty, np.empty(0, dtype=np.float32)
    k0, k1 = int(inside[0]), int(inside[-1]) + 1
    ci = np.clip(c[k0:k1], 0, n - 1)
    a = np.floor(ci).astype(np.intp)
    b = np.minimum(a + 1, n - 1)
    return k0, k1, a, b, (ci - a).astype(np.float32)


_BGR_OFFSETS = np.arange(3)


def detector_input(
    frame: np.ndarray,
    rects: np.ndarray,
    size: int,
    mean: tuple[float, float, float] = DETECTOR_MEAN,
    out: np.ndarray | None = None,
    *,
    scale: float | tuple[float, float, float] = 1.0,
    rgb: bool = False,
) -> np.ndarray:
    """Resize square regions of a BGR frame into one detector batch.

    ``frame``: (H, W, 3) uint8 BGR. ``rects``: (R, 3) float ``x0, y0, side`` — square regions in
    frame pixels (may extend past the frame). Returns ``out`` (R, 3, size, size) float32, or any
    (R, 3, h, w) window with ``h, w <= size`` (the top-left part of each resized region: a full scan
    feeds only the rows and columns that cover the frame); float16 ``out`` is filled too. Input pixel
    (i, j) of region r samples the frame bilinearly at ``x = x0 + (j + 0.5) * side / size - 0.5``
    (likewise y), minus ``mean`` per BGR channel, times ``scale`` (a number or one per BGR channel);
    samples outside the frame are 0 (i.e. the mean). ``rgb``: write the channels in R, G, B order
    (``mean`` and ``scale`` are still given per B, G, R channel of the frame).
    A full-frame scan is one region ``(0, 0, max(H, W))`` (letterbox, padding right/bottom).
    Detections in input pixels map back with ``frame = x0 + (p + 0.5) * side / size - 0.5``.
    """
    # Separable bilinear: blend the needed rows first (contiguous row gathers, on the frame's own
    # width), then gather and blend columns on the smaller result. The frame is viewed as
    # (H, W*3) so column gathers move whole BGR triples with one flat index each. Output rows go in
    # bands of about a megabyte of floats so the temporaries stay in cache.
    rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    if out is None:
        out = np.empty((rects.shape[0], 3, size, size), dtype=np.float32)
    out_h, out_w = int(out.shape[2]), int(out.shape[3])
    if out_h > size or out_w > size:
        raise ValueError(f"detector input window {out_w}x{out_h} is larger than the region size {size}")
    h, w = frame.shape[:2]
    flat = np.ascontiguousarray(frame).reshape(h, w * 3)
    mean_a = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    scale_a = np.broadcast_to(np.asarray(scale, dtype=np.float32).reshape(-1), (3,)).reshape(3, 1, 1)
    if rgb:  # frame channels B, G, R -> output channels R, G, B
        mean_a, scale_a = mean_a[::-1], scale_a[::-1]
    scaled = bool(np.any(scale_a != 1.0))
    for r, (x0, y0, side) in enumerate(rects):
        step = side / size
        j0, j1, xa, xb, fx = _sample_axis(x0, step, out_w, w)
        i0, i1, ya, yb, fy = _sample_axis(y0, step, out_h, h)
        dst = out[r]
        if j0 == j1 or i0 == i1:
            dst[...] = 0
            continue
        if i0 > 0:
            dst[:, :i0] = 0
        if i1 < out_h:
            dst[:, i1:] = 0
        if j0 > 0:
            dst[:, i0:i1, :j0] = 0
        if j1 < out_w:
            dst[:, i0:i1, j1:] = 0
        c0, c1 = int(xa[0]) * 3, (int(xb[-1]) + 1) * 3
        col_a = (xa[:, None] * 3 + _BGR_OFFSETS).ravel() - c0
        col_b = (xb[:, None] * 3 + _BGR_OFFSETS).ravel() - c0
        fx3 = np.repeat(fx, 3)
        band = max(16, (1 << 18) // (c1 - c0))
        for k0 in range(0, i1 - i0, band):
            k1 = min(k0 + band, i1 - i0)
            top = flat[ya[k0:k1], c0:c1]
            rows = np.subtract(flat[yb[k0:k1], c0:c1], top, dtype=np.float32)
            rows *= fy[k0:k1, None]
            rows += top
            left = np.take(rows, col_a, axis=1)
            right = np.take(rows, col_b, axis=1)
            right -= left
            right *= fx3
            right += left
            planes = right.reshape(k1 - k0, j1 - j0, 3).transpose(2, 0, 1)
            target = dst[:, i0 + k0 : i0 + k1, j0:j1]
            np.subtract(planes[::-1] if rgb else planes, mean_a, out=target)
            if scaled:
                target *= scale_a
    return out
