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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vcam.types import PixelFormat

log = logging.getLogger(__name__)

WIDTH = 320
FPS = 5.0
QUALITY = 70


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


def encode(small: np.ndarray, fmt: PixelFormat, width: int, height: int, target: int = WIDTH, quality: int = QUALITY) -> bytes:
    """A shrunk frame -> JPEG bytes ``target`` px wide (the encoder thread's work)."""
    import cv2

    from vcam.kernels.convert import to_bgr_cv

    bgr = small if PixelFormat(fmt) is PixelFormat.BGR and small.shape == (height, width, 3) else None
    if bgr is None:
        bgr = to_bgr_cv(small, fmt, width, height)
    if width != target:
        bgr = cv2.resize(bgr, (target, max(2, round(height * target / width))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return buf.tobytes() if ok else b""


class PreviewTap:
    """Per-stream preview frames (see the module docstring). ``on_frame(stream)`` is called from the
    encoder thread after each new JPEG (the server wakes its readers there)."""

    def __init__(self, fps: float = FPS, width: int = WIDTH) -> None:
        self.interval = 1.0 / fps
        self.width = width
        self.on_frame: Callable[[str], None] | None = None
        self._watchers: dict[str, int] = {}  # stream -> readers; read by the frame loop without a lock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._busy = False
        # (stream, frame or its shrunk copy, format, frames-begun counter or None, the last count it is valid at)
        self._job: tuple[str, Any, PixelFormat, Callable[[], int] | None, int] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frames: dict[str, tuple[int, bytes]] = {}  # stream -> (version, JPEG)
        self.offered = 0  # frames taken for the preview (tests, benchmarks)
        self.stale = 0  # frames overwritten while the encoder read them (dropped)

    # -- the frame loop's side -----------------------------------------------------------------
    def offer(
        self, stream: str, data: np.ndarray, fmt: PixelFormat, counter: Callable[[], int] | None = None, slack: int = 0
    ) -> None:
        """A frame was published on ``stream`` (frame thread; returns at once unless due)."""
        if not self._watchers.get(stream) or self._busy:
            return
        now = time.perf_counter()
        if now < self._next.get(stream, 0.0):
            return
        self._next[stream] = now + self.interval
        self._busy = True
        self.offered += 1
        if counter is None:
            small = shrink(data, fmt, self.width)
            self._job = None if small is None else (stream, small, PixelFormat(fmt), None, 0)
        else:
            self._job = (stream, data, PixelFormat(fmt), counter, counter() + slack)
        if self._job is None:
            self._busy = False
            return
        self._wake.set()

    # -- readers -------------------------------------------------------------------------------
    def watch(self, stream: str) -> None:
        with self._lock:
            self._watchers[stream] = self._watchers.get(stream, 0) + 1
            self._next[stream] = 0.0

    def unwatch(self, stream: str) -> None:
        with self._lock:
            left = self._watchers.get(stream, 0) - 1
            if left > 0:
                self._watchers[stream] = left
            else:
                self._watchers.pop(stream, None)

    # -- the encoder thread --------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="vcam-panel-preview", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            job, self._job = self._job, None
            if job is None:
                continue
            stream, data, fmt, counter, valid_until = job
            jpeg = b""
            try:
                small = data if counter is None else shrink(data, fmt, self.width)
                if counter is not None and counter() > valid_until:
                    self.stale += 1  # its buffer may have been written meanwhile
                    small = None
                if small is not None:
                    jpeg = encode(small[0], fmt, small[1], small[2], self.width)
            except Exception:  # a preview must never take anything down
                log.exception("preview encoding failed")
            finally:
                self._busy = False
            if jpeg:
                version = self.frames.get(stream, (0, b""))[0] + 1
                self.frames[stream] = (version, jpeg)
                if self.on_frame is not None:
                    self.on_frame(stream)
