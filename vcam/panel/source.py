"""The direct OBS source: every published frame, full size, as JPEG, for an OBS Browser Source
that opens ``/obs/source?key=K`` (MJPEG over HTTP, ``multipart/x-mixed-replace``) on the panel's
server. OBS then needs no virtual camera (on Windows and macOS OBS's own is the only one, and it
stays free for OBS's own use).

The frame loop calls :meth:`SourceTap.offer` after each publish, as it does the preview's. While
nobody watches a stream that is one dictionary lookup. While someone does, the offer only notes the
frame (the newest replaces one not yet taken: no queue) and wakes the encoder thread, which copies
it out of the pipeline's output ring, checks the ring did not move past it meanwhile (a frame
overwritten while copied is dropped, ``stale``, never shown torn), converts it to BGR and
JPEG-encodes it (OpenCV's libjpeg-turbo; the GIL is released while it encodes). The frame loop never
waits for the encoder, a reader or a lock held by either. Readers get the newest JPEG; one that is
slower than the stream skips frames, it never makes a backlog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcam.panel.preview import EncoderThread, encode, shrink
from vcam.types import PixelFormat

log = logging.getLogger(__name__)

QUALITY = 80


@dataclass(frozen=True)
class SourceFrame:
    """One encoded frame of a stream: ``version`` counts the stream's encoded frames from 1,
    ``published``: the frame's publish time (``time.time()``, for the measurements)."""

    version: int
    jpeg: bytes
    published: float
    width: int
    height: int


class SourceTap(EncoderThread):
    """Per-stream full-size JPEGs of the published frames (see the module docstring).
    ``on_frame(stream)`` is called from the encoder thread after each new JPEG (the server wakes
    its readers there)."""

    thread_name = "vcam-obs-source"

    def __init__(self, quality: int = QUALITY) -> None:
        self.quality = quality
        self.on_frame: Callable[[str], None] | None = None
        self._watchers: dict[str, int] = {}  # stream -> readers; read by the frame loop without a lock
        self._lock = threading.Lock()
        # stream -> (frame, format, frames-begun counter or None, the last count it is valid at, publish time)
        self._jobs: dict[str, tuple[Any, PixelFormat, Callable[[], int] | None, int, float]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frames: dict[str, SourceFrame] = {}
        self.offered = 0  # frames noted for the encoder
        self.replaced = 0  # noted frames a newer one replaced before the encoder took them
        self.stale = 0  # frames overwritten while the encoder copied them (dropped)
        self.sent = 0  # parts written to readers, all of them together

    # -- the frame loop's side -----------------------------------------------------------------
    def offer(
        self, stream: str, data: np.ndarray, fmt: PixelFormat, counter: Callable[[], int] | None = None, slack: int = 0
    ) -> None:
        """A frame was published on ``stream`` (frame thread). ``counter``/``slack`` as the
        preview's (:meth:`vcam.panel.preview.PreviewTap.offer`); without a counter the frame is
        copied here."""
        if not self._watchers.get(stream):
            return
        now = time.time()
        job: tuple[Any, PixelFormat, Callable[[], int] | None, int, float]
        if counter is None:
            job = (np.array(data, copy=True), PixelFormat(fmt), None, 0, now)
        else:
            job = (data, PixelFormat(fmt), counter, counter() + slack, now)
        self.replaced += int(self._jobs.get(stream) is not None)
        self._jobs[stream] = job  # one slot a stream: the newest wins
        self.offered += 1
        self._wake.set()

    # -- readers -------------------------------------------------------------------------------
    def _unwatched(self, stream: str) -> None:
        self._jobs.pop(stream, None)  # nobody reads it: its pending frame goes

    def watching(self, stream: str) -> int:
        return self._watchers.get(stream, 0)

    async def parts(self, stream: str, hub: Any, closing: Callable[[], bool]) -> AsyncIterator[bytes]:
        """The parts of one multipart JPEG answer for ``stream``, each new frame once (and the last
        one again every few ``hub`` waits: a gone reader is noticed when the picture stands still).
        ``hub``: the server's wake-up (``count`` of frames so far, ``wait(timeout)``)."""
        self.watch(stream)
        seen, quiet = 0, 0
        try:
            while not closing():
                fired = hub.count  # a frame encoded while this one was sent: no wait for it
                frame = self.frames.get(stream)
                if frame is not None and (frame.version != seen or quiet >= 4):
                    seen, quiet = frame.version, 0
                    head = (
                        f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(frame.jpeg)}\r\n"
                        f"X-Vcam-Published: {frame.published:.6f}\r\n\r\n"
                    )
                    self.sent += 1
                    yield head.encode() + frame.jpeg + b"\r\n"
                quiet += 1
                if hub.count == fired:
                    await hub.wait(0.5)
        finally:
            self.unwatch(stream)

    # -- the encoder thread --------------------------------------------------------------------
    def start(self, on_frame: Callable[[str], None] | None = None) -> None:
        self.on_frame = on_frame or self.on_frame
        super().start()

    def _take(self) -> tuple[str, tuple] | None:
        for stream in list(self._jobs):
            job = self._jobs.pop(stream, None)
            if job is not None:
                return stream, job
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            taken = self._take()
            if taken is None:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            stream, (data, fmt, counter, valid_until, published) = taken
            try:
                frame = self._encode(data, fmt, counter, valid_until)
            except Exception:  # the source must never take anything down
                log.exception("OBS source encoding failed")
                frame = None
            if frame is None:
                continue
            jpeg, width, height = frame
            old = self.frames.get(stream)
            self.frames[stream] = SourceFrame((old.version if old else 0) + 1, jpeg, published, width, height)
            if self.on_frame is not None:
                self.on_frame(stream)

    def _encode(
        self, data: Any, fmt: PixelFormat, counter: Callable[[], int] | None, valid_until: int
    ) -> tuple[bytes, int, int] | None:
        full = shrink(data, fmt, 1 << 30)  # full size: a copy in its own format
        if counter is not None and counter() > valid_until:
            self.stale += 1  # its buffer may have been written while it was copied
            return None
        if full is None:
            return None
        small, width, height = full
        jpeg = encode(small, fmt, width, height, width, quality=self.quality)
        return (jpeg, width, height) if jpeg else None
