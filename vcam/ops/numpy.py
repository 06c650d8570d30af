"""The CPU ops: the NumPy/OpenCV references themselves (see :mod:`vcam.ops`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from vcam import align
from vcam.align import PlanarAffine
from vcam.kernels import convert
from vcam.kernels import paste as blend
from vcam.ops import Clock, HostClock, Transfers
from vcam.stages import mask as masks
from vcam.types import Frame, PixelFormat


class _HostIO:
    """Frames stay where the source put them; outputs go to a ring of host buffers."""

    def __init__(self, out_shape: tuple, ring: int) -> None:
        self.ring = int(ring)
        self._out = [np.empty(out_shape, np.uint8) for _ in range(self.ring)]

    def host_slot(self) -> np.ndarray | None:
        return None

    def upload(self, frame: Frame, slot: int, rows: tuple[int, int] | None = None) -> Any:
        return np.asarray(frame.data)

    def upload_rest(self, slot: int) -> None:
        pass

    def output(self, slot: int) -> Any:
        return self._out[slot]

    def download(self, slot: int, parts: Sequence[tuple[int, int]] | None = None, *, last: bool = True) -> None:
        pass

    def result(self, slot: int) -> np.ndarray:
        return self._out[slot]

    def release(self, slot: int) -> None:
        pass


class _Done:
    """A readback that is already on the host (see ``CudaOps.readback_async``)."""

    def __init__(self, host: list[np.ndarray]) -> None:
        self.host = host

    def wait(self) -> list[np.ndarray]:
        return self.host

    def ready(self) -> bool:
        return True

    def release(self) -> None:
        self.host = []


class NumpyOps:
    """NumPy arrays in host memory; every method is the reference of the same name, except the two
    colour conversions, which go through OpenCV (``convert.to_bgr_cv`` / ``from_bgr_cv``: within
    one level of the references, several times faster) while the references stay the CUDA oracle."""

    device = "cpu"
    xp = np
    stream = None

    def __init__(self) -> None:
        self.transfers = Transfers()

    #: Work is done when a call returns: a daemon gains nothing by submitting ahead.
    concurrent = False

    def activate(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def front_stream(self) -> contextlib.nullcontext:
        """One thread, one order: nothing to separate on the CPU."""
        return contextlib.nullcontext()

    def back_stream(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def event(self) -> None:
        return None

    def record(self, event: Any) -> None:
        pass

    def wait(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def warmup(self) -> None:
        pass

    def empty(self, shape: tuple, dtype: Any = np.uint8) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def asarray(self, host: np.ndarray) -> np.ndarray:
        return np.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def readback(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return [np.asarray(a) for a in arrays]

    def readback_async(self, arrays: Sequence[Any]) -> _Done:
        """The arrays copied now (engine outputs are reused by the next call)."""
        return _Done([np.array(a, copy=True) for a in arrays])

    def staging(self, shape: tuple, count: int = 8) -> None:
        """No staging on the CPU: frames are read where they are."""
        return None

    def frame_io(
        self, in_fmt: PixelFormat, width: int, height: int, out_shape: tuple, ring: int, out_fmt: PixelFormat | None = None
    ) -> _HostIO:
        return _HostIO(out_shape, ring)

    def clocks(self, names: Sequence[str], ring: int, timing: bool) -> list[Clock]:
        return [HostClock() for _ in range(ring)]

    def to_bgr(
        self, data: Any, fmt: PixelFormat, width: int, height: int, out: Any = None, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """The reference's results through OpenCV (:func:`vcam.kernels.convert.to_bgr_cv`: YUV within one
        level); with ``rows`` (y0, y1) only those rows of ``out`` are written."""
        if rows is None:
            return convert.to_bgr_cv(data, fmt, width, height, out=out)
        y0, y1 = convert.check_rows(fmt, height, rows)
        if out is None:
            out = np.empty((height, width, 3), np.uint8)
        if y1 > y0:  # rows of a C-contiguous frame: a contiguous view, converted in place
            convert.to_bgr_cv(convert.frame_rows(data, fmt, width, height, (y0, y1)), fmt, width, y1 - y0, out=out[y0:y1])
        return out

    def from_bgr(self, frame: Any, fmt: PixelFormat, out: Any = None, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The reference's results through OpenCV (:func:`vcam.kernels.convert.from_bgr_cv`: 4:2:0 within one
        level); with ``rows`` (y0, y1) only the output of those rows is written."""
        if rows is None:
            return convert.from_bgr_cv(frame, fmt, out=out)
        h, w = frame.shape[:2]
        y0, y1 = convert.check_rows(fmt, h, rows)
        if out is None:
            out = np.empty(convert.frame_shape(fmt, w, h), np.uint8)
        if y1 > y0:
            convert.put_rows(convert.from_bgr_cv(frame[y0:y1], fmt), out, fmt, w, h, (y0, y1))
        return out

    def detector_input(
        self, frame: Any, rects: np.ndarray, size: int, mean: tuple, out: Any = None, *, scale: Any = 1.0, rgb: bool = False
    ) -> np.ndarray:
        return convert.detector_input(frame, rects, size, mean, out=out, scale=scale, rgb=rgb)

    def warp_crops(self, frame: Any, crop_from_frame: np.ndarray, size: int, out: Any = None) -> np.ndarray:
        return align.warp_crops(frame, crop_from_frame, size, out=out)

    def warp_crops_normalized(
        self, frame: Any, crop_from_frame: np.ndarray, size: int, mean: tuple, std: tuple, rgb: bool = True, out: Any = None
    ) -> np.ndarray:
        return align.warp_crops_normalized(frame, crop_from_frame, size, mean, std, rgb, out=out)

    def crops_from_planar(
        self,
        output: Any,
        inputs: Any,
        count: int,
        crops: Any,
        guard: Any,
        affine: PlanarAffine = PlanarAffine(),
        rgb: bool = True,
    ) -> np.ndarray:
        return align.crops_from_planar(output, inputs, count, crops, guard, affine, rgb)

    def lab_from_bgr(self, crops: Any, count: int, out: Any) -> np.ndarray:
        from vcam.kernels import color

        return color.lab_from_bgr(crops, count, out)

    def bgr_from_lab(
        self, lab: Any, count: int, out: Any, scale: Any = None, shift: Any = None, membrane: Any = None
    ) -> np.ndarray:
        from vcam.kernels import color

        return color.bgr_from_lab(lab, count, out, scale, shift, membrane)

    def lab_membrane(
        self,
        target: Any,
        source: Any,
        weight: Any,
        count: int,
        out: Any,
        scale: Any = None,
        shift: Any = None,
        sigma: float = 2.0,
        clip: float = 12.0,
    ) -> np.ndarray:
        from vcam.kernels import color

        return color.lab_membrane(target, source, weight, count, out, scale, shift, sigma, clip)

    def paste_back(self, frame: Any, crops: Any, crop_from_frame: np.ndarray, mask: Any, count: int | None = None) -> np.ndarray:
        return blend.paste_back(frame, crops, crop_from_frame, mask, count)

    def polygon_masks(
        self, planes: np.ndarray, feathers: np.ndarray, base: Any, count: int, out: Any, mouth: bool = False
    ) -> np.ndarray:
        return masks.polygon_masks(planes, feathers, base, count, out, mouth)

    def landmark_masks(
        self,
        landmarks: np.ndarray,
        count: int,
        base: Any,
        out: Any,
        face: bool = True,
        mouth: bool = False,
        face_scale: float = 1.0,
        mouth_scale: float = 1.0,
        feather: float = 0.12,
    ) -> np.ndarray:
        return masks.landmark_masks(landmarks, count, base, out, face, mouth, face_scale, mouth_scale, feather)

    def resample_masks(self, src: Any, count: int, out: Any, lo: float = 0.0, hi: float = 1.0, guard: Any = None) -> np.ndarray:
        return masks.resample_masks(src, count, out, lo, hi, guard)

    def parser_select(self, logits: Any, count: int, classes: int, out: Any, guard: Any = None) -> np.ndarray:
        return masks.parser_select(logits, count, classes, out, guard)

    # -- frame enhancer (twins in vcam.stages.upscale) -----------------------------------------------------
    def accumulate_tiles(
        self,
        output: Any,
        count: int,
        origins: np.ndarray,
        flags: np.ndarray,
        weights: Any,
        acc: Any,
        guard: Any,
        frame: Any,
        rgb: bool = True,
    ) -> np.ndarray:
        from vcam.stages import upscale

        return upscale.accumulate_tiles(output, count, origins, flags, weights, acc, guard, frame, rgb)

    def normalize_tiles(self, acc: Any, out: Any) -> np.ndarray:
        from vcam.stages import upscale

        return upscale.normalize_tiles(acc, out)

    def resize_bilinear(self, frame: Any, out: Any) -> np.ndarray:
        """Through OpenCV (within one level of the exact :func:`vcam.stages.upscale.resize_bilinear_exact`)."""
        from vcam.stages import upscale

        return upscale.resize_bilinear(frame, out)


__all__ = ["NumpyOps"]
