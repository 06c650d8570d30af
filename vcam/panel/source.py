"""The direct OBS source: every published frame, full size, as JPEG, for an OBS Browser Source
that opens ``/obs/source?key=K`` (MJPEG over HTTP, ``multipart/x-mixed-replace``) on the panel's
server. OBS then needs no virtual camera (on Windows and macOS OBS's own is the only one, and it
stays free for OBS's own use).

The frame loop calls :meth:`SourceTap.offer` after each publish, as it does the preview's. While
nobody watches a stream that is one dictionary lookup. While someone does, the offer only notes the
frame (the newest replaces one not yet taken: no queue) and wakes the encoder thread, which copies
it out of the pipeline's output ring into a buffer it keeps (no allocation a frame), checks the ring
did not move past it meanwhile (a frame that may have been overwritten while it was copied is
dropped, ``stale``, never shown torn), converts it to BGR if needed and JPEG-encodes it. (Encoding
straight out of the ring saves the copy, a tenth of the encode's time, but the ring's slot must then
outlast the whole encode: on a loaded machine 7 of 258 frames were lost so.) The encoder is
OpenCV's libjpeg-turbo (quality ``QUALITY``, 4:2:0; the GIL is released while it encodes);
simplejpeg was measured no faster on a BGR frame (the same library underneath). Each frame is
encoded once, into what every reader is sent of it as it is (the JPEG with its publish time, then
the next part's head: see ``OPENING``): no encode, join or copy per reader. The frame loop never
waits for the encoder, a reader or a lock held by either (the encoder is woken through a
:class:`~vcam.panel.preview.Wakeup`, whose ``set`` takes no lock). Readers get the newest part; one
that is slower than the stream skips frames, it never makes a backlog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcam.panel.preview import EncoderThread, Wakeup
from vcam.types import PixelFormat

log = logging.getLogger(__name__)

QUALITY = 80


@dataclass(frozen=True)
class SourceFrame:
    """One encoded frame of a stream: ``version`` counts the stream's encoded frames from 1,
    ``part``: what readers are sent of it (:func:`multipart`), ``published``: the frame's publish
    time (``time.time()``, also in the JPEG: :func:`published_of`)."""

    version: int
    part: bytes
    published: float
    width: int
    height: int

    @property
    def jpeg(self) -> bytes:
        """The JPEG alone (a copy: tests and tools)."""
        return self.part[: -len(CLOSING)]


#: The head of every part. Chromium (the engine of OBS's Browser Source) shows a part's picture
#: only once it has read the next part's head (the boundary and the headers after it); until then
#: it keeps the bytes and shows the frame before. So each part is sent with the next one's head
#: right behind it (``CLOSING``), and the answer opens with the first one's (``OPENING``): a frame is
#: shown when it arrives, not a frame later (seconds when the picture stands still). The headers
#: cannot then carry a frame's own length or time: readers find a part's end at the boundary
#: (RFC 2046; what Chromium, FFmpeg and VLC do), and the publish time is in the JPEG (a comment).
OPENING = b"--frame\r\nContent-Type: image/jpeg\r\n\r\n"
CLOSING = b"\r\n" + OPENING
STAMP = b"vcam-published="


def multipart(jpeg: Any, published: float) -> bytes:
    """What readers are sent of one frame: ``jpeg`` (any bytes-like object, not copied before
    the one join) with ``published`` in a comment segment after its JFIF header, then
    ``CLOSING``."""
    mv = memoryview(jpeg).cast("B")
    at = 2  # after SOI, or after the JFIF APP0 segment that should come first
    if mv[2:4] == b"\xff\xe0":
        at = 4 + int.from_bytes(mv[4:6], "big")
    text = STAMP + f"{published:.6f}".encode()
    return b"".join((mv[:at], b"\xff\xfe", (len(text) + 2).to_bytes(2, "big"), text, mv[at:], CLOSING))


def published_of(jpeg: bytes) -> float | None:
    """The publish time a source frame's JPEG carries (:func:`multipart`); None without one."""
    at = jpeg.find(STAMP, 0, 256)
    if at < 0:
        return None
    end = at + len(STAMP)
    while end < len(jpeg) and jpeg[end] in b"0123456789.":
        end += 1
    return float(jpeg[at + len(STAMP) : end])


def encode_bgr(data: Any, fmt: PixelFormat, width: int, height: int, quality: int = QUALITY) -> np.ndarray | None:
    """A full-size frame in ``fmt`` -> the JPEG's bytes (OpenCV's buffer, not copied), read in
    place for BGR; None when OpenCV refuses it."""
    import cv2

    from vcam.kernels.convert import to_bgr_cv

    a = np.asarray(data)
    bgr = a if fmt is PixelFormat.BGR and a.shape == (height, width, 3) else to_bgr_cv(a, fmt, width, height)
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]
    ok, buf = cv2.imencode(".jpg", bgr, params)
    return buf if ok else None


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
        self._wake = Wakeup()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frames: dict[str, SourceFrame] = {}
        self.offered = 0  # frames noted for the encoder
        self.replaced = 0  # noted frames a newer one replaced before the encoder took them
        self.stale = 0  # frames overwritten while the encoder copied them (dropped)
        self.sent = 0  # parts written to readers, all of them together
        self.encode_cpu = 0.0  # the encoder thread's CPU seconds on frames (benchmarks)
        self._copies: dict[tuple, np.ndarray] = {}  # the encoder's own copy of a frame, by shape (reused)

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
        """One multipart JPEG answer for ``stream``: ``OPENING``, then each new frame's part once (the last
        one again every few ``hub`` waits: a gone reader is noticed when the picture stands still).
        ``hub``: the server's wake-up (``count`` of frames so far, ``wait(timeout)``)."""
        self.watch(stream)
        seen, quiet = 0, 0
        try:
            yield OPENING
            while not closing():
                fired = hub.count  # a frame encoded while this one was sent: no wait for it
                frame = self.frames.get(stream)
                if frame is not None and (frame.version != seen or quiet >= 4):
                    seen, quiet = frame.version, 0
                    self.sent += 1
                    yield frame.part  # built once by the encoder for every reader
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
            cpu = time.thread_time()
            try:
                frame = self._encode(data, fmt, counter, valid_until, published)
            except Exception:  # the source must never take anything down
                log.exception("OBS source encoding failed")
                frame = None
            self.encode_cpu += time.thread_time() - cpu
            if frame is None:
                continue
            old = self.frames.get(stream)
            self.frames[stream] = SourceFrame((old.version if old else 0) + 1, *frame)
            if self.on_frame is not None:
                self.on_frame(stream)

    def _encode(
        self, data: Any, fmt: PixelFormat, counter: Callable[[], int] | None, valid_until: int, published: float
    ) -> tuple[bytes, float, int, int] | None:
        """The frame's part (see :class:`SourceFrame`); None when it cannot be encoded or its ring
        slot may have been written while it was copied out (``stale``)."""
        size = frame_size(data, fmt)
        if size is None:
            return None
        if counter is not None:  # out of the ring first: a copy takes a tenth of the encode's time
            data = copy_out(self._copies, data)
            if counter() > valid_until:
                self.stale += 1  # its buffer may have been written while it was copied
                return None
        jpeg = encode_bgr(data, fmt, size[0], size[1], self.quality)
        if jpeg is None:
            return None
        return multipart(jpeg, published), published, size[0], size[1]


def copy_out(kept: dict, data: Any) -> np.ndarray:
    """``data`` copied into the buffer ``kept`` holds for its shape (made once, then reused: no
    6 MB allocation a 1080p frame)."""
    src = np.asarray(data)
    key = (src.shape, src.dtype.str)
    buf = kept.get(key)
    if buf is None:
        kept.clear()  # one size at a time: a new size (an early swap's frames) replaces the last
        buf = kept[key] = np.empty_like(src)
    np.copyto(buf, src)
    return buf


def frame_size(data: Any, fmt: PixelFormat) -> tuple[int, int] | None:
    """(width, height) of a frame in ``fmt``; None for a format the source cannot read."""
    shape = np.shape(data)
    if fmt in (PixelFormat.I420, PixelFormat.NV12):
        return shape[1], shape[0] * 2 // 3
    if fmt in (PixelFormat.BGR, PixelFormat.RGB, PixelFormat.GRAY):
        return shape[1], shape[0]
    return None
