"""What every ops object offers: the :class:`Ops` protocol (device concerns: streams, events,
memory, staging, readback, frame IO, clocks), counted :class:`Transfers` and host clocks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from vcam.types import Frame, PixelFormat


@dataclass
class Transfers:
    """Host<->device copies, counted (the tests assert one upload, one download and one detection
    readback per frame on the GPU). ``d2h`` counts readbacks; ``d2h_arrays`` the arrays they moved."""

    h2d: int = 0
    d2h: int = 0
    d2h_arrays: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.h2d, self.d2h


class FrameIO(Protocol):
    """A ring of frame slots: raw input in, converted output out, ``ring`` frames in flight."""

    ring: int

    def host_slot(self) -> np.ndarray | None:
        """The host buffer the next :meth:`upload` reads from (pinned on CUDA), so a source may read
        a camera frame straight into it; None where uploads need no staging (the CPU)."""
        ...

    def upload(self, frame: Frame, slot: int, rows: tuple[int, int] | None = None) -> Any:
        """The raw frame of ``slot`` in the ops' memory (on CUDA: one async upload; the current
        stream waits for it). With ``rows`` (y0, y1) only those rows are moved now, and
        :meth:`upload_rest` moves the others."""
        ...

    def upload_rest(self, slot: int) -> None:
        """Move the rows an :meth:`upload` with ``rows`` left (nothing after a whole upload)."""
        ...

    def output(self, slot: int) -> Any:
        """The output buffer of ``slot`` (the converted frame is written here)."""
        ...

    def download(self, slot: int, parts: Sequence[tuple[int, int]] | None = None, *, last: bool = True) -> None:
        """Start moving the output of ``slot`` to the host (on CUDA: async, after the current
        stream's work so far). ``parts``: only these row ranges (y0, y1) of the frame; ``last``:
        this call completes the frame (:meth:`result` waits for every part)."""
        ...

    def result(self, slot: int) -> np.ndarray:
        """Wait for ``slot``'s output on the host; valid until ``ring`` more frames are submitted."""
        ...

    def release(self, slot: int) -> None:
        """Mark ``slot``'s raw input consumed (its next upload may start)."""
        ...


class Clock(Protocol):
    """Stage timings of one frame: ``mark(name)`` after each stage, ``durations()`` once it is done."""

    def start(self) -> None: ...

    def mark(self, name: str) -> None: ...

    def durations(self) -> dict[str, float]: ...


class HostClock:
    """Stage times from the host clock (on CUDA without timing: the time to enqueue each stage)."""

    def __init__(self) -> None:
        self._marks: list[tuple[str, float]] = []

    def start(self) -> None:
        self._marks = [("", time.perf_counter())]

    def mark(self, name: str) -> None:
        self._marks.append((name, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        m = self._marks
        return {m[i][0]: m[i][1] - m[i - 1][1] for i in range(1, len(m))}


class Ops(Protocol):
    """What the pipeline, the detector and the swappers need from a device: memory, streams and
    events, transfers, clocks. Array arguments live where the ops say (``xp`` arrays); the kernels
    (:mod:`vcam.kernels`) take the ops as their first argument and dispatch on ``device``."""

    device: str
    xp: Any
    stream: Any
    transfers: Transfers
    #: True where calls queue work and return before it is done (CUDA), False where they return
    #: with it done (the CPU).
    concurrent: bool

    def activate(self) -> Any:
        """Context manager: array-library calls inside run on the ops' stream (CuPy's current stream)."""
        ...

    def front_stream(self) -> Any:
        """Context manager: inside, the ops' calls queue on the front stream (a frame's convert and
        detection), beside the compute stream where the swap and everything after it run; on the
        CPU it changes nothing."""
        ...

    def back_stream(self) -> Any:
        """Context manager: inside, the ops' calls queue on the back stream (the detection of a
        frame swapped with predicted faces, which nothing waits for): the lowest priority, so it
        fills what the swap leaves of the device; on the CPU it changes nothing."""
        ...

    def event(self) -> Any:
        """A reusable marker that orders one stream after a point of another (None on the CPU)."""
        ...

    def record(self, event: Any) -> None:
        """Mark ``event`` at this point of the current stream."""
        ...

    def wait(self, event: Any) -> None:
        """Make the current stream wait, on the device, until ``event``'s point is passed."""
        ...

    def synchronize(self) -> None:
        """Wait for everything queued on the ops' streams (start-up, tests; never per frame)."""
        ...

    def warmup(self) -> None:
        """Prepare what the first frame would otherwise pay for (kernel builds)."""
        ...

    def empty(self, shape: tuple, dtype: Any = np.uint8) -> Any: ...

    def asarray(self, host: np.ndarray) -> Any: ...

    def to_host(self, array: Any) -> np.ndarray: ...

    def readback(self, arrays: Sequence[Any]) -> list[np.ndarray]: ...

    def readback_async(self, arrays: Sequence[Any]) -> Any:
        """The same without waiting: an object with ``wait() -> host arrays`` (one host wait) and
        ``release()`` (after reading them); the arrays get host buffers of their own, so several
        readbacks may be in flight."""
        ...

    def frame_io(
        self, in_fmt: PixelFormat, width: int, height: int, out_shape: tuple, ring: int, out_fmt: PixelFormat | None = None
    ) -> FrameIO: ...

    def staging(self, shape: tuple, count: int = 8) -> Any:
        """A ring of pinned buffers with ``stage(frame) -> frame`` for a capture thread to copy raw
        frames of ``shape`` into (the upload is then one DMA); None where uploads need no staging."""
        ...

    def clocks(self, names: Sequence[str], ring: int, timing: bool) -> list[Clock]: ...

    def param_record(self) -> Any:
        """A parameter record (:mod:`vcam.kernels.records`: a host block, its device twin, the event
        that says the device has read it); launches read their structs from it under ``recording``."""
        ...

    def put_params(self, device: Any, host: np.ndarray) -> None:
        """Queue the copy of a parameter struct's bytes to their place in a record's device twin."""
        ...
