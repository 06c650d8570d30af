"""The CPU ops: host memory, no streams (see :mod:`vcam.ops`); the kernels of :mod:`vcam.kernels` run
their NumPy/OpenCV paths on these ops' arrays."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from vcam.kernels.records import ParamRecord
from vcam.ops.base import Clock, HostClock, Transfers
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
    """NumPy arrays in host memory; calls return with their work done (``device = "cpu"``: the kernel
    fronts of :mod:`vcam.kernels` run the NumPy/OpenCV paths)."""

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

    def param_record(self) -> ParamRecord:
        """A record in host memory (the CPU's kernels are the NumPy references: nothing reads it
        through a pointer; a record here only keeps the ops interchangeable)."""
        return ParamRecord.in_host_memory()

    def put_params(self, device: np.ndarray, host: np.ndarray) -> None:
        np.copyto(device, host)

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


__all__ = ["NumpyOps"]
