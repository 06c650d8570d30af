"""GPU twins of :mod:`vcam.align`'s batched warp-crops (kernels/warp.cu).

``crop_from_frame`` stays on the host (the tracker makes it there): the inverse matrices travel by
value in the kernel's parameter block, so a warp costs no host-to-device copy. One launch per 32
faces. Keyword ``stream`` as in :mod:`vcam.gpu.convert`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..align import invert
from ._compile import launch

BLOCK = 256
MAX_FACES = 32
FACES = np.dtype(
    {"names": ["frame_from_crop", "mean", "std", "count"], "formats": [("f8", (MAX_FACES, 6)), ("f4", (3,)), ("f4", (3,)), "i4"]},
    align=True,
)


def faces_param(crop_from_frame: np.ndarray, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)) -> np.ndarray:
    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    p = np.zeros(1, dtype=FACES)
    if mats.shape[0]:
        p["frame_from_crop"][0, : mats.shape[0]] = invert(mats).reshape(-1, 6)
    p["mean"][0] = mean
    p["std"][0] = std
    p["count"][0] = mats.shape[0]
    return p


def _grid(size: int, faces: int) -> tuple[int, int]:
    return ((size * size + BLOCK - 1) // BLOCK, faces)


def warp_crops(frame: Any, crop_from_frame: np.ndarray, size: int, out: Any = None, *, stream: Any = None) -> Any:
    """(H, W, 3) uint8 BGR frame -> (F, size, size, 3) uint8 crops (twin of ``vcam.align.warp_crops``)."""
    import cupy

    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = cupy.empty((mats.shape[0], size, size, 3), dtype=cupy.uint8)
    h, w = frame.shape[:2]
    for s in range(0, mats.shape[0], MAX_FACES):
        m = mats[s : s + MAX_FACES]
        launch("warp", "warp_crops_u8", _grid(size, m.shape[0]), (BLOCK,),
               (frame, np.int32(w), np.int32(h), faces_param(m), np.int32(size), out[s : s + m.shape[0]]), stream)
    return out


def warp_crops_normalized(
    frame: Any,
    crop_from_frame: np.ndarray,
    size: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    rgb: bool = True,
    out: Any = None,
    *,
    stream: Any = None,
) -> Any:
    """Warp straight into a model input (F, 3, size, size) float32/float16 (twin of
    ``vcam.align.warp_crops_normalized``); the dtype follows ``out``."""
    import cupy

    mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
    if out is None:
        out = cupy.empty((mats.shape[0], 3, size, size), dtype=cupy.float32)
    kernel = "warp_crops_norm_f16" if out.dtype == cupy.float16 else "warp_crops_norm_f32"
    h, w = frame.shape[:2]
    for s in range(0, mats.shape[0], MAX_FACES):
        m = mats[s : s + MAX_FACES]
        launch("warp", kernel, _grid(size, m.shape[0]), (BLOCK,),
               (frame, np.int32(w), np.int32(h), faces_param(m, mean, std), np.int32(size), np.int32(bool(rgb)),
                out[s : s + m.shape[0]]), stream)
    return out


def crops_from_planar(output: Any, inputs: Any, count: int, crops: Any, guard: Any, *, stream: Any = None) -> Any:
    """Swapper output (F, 3, S, S) RGB in [0, 1] -> (F, S, S, 3) uint8 BGR ``crops`` for the first
    ``count`` faces; a face with NaN/Inf gets its input crop back and ``guard[f] = 1`` (FP16 guard).

    NumPy twin: :func:`crops_from_planar_reference`."""
    import cupy

    kernel = "crops_from_planar_f16" if output.dtype == cupy.float16 else "crops_from_planar_f32"
    if count > 0:
        launch("warp", kernel, (int(count),), (512,),
               (output, inputs, np.int32(count), np.int32(output.shape[-1]), crops, guard), stream)
    return crops


def crops_from_planar_reference(output: np.ndarray, inputs: np.ndarray, count: int, crops: np.ndarray,
                                guard: np.ndarray) -> np.ndarray:
    """NumPy twin of :func:`crops_from_planar`."""
    for f in range(count):
        o = output[f].astype(np.float32)
        bad = not np.isfinite(o).all()
        src = inputs[f].astype(np.float32) if bad else o
        crops[f] = np.floor(src[::-1].transpose(1, 2, 0) * 255.0 + 0.5).clip(0, 255).astype(np.uint8)
        guard[f] = int(bad)
    return crops
