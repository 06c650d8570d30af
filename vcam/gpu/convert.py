"""GPU twins of :mod:`vcam.convert` (kernels/convert.cu): same signatures, CuPy arrays in and out.

Each function takes an optional keyword ``stream`` (a ``cupy.cuda.Stream``; default: the current
stream) and never synchronises. ``out`` buffers are written in full.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..convert import DETECTOR_MEAN
from ..errors import InputError
from ..types import PixelFormat
from ._compile import launch

BLOCK = 256
MAX_REGIONS = 32
REGIONS = np.dtype({"names": ["rect", "mean", "count"], "formats": [("f8", (MAX_REGIONS, 3)), ("f4", (3,)), "i4"]}, align=True)


def _grid(n: int) -> tuple[int]:
    return (max(1, (n + BLOCK - 1) // BLOCK),)


def _mjpeg_to_bgr(data: Any, width: int, height: int, out: Any, stream: Any) -> Any:
    """MJPEG on the GPU with nvJPEG through torchvision; ``data`` is host bytes (uploaded once)."""
    try:
        import torch
        from torchvision.io import decode_jpeg
    except ImportError as exc:
        raise InputError("MJPEG on the GPU needs torchvision", hint="install torchvision or request fourcc = 'YUYV'") from exc
    import cupy

    raw = torch.frombuffer(memoryview(bytes(data) if not isinstance(data, (bytes, bytearray)) else data), dtype=torch.uint8)
    ts = torch.cuda.ExternalStream(stream.ptr) if stream is not None else torch.cuda.current_stream()
    with torch.cuda.stream(ts):
        try:
            img = decode_jpeg(raw, device="cuda")  # (3, H, W) RGB
        except RuntimeError as exc:
            raise InputError("could not decode an MJPEG frame", hint="the camera sent a corrupt JPEG; try fourcc = 'YUYV'") from exc
        if tuple(img.shape[1:]) != (height, width):
            raise InputError(f"MJPEG frame is {img.shape[2]}x{img.shape[1]}, expected {width}x{height}")
        rgb = cupy.from_dlpack(img)
        with (stream or cupy.cuda.get_current_stream()):
            out[...] = rgb[::-1].transpose(1, 2, 0)
    return out


def to_bgr(data: Any, fmt: PixelFormat, width: int, height: int, out: Any = None, *, stream: Any = None) -> Any:
    """Camera frame on the device -> (height, width, 3) uint8 BGR (twin of ``vcam.convert.to_bgr``)."""
    import cupy

    fmt = PixelFormat(fmt)
    if out is None:
        out = cupy.empty((height, width, 3), dtype=cupy.uint8)
    if fmt is PixelFormat.MJPEG:
        return _mjpeg_to_bgr(data, width, height, out, stream)
    a = data
    if a.dtype != cupy.uint8:
        raise InputError(f"frames must be uint8, got {a.dtype}")
    n = width * height
    if fmt in (PixelFormat.BGR, PixelFormat.RGB, PixelFormat.GRAY):
        ch = 1 if (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 1)) else int(a.shape[2])
        if a.size != n * ch or ch not in (1, 3, 4):
            raise InputError(f"unexpected frame shape {a.shape} for {fmt.value} {width}x{height}")
        launch("convert", "bgr_from_packed", _grid(n), (BLOCK,),
               (cupy.ascontiguousarray(a), np.int32(width), np.int32(height), np.int32(ch),
                np.int32(fmt is PixelFormat.RGB), out), stream)
        return out
    if fmt is PixelFormat.YUYV:
        if a.size != n * 2 or width % 2:
            raise InputError(f"unexpected YUYV frame size {a.size} for {width}x{height} (even width needed)")
        launch("convert", "bgr_from_yuyv", _grid(n), (BLOCK,), (a, np.int32(width), np.int32(height), out), stream)
        return out
    if fmt in (PixelFormat.NV12, PixelFormat.I420):
        if width % 2 or height % 2:
            raise InputError(f"{fmt.value} needs an even width and height, got {width}x{height}")
        if a.size != n * 3 // 2:
            raise InputError(f"unexpected {fmt.value} frame size {a.size} for {width}x{height}")
        launch("convert", "bgr_from_420", _grid(n), (BLOCK,),
               (a, np.int32(width), np.int32(height), np.int32(fmt is PixelFormat.NV12), out), stream)
        return out
    raise InputError(f"unsupported input pixel format {fmt}")


def from_bgr(frame: Any, fmt: PixelFormat, out: Any = None, *, stream: Any = None) -> Any:
    """(H, W, 3) uint8 BGR on the device -> RGB/BGR (H, W, 3) or I420/NV12 (H*3/2, W) (twin of
    ``vcam.convert.from_bgr``)."""
    import cupy

    fmt = PixelFormat(fmt)
    h, w = frame.shape[:2]
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        if out is None:
            out = cupy.empty((h, w, 3), dtype=cupy.uint8)
        launch("convert", "bgr_to_packed", _grid(h * w), (BLOCK,),
               (frame, np.int32(w), np.int32(h), np.int32(fmt is PixelFormat.RGB), out), stream)
        return out
    if fmt not in (PixelFormat.I420, PixelFormat.NV12):
        raise ValueError(f"unsupported output pixel format {fmt}")
    if w % 2 or h % 2:
        raise ValueError(f"{fmt.value} needs an even width and height, got {w}x{h}")
    if out is None:
        out = cupy.empty((h * 3 // 2, w), dtype=cupy.uint8)
    launch("convert", "bgr_to_420", _grid((h // 2) * (w // 2)), (BLOCK,),
           (frame, np.int32(w), np.int32(h), np.int32(fmt is PixelFormat.NV12), out), stream)
    return out


def regions_param(rects: np.ndarray, mean: tuple[float, float, float]) -> np.ndarray:
    """The by-value ``Regions`` struct for up to 32 regions (host, a few hundred bytes)."""
    p = np.zeros(1, dtype=REGIONS)
    r = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    p["rect"][0, : r.shape[0]] = r
    p["mean"][0] = mean
    p["count"][0] = r.shape[0]
    return p


def detector_input(
    frame: Any,
    rects: np.ndarray,
    size: int,
    mean: tuple[float, float, float] = DETECTOR_MEAN,
    out: Any = None,
    *,
    stream: Any = None,
) -> Any:
    """All square regions of a BGR frame into one detector batch, one launch per 32 regions (twin of
    ``vcam.convert.detector_input``). ``rects`` stay on the host (passed by value to the kernel);
    ``out`` (R, 3, size, size) float32, or float16 when ``out`` is float16."""
    import cupy

    rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
    if out is None:
        out = cupy.empty((rects.shape[0], 3, size, size), dtype=cupy.float32)
    kernel = "detector_input_f16" if out.dtype == cupy.float16 else "detector_input_f32"
    h, w = frame.shape[:2]
    for start in range(0, rects.shape[0], MAX_REGIONS):
        chunk = rects[start : start + MAX_REGIONS]
        dst = out[start : start + chunk.shape[0]]
        launch("convert", kernel, (_grid(size * size)[0], chunk.shape[0]), (BLOCK,),
               (frame, np.int32(w), np.int32(h), regions_param(chunk, mean), np.int32(size), dst), stream)
    return out
