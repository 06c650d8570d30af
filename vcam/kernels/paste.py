"""Paste kernel (``kernels/paste.cu``): feathered paste-back of swapped crops into the frame.

:func:`paste_back_ref` is the NumPy reference (CPU path and test oracle) of the CUDA launch, with its
arguments; :func:`paste_back` picks one by the ops' device. It touches only
the pixels inside each face's paste box (the bounding box of the crop's corners mapped into the
frame, clipped to the frame), so its cost follows the face size, not the frame size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device
from vcam.kernels.warp import MAX_FACES

#: Mirrors ``struct Paste`` of kernels/paste.cu (passed by value).
PASTE = np.dtype(
    {
        "names": ["crop_from_frame", "box", "count", "box_w", "box_h"],
        "formats": [("f8", (MAX_FACES, 6)), ("i4", (MAX_FACES, 4)), "i4", "i4", "i4"],
    },
    align=True,
)
#: Blocks a face of the paste-back's ``_rec`` twin (a parameter record, :mod:`vcam.kernels.records`),
#: whose grid cannot follow the boxes: 32,768 threads striding over the largest box (a 1080p face's
#: box of 400 x 400 pixels takes five passes; the by-value launch gives every pixel its thread).
PASTE_BLOCKS = 128


def box_mask(size: int, blur: float = 0.3, padding: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)) -> np.ndarray:
    """FaceFusion-style feathered box mask (size, size) float32 in [0, 1].

    A border of ``max(blur_amount // 2, 1)`` pixels is zeroed (``blur_amount = int(size * 0.5 *
    blur)``), or more on a side with ``padding`` (top, right, bottom, left, in percent of the crop),
    then a Gaussian blur of sigma ``blur_amount * 0.25`` softens the edge. Unlike FaceFusion's, the
    outermost ring is zeroed again after the blur, so the paste fades to exactly 0 at the crop's
    edge and leaves no seam.
    """
    import cv2

    blur_amount = int(size * 0.5 * blur)
    border = max(blur_amount // 2, 1)
    top, right, bottom, left = (max(border, int(size * float(p) / 100.0)) for p in padding)
    mask = np.ones((size, size), dtype=np.float32)
    mask[:top, :] = 0
    mask[size - bottom :, :] = 0
    mask[:, :left] = 0
    mask[:, size - right :] = 0
    if blur_amount > 0:
        mask = cv2.GaussianBlur(mask, (0, 0), blur_amount * 0.25)
        mask[0, :] = mask[-1, :] = mask[:, 0] = mask[:, -1] = 0.0
    return np.clip(mask, 0.0, 1.0).astype(np.float32)


def paste_boxes(crop_from_frame: np.ndarray, size: int, height: int, width: int) -> np.ndarray:
    """(F, 4) int32 paste boxes ``x0, y0, x1, y1`` (exclusive end), clipped to the frame.

    The box holds every frame pixel whose centre maps inside the crop's pixel-centre square
    ``[0, size-1]^2``; an empty box has ``x1 <= x0`` or ``y1 <= y0``.
    """
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    boxes = np.zeros((mats.shape[0], 4), dtype=np.int32)
    s = float(size - 1)
    # The crop's corners in the frame, the inverse affine written out in Python floats (this runs
    # every frame, for a few faces: NumPy's per-call cost would be most of it).
    for f, ((a, b, tx), (c, d, ty)) in enumerate(mats.tolist()):
        det = a * d - b * c
        xs, ys = [], []
        for u, v in ((-tx, -ty), (s - tx, -ty), (-tx, s - ty), (s - tx, s - ty)):
            xs.append((d * u - b * v) / det)
            ys.append((a * v - c * u) / det)
        x0 = min(max(math.floor(min(xs)), 0), width)
        y0 = min(max(math.floor(min(ys)), 0), height)
        x1 = min(max(math.ceil(max(xs)) + 1, 0), width)
        y1 = min(max(math.ceil(max(ys)) + 1, 0), height)
        boxes[f] = (x0, y0, x1, y1)
    return boxes


def paste_back_ref(
    frame: np.ndarray,
    crops: np.ndarray,
    crop_from_frame: np.ndarray,
    mask: np.ndarray,
    count: int | None = None,
) -> np.ndarray:
    """Blend ``count`` swapped ``crops`` into ``frame`` in place and return it.

    ``frame``: (H, W, 3) uint8 BGR, modified in place. ``crops``: (F, S, S, 3) uint8 BGR (the
    swapper's output). ``crop_from_frame``: (F, 2, 3). ``mask``: (S, S) float32 in [0, 1] shared by
    every face, or (F, S, S) one per face; zero on its outermost pixels (see :func:`box_mask`). For
    each frame pixel p in the face's paste box:
    ``q = M_f @ p`` (float32); if q lies inside the crop (``0 <= q <= S-1``), ``m = bilinear(mask, q)``,
    ``c = bilinear(crop, q)`` and ``p = floor(p * (1 - m) + c * m + 0.5)``; pixels outside the crop
    stay as they were. Faces are blended in order, so a later face wins where boxes overlap.

    Works on the paste box only: cost follows the face size, not the frame size.
    """
    import cv2

    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    n = mats.shape[0] if count is None else int(count)
    size = crops.shape[1]
    h, w = frame.shape[:2]
    boxes = paste_boxes(mats[:n], size, h, w)
    # OpenCV's warp of a float32 image is plain bilinear in float (no fixed-point coordinates), so
    # sampling the crop and the mask with it computes the definition above: the mask is 0 on its
    # outermost ring, and zero padding outside it makes "outside the crop" weigh 0.
    masks = np.ascontiguousarray(mask, dtype=np.float32)
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for f in range(n):
        x0, y0, x1, y1 = (int(v) for v in boxes[f])
        if x1 <= x0 or y1 <= y0:
            continue
        m = mats[f].copy()  # crop_from_roi: ROI pixel (x, y) is frame pixel (x + x0, y + y0)
        m[:, 2] += m[:, 0] * x0 + m[:, 1] * y0
        bw, bh = x1 - x0, y1 - y0
        a = cv2.warpAffine(
            masks[f] if masks.ndim == 3 else masks, m, (bw, bh), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0
        )
        c = cv2.warpAffine(crops[f].astype(np.float32), m, (bw, bh), flags=flags, borderMode=cv2.BORDER_REPLICATE)
        roi = frame[y0:y1, x0:x1]
        a3 = a[..., None]
        out = roi.astype(np.float32)
        out -= out * a3
        out += c * a3
        out += 0.5
        np.clip(out, 0, 255, out=out)
        roi[...] = out.astype(np.uint8)  # truncation of x + 0.5 >= 0: round half up
    return frame


# -- fronts: one per kernel, by device -------------------------------------------------------------
def paste_back(ops: Any, frame: Any, crops: Any, crop_from_frame: np.ndarray, mask: Any, count: int | None = None) -> Any:
    """Blend ``count`` crops into ``frame`` in place (:func:`paste_back_ref`)."""
    if not on_device(ops):
        return paste_back_ref(frame, crops, crop_from_frame, mask, count)
    # Blend ``count`` crops (F, S, S, 3) into ``frame`` in place; ``mask`` (S, S) or (F, S, S)
    # float32 on the device. One launch per 32 faces; faces blend in order.
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    n = mats.shape[0] if count is None else int(count)
    size = int(crops.shape[1])
    h, w = frame.shape[:2]
    per_face = mask.ndim == 3
    for s in range(0, n, MAX_FACES):  # chunks keep the order: a later chunk blends over an earlier one
        m = mats[s : min(n, s + MAX_FACES)]
        boxes = paste_boxes(m, size, h, w)
        p = np.zeros(1, dtype=PASTE)
        p["crop_from_frame"][0, : m.shape[0]] = m.reshape(-1, 6)
        p["box"][0, : m.shape[0]] = boxes
        p["count"][0] = m.shape[0]
        bw = max(1, int((boxes[:, 2] - boxes[:, 0]).max(initial=0)))
        bh = max(1, int((boxes[:, 3] - boxes[:, 1]).max(initial=0)))
        p["box_w"][0], p["box_h"][0] = bw, bh
        launch(
            ops,
            "paste",
            "paste_back",
            (_grid(bw * bh), m.shape[0]),
            (
                frame,
                np.int32(w),
                np.int32(h),
                crops[s:],
                np.int32(size),
                mask[s:] if per_face else mask,
                np.int32(size * size if per_face else 0),
                p,
            ),
            fixed=(PASTE_BLOCKS, m.shape[0]),
        )
    return frame
