"""The CUDA ops: CuPy kernels from ``kernels/*.cu`` with the NumPy references' signatures.

Streams, ordered by events, never by a host synchronisation:

- the front stream: a frame's first stages (convert, detector input, detector, its readback), so
  that the detection of frame N+1 never queues behind frame N's swap (:meth:`CudaOps.front_stream`);
- the compute stream: everything after the detection (alignment crops, swapper, masks, paste-back,
  enhancers, output colour);
- the back stream, lowest priority: the detection of a frame swapped with predicted faces
  (``[track] predict``), queued after its swap and read at the next frame
  (:meth:`CudaOps.back_stream`), so it fills what the swap leaves of the GPU;
- one copy stream for uploads and one for downloads (an upload never waits behind a download).

The only host waits of a frame are the detection readback (which waits for the front stream only)
and the collection of the output.

Per-frame parameters (matrices, regions, paste boxes) travel by value in kernel parameter blocks,
so no kernel needs a host-to-device copy. Buffers are allocated at start (frame ring, engine
inputs, crops); a kernel never allocates. Every host<->device copy is counted in ``transfers``.

    host pinned slot --(upload stream, H2D)--> raw device slot --event--> front stream:
    to_bgr -> detector input -> detector (engine) -> [readback of a few KB] -> host track/align
    --event--> compute stream: warp -> swapper (engine) -> crops -> paste-back -> output colour
    --event--> download stream: D2H into the pinned output slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vcam.align import PlanarAffine, invert
from vcam.errors import DeviceError, InputError
from vcam.kernels.build import Kernels
from vcam.kernels.convert import band_bytes, check_420_output, check_rows, frame_shape
from vcam.kernels.paste import paste_boxes
from vcam.ops import Clock, HostClock, Transfers
from vcam.types import Frame, PixelFormat

BLOCK = 256
MAX_FACES = 32  # faces per launch (kernels/warp.cu, kernels/paste.cu); larger batches loop
MAX_REGIONS = 32  # regions per launch (kernels/convert.cu)

REGIONS = np.dtype(
    {
        "names": ["rect", "mean", "scale", "count", "rgb"],
        "formats": [("f8", (MAX_REGIONS, 3)), ("f4", (3,)), ("f4", (3,)), "i4", "i4"],
    },
    align=True,
)
FACES = np.dtype(
    {"names": ["frame_from_crop", "mean", "std", "count"], "formats": [("f8", (MAX_FACES, 6)), ("f4", (3,)), ("f4", (3,)), "i4"]},
    align=True,
)
AFFINE = np.dtype(
    {
        "names": ["out_scale", "out_shift", "in_scale", "in_shift"],
        "formats": [("f4", (3,)), ("f4", (3,)), ("f4", (3,)), ("f4", (3,))],
    },
    align=True,
)
MASK_FACES = 8  # faces per launch of the shape kernel (kernels/mask.cu)
SHAPES = np.dtype(
    {
        "names": ["planes", "feather", "count", "mouth"],
        "formats": [("f4", (MASK_FACES, 2, 16, 3)), ("f4", (MASK_FACES, 2)), "i4", "i4"],
    },
    align=True,
)
LM_FACES = 32  # faces per launch of the landmark shape kernel
LANDMARKS = np.dtype(
    {
        "names": [
            "lm",
            "face_local",
            "mouth_local",
            "centre_u",
            "centre_v",
            "face_scale",
            "mouth_scale",
            "feather",
            "across",
            "count",
            "face",
            "mouth",
        ],
        "formats": [
            ("f4", (LM_FACES, 10)),
            ("f4", (16, 3)),
            ("f4", (16, 3)),
            "f4",
            "f4",
            "f4",
            "f4",
            "f4",
            "f4",
            "i4",
            "i4",
            "i4",
        ],
    },
    align=True,
)
MAX_TILES = 64  # tiles per launch of the accumulation (kernels/tiles.cu); larger batches loop
TILES = np.dtype(
    {
        "names": ["x", "y", "flags", "count", "box"],
        "formats": [("i4", (MAX_TILES,)), ("i4", (MAX_TILES,)), ("i4", (MAX_TILES,)), "i4", ("i4", (4,))],
    },
    align=True,
)
PASTE = np.dtype(
    {
        "names": ["crop_from_frame", "box", "count", "box_w", "box_h"],
        "formats": [("f8", (MAX_FACES, 6)), ("i4", (MAX_FACES, 4)), "i4", "i4", "i4"],
    },
    align=True,
)


def _grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


def pinned(shape: tuple, dtype: Any = np.uint8) -> np.ndarray:
    """A page-locked host array (allocated once; async copies need it)."""
    import cupy

    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    mem = cupy.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)


def _get_async(src: Any, stream: Any, out: np.ndarray) -> None:
    """Device -> pinned host copy queued on ``stream`` without waiting for it (CuPy >= 13; an older
    CuPy waits)."""
    try:
        src.get(stream=stream, out=out, blocking=False)
    except TypeError:  # pragma: no cover - CuPy < 13
        src.get(stream=stream, out=out)


class Staging:
    """A ring of pinned host buffers a capture thread copies each frame into (off the frame loop),
    so the upload is one DMA from it with no copy in the frame loop. Each buffer has an event
    recorded after its upload; the capture thread waits on it before writing the buffer again.

    The copy counts in the frame's latency (the clock starts when the source hands the frame over)
    and a 1080p BGR frame from main memory takes about a millisecond on one core, so a large frame
    is copied in :data:`COPY_PARTS` contiguous parts by as many threads (NumPy releases the GIL
    while it copies)."""

    #: Parts a large frame is copied in, by a pool of that many threads (1: the capture thread alone).
    COPY_PARTS = max(1, min(4, (os.cpu_count() or 1) // 2))
    #: Frames smaller than this are copied by the capture thread alone.
    PARALLEL_BYTES = 1 << 20

    def __init__(self, ops: CudaOps, shape: tuple, count: int = 8) -> None:
        import cupy

        self.buffers = [pinned(shape) for _ in range(int(count))]
        self.events = [cupy.cuda.Event(disable_timing=True) for _ in self.buffers]
        self._next = 0
        self._pool: Any = None
        self._ptrs = {b.__array_interface__["data"][0] for b in self.buffers}
        for i, b in enumerate(self.buffers):
            ops._staged[b.__array_interface__["data"][0]] = (self, i)

    def claim(self) -> np.ndarray:
        """The next buffer, once its last upload has left it (call in the capture thread): a source
        with ``read_into`` writes the next frame there itself (:class:`~vcam.stages.capture.CaptureThread`
        ``target``), and :meth:`stage` then has nothing to copy."""
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        self.events[i].synchronize()
        return self.buffers[i]

    def stage(self, frame: Frame) -> Frame:
        """``frame`` with its pixels in a buffer of this ring: as it is when the source wrote them
        into one (:meth:`claim`), else copied into the next (call in the capture thread)."""
        data = np.asarray(frame.data)
        if data.size != self.buffers[0].size:
            return frame  # another geometry: the frame loop copies it
        if data.__array_interface__["data"][0] in self._ptrs:
            return frame
        buf = self.claim()
        self._copy(buf, data)
        return dataclasses.replace(frame, data=buf)

    def _copy(self, buf: np.ndarray, data: np.ndarray) -> None:
        parts = self.COPY_PARTS
        if parts < 2 or data.nbytes < self.PARALLEL_BYTES or not data.flags.c_contiguous:
            np.copyto(buf, data.reshape(buf.shape))
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(parts, thread_name_prefix="vcam-stage")
        src, dst = data.reshape(-1), buf.reshape(-1)
        cuts = [len(src) * k // parts for k in range(parts + 1)]
        jobs = [self._pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
        for job in jobs:
            job.result()

    def close(self) -> None:
        """Stop the copy threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class DeviceRing:
    """Device BGR frames a producer thread writes (the GPU JPEG decoder, :mod:`vcam.stages.decode`) and the
    pipeline reads as they are, with no upload. ``ready[i]``: buffer ``i`` is written (the upload
    waits for it on the device); ``free[i]``: the pipeline's convert has read it (the producer
    waits for it before writing it again). A buffer the pipeline has taken but not yet read is
    never handed out again."""

    def __init__(self, ops: CudaOps, shape: tuple, count: int) -> None:
        import cupy

        self.buffers = [cupy.zeros(shape, dtype=cupy.uint8) for _ in range(int(count))]
        self.ready = [cupy.cuda.Event(disable_timing=True) for _ in self.buffers]
        self.free = [cupy.cuda.Event(disable_timing=True) for _ in self.buffers]
        self._claimed = [False] * len(self.buffers)
        self._lock = threading.Lock()
        self._next = 0
        for i, b in enumerate(self.buffers):
            ops._on_device[b.data.ptr] = (self, i)

    def take(self) -> int:
        """The next buffer to write (producer thread): not claimed, and read by its last reader."""
        n = len(self.buffers)
        with self._lock:
            for _ in range(n):
                i = self._next
                self._next = (i + 1) % n
                if not self._claimed[i]:
                    break
            else:  # pragma: no cover - the ring is larger than what the pipeline holds
                raise RuntimeError("every device frame buffer is in use")
        self.free[i].synchronize()
        return i

    def claim(self, i: int, stream: Any) -> None:
        """The pipeline takes buffer ``i``: ``stream`` waits until it is written."""
        with self._lock:
            self._claimed[i] = True
        stream.wait_event(self.ready[i])

    def release(self, i: int, stream: Any) -> None:
        """The pipeline's reads of buffer ``i`` are queued on ``stream``."""
        self.free[i].record(stream)
        with self._lock:
            self._claimed[i] = False


class _Readback:
    """Small device arrays on their way to pinned host buffers of their own (taken from the ops'
    pool), queued on the current stream; :meth:`wait` waits for them once, :meth:`release` gives
    the buffers back once the caller has read them."""

    def __init__(self, ops: CudaOps, arrays: Sequence[Any]) -> None:
        self.ops = ops
        self.host: list[np.ndarray] = []
        for a in arrays:
            host = ops._take_pinned(tuple(a.shape), a.dtype)
            src = a if a.flags.c_contiguous else ops.xp.ascontiguousarray(a)
            _get_async(src, ops.stream, host)
            ops.transfers.d2h_bytes += host.nbytes
            self.host.append(host)
        ops.transfers.d2h += 1
        ops.transfers.d2h_arrays += len(self.host)
        self.event = ops._events.pop() if ops._events else ops.event()
        self.event.record(ops.stream)

    def wait(self) -> list[np.ndarray]:
        self.event.synchronize()
        return self.host

    def ready(self) -> bool:
        """The copies have landed (no wait)."""
        return bool(self.event.done)

    def release(self) -> None:
        pool = self.ops._pool
        for h in self.host:
            pool.setdefault((h.shape, h.dtype.str), []).append(h)
        self.ops._events.append(self.event)
        self.host = []


def _copy_ranges(dst: int, src: int, ranges: Sequence[tuple[int, int]], kind: int, stream: Any) -> int:
    """One async copy on ``stream`` per byte range [lo, hi) from ``src + lo`` to ``dst + lo`` (the
    same layout both sides: a frame's rows moved between its host and device slots). Returns the
    bytes queued."""
    import cupy

    moved = 0
    for lo, hi in ranges:
        if hi > lo:
            cupy.cuda.runtime.memcpyAsync(dst + lo, src + lo, hi - lo, kind, stream.ptr)
            moved += hi - lo
    return moved


class _DeviceIO:
    """Pinned host slots and device slots per direction, ``ring`` frames in flight (see the module
    docstring). Events order the copy stream against the compute stream. A frame may move in row
    bands (``rows``/``parts``): one async copy per plane and band, from and to the same slots."""

    def __init__(
        self,
        ops: CudaOps,
        in_fmt: PixelFormat,
        width: int,
        height: int,
        out_shape: tuple,
        ring: int,
        out_fmt: PixelFormat | None = None,
    ) -> None:
        import cupy

        if PixelFormat(in_fmt) is PixelFormat.MJPEG:
            raise InputError(
                "the GPU pipeline takes decoded frames, not MJPEG",
                hint="decode them first with vcam.stages.decode.open_decoder (the daemon does)",
            )
        self.ops = ops
        self.ring = int(ring)
        self.in_fmt, self.width, self.height = PixelFormat(in_fmt), int(width), int(height)
        self.out_fmt = None if out_fmt is None else PixelFormat(out_fmt)
        in_shape = frame_shape(self.in_fmt, width, height)
        self._host_in = [pinned(in_shape) for _ in range(self.ring)]
        self._host_out = [pinned(out_shape) for _ in range(self.ring)]
        self._dev_in = [cupy.empty(in_shape, dtype=cupy.uint8) for _ in range(self.ring)]
        self._dev_out = [cupy.empty(out_shape, dtype=cupy.uint8) for _ in range(self.ring)]
        if self.out_fmt in (PixelFormat.I420, PixelFormat.NV12):
            self._out_size = (int(out_shape[1]), int(out_shape[0]) * 2 // 3)
        else:
            self._out_size = (int(out_shape[1]), int(out_shape[0]))

        def ev() -> Any:
            return cupy.cuda.Event(disable_timing=True)

        self._up = [ev() for _ in range(self.ring)]  # upload of the slot finished
        self._up_band = [ev() for _ in range(self.ring)]  # upload of its first band finished
        self._in_free = [ev() for _ in range(self.ring)]  # compute is done with the raw slot
        self._out_ready = [ev() for _ in range(self.ring)]  # the output of the slot is written
        self._down = [ev() for _ in range(self.ring)]  # its download finished
        self._ring_entry: list[tuple[DeviceRing, int] | None] = [None] * self.ring  # a device frame's buffer
        # An upload that moved one band only: (host buffer, staging entry, the band's rows).
        self._partial: list[tuple[np.ndarray, tuple[Staging, int] | None, tuple[int, int]] | None] = [None] * self.ring
        self._next = 0

    def host_slot(self) -> np.ndarray:
        slot = self._next
        self._up[slot].synchronize()  # its previous upload has left the buffer
        return self._host_in[slot]

    def upload(self, frame: Frame, slot: int, rows: tuple[int, int] | None = None) -> Any:
        ops = self.ops
        self._partial[slot] = None
        if self._ring_entry[slot] is not None:  # a frame that never finished (an error): give its buffer back
            self.release(slot)
        if isinstance(frame.data, ops.xp.ndarray):  # already on the device (a decoded JPEG): no copy
            entry = ops._on_device.get(frame.data.data.ptr)
            if entry is not None:
                entry[0].claim(entry[1], ops.stream)
            self._ring_entry[slot] = entry
            self._next = (slot + 1) % self.ring
            return frame.data
        host = self._host_in[slot]
        data = np.asarray(frame.data)
        ptr = data.__array_interface__["data"][0]
        staged = ops._staged.get(ptr) if data.size == host.size else None
        if staged is not None:  # already in pinned memory (a Staging buffer): one DMA from there
            host = data.reshape(host.shape)
        elif ptr != host.__array_interface__["data"][0]:
            self._up[slot].synchronize()
            np.copyto(host, data.reshape(host.shape))
        ops.copy_in.wait_event(self._in_free[slot])
        ops.transfers.h2d += 1
        self._next = (slot + 1) % self.ring
        if rows is None or tuple(rows) == (0, self.height):
            self._copy_in(slot, host, None)
            self._uploaded(slot, staged)
        else:
            self._copy_in(slot, host, [rows])
            self._up_band[slot].record(ops.copy_in)
            ops.stream.wait_event(self._up_band[slot])
            self._partial[slot] = (host, staged, (int(rows[0]), int(rows[1])))
        return self._dev_in[slot]

    def upload_rest(self, slot: int) -> None:
        part, self._partial[slot] = self._partial[slot], None
        if part is None:
            return
        host, staged, (y0, y1) = part
        self._copy_in(slot, host, [(0, y0), (y1, self.height)])
        self._uploaded(slot, staged)

    def _copy_in(self, slot: int, host: np.ndarray, parts: Sequence[tuple[int, int]] | None) -> None:
        import cupy

        ops, dev = self.ops, self._dev_in[slot]
        if parts is None:
            dev.set(host, stream=ops.copy_in)
            ops.transfers.h2d_bytes += host.nbytes
            return
        ranges = [r for rows in parts for r in band_bytes(self.in_fmt, self.width, self.height, rows)]
        kind = cupy.cuda.runtime.memcpyHostToDevice
        ops.transfers.h2d_bytes += _copy_ranges(dev.data.ptr, host.ctypes.data, ranges, kind, ops.copy_in)

    def _uploaded(self, slot: int, staged: tuple[Staging, int] | None) -> None:
        ops = self.ops
        if staged is not None:  # the capture thread may write the buffer again after this
            staged[0].events[staged[1]].record(ops.copy_in)
        self._up[slot].record(ops.copy_in)
        ops.stream.wait_event(self._up[slot])

    def release(self, slot: int) -> None:
        entry, self._ring_entry[slot] = self._ring_entry[slot], None
        if entry is not None:
            entry[0].release(entry[1], self.ops.stream)
            return
        self._in_free[slot].record(self.ops.stream)

    def output(self, slot: int) -> Any:
        self.ops.stream.wait_event(self._down[slot])  # the previous download from this slot has left
        return self._dev_out[slot]

    def download(self, slot: int, parts: Sequence[tuple[int, int]] | None = None, *, last: bool = True) -> None:
        import cupy

        ops = self.ops
        self._out_ready[slot].record(ops.stream)
        ops.copy.wait_event(self._out_ready[slot])
        host, dev = self._host_out[slot], self._dev_out[slot]
        if parts is None:
            _get_async(dev, ops.copy, host)
            ops.transfers.d2h_bytes += host.nbytes
        else:
            if self.out_fmt is None:
                raise ValueError("a download in parts needs the output format (frame_io(..., out_fmt=))")
            ranges = [r for rows in parts for r in band_bytes(self.out_fmt, *self._out_size, rows)]
            kind = cupy.cuda.runtime.memcpyDeviceToHost
            ops.transfers.d2h_bytes += _copy_ranges(host.ctypes.data, dev.data.ptr, ranges, kind, ops.copy)
        if last:
            ops.transfers.d2h += 1
            ops.transfers.d2h_arrays += 1
            self._down[slot].record(ops.copy)

    def result(self, slot: int) -> np.ndarray:
        self._down[slot].synchronize()
        return self._host_out[slot]


class _EventClock:
    """Stage times from CUDA events on the ops' current stream (the front stream for the first
    stages, the compute stream after; device milliseconds, read at collect)."""

    def __init__(self, ops: CudaOps, names: Sequence[str]) -> None:
        import cupy

        self.ops = ops
        self._events = {n: cupy.cuda.Event() for n in ("", *names)}
        self._order: list[str] = []

    def start(self) -> None:
        self._order = [""]
        self._events[""].record(self.ops.stream)

    def mark(self, name: str) -> None:
        self._events[name].record(self.ops.stream)
        self._order.append(name)

    def durations(self) -> dict[str, float]:
        import cupy

        ev, order = self._events, self._order
        return {order[i]: cupy.cuda.get_elapsed_time(ev[order[i - 1]], ev[order[i]]) / 1e3 for i in range(1, len(order))}


class CudaOps:
    """CuPy arrays on the current CUDA device (see the module docstring)."""

    device = "cuda"
    #: Calls queue work and return: the host may prepare the next frame while the GPU runs this one.
    concurrent = True

    def __init__(self) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise DeviceError(
                "the GPU path needs CuPy", hint="pip install 'fastswap-cam[cuda13]' (or [cuda] for CUDA 12), or use --device cpu"
            ) from exc
        self.xp = cupy
        #: The stream the ops' calls queue on now: :attr:`compute`, or :attr:`front` inside
        #: :meth:`front_stream`.
        # Priorities (lower number: higher). The front stream has the device's highest: the host waits
        # for its detection readback, so its small kernels go first when the swap of the previous
        # frame fills the GPU. The compute stream comes next, and the back stream (the detection of
        # a frame swapped with predicted faces, which no one waits for) last: it takes what the swap
        # leaves of the device instead of slowing it down. A CUDA graph replayed on a stream runs at
        # that stream's priority.
        try:
            least, greatest = cupy.cuda.runtime.deviceGetStreamPriorityRange()
        except Exception:  # pragma: no cover - priorities unsupported
            least = greatest = 0
        middle = max(greatest, least - 1)
        self.stream = self.compute = cupy.cuda.Stream(non_blocking=True, priority=middle)
        self.front = cupy.cuda.Stream(non_blocking=True, priority=greatest)
        self.back = cupy.cuda.Stream(non_blocking=True, priority=least)
        self.copy_in = cupy.cuda.Stream(non_blocking=True)
        self.copy = cupy.cuda.Stream(non_blocking=True)  # downloads
        self.transfers = Transfers()
        self.kernels = Kernels()
        self._pinned: dict[tuple, np.ndarray] = {}
        self._staged: dict[int, tuple[Staging, int]] = {}  # pinned staging buffer address -> (ring, index)
        self._on_device: dict[int, tuple[DeviceRing, int]] = {}  # device frame buffer address -> (ring, index)
        self._read_done = cupy.cuda.Event(disable_timing=True)
        self._pool: dict[tuple, list[np.ndarray]] = {}  # pinned buffers of released readbacks
        self._events: list[Any] = []
        self._lm_params: np.ndarray | None = None

    def activate(self) -> Any:
        return self.stream

    def front_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Inside: the ops' calls (kernels, engines, readbacks) queue on the front stream, so a
        frame's detection runs beside the previous frame's swap; order the two with :meth:`event`,
        :meth:`record` and :meth:`wait`."""
        return self._queue_on(self.front)

    def back_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Inside: the ops' calls queue on the back stream (lowest priority): the detection of a
        frame that was swapped with predicted faces runs there, in what the swap leaves of the GPU."""
        return self._queue_on(self.back)

    @contextlib.contextmanager
    def _queue_on(self, stream: Any) -> Iterator[Any]:
        before = self.stream
        self.stream = stream
        try:
            with stream:
                yield stream
        finally:
            self.stream = before

    def event(self) -> Any:
        """A reusable marker between streams (allocate once, at configure)."""
        return self.xp.cuda.Event(disable_timing=True)

    def record(self, event: Any) -> None:
        """Mark ``event`` at this point of the current stream."""
        event.record(self.stream)

    def wait(self, event: Any) -> None:
        """The current stream waits, on the device, for ``event`` (no host wait; an event never
        recorded is passed at once)."""
        self.stream.wait_event(event)

    def warmup(self) -> None:
        """Build every kernel module now (NVRTC, or CuPy's on-disk cache), not on the first frame."""
        for name in ("convert", "warp", "paste", "mask", "color"):
            self.kernels.module(name)

    def synchronize(self) -> None:
        for s in (self.copy_in, self.front, self.compute, self.back, self.copy):
            s.synchronize()

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, shape: tuple, dtype: Any = np.uint8) -> Any:
        with self.stream:
            return self.xp.zeros(shape, dtype=dtype)

    def asarray(self, host: np.ndarray) -> Any:
        with self.stream:
            return self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        """A synchronous copy to the host (off the hot path: a new track's embedding, tests)."""
        self.transfers.d2h += 1
        self.transfers.d2h_arrays += 1
        return array.get(stream=self.stream)

    def readback_async(self, arrays: Sequence[Any]) -> _Readback:
        """Queue small device arrays (detections) to pinned host buffers of their own without
        waiting: ``wait()`` gives them (one host wait), ``release()`` returns the buffers."""
        return _Readback(self, arrays)

    def _take_pinned(self, shape: tuple, dtype: Any) -> np.ndarray:
        free = self._pool.get((shape, np.dtype(dtype).str))
        return free.pop() if free else pinned(shape, dtype)

    def readback(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Small device arrays (detections) to pinned host buffers, then one wait: one readback."""
        out = []
        for i, a in enumerate(arrays):
            key = (i, tuple(a.shape), a.dtype.str)  # by position too: two outputs may share a shape
            host = self._pinned.get(key)
            if host is None:
                host = self._pinned[key] = pinned(a.shape, a.dtype)
            src = a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)
            _get_async(src, self.stream, host)
            self.transfers.d2h_bytes += host.nbytes
            out.append(host)
        self.transfers.d2h += 1
        self.transfers.d2h_arrays += len(out)
        self._read_done.record(self.stream)
        self._read_done.synchronize()
        return out

    def staging(self, shape: tuple, count: int = 8) -> Staging:
        """A :class:`Staging` ring for raw frames of ``shape`` (a capture thread fills it)."""
        return Staging(self, shape, count)

    def device_ring(self, shape: tuple, count: int = 8) -> DeviceRing:
        """A :class:`DeviceRing` of device frames of ``shape`` (a producer thread fills it)."""
        return DeviceRing(self, shape, count)

    def frame_io(
        self, in_fmt: PixelFormat, width: int, height: int, out_shape: tuple, ring: int, out_fmt: PixelFormat | None = None
    ) -> _DeviceIO:
        return _DeviceIO(self, in_fmt, width, height, out_shape, ring, out_fmt)

    def clocks(self, names: Sequence[str], ring: int, timing: bool) -> list[Clock]:
        return [_EventClock(self, names) if timing else HostClock() for _ in range(ring)]

    # -- convert (twins of vcam.kernels.convert) --------------------------------------------------------
    def to_bgr(
        self, data: Any, fmt: PixelFormat, width: int, height: int, out: Any = None, rows: tuple[int, int] | None = None
    ) -> Any:
        """Camera frame on the device -> (height, width, 3) uint8 BGR; with ``rows`` (y0, y1) only
        those rows of ``out`` are written (even bounds for 4:2:0 input, see :func:`vcam.kernels.convert.check_rows`)."""
        cp = self.xp
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
            self._launch("convert", "bgr_from_packed", grid, (a, *band, np.int32(ch), np.int32(fmt is PixelFormat.RGB), out))
        elif fmt is PixelFormat.RGBP:
            if a.size != n * 3:
                raise InputError(f"unexpected RGBP frame size {a.size} for {width}x{height}")
            self._launch("convert", "bgr_from_planar", grid, (a, *band, out))
        elif fmt is PixelFormat.YUYV:
            if a.size != n * 2 or width % 2:
                raise InputError(f"unexpected YUYV frame size {a.size} for {width}x{height} (even width needed)")
            self._launch("convert", "bgr_from_yuyv", grid, (a, *band, out))
        elif fmt in (PixelFormat.NV12, PixelFormat.I420):
            if width % 2 or height % 2:
                raise InputError(f"{fmt.value} needs an even width and height, got {width}x{height}")
            if a.size != n * 3 // 2:
                raise InputError(f"unexpected {fmt.value} frame size {a.size} for {width}x{height}")
            self._launch("convert", "bgr_from_420", grid, (a, *band, np.int32(fmt is PixelFormat.NV12), out))
        else:
            raise InputError(f"unsupported input pixel format {fmt.value} on the GPU", hint="use --device cpu")
        return out

    def from_bgr(self, frame: Any, fmt: PixelFormat, out: Any = None, rows: tuple[int, int] | None = None) -> Any:
        """(H, W, 3) uint8 BGR -> RGB/BGR (H, W, 3) or I420/NV12 (H*3/2, W); with ``rows`` (y0, y1)
        only the output of those rows is written (even bounds for 4:2:0)."""
        cp = self.xp
        fmt = PixelFormat(fmt)
        h, w = frame.shape[:2]
        y0, y1 = check_rows(fmt, h, rows)
        if fmt in (PixelFormat.BGR, PixelFormat.RGB):
            if out is None:
                out = cp.empty((h, w, 3), dtype=cp.uint8)
            self._launch(
                "convert",
                "bgr_to_packed",
                (_grid(w * (y1 - y0)),),
                (frame, np.int32(w), np.int32(h), np.int32(y0), np.int32(y1 - y0), np.int32(fmt is PixelFormat.RGB), out),
            )
            return out
        check_420_output(fmt, w, h)
        if out is None:
            out = cp.empty((h * 3 // 2, w), dtype=cp.uint8)
        self._launch(
            "convert",
            "bgr_to_420",
            (_grid(((y1 - y0) // 2) * (w // 2)),),
            (frame, np.int32(w), np.int32(h), np.int32(y0), np.int32(y1 - y0), np.int32(fmt is PixelFormat.NV12), out),
        )
        return out

    def detector_input(
        self, frame: Any, rects: np.ndarray, size: int, mean: tuple, out: Any = None, *, scale: Any = 1.0, rgb: bool = False
    ) -> Any:
        """All square regions of a BGR frame into one detector batch (R, 3, h, w), float32 or float16
        after ``out``; one launch per 32 regions."""
        cp = self.xp
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
        if out is None:
            out = cp.empty((rects.shape[0], 3, size, size), dtype=cp.float32)
        out_h, out_w = int(out.shape[2]), int(out.shape[3])
        if out_h > size or out_w > size:
            raise ValueError(f"detector input window {out_w}x{out_h} is larger than the region size {size}")
        kernel = "detector_input_f16" if out.dtype == cp.float16 else "detector_input_f32"
        h, w = frame.shape[:2]
        scale3 = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (3,))
        for start in range(0, rects.shape[0], MAX_REGIONS):
            chunk = rects[start : start + MAX_REGIONS]
            p = np.zeros(1, dtype=REGIONS)
            p["rect"][0, : chunk.shape[0]] = chunk
            p["mean"][0] = mean
            p["scale"][0] = scale3
            p["count"][0] = chunk.shape[0]
            p["rgb"][0] = int(bool(rgb))
            self._launch(
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

    # -- align (twins of vcam.align) ------------------------------------------------------------
    @staticmethod
    def _faces(mats: np.ndarray, mean: Any = (0.0, 0.0, 0.0), std: Any = (1.0, 1.0, 1.0)) -> np.ndarray:
        p = np.zeros(1, dtype=FACES)
        if mats.shape[0]:
            p["frame_from_crop"][0, : mats.shape[0]] = invert(mats).reshape(-1, 6)
        p["mean"][0] = mean
        p["std"][0] = std
        p["count"][0] = mats.shape[0]
        return p

    def warp_crops(self, frame: Any, crop_from_frame: np.ndarray, size: int, out: Any = None) -> Any:
        """(H, W, 3) uint8 BGR -> (F, size, size, 3) uint8 crops; one launch per 32 faces."""
        mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
        if out is None:
            out = self.xp.empty((mats.shape[0], size, size, 3), dtype=self.xp.uint8)
        h, w = frame.shape[:2]
        for s in range(0, mats.shape[0], MAX_FACES):
            m = mats[s : s + MAX_FACES]
            self._launch(
                "warp",
                "warp_crops_u8",
                (_grid(size * size), m.shape[0]),
                (frame, np.int32(w), np.int32(h), self._faces(m), np.int32(size), out[s : s + m.shape[0]]),
            )
        return out

    def warp_crops_normalized(
        self, frame: Any, crop_from_frame: np.ndarray, size: int, mean: tuple, std: tuple, rgb: bool = True, out: Any = None
    ) -> Any:
        """Warp straight into a model input (F, 3, size, size) float32/float16 (after ``out``)."""
        cp = self.xp
        mats = np.asarray(crop_from_frame, dtype=np.float64).reshape(-1, 2, 3)
        if out is None:
            out = cp.empty((mats.shape[0], 3, size, size), dtype=cp.float32)
        kernel = "warp_crops_norm_f16" if out.dtype == cp.float16 else "warp_crops_norm_f32"
        h, w = frame.shape[:2]
        for s in range(0, mats.shape[0], MAX_FACES):
            m = mats[s : s + MAX_FACES]
            self._launch(
                "warp",
                kernel,
                (_grid(size * size), m.shape[0]),
                (
                    frame,
                    np.int32(w),
                    np.int32(h),
                    self._faces(m, mean, std),
                    np.int32(size),
                    np.int32(bool(rgb)),
                    out[s : s + m.shape[0]],
                ),
            )
        return out

    def crops_from_planar(
        self,
        output: Any,
        inputs: Any,
        count: int,
        crops: Any,
        guard: Any,
        affine: PlanarAffine = PlanarAffine(),
        rgb: bool = True,
    ) -> Any:
        """Model output (F, 3, S, S) -> uint8 BGR crops with the NaN guard; one block per face."""
        cp = self.xp
        if count <= 0:
            return crops
        kernel = "crops_from_planar_{}_{}".format(*("f16" if a.dtype == cp.float16 else "f32" for a in (output, inputs)))
        p = np.zeros(1, dtype=AFFINE)
        for field in AFFINE.names:
            p[field][0] = getattr(affine, field)
        self._launch(
            "warp",
            kernel,
            (int(count),),
            (
                cp.ascontiguousarray(output),
                inputs,
                np.int32(count),
                np.int32(output.shape[-1]),
                p,
                np.int32(bool(rgb)),
                crops,
                guard,
            ),
            block=(512,),
        )
        return crops

    # -- colour (twins of vcam.kernels.color) -----------------------------------------------------------
    def _color_params(self, ref: Any, scale: Any, shift: Any) -> tuple[Any, Any, np.int32]:
        """(scale, shift, affine flag) kernel arguments: (F, 3) float32 device arrays, or ``ref``
        (any valid device array, never read) twice and 0 when there is no affine."""
        if (scale is None) != (shift is None):
            raise ValueError("give both scale and shift, or neither")
        if scale is None:
            return ref, ref, np.int32(0)
        cp = self.xp
        return (
            cp.ascontiguousarray(scale.reshape(-1, 3), dtype=cp.float32),
            cp.ascontiguousarray(shift.reshape(-1, 3), dtype=cp.float32),
            np.int32(1),
        )

    @staticmethod
    def _dense(out: Any, dtype: Any) -> Any:
        if not out.flags.c_contiguous or out.dtype != np.dtype(dtype):
            raise ValueError(f"the output buffer must be C-contiguous {np.dtype(dtype)}, got {out.dtype}")
        return out

    def lab_from_bgr(self, crops: Any, count: int, out: Any) -> Any:
        """Crops (F, S, S, 3) uint8 BGR -> L*a*b* float32 (F, S, S, 3); one thread per pixel."""
        n = int(count)
        if n <= 0:
            return out
        size = int(crops.shape[1])
        total = n * size * size
        with self.stream:  # a copy made here is ordered before the kernel
            src = self.xp.ascontiguousarray(crops[:n], dtype=self.xp.uint8)
        self._launch("color", "lab_from_bgr", (_grid(total),), (src, np.int32(total), self._dense(out, np.float32)))
        return out

    def bgr_from_lab(self, lab: Any, count: int, out: Any, scale: Any = None, shift: Any = None, membrane: Any = None) -> Any:
        """``lab * scale[f] + shift[f]`` (+ the membrane grid, upsampled) -> uint8 BGR crops; the
        per-face parameters stay on the device (no host wait)."""
        n = int(count)
        if n <= 0:
            return out
        cp = self.xp
        size = int(lab.shape[1])
        with self.stream:  # copies made here are ordered before the kernel
            src = cp.ascontiguousarray(lab[:n], dtype=cp.float32)
            sc, sh, affine = self._color_params(src, scale, shift)
            grid = 0 if membrane is None else int(membrane.shape[1])
            mem = src if membrane is None else cp.ascontiguousarray(membrane, dtype=cp.float32)
        self._launch(
            "color",
            "bgr_from_lab",
            (_grid(n * size * size),),
            (src, np.int32(n), np.int32(size), sc, sh, affine, mem, np.int32(grid), self._dense(out, np.uint8)),
        )
        return out

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
    ) -> Any:
        """The seamless offset grid (F, G, G, 3) float32; one block of 256 threads per face."""
        from vcam.kernels.color import MAX_GRID

        n = int(count)
        if n <= 0:
            return out
        grid = int(out.shape[1])
        if grid < 1 or grid > MAX_GRID:
            raise ValueError(f"membrane grid {grid} is outside 1..{MAX_GRID}")
        cp = self.xp
        size = int(target.shape[1])
        with self.stream:  # copies made here are ordered before the kernel
            t = cp.ascontiguousarray(target[:n], dtype=cp.float32)
            s = cp.ascontiguousarray(source[:n], dtype=cp.float32)
            w = cp.ascontiguousarray(weight[:n], dtype=cp.float32)
            sc, sh, affine = self._color_params(t, scale, shift)
        inv = np.float64(0.5 / float(sigma) ** 2)  # 1 / (2 sigma^2), sigma in cells
        dst = self._dense(out, np.float32)
        args = (t, s, w, np.int32(n), np.int32(size), sc, sh, affine, inv, np.float32(clip), np.int32(grid), dst)
        self._launch("color", "lab_membrane", (n,), args)
        return out

    # -- blend (twin of vcam.kernels.paste.paste_back) --------------------------------------------------
    def paste_back(self, frame: Any, crops: Any, crop_from_frame: np.ndarray, mask: Any, count: int | None = None) -> Any:
        """Blend ``count`` crops (F, S, S, 3) into ``frame`` in place; ``mask`` (S, S) or (F, S, S)
        float32 on the device. One launch per 32 faces; faces blend in order."""
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
            self._launch(
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
            )
        return frame

    # -- mask stage (twins of vcam.stages.mask) --------------------------------------------------------
    def polygon_masks(
        self, planes: np.ndarray, feathers: np.ndarray, base: Any, count: int, out: Any, mouth: bool = False
    ) -> Any:
        """Face/mouth shapes times ``base`` into ``out`` (F, S, S) float32; shapes by value, one launch
        per 8 faces (see :func:`vcam.stages.mask.polygon_masks`)."""
        n = int(count)
        size = int(out.shape[-1])
        per_face = base.ndim == 3
        planes = np.asarray(planes, np.float32)
        feathers = np.asarray(feathers, np.float32)
        for s in range(0, n, MASK_FACES):
            k = min(MASK_FACES, n - s)
            p = np.zeros(1, dtype=SHAPES)
            p["planes"][0, :k] = planes[s : s + k]
            p["feather"][0, :k] = feathers[s : s + k]
            p["count"][0] = k
            p["mouth"][0] = int(bool(mouth))
            self._launch(
                "mask",
                "polygon_masks",
                (_grid(size * size), k),
                (base[s:] if per_face else base, np.int32(size * size if per_face else 0), np.int32(size), p, out[s:]),
            )
        return out

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
    ) -> Any:
        """Face/mouth shapes from 5 crop-space points (F, 5, 2), geometry on the device: the host
        fills one cached parameter block (see :func:`vcam.stages.mask.landmark_masks`); one launch per 32 faces."""
        n = int(count)
        size = int(out.shape[-1])
        per_face = base.ndim == 3
        p = self._lm_params
        if p is None:
            from vcam.stages.mask import _FACE_CENTRE_5, _local_planes

            p = self._lm_params = np.zeros(1, dtype=LANDMARKS)
            p["face_local"][0], p["mouth_local"][0] = _local_planes()
            p["centre_u"][0], p["centre_v"][0] = _FACE_CENTRE_5
            p["across"][0] = 0.35 / 0.6
        p["face_scale"][0], p["mouth_scale"][0], p["feather"][0] = face_scale, mouth_scale, feather
        p["face"][0], p["mouth"][0] = int(bool(face)), int(bool(mouth))
        lms = np.asarray(landmarks, np.float32).reshape(-1, 10)
        for s in range(0, n, LM_FACES):
            k = min(LM_FACES, n - s)
            p["lm"][0, :k] = lms[s : s + k]
            p["count"][0] = k
            self._launch(
                "mask",
                "landmark_masks",
                (_grid(size * size), k),
                (base[s:] if per_face else base, np.int32(size * size if per_face else 0), np.int32(size), p, out[s:]),
            )
        return out

    def resample_masks(self, src: Any, count: int, out: Any, lo: float = 0.0, hi: float = 1.0, guard: Any = None) -> Any:
        """``out *= clip((bilinear(src) - lo) / (hi - lo), 0, 1)`` per face (see :func:`vcam.stages.mask.resample_masks`)."""
        cp = self.xp
        n = int(count)
        if n <= 0:
            return out
        size = int(out.shape[-1])
        hs, ws = int(src.shape[1]), int(src.shape[2])
        src = src if src.flags.c_contiguous else cp.ascontiguousarray(src)
        kernel = "resample_masks_f16" if src.dtype == cp.float16 else "resample_masks_f32"
        if src.dtype not in (cp.float16, cp.float32):
            src = src.astype(cp.float32)
        scale = np.float32(1.0 / (hi - lo)) if hi != lo else np.float32(1.0)
        self._launch(
            "mask",
            kernel,
            (_grid(size * size), n),
            (
                src,
                np.int32(hs),
                np.int32(ws),
                np.float32(hs / size),
                np.float32(ws / size),
                np.int32(n),
                np.int32(size),
                np.float32(lo),
                scale,
                guard if guard is not None else self._no_guard(),
                np.int32(guard is not None),
                out,
            ),
        )
        return out

    def parser_select(self, logits: Any, count: int, classes: int, out: Any, guard: Any = None) -> Any:
        """Arg-max class in the bit set ``classes`` -> 1, else 0 (see :func:`vcam.stages.mask.parser_select`)."""
        cp = self.xp
        n = int(count)
        if n <= 0:
            return out
        logits = logits if logits.flags.c_contiguous else cp.ascontiguousarray(logits)
        kernel = "parser_select_f16" if logits.dtype == cp.float16 else "parser_select_f32"
        hw = int(logits.shape[2]) * int(logits.shape[3])
        self._launch(
            "mask",
            kernel,
            (_grid(hw), n),
            (
                logits,
                np.int32(logits.shape[1]),
                np.int32(hw),
                np.int32(n),
                np.int64(classes),
                guard if guard is not None else self._no_guard(),
                out,
            ),
        )
        return out

    # -- frame enhancer (twins of vcam.stages.upscale) ----------------------------------------------------
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
    ) -> Any:
        """Add ``count`` upscaled tiles to ``acc`` (see :func:`vcam.stages.upscale.accumulate_tiles`): per 64
        tiles one guard launch (a block per tile) and one launch over the tiles' union, each thread
        summing the tiles that cover its pixel in order (no atomics: the twin's order)."""
        cp = self.xp
        n = int(count)
        if n <= 0:
            return acc
        with self.stream:  # a copy made here is ordered before the kernels
            out = output if output.dtype in (cp.float16, cp.float32) else output.astype(cp.float32)
            out = out if out.flags.c_contiguous else cp.ascontiguousarray(out)
        suffix = "f16" if out.dtype == cp.float16 else "f32"
        size = int(out.shape[-1])
        out_h, out_w = int(acc.shape[0]), int(acc.shape[1])
        h, w = int(frame.shape[0]), int(frame.shape[1])
        origins = np.asarray(origins, np.int64).reshape(-1, 2)
        flags = np.asarray(flags, np.int64).reshape(-1)
        bad = self._tile_flags()
        wts = self._dense(weights, np.float32)
        dst = self._dense(acc, np.float32)
        for s in range(0, n, MAX_TILES):
            k = min(MAX_TILES, n - s)
            o = origins[s : s + k]
            p = np.zeros(1, dtype=TILES)
            p["x"][0, :k], p["y"][0, :k], p["flags"][0, :k] = o[:, 0], o[:, 1], flags[s : s + k]
            p["count"][0] = k
            x0, y0 = max(0, int(o[:, 0].min())), max(0, int(o[:, 1].min()))
            x1, y1 = min(out_w, int(o[:, 0].max()) + size), min(out_h, int(o[:, 1].max()) + size)
            p["box"][0] = (x0, y0, x1, y1)
            self._launch(
                "tiles", f"tiles_guard_{suffix}", (k,), (out[s:], np.int32(k), np.int32(size), bad, guard[s:]), block=(512,)
            )
            if x1 <= x0 or y1 <= y0:
                continue
            self._launch(
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

    def normalize_tiles(self, acc: Any, out: Any) -> Any:
        """``acc`` (sH, sW, 4) float32 -> ``out`` (sH, sW, 3) uint8 BGR; one thread per pixel."""
        n = int(acc.shape[0]) * int(acc.shape[1])
        self._launch(
            "tiles", "tiles_normalize", (_grid(n),), (self._dense(acc, np.float32), np.int64(n), self._dense(out, np.uint8))
        )
        return out

    def resize_bilinear(self, frame: Any, out: Any) -> Any:
        """(H, W, 3) uint8 -> ``out`` (oH, oW, 3) uint8, bilinear; one thread per output pixel."""
        h, w = int(frame.shape[0]), int(frame.shape[1])
        oh, ow = int(out.shape[0]), int(out.shape[1])
        args = (
            frame,
            np.int32(w),
            np.int32(h),
            np.float64(w / ow),
            np.float64(h / oh),
            self._dense(out, np.uint8),
            np.int32(ow),
            np.int32(oh),
        )
        self._launch("tiles", "resize_bilinear", (_grid(ow * oh),), args)
        return out

    def _tile_flags(self) -> Any:
        if getattr(self, "_tile_bad", None) is None:
            self._tile_bad = self.empty((MAX_TILES,), np.int32)
        return self._tile_bad

    def _no_guard(self) -> Any:
        if getattr(self, "_dummy_guard", None) is None:
            self._dummy_guard = self.empty((MAX_FACES,), np.int32)
        return self._dummy_guard

    def _launch(self, module: str, kernel: str, grid: tuple, args: tuple, block: tuple = (BLOCK,)) -> None:
        self.kernels.launch(module, kernel, grid, block, args, self.stream)


__all__ = ["CudaOps", "DeviceRing", "pinned"]
