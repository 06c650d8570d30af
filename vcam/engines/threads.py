"""Thread and stream helpers shared by the torch engine and its compiled-artifact loader.

- :data:`CAPTURE_LOCK`: CUDA graph captures and the first calls of loaded compiled artifacts
  exclude each other, across threads and engines (a first call may synchronise the device, which
  is illegal while any stream captures and would void that capture).
- :class:`CaptureQueue`: an engine's batch sizes captured by a background thread, after the
  start-up's own captures (:data:`vcam.engines.gate.BACKGROUND`).
- :func:`heuristics`: a thread's calls on cuDNN's heuristic algorithms, as a background capture's.
- :func:`private_stream`: a side stream of the calling thread's own for one piece of device work.
- :class:`OnStream`: a cheap, reusable "this stream is current" context for the replay hot path.
- :class:`StreamMap`: CuPy streams (or raw handles) as torch streams, and their replay contexts.

Imports without PyTorch; the stream helpers need it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

try:  # optional: the package imports everywhere
    import torch as _torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    _torch = None  # type: ignore[assignment]

from vcam.engines.gate import BACKGROUND
from vcam.engines.held import QUICK_SWITCHES
from vcam.platform import process

log = logging.getLogger("vcam.engines.torch")

#: See the module docstring. Re-entrant: a capture may run inside an adoption that holds it.
CAPTURE_LOCK = threading.RLock()


#: ``"1"``: the captures of :class:`CaptureQueue` (beside the frames) autotune cuDNN's algorithms as
#: every other call does; by default they take cuDNN's heuristic choice (see :func:`tuning_allowed`).
TUNE_BACKGROUND_ENV = "VCAM_TUNE_BACKGROUND"

#: Whether the calling thread's calls take cuDNN's heuristic algorithms: a :class:`CaptureQueue`'s
#: thread, or one inside :func:`heuristics` (set by that thread only).
_untuned = threading.local()


def tuning_allowed() -> bool:
    """Whether cuDNN may autotune a call made by this thread: not in a background capture thread
    unless ``$VCAM_TUNE_BACKGROUND`` is ``1``. Autotuning a new shape is a pass of timed runs on the
    GPU (0.3 s a size, 2 s for the first) that the frames wait for, the GIL free meanwhile: on the
    H200 (inswapper FP16 stand-in, 20 s live runs, 4 streams) each background size paused the camera
    300-550 ms and the first 10 s published 76-80 % of the frames (p99 72-115 ms) against 93-96 %
    (p99 24-28 ms) on the heuristics, whose calls measured 1.932 / 3.433 / 4.995 / 10.107 ms at batch
    1 / 2 / 4 / 8 against 1.888 / 2.857 / 4.946 / 9.193 ms autotuned (``benchmarks.autotune``). A
    size a frame captures itself is still autotuned, and so are the compiled loader's first calls:
    on their heuristics (an experiment, H100, 2026-12-06, one stream with a compiled cache, 2 runs
    alternated) the camera published 98, 98 % of its frames in the first 10 s, p99 23, 26 ms,
    against 99, 99 %, p99 18, 14 ms autotuned: no gain, so no switch."""
    if getattr(_untuned, "on", False):
        return os.environ.get(TUNE_BACKGROUND_ENV, "0") == "1"
    return True


@contextlib.contextmanager
def heuristics() -> Iterator[None]:
    """The calling thread's calls meanwhile take cuDNN's heuristic algorithms, as a background
    capture's do (:func:`tuning_allowed`): a capture made in the load rather than beside the frames
    (:meth:`vcam.engines.torch.TorchEngine.capture_first`) costs what theirs costs."""
    before = getattr(_untuned, "on", False)
    _untuned.on = True
    try:
        yield
    finally:
        _untuned.on = before


@contextlib.contextmanager
def private_stream(device: Any) -> Iterator[None]:
    """Run the body on a new CUDA stream of ``device`` and wait for it at the end (work that may
    synchronise or tune, kept off the streams other threads use); on the CPU, nothing."""
    if getattr(device, "type", device) != "cuda":
        yield
        return
    side = _torch.cuda.Stream(device)
    with _torch.cuda.stream(side):
        yield
    side.synchronize()


class CaptureQueue:
    """Batch sizes of one engine captured by a background thread (``capture(b, items)``, the
    engine's capture-if-missing, which takes :data:`CAPTURE_LOCK` itself), one at a time, while the
    frames run; a failure leaves that size to be captured when a call needs it, with one log line.
    :meth:`close` stops it between two sizes."""

    def __init__(self, capture: Any, device: Any, name: str) -> None:
        self._capture, self._device, self.name = capture, device, name
        self._todo: list[tuple[int, Any]] = []  # (size, items), in the order they are captured
        self._wanted: list[tuple[int, Any]] = []  # queued sizes a call ran without their graph (want; items: dicts)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._exit_hooked = False  # the at-exit stop is registered once per queue

    def put(self, sizes: Any, items: Any) -> None:
        """Queue ``sizes`` for ``items`` (the thread starts when none runs)."""
        with self._lock:
            if self._closing.is_set():
                return
            self._todo.extend((b, items) for b in sizes)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-graphs", daemon=True)
                self._thread.start()
                # A capture still running when the interpreter ends aborts the process ("terminate
                # called without an active exception"): at exit the queue stops after its current size.
                if not self._exit_hooked:
                    self._exit_hooked = True
                    atexit.register(_close_at_exit, weakref.ref(self))

    def _run(self) -> None:
        _untuned.on = True
        t0 = time.perf_counter()
        done: list[int] = []
        on_device = (
            _torch.cuda.device(self._device) if getattr(self._device, "type", None) == "cuda" else contextlib.nullcontext()
        )
        with on_device:
            while True:
                with self._lock:
                    if not self._todo or self._closing.is_set():
                        self._todo.clear()
                        self._wanted.clear()
                        if done:  # said before the queue reads as idle: a waiter returns after this line
                            what = "%s: batch %s captured in the background in %.2f s"
                            log.info(what, self.name, ",".join(map(str, done)), time.perf_counter() - t0)
                        self._thread = None
                        break
                b = 0  # for the warning, should the pace itself fail
                try:
                    # After the start-up's own captures, one at a time, paced beside the frames; its
                    # Python beside the frame loop hands the GIL back soon (QUICK_SWITCHES).
                    # A size a call runs without goes before the other engines' sizes (urgent).
                    with BACKGROUND.turn(self._closing, self.urgent), QUICK_SWITCHES.held():
                        with self._lock:  # taken after the pace's wait: a size a call wanted meanwhile goes first
                            if not self._todo or self._closing.is_set():
                                continue
                            b, items = self._todo.pop(0)
                            self._wanted = [w for w in self._wanted if w != (b, items)]
                        if not done:
                            t0 = time.perf_counter()  # from the first capture on, not from the wait
                        began = time.perf_counter()
                        self._capture(b, items)
                    done.append(b)
                    # One line each, with when: a pause of the camera can be laid beside it
                    # (benchmarks.first_seconds --phases keeps these lines).
                    took = time.perf_counter() - began
                    what = "%s: batch %d captured in the background, %.0f ms from %.2f s after the start"
                    log.info(what, self.name, b, took * 1e3, process.age() - took)
                except Exception as exc:  # never take the daemon down: captured on first use instead
                    log.warning("%s: capturing batch %d in the background failed (%s: %s)", self.name, b, type(exc).__name__, exc)

    def want(self, b: int, items: Any, *, urgent: bool = True) -> None:
        """A call runs batch ``b`` for ``items`` without its graph, which this queue has not reached
        yet: capture it next. Issue 39 (H100, four streams, 2026-12-06): the frames ran batch 4
        eagerly while the queue captured 2 and 3 first, and each eager call waited out a capture
        (the capture lock), 60-125 ms a time. With ``urgent`` (the call ran eagerly) it also goes
        before the other engines' queues and is not paced (:meth:`urgent`); without (a larger
        graph ran it) it only goes first in this queue: on the H200 the sizes of the rounds that
        replayed batch 4's graph were captured back to back right after the takeover, beside the
        frames. A size being captured now, or not queued, is left."""
        with self._lock:
            pair = (b, items)
            if self._closing.is_set() or pair not in self._todo:
                return
            if urgent and pair not in self._wanted:
                self._wanted.append(pair)
            if self._todo[0] != pair:
                self._todo.remove(pair)
                self._todo.insert(0, pair)

    def urgent(self) -> bool:
        """Whether the next size is one a call runs without its graph (:meth:`want`): the
        background gate gives this queue its next turn before the other engines'."""
        with self._lock:
            return bool(self._todo) and self._todo[0] in self._wanted

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the queued captures; True when none is still running."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not self.running

    def close(self, timeout: float = 30.0) -> None:
        self._closing.set()
        self.wait(timeout)


def _close_at_exit(ref: weakref.ref[CaptureQueue]) -> None:
    queue = ref()
    if queue is not None:
        queue.close(timeout=30.0)


class OnStream:
    """``torch.cuda.StreamContext`` for the hot path: the stream's ids are read once, and entering
    and leaving are one call into torch each (StreamContext looks the device index up in Python on
    every entry: tens of microseconds a replay, twice a frame). For a stream of the current device."""

    __slots__ = ("_ids", "_prev")

    def __init__(self, stream: Any) -> None:
        self._ids = (int(stream.stream_id), int(stream.device_index), int(stream.device_type))
        self._prev: Any = None

    @staticmethod
    def usable() -> bool:
        c = _torch._C
        return hasattr(c, "_cuda_getCurrentStream") and hasattr(c, "_cuda_setStream")

    def __enter__(self) -> None:
        sid, idx, kind = self._ids
        self._prev = _torch._C._cuda_getCurrentStream(idx)
        _torch._C._cuda_setStream(stream_id=sid, device_index=idx, device_type=kind)

    def __exit__(self, *exc: object) -> None:
        sid, idx, kind = self._prev
        _torch._C._cuda_setStream(stream_id=sid, device_index=idx, device_type=kind)


class StreamMap:
    """One engine's view of the callers' streams on its CUDA ``device``: each CuPy stream or raw
    handle wrapped once as a torch stream, and one reusable replay context per stream."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._streams: dict[int, Any] = {}  # raw handle -> torch ExternalStream
        self._contexts: dict[int, tuple[Any, Any]] = {}  # id(CuPy stream) -> (that stream, its context)

    def torch_stream(self, stream: Any, kind: str) -> Any:
        """``stream`` (a torch or CuPy stream, a raw handle, or None: the current stream of the
        ``kind`` of arrays being passed) as a torch stream."""
        torch = _torch
        if isinstance(stream, torch.cuda.Stream):
            return stream
        if stream is None:
            if kind == "torch":
                return torch.cuda.current_stream(self.device)
            import cupy

            ptr = int(cupy.cuda.get_current_stream().ptr)
        else:
            ptr = int(getattr(stream, "ptr", getattr(stream, "cuda_stream", stream)))
        if ptr == 0:
            return torch.cuda.default_stream(self.device)
        s = self._streams.get(ptr)
        if s is None:
            s = self._streams[ptr] = torch.cuda.ExternalStream(ptr, device=self.device)
        return s

    def replay_context(self, stream: Any) -> AbstractContextManager[Any]:
        """A reusable context that makes a CuPy ``stream`` (or None: CuPy's current one) torch's
        current stream for a graph replay (:class:`OnStream`; ``torch.cuda.StreamContext`` where
        torch lacks what it uses): building one costs about 30 us of device-index bookkeeping."""
        key = id(stream) if stream is not None else None
        ctx = self._contexts.get(key) if key is not None else None
        if ctx is None or ctx[0] is not stream:
            target = self.torch_stream(stream, "cupy")
            ctx = (stream, OnStream(target) if OnStream.usable() else _torch.cuda.StreamContext(target))
            if key is not None:
                self._contexts[key] = ctx
        return ctx[1]

    def clear(self) -> None:
        self._streams.clear()
        self._contexts.clear()


__all__ = ["CAPTURE_LOCK", "CaptureQueue", "OnStream", "StreamMap", "private_stream"]
