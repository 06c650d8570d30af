"""The CUDA ops: device memory, streams, events and frame transfers for the kernels of
:mod:`vcam.kernels` (which launch ``kernels/*.cu`` on the ops' current stream).

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
and the collection of the output. Every event a host thread waits on is a blocking-sync event
(:meth:`CudaOps.host_event`): the waiting thread sleeps until the GPU signals it instead of spinning
on a core (the frame thread spun 3.7 ms a frame on a six-face swap's download on the H200, issue 43);
``CudaOps(sleep_waits=False)`` (``$VCAM_SPIN_WAITS=1`` through :func:`vcam.ops.make_ops`) keeps the
spinning events, for the A/B measurement only.

Per-frame parameters (matrices, regions, paste boxes) travel by value in kernel parameter blocks,
so no kernel needs a host-to-device copy; under a parameter record (:mod:`vcam.kernels.records`, the
groundwork of a per-frame CUDA graph, off by default) the face kernels' structs are copied from a
pinned block instead, one small async copy before each kernel. Buffers are allocated at start
(frame ring, engine inputs, crops); a kernel never allocates. Every host<->device copy is counted in ``transfers``.

    host pinned slot --(upload stream, H2D)--> raw device slot --event--> front stream:
    to_bgr -> detector input -> detector (engine) -> [readback of a few KB] -> host track/align
    --event--> compute stream: warp -> swapper (engine) -> crops -> paste-back -> output colour
    --event--> download stream: D2H into the pinned output slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vcam.errors import DeviceError, InputError
from vcam.kernels.build import Kernels
from vcam.kernels.convert import band_bytes, frame_shape
from vcam.kernels.records import RECORD_BYTES, ParamRecord
from vcam.ops.base import Clock, HostClock, Transfers
from vcam.platform.cpu import usable_cores
from vcam.types import Frame, PixelFormat


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
    COPY_PARTS = max(1, min(4, usable_cores() // 2))
    #: Frames smaller than this are copied by the capture thread alone.
    PARALLEL_BYTES = 1 << 20

    def __init__(self, ops: CudaOps, shape: tuple, count: int = 8) -> None:

        self.buffers = [pinned(shape) for _ in range(int(count))]
        self.events = [ops.host_event() for _ in self.buffers]  # the capture thread waits on them
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
        self.free = [ops.host_event() for _ in self.buffers]  # the producer thread waits on them
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
        self.event = ops._events.pop() if ops._events else ops.host_event()
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

        ev, host_ev = ops.event, ops.host_event
        self._up = [host_ev() for _ in range(self.ring)]  # upload of the slot finished (the host waits)
        self._up_band = [ev() for _ in range(self.ring)]  # upload of its first band finished
        self._in_free = [ev() for _ in range(self.ring)]  # compute is done with the raw slot
        self._out_ready = [ev() for _ in range(self.ring)]  # the output of the slot is written
        self._down = [host_ev() for _ in range(self.ring)]  # its download finished (the frame thread waits)
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

    def __init__(self, *, sleep_waits: bool = True) -> None:
        #: Host waits sleep (blocking-sync events) rather than spin (see the module docstring).
        self.sleep_waits = bool(sleep_waits)
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
        self._read_done = self.host_event()
        self._pool: dict[tuple, list[np.ndarray]] = {}  # pinned buffers of released readbacks
        self._events: list[Any] = []
        #: The parameter record launches read their structs from now (None: by value; see
        #: :func:`vcam.kernels.records.recording`).
        self.params: ParamRecord | None = None

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

    def host_event(self) -> Any:
        """A reusable marker a host thread waits on (``synchronize``): blocking-sync, so the waiting
        thread sleeps until the GPU reaches it (:attr:`sleep_waits`; spinning otherwise)."""
        return self.xp.cuda.Event(block=self.sleep_waits, disable_timing=True)

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
    def param_record(self) -> ParamRecord:
        """A parameter record (:mod:`vcam.kernels.records`): a pinned host block, its device twin
        and the host event that says the device has read it."""
        with self.stream:
            device = self.xp.zeros(RECORD_BYTES, dtype=self.xp.uint8)
        return ParamRecord(pinned((RECORD_BYTES,)), device, self.host_event())

    def put_params(self, device: Any, host: np.ndarray) -> None:
        """Queue a parameter struct's copy (pinned host bytes to their device place) on the current
        stream, before the kernel that reads it; captured into a graph, it copies at each replay.
        A raw async copy: CuPy's ``set`` refuses while the stream is capturing ("H2D transfers are
        disallowed", the graph probe on the H100); CUDA captures this one (its source pinned) as a
        copy node of the same bytes."""
        self.transfers.h2d_bytes += host.nbytes
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(device.data.ptr, host.ctypes.data, host.nbytes, rt.memcpyHostToDevice, self.stream.ptr)

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


__all__ = ["CudaOps", "DeviceRing", "pinned"]
