"""The live preview: the published picture, small (``WIDTH`` px wide), at most ``FPS`` frames a
second, as JPEG, for the panel's ``<img>``.

The frame loop calls :meth:`PreviewTap.offer` after each publish. While nobody watches a stream that
is one dictionary lookup. While someone does, at most ``FPS`` times a second and only when the
encoder is idle (at most one frame in flight), the frame is handed to the encoder thread, which cuts
it down to about ``WIDTH`` px by taking every n-th pixel of each plane in its own format (OpenCV's
nearest-neighbour resize), converts, scales and JPEG-encodes it. The frame loop never waits for the
encoder, a reader or a lock held by either, and copies nothing: a published frame lives in the
pipeline's output ring, valid until ``ring`` more frames are begun, so the offer carries the
stream's count of frames begun (``counter``) and how many more may begin before that buffer is
written again (``slack``); a picture the encoder finds was overwritten while it read it is dropped
(``stale``), never shown torn. Without a counter the frame is cut down on the frame thread instead
(a copy of ~100 kB).

Before/after (the ``before_after`` setting, the panel's only: :mod:`vcam.control.commands`): while a
stream is watched with it on, the frame loop hands each input frame, before the pipeline touches it,
to :meth:`PreviewTap.keep_before`, which keeps a shrunk copy (every n-th pixel, as above: tens of
microseconds) of the last few by frame number; only frames begun shortly before the next preview
frame is due are kept (the lead follows the frames' time in flight: 1.5 times the last one seen,
doubled when a frame was kept too late), so a few frames a second pay for it. When the published
frame of that number is taken for the preview, the encoder puts the two side by side (the camera
as it came on the left, mirrored as the output is, the published picture on the right) in one JPEG
twice as wide. The before frame goes nowhere else: the output, a recording and the direct source get the published frame only.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from vcam.types import PixelFormat

log = logging.getLogger(__name__)

WIDTH = 320
FPS = 5.0
QUALITY = 70
#: Input frames kept per stream for before/after: enough for the frames in flight between a frame's
#: begin and its publish (the rounds overlap by one on the GPU).
BEFORE_KEPT = 4
#: The shortest lead (seconds before a preview frame is due) from which input frames are kept.
MIN_LEAD = 0.01


def _resize(plane: np.ndarray, width: int, height: int) -> np.ndarray:
    import cv2

    return cv2.resize(plane, (width, height), interpolation=cv2.INTER_NEAREST)


def shrink(data: np.ndarray, fmt: PixelFormat, target: int = WIDTH) -> tuple[np.ndarray, int, int] | None:
    """``data`` (a published frame in ``fmt``) cut to about ``target`` px wide in the same format by
    taking every n-th pixel: (small frame, width, height); None for a format the preview cannot read."""
    fmt = PixelFormat(fmt)
    a = np.asarray(data)
    if fmt in (PixelFormat.I420, PixelFormat.NV12):
        h, w = a.shape[0] * 2 // 3, a.shape[1]
    elif fmt in (PixelFormat.BGR, PixelFormat.RGB, PixelFormat.GRAY):
        h, w = a.shape[:2]
    else:
        return None
    step = max(1, w // target)
    sw, sh = max(2, (w // step) & ~1), max(2, (h // step) & ~1)
    if step == 1 and (sw, sh) == (w, h):
        return a.copy(), w, h
    if fmt is PixelFormat.I420:
        flat = a.reshape(-1)
        y = flat[: h * w].reshape(h, w)
        u = flat[h * w : h * w * 5 // 4].reshape(h // 2, w // 2)
        v = flat[h * w * 5 // 4 : h * w * 3 // 2].reshape(h // 2, w // 2)
        parts = [
            _resize(y, sw, sh).reshape(-1),
            _resize(u, sw // 2, sh // 2).reshape(-1),
            _resize(v, sw // 2, sh // 2).reshape(-1),
        ]
        return np.concatenate(parts).reshape(sh * 3 // 2, sw), sw, sh
    if fmt is PixelFormat.NV12:
        y = a[:h]
        uv = np.ascontiguousarray(a[h : h + h // 2]).reshape(h // 2, w // 2, 2)
        return np.concatenate([_resize(y, sw, sh), _resize(uv, sw // 2, sh // 2).reshape(sh // 2, sw)]), sw, sh
    return _resize(np.ascontiguousarray(a), sw, sh), sw, sh


def _scaled(small: np.ndarray, fmt: PixelFormat, width: int, height: int, target: int) -> np.ndarray:
    import cv2

    from vcam.kernels.convert import to_bgr_cv

    bgr = small if PixelFormat(fmt) is PixelFormat.BGR and small.shape == (height, width, 3) else None
    if bgr is None:
        bgr = to_bgr_cv(small, fmt, width, height)
    if width != target:
        bgr = cv2.resize(bgr, (target, max(2, round(height * target / width))), interpolation=cv2.INTER_AREA)
    return bgr


def encode(
    small: np.ndarray, fmt: PixelFormat, width: int, height: int, target: int = WIDTH, before: Any = None, quality: int = QUALITY
) -> bytes:
    """A shrunk frame -> JPEG bytes ``target`` px wide (the encoder thread's work). ``before``: a
    kept input frame ``(seq, (shrunk, w, h), format, mirrored, when kept)`` put on its left (before/after: the
    JPEG is twice as wide); ``quality``: the JPEG quality (the OBS source's is higher)."""
    import cv2

    bgr = _scaled(small, fmt, width, height, target)
    if before is not None:
        _seq, (b_small, b_w, b_h), b_fmt, mirrored, _kept_at = before
        left = _scaled(b_small, b_fmt, b_w, b_h, target)
        if left.shape[0] != bgr.shape[0]:  # another aspect (an early swap's frames): the right height
            left = cv2.resize(left, (target, bgr.shape[0]), interpolation=cv2.INTER_AREA)
        bgr = np.hstack([left[:, ::-1] if mirrored else left, bgr])
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return buf.tobytes() if ok else b""


class Wakeup:
    """A wake-up flag like :class:`threading.Event` whose :meth:`set`, called on the frame thread,
    never waits: an Event's set takes the lock its waiter holds while it wakes, so a woken encoder
    thread that the OS puts aside there (a busy machine) would hold up the frame loop.
    :class:`queue.SimpleQueue`'s ``put`` takes no lock a waiter can hold. One waiter."""

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._tokens.put(None)

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Until set or ``timeout`` seconds; whether it is set."""
        if self._set:
            return True
        with contextlib.suppress(queue.Empty):
            self._tokens.get(timeout=timeout)
        return self._set

    def clear(self) -> None:
        self._set = False
        with contextlib.suppress(queue.Empty):
            while True:
                self._tokens.get_nowait()


class EncoderThread:
    """The thread an encoding tap runs its ``_run`` loop on (woken by ``_wake``, ended by ``_stop``),
    started and stopped once: the preview's and the OBS source's."""

    thread_name = "vcam-encoder"
    _wake: Wakeup
    _stop: threading.Event
    _thread: threading.Thread | None
    _lock: threading.Lock
    _watchers: dict[str, int]  # stream -> readers; read by the frame loop without a lock

    def watch(self, stream: str) -> None:
        """One more reader of ``stream`` (:meth:`_watched` runs under the lock)."""
        with self._lock:
            self._watchers[stream] = self._watchers.get(stream, 0) + 1
            self._watched(stream)

    def unwatch(self, stream: str) -> None:
        """One reader of ``stream`` fewer (:meth:`_unwatched` runs under the lock after the last)."""
        with self._lock:
            left = self._watchers.get(stream, 0) - 1
            if left > 0:
                self._watchers[stream] = left
            else:
                self._watchers.pop(stream, None)
                self._unwatched(stream)

    def _watched(self, stream: str) -> None:
        pass

    def _unwatched(self, stream: str) -> None:
        pass

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None


class PreviewTap(EncoderThread):
    """Per-stream preview frames (see the module docstring). ``on_frame(stream)`` is called from the
    encoder thread after each new JPEG (the server wakes its readers there)."""

    thread_name = "vcam-panel-preview"

    def __init__(self, fps: float = FPS, width: int = WIDTH) -> None:
        self.interval = 1.0 / fps
        self.width = width
        self.on_frame: Callable[[str], None] | None = None
        self._watchers: dict[str, int] = {}  # stream -> readers; read by the frame loop without a lock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._busy = False
        # (stream, frame or its shrunk copy, format, frames-begun counter or None, the last count it is
        # valid at, the before frame beside it or None)
        self._job: tuple[str, Any, PixelFormat, Callable[[], int] | None, int, Any] | None = None
        self._wake = Wakeup()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # stream -> the last input frames kept for before/after: (frame number, shrunk copy, its format,
        # mirrored, when kept), and how long before a preview frame is due they are kept (seconds)
        self._before: dict[str, deque[tuple[int, tuple[np.ndarray, int, int], PixelFormat, bool, float]]] = {}
        self._lead: dict[str, float] = {}
        self.frames: dict[str, tuple[int, bytes]] = {}  # stream -> (version, JPEG)
        self.offered = 0  # frames taken for the preview (tests, benchmarks)
        self.stale = 0  # frames overwritten while the encoder read them (dropped)

    # -- the frame loop's side -----------------------------------------------------------------
    def offer(
        self,
        stream: str,
        data: np.ndarray,
        fmt: PixelFormat,
        counter: Callable[[], int] | None = None,
        slack: int = 0,
        seq: int = -1,
    ) -> None:
        """A frame was published on ``stream`` (frame thread; returns at once unless due). ``seq``:
        its frame number, for the before frame kept of it (before/after on; -1: none, a card)."""
        if not self._watchers.get(stream) or self._busy:
            return
        now = time.perf_counter()
        due = self._next.get(stream, 0.0)
        if now < due:
            return
        kept = self._before.get(stream)
        before = None
        if kept and seq >= 0:  # before/after in use: the input frame of this number, kept before the pipeline
            before = next((b for b in kept if b[0] == seq), None)
            lead = self._lead.get(stream, self.interval)
            if before is None and now < due + self.interval and now - kept[-1][4] < 1.0:
                # kept too late for this frame (the frames in flight take longer than the lead): keep
                # earlier from now on, and take a later frame whose input was kept
                self._lead[stream] = min(2 * lead, self.interval)
                return
            if before is not None:  # keep from about 1.5 times the frames' time in flight before the next is due
                self._lead[stream] = min(max(1.5 * (now - before[4]), MIN_LEAD), self.interval)
        self._next[stream] = now + self.interval
        self._busy = True
        self.offered += 1
        if counter is None:
            small = shrink(data, fmt, self.width)
            self._job = None if small is None else (stream, small, PixelFormat(fmt), None, 0, before)
        else:
            self._job = (stream, data, PixelFormat(fmt), counter, counter() + slack, before)
        if self._job is None:
            self._busy = False
            return
        self._wake.set()

    def wants_before(self, stream: str) -> bool:
        """Whether the input frame begun now on ``stream`` may be taken for the preview (someone
        watches it, and the next preview frame is due within the frames' time in flight): the frame
        loop then keeps it while before/after is on. Two lookups and a clock read."""
        if not self._watchers.get(stream):
            return False
        return time.perf_counter() >= self._next.get(stream, 0.0) - self._lead.get(stream, self.interval)

    def keep_before(self, stream: str, seq: int, data: Any, fmt: PixelFormat, mirrored: bool = False) -> None:
        """Input frame ``seq`` of ``stream``, before the pipeline (frame thread): a shrunk copy kept
        for the preview of its published frame (``mirrored``: flipped as the output is). A frame
        not in host memory, or in a format :func:`shrink` cannot read, is not kept."""
        if not isinstance(data, np.ndarray):
            return
        small = shrink(data, fmt, self.width)
        if small is None:
            return
        kept = self._before.get(stream)
        if kept is None:
            kept = self._before[stream] = deque(maxlen=BEFORE_KEPT)
        kept.append((seq, small, PixelFormat(fmt), mirrored, time.perf_counter()))

    # -- readers -------------------------------------------------------------------------------
    def _watched(self, stream: str) -> None:
        self._next[stream] = 0.0  # a new reader gets a frame at once

    # -- the encoder thread (EncoderThread's start/stop) ---------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            job, self._job = self._job, None
            if job is None:
                continue
            stream, data, fmt, counter, valid_until, before = job
            jpeg = b""
            try:
                small = data if counter is None else shrink(data, fmt, self.width)
                if counter is not None and counter() > valid_until:
                    self.stale += 1  # its buffer may have been written meanwhile
                    small = None
                if small is not None:
                    jpeg = encode(small[0], fmt, small[1], small[2], self.width, before=before)
            except Exception:  # a preview must never take anything down
                log.exception("preview encoding failed")
            finally:
                self._busy = False
            if jpeg:
                version = self.frames.get(stream, (0, b""))[0] + 1
                self.frames[stream] = (version, jpeg)
                if self.on_frame is not None:
                    self.on_frame(stream)
