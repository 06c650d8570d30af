"""GPU twin of :func:`vcam.blend.paste_back` (kernels/paste.cu).

Paste boxes are computed on the host from the matrices (a few corner transforms) and travel with the
matrices by value in the kernel's parameter block; the grid is (tiles of the largest box, faces), so
the cost follows the faces, not the frame. One launch per 32 faces; faces blend in order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..blend import paste_boxes
from ._compile import launch

BLOCK = 256
MAX_FACES = 32
PASTE = np.dtype(
    {"names": ["crop_from_frame", "box", "count", "box_w", "box_h"],
     "formats": [("f8", (MAX_FACES, 6)), ("i4", (MAX_FACES, 4)), "i4", "i4", "i4"]},
    align=True,
)


def paste_param(mats: np.ndarray, size: int, height: int, width: int) -> np.ndarray:
    boxes = paste_boxes(mats, size, height, width)
    p = np.zeros(1, dtype=PASTE)
    n = mats.shape[0]
    p["crop_from_frame"][0, :n] = mats.reshape(-1, 6)
    p["box"][0, :n] = boxes
    p["count"][0] = n
    p["box_w"][0] = max(1, int((boxes[:, 2] - boxes[:, 0]).max(initial=0)))
    p["box_h"][0] = max(1, int((boxes[:, 3] - boxes[:, 1]).max(initial=0)))
    return p


def paste_back(frame: Any, crops: Any, crop_from_frame: np.ndarray, mask: Any, count: int | None = None, *,
               stream: Any = None) -> Any:
    """Blend ``count`` crops (F, S, S, 3) uint8 into ``frame`` (H, W, 3) uint8 in place; ``mask``
    (S, S) float32 on the device. Twin of ``vcam.blend.paste_back``."""
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    n = mats.shape[0] if count is None else int(count)
    size = int(crops.shape[1])
    h, w = frame.shape[:2]
    if n > MAX_FACES:
        # Chunks keep the in-order semantics: a later chunk blends over an earlier one.
        for s in range(0, n, MAX_FACES):
            paste_back(frame, crops[s:], mats[s : min(n, s + MAX_FACES)], mask, None, stream=stream)
        return frame
    if n <= 0:
        return frame
    p = paste_param(mats[:n], size, h, w)
    tiles = (int(p["box_w"][0]) * int(p["box_h"][0]) + BLOCK - 1) // BLOCK
    launch("paste", "paste_back", (tiles, n), (BLOCK,),
           (frame, np.int32(w), np.int32(h), crops, np.int32(size), mask, p), stream)
    return frame
