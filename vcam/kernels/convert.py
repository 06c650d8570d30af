"""Convert kernels (``kernels/convert.cu``): camera formats in, virtual-camera formats out.

:func:`to_bgr_ref` and :func:`from_bgr_ref` are the NumPy references (the test oracle) of the CUDA
launches, with their arguments; the CPU path runs their OpenCV twins (:func:`to_bgr_cv`,
:func:`from_bgr_cv`). :func:`to_bgr` and :func:`from_bgr` (``ops`` first) pick by the ops' device.
The detector input kernel of the same ``.cu`` file is in :mod:`vcam.kernels.detect`.

Colour: BT.601 limited range ("studio swing"), what webcams send for YUYV/NV12/I420 and what
virtual-camera consumers assume. Chroma for 4:2:0 output is the mean of each 2x2 block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.errors import InputError
from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device
from vcam.types import PixelFormat

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
    if fmt is PixelFormat.RGBP:
        return (3, height, width)
    if fmt is PixelFormat.YUYV:
        return (height, width, 2)
    if fmt in (PixelFormat.NV12, PixelFormat.I420):
        return (height * 3 // 2, width)
    return ()


def plane_layout(fmt: PixelFormat, width: int, height: int) -> tuple[tuple[int, int, int], ...]:
    """Where the rows of a ``width`` x ``height`` frame in ``fmt`` (laid out as :func:`frame_shape`)
    lie: per plane, (byte offset, bytes per plane row, frame rows per plane row)."""
    fmt = PixelFormat(fmt)
    n = width * height
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        return ((0, width * 3, 1),)
    if fmt is PixelFormat.GRAY:
        return ((0, width, 1),)
    if fmt is PixelFormat.YUYV:
        return ((0, width * 2, 1),)
    if fmt is PixelFormat.RGBP:
        return ((0, width, 1), (n, width, 1), (2 * n, width, 1))
    if fmt is PixelFormat.NV12:
        return ((0, width, 1), (n, width, 2))
    if fmt is PixelFormat.I420:
        return ((0, width, 1), (n, width // 2, 2), (n + n // 4, width // 2, 2))
    raise InputError(f"{fmt.value} frames have no fixed row layout")


def check_rows(fmt: PixelFormat, height: int, rows: tuple[int, int] | None) -> tuple[int, int]:
    """``rows`` (y0, y1) of a frame of ``height`` rows checked (ValueError: outside the frame, or odd
    bounds in a 4:2:0 format, whose chroma rows cover two frame rows); None is the whole frame."""
    if rows is None:
        return 0, int(height)
    y0, y1 = int(rows[0]), int(rows[1])
    if not 0 <= y0 <= y1 <= height:
        raise ValueError(f"rows {y0}..{y1} are not within a frame of {height} rows")
    if PixelFormat(fmt) in (PixelFormat.NV12, PixelFormat.I420) and (y0 % 2 or y1 % 2):
        raise ValueError(f"{PixelFormat(fmt).value} rows need even bounds, got {y0}..{y1}")
    return y0, y1


def band_bytes(fmt: PixelFormat, width: int, height: int, rows: tuple[int, int]) -> list[tuple[int, int]]:
    """The byte ranges [start, stop) of a frame buffer in ``fmt`` that hold ``rows`` (one per plane)."""
    y0, y1 = check_rows(fmt, height, rows)
    return [(off + (y0 // sub) * size, off + (y1 // sub) * size) for off, size, sub in plane_layout(fmt, width, height)]


def frame_rows(data: np.ndarray, fmt: PixelFormat, width: int, height: int, rows: tuple[int, int]) -> np.ndarray:
    """``rows`` (y0, y1) of a frame as a frame of their own, y1 - y0 rows high in the same format and
    layout (:func:`frame_shape`; a copy for the planar formats). A packed frame of 1 or 4 channels
    (GRAY as (H, W, 1), BGRA) keeps its channels."""
    fmt = PixelFormat(fmt)
    y0, y1 = check_rows(fmt, height, rows)
    a = np.asarray(data)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB, PixelFormat.GRAY, PixelFormat.YUYV):
        per_row = a.size // height
        shape = (y1 - y0, width, per_row // width) if per_row > width else (y1 - y0, width)
        return a.reshape(height, per_row)[y0:y1].reshape(shape)
    flat = a.reshape(-1)
    parts = [flat[lo:hi] for lo, hi in band_bytes(fmt, width, height, (y0, y1))]
    return np.concatenate(parts).reshape(frame_shape(fmt, width, y1 - y0))


def put_rows(band: np.ndarray, out: np.ndarray, fmt: PixelFormat, width: int, height: int, rows: tuple[int, int]) -> np.ndarray:
    """Write ``band``, the output of ``rows`` (y0, y1) as a frame of its own in ``fmt``, into those
    rows of ``out``, a ``width`` x ``height`` frame in ``fmt`` (the inverse of :func:`frame_rows`)."""
    src = np.asarray(band).reshape(-1)
    dst = out.reshape(-1)
    at = 0
    for lo, hi in band_bytes(fmt, width, height, rows):
        dst[lo:hi] = src[at : at + hi - lo]
        at += hi - lo
    return out


def to_bgr_ref(data: np.ndarray, fmt: PixelFormat, width: int, height: int, out: np.ndarray | None = None) -> np.ndarray:
    """Convert a camera frame to (height, width, 3) uint8 BGR, written to ``out`` if given.

    Accepted: BGR, RGB, GRAY (H, W) or (H, W, 1), BGRA/RGBA as (H, W, 4) with fmt BGR/RGB,
    YUYV (H, W, 2) or flat, NV12/I420 (H*3/2, W) or flat (even width and height), RGBP (3, H, W)
    or flat (planar RGB), MJPEG bytes.
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
    if fmt is PixelFormat.RGBP:
        if a.size != 3 * width * height:
            raise InputError(f"unexpected RGBP frame size {a.size} for {width}x{height}")
        out[...] = a.reshape(3, height, width)[::-1].transpose(1, 2, 0)
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


def from_bgr_ref(frame: np.ndarray, fmt: PixelFormat, out: np.ndarray | None = None) -> np.ndarray:
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


# --------------------------------------------------------------------------------------------------
# OpenCV twins for the CPU path (the CPU side of :func:`to_bgr` / :func:`from_bgr`)
#
# The functions above stay the references (the CUDA kernels are checked against them). The twins
# below give the same results through OpenCV's SIMD, multi-threaded colour conversions, which at
# 720p take a fraction of a millisecond where the NumPy arithmetic takes several:
#
# - YUV -> BGR: ``cvtColor`` with COLOR_YUV2BGR_NV12 / _I420 / _YUYV, which is BT.601 limited range
#   with nearest-neighbour chroma (each chroma sample covers its 2x2 or 2x1 block), as here. OpenCV
#   computes in 20-bit fixed point and rounds differently, so results differ from the reference by
#   at most one level. One real difference: OpenCV clamps Y below 16 ("footroom") to 16 before
#   converting, the reference does not; pixels with Y < 16 are recomputed with the reference formula.
# - BGR -> I420/NV12: luma from ``cvtColor(COLOR_BGR2YUV_I420)`` (BT.601 limited range, fixed
#   point, within one level of the reference); OpenCV's chroma samples one pixel of each 2x2 block
#   instead of averaging it, so the chroma planes are computed as in the reference (2x2 means, then
#   the chroma matrix) on the quarter-size image.
# - Channel shuffles (RGB, GRAY, BGRA/RGBA) through ``cvtColor``: exact.
#
# Anything else (MJPEG, unexpected shapes, odd 4:2:0 sizes, non-contiguous ``out``) is handed to
# the reference, so errors and edge cases are the reference's own.

_CV_FOOTROOM = 16  # OpenCV converts max(Y, 16); the reference converts Y as it is
# Recomputing one footroom pixel costs about 7x what the reference spends on a pixel (gather,
# arithmetic, scatter); past this share of the frame the whole frame goes to the reference instead.
_CV_FOOTROOM_SHARE = 1 / 8


def _cv_codes():
    import cv2

    return {
        PixelFormat.YUYV: cv2.COLOR_YUV2BGR_YUYV,
        PixelFormat.NV12: cv2.COLOR_YUV2BGR_NV12,
        PixelFormat.I420: cv2.COLOR_YUV2BGR_I420,
    }


def _writable_bgr(out: np.ndarray | None, height: int, width: int) -> bool:
    return (
        out is None
        or isinstance(out, np.ndarray)
        and out.shape == (height, width, 3)
        and out.dtype == np.uint8
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def _fix_footroom(out: np.ndarray, y: np.ndarray, chroma_at) -> bool:
    """Recompute with the reference formula the pixels of ``out`` whose luma ``y`` (H, W) is below 16.

    ``chroma_at(rows, cols)`` returns the (U, V) samples of those pixels. A frame with no such pixel
    (the usual case: cameras keep Y within 16..235) costs one minimum over the luma plane. Returns
    False, leaving ``out`` alone, when too many pixels need it (the caller then uses the reference).
    """
    if int(y.min()) >= _CV_FOOTROOM:
        return True
    low = y < _CV_FOOTROOM
    count = int(np.count_nonzero(low))
    if count > _CV_FOOTROOM_SHARE * low.size:
        return False
    idx = np.flatnonzero(low)
    rows, cols = np.divmod(idx, y.shape[1])
    u, v = chroma_at(rows, cols)
    fixed = _yuv_to_bgr(y.reshape(-1)[idx], u, v, np.empty((count, 3), np.uint8))
    out.reshape(-1, 3)[idx] = fixed
    return True


def to_bgr_cv(data: np.ndarray, fmt: PixelFormat, width: int, height: int, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`to_bgr_ref` through OpenCV: the same accepted inputs, results and errors; YUV formats
    within one level of the reference (BGR, RGB, GRAY and 4-channel inputs exactly equal)."""
    import cv2

    fmt = PixelFormat(fmt)
    if fmt is PixelFormat.MJPEG or not _writable_bgr(out, height, width):
        return to_bgr_ref(data, fmt, width, height, out=out)
    a = np.asarray(data)
    if a.dtype != np.uint8:
        return to_bgr_ref(data, fmt, width, height, out=out)
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        if a.ndim == 3 and a.shape[:2] == (height, width) and a.shape[2] in (3, 4):
            if fmt is PixelFormat.BGR and a.shape[2] == 3:
                np.copyto(out, a)
            elif fmt is PixelFormat.RGB:
                cv2.cvtColor(a, cv2.COLOR_RGB2BGR if a.shape[2] == 3 else cv2.COLOR_RGBA2BGR, dst=out)
            else:
                cv2.cvtColor(a, cv2.COLOR_BGRA2BGR, dst=out)
            return out
        return to_bgr_ref(a, fmt, width, height, out=out)
    if fmt is PixelFormat.GRAY:
        if a.size == height * width:
            cv2.cvtColor(a.reshape(height, width), cv2.COLOR_GRAY2BGR, dst=out)
            return out
        return to_bgr_ref(a, fmt, width, height, out=out)
    if fmt is PixelFormat.YUYV:
        if width % 2 or a.size != height * width * 2:
            return to_bgr_ref(a, fmt, width, height, out=out)
        packed = a.reshape(height, width, 2)  # Y0 U | Y1 V per pair of pixels
        cv2.cvtColor(packed, _cv_codes()[fmt], dst=out)
        if not _fix_footroom(out, packed[..., 0], lambda r, c: (packed[r, c & ~1, 1], packed[r, c | 1, 1])):
            to_bgr_ref(a, fmt, width, height, out=out)
        return out
    if fmt in (PixelFormat.NV12, PixelFormat.I420):
        if width % 2 or height % 2 or a.size != height * width * 3 // 2:
            return to_bgr_ref(a, fmt, width, height, out=out)  # raises the reference's error for odd sizes
        planes = a.reshape(height * 3 // 2, width)
        cv2.cvtColor(planes, _cv_codes()[fmt], dst=out)
        flat = planes.reshape(-1)
        n, ch, cw = width * height, height // 2, width // 2
        if fmt is PixelFormat.NV12:
            uv = flat[n:].reshape(ch, cw, 2)

            def chroma(r, c):
                return uv[r // 2, c // 2, 0], uv[r // 2, c // 2, 1]
        else:
            u_plane = flat[n : n + ch * cw].reshape(ch, cw)
            v_plane = flat[n + ch * cw :].reshape(ch, cw)

            def chroma(r, c):
                return u_plane[r // 2, c // 2], v_plane[r // 2, c // 2]

        if not _fix_footroom(out, planes[:height], chroma):
            to_bgr_ref(a, fmt, width, height, out=out)
        return out
    return to_bgr_ref(a, fmt, width, height, out=out)


# The reference's chroma matrix padded to three output rows: OpenCV transforms 8-bit 3 -> 3 channels
# in fixed point with SIMD, about 9x faster than its generic 3 -> 2 channel path (within one level).
_UV3_MAT = np.concatenate([_UV_MAT, np.zeros((1, 4), np.float32)])


def from_bgr_cv(frame: np.ndarray, fmt: PixelFormat, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`from_bgr_ref` through OpenCV: the same outputs within one level (luma from OpenCV's fixed
    point; chroma the reference's 2x2 means), the same errors. BGR and RGB are the reference."""
    import cv2

    fmt = PixelFormat(fmt)
    a = np.asarray(frame)
    if fmt not in (PixelFormat.I420, PixelFormat.NV12) or a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        return from_bgr_ref(frame, fmt, out=out)
    h, w = a.shape[:2]
    check_420_output(fmt, w, h)
    shape = (h * 3 // 2, w)
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif not (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == np.uint8 and out.flags.c_contiguous):
        return from_bgr_ref(frame, fmt, out=out)
    cv2.cvtColor(a, cv2.COLOR_BGR2YUV_I420, dst=out)  # the luma plane is kept; the chroma is rewritten below
    small = cv2.resize(a, (w // 2, h // 2), interpolation=cv2.INTER_AREA)  # 2x2 means, rounded
    uv = cv2.transform(small, _UV3_MAT)  # (H/2, W/2, 3): U, V, unused; 3 -> 3 channels is OpenCV's fast path
    flat = out.reshape(-1)
    n = (h // 2) * (w // 2)
    # Channel copies through mixChannels: NumPy's strided copies of these views are ~10x slower.
    if fmt is PixelFormat.I420:
        planes = [flat[w * h : w * h + n].reshape(h // 2, w // 2), flat[w * h + n :].reshape(h // 2, w // 2)]
        cv2.mixChannels([uv], planes, [0, 0, 1, 1])
    else:
        cv2.mixChannels([uv], [flat[w * h :].reshape(h // 2, w // 2, 2)], [0, 0, 1, 1])
    return out


# -- fronts: one per kernel, by device -------------------------------------------------------------
def to_bgr(
    ops: Any, data: Any, fmt: PixelFormat, width: int, height: int, out: Any = None, rows: tuple[int, int] | None = None
) -> Any:
    """Camera frame in the ops' memory -> (height, width, 3) uint8 BGR; with ``rows`` (y0, y1) only
    those rows of ``out`` are written (even bounds for 4:2:0 input, :func:`check_rows`). On the CPU
    through OpenCV (:func:`to_bgr_cv`: YUV within one level of :func:`to_bgr_ref`)."""
    if not on_device(ops):
        if rows is None:
            return to_bgr_cv(data, fmt, width, height, out=out)
        y0, y1 = check_rows(fmt, height, rows)
        if out is None:
            out = np.empty((height, width, 3), np.uint8)
        if y1 > y0:  # rows of a C-contiguous frame: a contiguous view, converted in place
            to_bgr_cv(frame_rows(data, fmt, width, height, (y0, y1)), fmt, width, y1 - y0, out=out[y0:y1])
        return out
    # Camera frame on the device -> (height, width, 3) uint8 BGR; with ``rows`` (y0, y1) only
    # those rows of ``out`` are written (even bounds for 4:2:0 input, see :func:`vcam.kernels.convert.check_rows`).
    cp = ops.xp
    fmt = PixelFormat(fmt)
    if out is None:
        out = cp.empty((height, width, 3), dtype=cp.uint8)
    a = data
    if a.dtype != cp.uint8:
        raise InputError(f"frames must be uint8, got {a.dtype}")
    n = width * height
    y0, y1 = check_rows(fmt, height, rows)
    band = (np.int32(width), np.int32(height), np.int32(y0), np.int32(y1 - y0))
    grid = (_grid(width * (y1 - y0)),)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB, PixelFormat.GRAY):
        ch = 1 if (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 1)) else int(a.shape[2])
        if a.size != n * ch or ch not in (1, 3, 4):
            raise InputError(f"unexpected frame shape {a.shape} for {fmt.value} {width}x{height}")
        launch(ops, "convert", "bgr_from_packed", grid, (a, *band, np.int32(ch), np.int32(fmt is PixelFormat.RGB), out))
    elif fmt is PixelFormat.RGBP:
        if a.size != n * 3:
            raise InputError(f"unexpected RGBP frame size {a.size} for {width}x{height}")
        launch(ops, "convert", "bgr_from_planar", grid, (a, *band, out))
    elif fmt is PixelFormat.YUYV:
        if a.size != n * 2 or width % 2:
            raise InputError(f"unexpected YUYV frame size {a.size} for {width}x{height} (even width needed)")
        launch(ops, "convert", "bgr_from_yuyv", grid, (a, *band, out))
    elif fmt in (PixelFormat.NV12, PixelFormat.I420):
        if width % 2 or height % 2:
            raise InputError(f"{fmt.value} needs an even width and height, got {width}x{height}")
        if a.size != n * 3 // 2:
            raise InputError(f"unexpected {fmt.value} frame size {a.size} for {width}x{height}")
        launch(ops, "convert", "bgr_from_420", grid, (a, *band, np.int32(fmt is PixelFormat.NV12), out))
    else:
        raise InputError(f"unsupported input pixel format {fmt.value} on the GPU", hint="use --device cpu")
    return out


def from_bgr(ops: Any, frame: Any, fmt: PixelFormat, out: Any = None, rows: tuple[int, int] | None = None) -> Any:
    """(H, W, 3) uint8 BGR -> RGB/BGR (H, W, 3) or I420/NV12 (H*3/2, W); with ``rows`` (y0, y1) only
    the output of those rows is written (even bounds for 4:2:0). On the CPU through OpenCV
    (:func:`from_bgr_cv`: 4:2:0 within one level of :func:`from_bgr_ref`)."""
    if not on_device(ops):
        if rows is None:
            return from_bgr_cv(frame, fmt, out=out)
        h, w = frame.shape[:2]
        y0, y1 = check_rows(fmt, h, rows)
        if out is None:
            out = np.empty(frame_shape(fmt, w, h), np.uint8)
        if y1 > y0:
            put_rows(from_bgr_cv(frame[y0:y1], fmt), out, fmt, w, h, (y0, y1))
        return out
    # (H, W, 3) uint8 BGR -> RGB/BGR (H, W, 3) or I420/NV12 (H*3/2, W); with ``rows`` (y0, y1)
    # only the output of those rows is written (even bounds for 4:2:0).
    cp = ops.xp
    fmt = PixelFormat(fmt)
    h, w = frame.shape[:2]
    y0, y1 = check_rows(fmt, h, rows)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        if out is None:
            out = cp.empty((h, w, 3), dtype=cp.uint8)
        launch(
            ops,
            "convert",
            "bgr_to_packed",
            (_grid(w * (y1 - y0)),),
            (frame, np.int32(w), np.int32(h), np.int32(y0), np.int32(y1 - y0), np.int32(fmt is PixelFormat.RGB), out),
        )
        return out
    check_420_output(fmt, w, h)
    if out is None:
        out = cp.empty((h * 3 // 2, w), dtype=cp.uint8)
    launch(
        ops,
        "convert",
        "bgr_to_420",
        (_grid(((y1 - y0) // 2) * (w // 2)),),
        (frame, np.int32(w), np.int32(h), np.int32(y0), np.int32(y1 - y0), np.int32(fmt is PixelFormat.NV12), out),
    )
    return out
