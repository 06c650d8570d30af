"""Detector input kernel (``detector_input_f32`` / ``_f16`` of ``kernels/convert.cu``): square regions
of a BGR frame resampled into one detector batch.

:func:`detector_input_ref` is the NumPy reference (the CPU path and the test oracle) of the CUDA
launch, with its arguments; :func:`detector_input` (``ops`` first) picks one by the ops' device.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device
from vcam.kernels.convert import DETECTOR_MEAN

MAX_REGIONS = 32  # regions per launch (kernels/convert.cu)
#: Mirrors ``struct Regions`` of kernels/convert.cu (passed by value).
REGIONS = np.dtype(
    {
        "names": ["rect", "mean", "scale", "count", "rgb"],
        "formats": [("f8", (MAX_REGIONS, 3)), ("f4", (3,)), ("f4", (3,)), "i4", "i4"],
    },
    align=True,
)


# -- NumPy reference -------------------------------------------------------------------------------
def _sample_axis(start: float, step: float, count: int, n: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps of the first ``count`` outputs along one axis of :func:`detector_input_ref`.

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


def _zero_outside(dst: np.ndarray, i0: int, i1: int, j0: int, j1: int) -> bool:
    """Zero ``dst`` (3, out_h, out_w) outside rows ``i0:i1`` and columns ``j0:j1``, the window that
    samples the frame; False when that window is empty (``dst`` all zero, nothing to sample)."""
    if j0 == j1 or i0 == i1:
        dst[...] = 0
        return False
    dst[:, :i0] = 0
    dst[:, i1:] = 0
    dst[:, i0:i1, :j0] = 0
    dst[:, i0:i1, j1:] = 0
    return True


def detector_input_ref(
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
        if not _zero_outside(dst, i0, i1, j0, j1):
            continue
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


#: What :func:`detector_input_cv` may differ from :func:`detector_input_ref` by, in frame levels
#: (before ``scale``): OpenCV's bilinear quantises sample positions to 1/32 pixel and rounds its
#: uint8 result, so the worst case is a 1/64-pixel shift across a 0-255 edge (4 levels) plus the
#: rounding; on camera frames the mean difference is a small fraction of a level.
CV_TOLERANCE = 4.5


def detector_input_cv(
    frame: np.ndarray,
    rects: np.ndarray,
    size: int,
    mean: tuple[float, float, float] = DETECTOR_MEAN,
    out: np.ndarray | None = None,
    *,
    scale: float | tuple[float, float, float] = 1.0,
    rgb: bool = False,
) -> np.ndarray:
    """:func:`detector_input_ref` through OpenCV (the CPU ops' path): the same sample positions,
    border and padding, one ``cv2.warpAffine`` per region (replicate border inside the half pixel
    the reference clamps, zero padding outside it), within :data:`CV_TOLERANCE` levels of the
    reference and about 5x faster on a 720p frame."""
    import cv2

    rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    if out is None:
        out = np.empty((rects.shape[0], 3, size, size), dtype=np.float32)
    out_h, out_w = int(out.shape[2]), int(out.shape[3])
    if out_h > size or out_w > size:
        raise ValueError(f"detector input window {out_w}x{out_h} is larger than the region size {size}")
    h, w = frame.shape[:2]
    frame = np.ascontiguousarray(frame)
    mean_a = np.asarray(mean, dtype=np.float32)
    scale_a = np.broadcast_to(np.asarray(scale, dtype=np.float32).reshape(-1), (3,))
    order = (2, 1, 0) if rgb else (0, 1, 2)  # output channel c reads frame channel order[c]
    scaled = bool(np.any(scale_a != 1.0))
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for r, (x0, y0, side) in enumerate(rects):
        step = side / size
        j0, j1 = _inside(x0, step, out_w, w)
        i0, i1 = _inside(y0, step, out_h, h)
        dst = out[r]
        if not _zero_outside(dst, i0, i1, j0, j1):
            continue
        # Output pixel (i0 + i, j0 + j) samples x = x0 + (j0 + j + 0.5) * step - 0.5 (likewise y).
        crop = _resize_crop(x0, y0, step, j0, j1, i0, i1, w, h)
        if crop is not None:  # a whole-pixel crop resized (a full scan's letterbox): cv2.resize, 5x faster
            cx, cy, cw, ch = crop
            win = cv2.resize(frame[cy : cy + ch, cx : cx + cw], (j1 - j0, i1 - i0), interpolation=cv2.INTER_LINEAR)
        else:
            m = np.array([[step, 0.0, x0 + (j0 + 0.5) * step - 0.5], [0.0, step, y0 + (i0 + 0.5) * step - 0.5]], dtype=np.float64)
            win = cv2.warpAffine(frame, m, (j1 - j0, i1 - i0), flags=flags, borderMode=cv2.BORDER_REPLICATE)
        for c, src in enumerate(order):
            target = dst[c, i0:i1, j0:j1]
            np.subtract(win[:, :, src], mean_a[src], out=target)
            if scaled:
                target *= scale_a[src]
    return out


def _resize_crop(
    x0: float, y0: float, step: float, j0: int, j1: int, i0: int, i1: int, w: int, h: int
) -> tuple[int, int, int, int] | None:
    """``(x, y, width, height)`` of the frame crop whose ``cv2.resize`` to the window ``j0:j1`` x
    ``i0:i1`` samples where :func:`detector_input_cv` does, or None: resize maps output ``k`` to crop
    pixel ``(k + 0.5) * width / (j1 - j0) - 0.5``, so the crop must start at ``x0 + j0 * step`` and span
    ``(j1 - j0) * step`` whole pixels inside the frame (a downscale: no sample falls past its edges)."""
    if step < 1.0:
        return None
    vals = (x0 + j0 * step, y0 + i0 * step, (j1 - j0) * step, (i1 - i0) * step)
    ints = [round(v) for v in vals]
    if any(abs(v - i) > 1e-6 for v, i in zip(vals, ints)):
        return None
    cx, cy, cw, ch = ints
    if cx < 0 or cy < 0 or cx + cw > w or cy + ch > h:
        return None
    return cx, cy, cw, ch


def _inside(start: float, step: float, count: int, n: int) -> tuple[int, int]:
    """The outputs ``k0:k1`` of :func:`_sample_axis` that sample inside the frame, without the taps."""
    c = start + (np.arange(count, dtype=np.float64) + 0.5) * step - 0.5
    inside = np.flatnonzero((c >= -0.5) & (c <= n - 0.5))
    if inside.size == 0:
        return 0, 0
    return int(inside[0]), int(inside[-1]) + 1


@functools.lru_cache(maxsize=16)
def _regions_template(mean: tuple, scale: tuple, rgb: bool) -> np.ndarray:
    """A :data:`REGIONS` block with a detector's constants (mean, scale, channel order) filled in
    and no region: what every call of that detector copies (packing a struct field by field costs
    more than the kernel's launch)."""
    p = np.zeros(1, dtype=REGIONS)
    p["mean"][0] = mean
    p["scale"][0] = np.broadcast_to(np.asarray(scale, np.float32), (3,))
    p["rgb"][0] = int(rgb)
    p.setflags(write=False)
    return p


# -- fronts: one per kernel, by device -------------------------------------------------------------
def detector_input(
    ops: Any, frame: Any, rects: np.ndarray, size: int, mean: tuple, out: Any = None, *, scale: Any = 1.0, rgb: bool = False
) -> Any:
    """All square regions ``rects`` (R, 3) of a BGR frame into one detector batch (R, 3, h, w),
    float32 or float16 after ``out`` (:func:`detector_input_ref`; on the CPU :func:`detector_input_cv`)."""
    if not on_device(ops):
        return detector_input_cv(frame, rects, size, mean, out=out, scale=scale, rgb=rgb)
    # All square regions of a BGR frame into one detector batch (R, 3, h, w), float32 or float16
    # after ``out``; one launch per 32 regions.
    cp = ops.xp
    rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    if out is None:
        out = cp.empty((rects.shape[0], 3, size, size), dtype=cp.float32)
    out_h, out_w = int(out.shape[2]), int(out.shape[3])
    if out_h > size or out_w > size:
        raise ValueError(f"detector input window {out_w}x{out_h} is larger than the region size {size}")
    kernel = "detector_input_f16" if out.dtype == cp.float16 else "detector_input_f32"
    h, w = frame.shape[:2]
    template = _regions_template(tuple(mean), tuple(np.asarray(scale, np.float32).reshape(-1).tolist()), bool(rgb))
    for start in range(0, rects.shape[0], MAX_REGIONS):
        chunk = rects[start : start + MAX_REGIONS]
        p = template.copy()  # the detector's constants packed once; the regions every call
        p["rect"][0, : chunk.shape[0]] = chunk
        p["count"][0] = chunk.shape[0]
        launch(
            ops,
            "convert",
            kernel,
            (_grid(out_h * out_w), chunk.shape[0]),
            (
                frame,
                np.int32(w),
                np.int32(h),
                p,
                np.int32(size),
                np.int32(out_h),
                np.int32(out_w),
                out[start : start + chunk.shape[0]],
            ),
        )
    return out
