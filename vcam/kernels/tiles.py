"""Tile kernels (``kernels/tiles.cu``) of the frame enhancer: feathered accumulation of upscaled
tiles, their normalisation to uint8, and the bilinear resize the NaN guard falls back to.

Each has a NumPy reference (``<name>_ref``: the test oracle), a CUDA launch with the same arguments
after ``ops``, and a front ``<name>(ops, ...)`` that picks one by the ops' device. The CPU resize goes
through OpenCV (:func:`resize_bilinear_cv`, within one level of the reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.kernels.build import dense, launch, on_device, scratch
from vcam.kernels.build import grid as _grid
from vcam.kernels.warp import bilinear_replicate

MAX_TILES = 64  # tiles per launch of the accumulation (kernels/tiles.cu); larger batches loop
#: Mirrors ``struct Tiles`` of kernels/tiles.cu (passed by value).
TILES = np.dtype(
    {
        "names": ["x", "y", "flags", "count", "box"],
        "formats": [("i4", (MAX_TILES,)), ("i4", (MAX_TILES,)), ("i4", (MAX_TILES,)), "i4", ("i4", (4,))],
    },
    align=True,
)


# -- NumPy references ------------------------------------------------------------------------------
def _samples(frame: np.ndarray, x0: int, y0: int, x1: int, y1: int, sx: float, sy: float) -> np.ndarray:
    """Bilinear samples (y1-y0, x1-x0, 3) float32 of the frame at the output pixels [x0, x1) x [y0, y1)
    of a resize by 1/sx, 1/sy (half-pixel centres, replicate border): the kernels' ``sample_bgr``."""
    xs = (np.arange(x0, x1, dtype=np.float64) + 0.5) * sx - 0.5
    ys = (np.arange(y0, y1, dtype=np.float64) + 0.5) * sy - 0.5
    return bilinear_replicate(frame, *np.meshgrid(xs, ys))


def accumulate_tiles_ref(
    output: np.ndarray,
    count: int,
    origins: np.ndarray,
    flags: np.ndarray,
    weights: np.ndarray,
    acc: np.ndarray,
    guard: np.ndarray,
    frame: np.ndarray,
    rgb: bool = True,
) -> np.ndarray:
    """Add ``count`` upscaled tiles to the accumulator, feathered.

    ``output`` (T, 3, S, S) the model's planar output in [0, 1] (float32 or float16; model channels
    R, G, B when ``rgb``); ``origins`` (T, 2) each tile's top-left (x, y) in output pixels (host);
    ``flags`` (T,) its feathered sides (:func:`vcam.stages.upscale.tile_grid`); ``weights`` (4, S) float32
    (:func:`vcam.stages.upscale.feather_profile`); ``acc`` (sH, sW, 4) float32: weighted B, G, R sums and the weight sum.
    Per tile and covered pixel inside the frame, in tile order:
    ``acc[..., :3] += w * clip(v, 0, 1) * 255`` (BGR) and ``acc[..., 3] += w``, with
    ``w = weights[(flags >> 2) & 3][ty] * weights[flags & 3][tx]``. FP16 guard: a tile holding NaN/Inf
    adds the bilinear resize of ``frame`` (H, W, 3) uint8 BGR instead and ``guard[t]`` grows by one.
    Twin of ``kernels/tiles.cu`` tiles_guard + tiles_accumulate."""
    n = int(count)
    size = int(output.shape[-1])
    out_h, out_w = acc.shape[:2]
    h, w = frame.shape[:2]
    wts = np.asarray(weights, np.float32)
    origins = np.asarray(origins, np.int64).reshape(-1, 2)
    flags = np.asarray(flags, np.int64).reshape(-1)
    for t in range(n):
        o = np.asarray(output[t], np.float32)
        bad = not bool(np.isfinite(o).all())
        guard[t] += int(bad)
        x0, y0 = int(origins[t, 0]), int(origins[t, 1])
        xa, ya, xb, yb = max(x0, 0), max(y0, 0), min(x0 + size, out_w), min(y0 + size, out_h)
        if xb <= xa or yb <= ya:
            continue
        f = int(flags[t])
        wt = wts[(f >> 2) & 3, ya - y0 : yb - y0][:, None] * wts[f & 3, xa - x0 : xb - x0][None, :]
        if bad:
            v = _samples(frame, xa, ya, xb, yb, w / out_w, h / out_h)
        else:
            v = np.clip(o[:, ya - y0 : yb - y0, xa - x0 : xb - x0], 0.0, 1.0) * np.float32(255.0)
            v = (v[::-1] if rgb else v).transpose(1, 2, 0)
        a = acc[ya:yb, xa:xb]
        a[..., :3] += wt[..., None] * v
        a[..., 3] += wt
    return acc


def normalize_tiles_ref(acc: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out`` (sH, sW, 3) uint8 BGR = ``clip(floor(acc[..., :3] / acc[..., 3] + 0.5), 0, 255)`` (0
    where no tile has weight). Twin of ``kernels/tiles.cu`` tiles_normalize."""
    a = np.asarray(acc, np.float32)
    wsum = a[..., 3:]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(wsum > 0, np.floor(a[..., :3] / wsum + np.float32(0.5)), np.float32(0.0))
    out[...] = np.clip(r, 0, 255).astype(np.uint8)
    return out


def resize_bilinear_cv(frame: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``frame`` (H, W, 3) uint8 resized bilinearly (half-pixel centres, replicate border) into
    ``out`` (oH, oW, 3) uint8, by OpenCV: within one level of ``kernels/tiles.cu`` resize_bilinear,
    whose exact twin is :func:`resize_bilinear_ref`."""
    import cv2

    oh, ow = out.shape[:2]
    res = cv2.resize(np.ascontiguousarray(frame), (ow, oh), dst=out, interpolation=cv2.INTER_LINEAR)
    if res is not out:
        out[...] = res
    return out


def resize_bilinear_ref(frame: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The float reference of ``kernels/tiles.cu`` resize_bilinear (slow; tests)."""
    h, w = frame.shape[:2]
    oh, ow = out.shape[:2]
    s = _samples(frame, 0, 0, ow, oh, w / ow, h / oh)
    out[...] = np.clip(np.floor(s + np.float32(0.5)), 0, 255).astype(np.uint8)
    return out


# -- CUDA launches ---------------------------------------------------------------------------------
def _tile_flags(ops: Any) -> Any:
    """The per-launch flags of non-finite tiles (a device buffer kept per device)."""
    return scratch(ops, "tiles.bad", lambda: ops.empty((MAX_TILES,), np.int32))


# -- fronts: one per kernel, by device -------------------------------------------------------------
def accumulate_tiles(
    ops: Any,
    output: Any,
    count: int,
    origins: np.ndarray,
    flags: np.ndarray,
    weights: Any,
    acc: Any,
    guard: Any,
    frame: Any,
    rgb: bool = True,
) -> Any:
    """Add ``count`` upscaled tiles (T, 3, S, S) to ``acc`` (sH, sW, 4) float32, feathered
    (:func:`accumulate_tiles_ref`)."""
    if not on_device(ops):
        return accumulate_tiles_ref(output, count, origins, flags, weights, acc, guard, frame, rgb)
    # Add ``count`` upscaled tiles to ``acc`` (see :func:`vcam.stages.upscale.accumulate_tiles`): per 64
    # tiles one guard launch (a block per tile) and one launch over the tiles' union, each thread
    # summing the tiles that cover its pixel in order (no atomics: the twin's order).
    cp = ops.xp
    n = int(count)
    if n <= 0:
        return acc
    with ops.stream:  # a copy made here is ordered before the kernels
        out = output if output.dtype in (cp.float16, cp.float32) else output.astype(cp.float32)
        out = out if out.flags.c_contiguous else cp.ascontiguousarray(out)
    suffix = "f16" if out.dtype == cp.float16 else "f32"
    size = int(out.shape[-1])
    out_h, out_w = int(acc.shape[0]), int(acc.shape[1])
    h, w = int(frame.shape[0]), int(frame.shape[1])
    origins = np.asarray(origins, np.int64).reshape(-1, 2)
    flags = np.asarray(flags, np.int64).reshape(-1)
    bad = _tile_flags(ops)
    wts = dense(weights, np.float32)
    dst = dense(acc, np.float32)
    for s in range(0, n, MAX_TILES):
        k = min(MAX_TILES, n - s)
        o = origins[s : s + k]
        p = np.zeros(1, dtype=TILES)
        p["x"][0, :k], p["y"][0, :k], p["flags"][0, :k] = o[:, 0], o[:, 1], flags[s : s + k]
        p["count"][0] = k
        x0, y0 = max(0, int(o[:, 0].min())), max(0, int(o[:, 1].min()))
        x1, y1 = min(out_w, int(o[:, 0].max()) + size), min(out_h, int(o[:, 1].max()) + size)
        p["box"][0] = (x0, y0, x1, y1)
        launch(ops, "tiles", f"tiles_guard_{suffix}", (k,), (out[s:], np.int32(k), np.int32(size), bad, guard[s:]), block=(512,))
        if x1 <= x0 or y1 <= y0:
            continue
        launch(
            ops,
            "tiles",
            f"tiles_accumulate_{suffix}",
            (_grid((x1 - x0) * (y1 - y0)),),
            (
                out[s:],
                bad,
                p,
                np.int32(size),
                wts,
                frame,
                np.int32(w),
                np.int32(h),
                np.float64(w / out_w),
                np.float64(h / out_h),
                np.int32(bool(rgb)),
                dst,
                np.int32(out_w),
            ),
        )
    return acc


def normalize_tiles(ops: Any, acc: Any, out: Any) -> Any:
    """``acc`` (sH, sW, 4) float32 -> ``out`` (sH, sW, 3) uint8 BGR (:func:`normalize_tiles_ref`)."""
    if not on_device(ops):
        return normalize_tiles_ref(acc, out)
    # ``acc`` (sH, sW, 4) float32 -> ``out`` (sH, sW, 3) uint8 BGR; one thread per pixel.
    n = int(acc.shape[0]) * int(acc.shape[1])
    launch(ops, "tiles", "tiles_normalize", (_grid(n),), (dense(acc, np.float32), np.int64(n), dense(out, np.uint8)))
    return out


def resize_bilinear(ops: Any, frame: Any, out: Any) -> Any:
    """(H, W, 3) uint8 -> ``out`` (oH, oW, 3) uint8, bilinear (:func:`resize_bilinear_ref`; on the CPU
    through OpenCV, :func:`resize_bilinear_cv`)."""
    if not on_device(ops):
        return resize_bilinear_cv(frame, out)
    # (H, W, 3) uint8 -> ``out`` (oH, oW, 3) uint8, bilinear; one thread per output pixel.
    h, w = int(frame.shape[0]), int(frame.shape[1])
    oh, ow = int(out.shape[0]), int(out.shape[1])
    args = (
        frame,
        np.int32(w),
        np.int32(h),
        np.float64(w / ow),
        np.float64(h / oh),
        dense(out, np.uint8),
        np.int32(ow),
        np.int32(oh),
    )
    launch(ops, "tiles", "resize_bilinear", (_grid(ow * oh),), args)
    return out
