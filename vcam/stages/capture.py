"""Capture stage: frame sources and the capture thread.

A :class:`Source` yields :class:`~vcam.types.Frame` objects; :func:`open_source` builds one from
``CaptureSettings.input``:

============== ============================================================================
``webcam[:N]`` camera N (default 0) through OpenCV (V4L2 on Linux), MJPG at the configured size
``PATH``       a video file (PyAV) or a still image (OpenCV), chosen by the file's extension
``pattern``    a synthetic moving colour pattern at the configured size
``demo``       the generated demo clip (:class:`vcam.stages.demo.DemoClip`)
============== ============================================================================

Pixel formats delivered: colour sources deliver ``BGR`` ``(H, W, 3)``; grayscale images and videos
deliver ``GRAY`` ``(H, W)`` (the convert stage turns every format into BGR, so no source expands
gray itself). Opened with ``compressed=True`` (the daemon does), an MJPG camera and a Motion-JPEG
video deliver each frame's JPEG undecoded (``MJPEG``, 1-D bytes) for the decode stage
(:mod:`vcam.stages.decode`, run in the capture thread). Any size works, odd ones included. Every frame's
buffer is a fresh C-contiguous array the consumer may modify. ``Frame.t_capture`` is
``time.perf_counter()`` when the frame was read and ``Frame.seq`` counts the frames the source
delivered (0, 1, 2, ...).

Delivery (:func:`plan_delivery`, from ``[capture] pacing`` and the output): *realtime* sources are
paced at their frame rate and :class:`CaptureThread` keeps one slot, the consumer always getting the
newest frame (frames replaced before being read are counted in ``dropped``), as a camera behaves;
*lossless* sources are read on demand, one frame ahead of the consumer, so every frame is processed
once and in order however slow the pipeline is, and no core is spent decoding or generating frames
nobody takes (the producer blocks on the slot; it never spins). Every non-camera source (file,
image, demo, pattern) is lossless with ``pacing = "fast"`` (``--fast``) whatever the output, and by
default when the output is a file, where it also plays once (every frame exactly once, no loop);
cameras are always realtime (they pace themselves).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vcam import devices
from vcam.errors import InputError, VcamError
from vcam.stages.decode import CorruptFrame
from vcam.stages.sources import (
    IMAGE_EXTENSIONS,
    DemoSource,
    ImageSource,
    PatternSource,
    Source,
    VideoSource,
    WebcamSource,
    read_image,
)
from vcam.types import Frame

log = logging.getLogger(__name__)


class CaptureSettings(Protocol):
    """What :func:`plan_delivery` and :func:`open_source` read (the config's ``[capture]`` section
    is one; the runtime passes it, this stage never reads the config itself)."""

    @property
    def input(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def fps(self) -> float: ...
    @property
    def fourcc(self) -> str: ...
    @property
    def loop(self) -> bool: ...
    @property
    def pacing(self) -> str: ...


INPUT_FORMS = "webcam, webcam:N, a video or image path, demo or pattern"


# --------------------------------------------------------------------------------------------------
# Webcam


# --------------------------------------------------------------------------------------------------
# Video files


# --------------------------------------------------------------------------------------------------
# Still images


# --------------------------------------------------------------------------------------------------
# Synthetic sources


# --------------------------------------------------------------------------------------------------
# Factory


def parse_webcam_index(spec: str) -> int | None:
    """``webcam`` -> 0, ``webcam:3`` -> 3, anything else -> None; ``webcam:x`` raises InputError."""
    s = spec.strip()
    if s.lower() == "webcam":
        return 0
    if s.lower().startswith("webcam:"):
        rest = s.split(":", 1)[1].strip()
        if rest.isdigit():
            return int(rest)
        raise InputError(f"bad camera index in {spec!r}", hint="use webcam or webcam:N with N a number from `vcam devices`")
    return None


@dataclass(frozen=True)
class Delivery:
    """How a source's frames reach the pipeline (see the module docstring). ``realtime``: paced at
    the frame rate; ``lossless``: every frame, in order, read on demand; ``still_frames``: a still
    image delivers this many frames and ends (None: endless); ``loop``: video files and the demo
    start again at their end."""

    realtime: bool = True
    lossless: bool = False
    still_frames: int | None = None
    loop: bool = True


def is_camera(spec: str) -> bool:
    try:
        return parse_webcam_index(spec) is not None
    except InputError:
        return True


def plan_delivery(cfg: CaptureSettings, output_target: str = "", max_frames: int | None = None) -> Delivery:
    """The :class:`Delivery` for ``cfg.input`` going to ``output_target`` (``[output] target``);
    ``max_frames``: a frame limit (a still image to a file writes that many frames, else one)."""
    if is_camera(cfg.input or ""):
        return Delivery(realtime=True, lossless=False, loop=cfg.loop)
    from vcam.stages.recording import file_target

    to_file = file_target(output_target) is not None
    pacing = cfg.pacing if cfg.pacing != "auto" else ("fast" if to_file else "realtime")
    if pacing == "realtime":
        return Delivery(realtime=True, lossless=False, loop=cfg.loop)
    if not to_file:
        return Delivery(realtime=False, lossless=True, loop=cfg.loop)
    # Converting to a file: every frame exactly once, so the input plays once (no loop).
    still = (max_frames or 1) if Path((cfg.input or "").strip()).suffix.lower() in IMAGE_EXTENSIONS else None
    return Delivery(realtime=False, lossless=True, still_frames=still, loop=False)


def open_source(
    cfg: CaptureSettings,
    *,
    delivery: Delivery | None = None,
    demo_clip_factory: Callable[..., Any] | None = None,
    sysfs_root: Path = devices.SYSFS_ROOT,
    compressed: bool = False,
) -> Source:
    """Open the source named by ``cfg.input`` (see the module docstring for the forms).

    ``delivery``: pacing and still-image frame count (default: :func:`plan_delivery` without an
    output). ``demo_clip_factory(width=, height=, fps=)`` builds the demo clip (default
    ``vcam.stages.demo.DemoClip``). ``compressed``: an MJPG camera and a Motion-JPEG file deliver their
    JPEGs undecoded (``MJPEG`` frames, for :mod:`vcam.stages.decode`). Raises :class:`InputError` naming the fix
    for anything unusable.
    """
    delivery = delivery or plan_delivery(cfg)
    realtime = delivery.realtime
    spec = (cfg.input or "").strip()
    if not spec:
        raise InputError("no input given", hint=f"use --input with one of: {INPUT_FORMS}")
    idx = parse_webcam_index(spec)
    if idx is not None:
        return WebcamSource(
            idx, width=cfg.width, height=cfg.height, fps=cfg.fps, fourcc=cfg.fourcc, sysfs_root=sysfs_root, compressed=compressed
        )
    low = spec.lower()
    if low == "pattern":
        return PatternSource(cfg.width, cfg.height, fps=cfg.fps, realtime=realtime)
    if low == "demo":
        if demo_clip_factory is None:
            from vcam.stages.demo import DemoClip

            demo_clip_factory = DemoClip
        clip = demo_clip_factory(width=cfg.width, height=cfg.height, fps=cfg.fps)
        return DemoSource(clip, loop=delivery.loop, realtime=realtime)
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(f"input not found: {spec}", hint=f"check the path, or use one of: {INPUT_FORMS}")
    if path.is_dir():
        raise InputError(f"input {spec} is a directory", hint="pass a video or image file")
    if path.suffix.lower() in IMAGE_EXTENSIONS:
        return ImageSource(path, fps=cfg.fps, realtime=realtime, frames=delivery.still_frames)
    return VideoSource(path, loop=delivery.loop, realtime=realtime, fallback_fps=cfg.fps, compressed=compressed)


# --------------------------------------------------------------------------------------------------
# Capture thread


#: Corrupt frames in a row after which the capture thread gives up on its source.
MAX_CORRUPT = 30


class CaptureThread:
    """Runs a :class:`Source` on a daemon thread; the consumer takes the newest frame.

    One slot, no queue. By default a frame the consumer has not taken when the next one arrives is
    replaced and counted in ``dropped`` (newest wins, as for a camera). With ``lossless`` the
    thread waits for the consumer to take the slot before reading the next frame: every frame is
    delivered, in order, and the source is read on demand. ``get(timeout)`` returns the newest frame; it returns None when the
    source has ended cleanly (after the last frame was taken), after :meth:`stop`, or when
    ``timeout`` passes without a frame — ``finished`` tells the end apart from a timeout. It raises
    the source's :class:`InputError` (other exceptions are wrapped in one) in the consumer's
    thread. The thread owns the source and closes it when it ends. ``wake``: an event set whenever
    a frame arrives or the source ends, so one consumer can wait for any of several threads.
    ``stage``: a function applied to each frame in the capture thread (the GPU path copies it into
    a pinned buffer there, so the frame loop only starts its upload; an MJPG frame is decoded
    there, :mod:`vcam.stages.decode`). A frame the stage finds corrupt (:class:`vcam.stages.decode.CorruptFrame`)
    is skipped and counted in ``corrupt``; :data:`MAX_CORRUPT` in a row end the source with that error.
    ``target``: gives the buffer the next frame is read into, for a source with ``read_into``
    (the GPU path's next pinned staging buffer: the frame is written there once, by the source).
    """

    def __init__(
        self,
        source: Source,
        *,
        lossless: bool = False,
        name: str = "vcam-capture",
        fps_window: int = 30,
        wake: threading.Event | None = None,
        stage: Callable[[Frame], Frame] | None = None,
        target: Callable[[], np.ndarray] | None = None,
    ) -> None:
        self.source = source
        self.name = name
        #: The buffer the next frame is read into (see the class docstring); replaced with ``stage``.
        self.target = target
        #: Applied to each frame in this thread (a copy into pinned memory, an MJPG decode); may be
        #: replaced while the thread runs (the daemon does once its models are loaded).
        self.stage = stage
        self._wake = wake  # set whenever a frame arrives or the source ends (a consumer of several threads waits on it)
        self.lossless = bool(lossless)
        self._cond = threading.Condition()
        self._slot: Frame | None = None
        self._error: BaseException | None = None
        self._eof = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stamps: collections.deque[float] = collections.deque(maxlen=max(2, fps_window))
        self.delivered = 0  # frames read from the source
        self.taken = 0  # frames handed to the consumer
        self.dropped = 0  # frames replaced before the consumer took them
        self.corrupt = 0  # frames the stage could not use (a broken JPEG), skipped

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> CaptureThread:
        self._thread.start()
        return self

    def __enter__(self) -> CaptureThread:
        if not self._thread.is_alive() and not self.finished:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to end and join it; the source is closed by the thread. Idempotent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():  # pragma: no cover - a driver stuck in read()
                log.warning("capture thread did not stop within %.1fs; leaving it behind", timeout)
        elif not self._thread.ident:  # never started: close here
            _close_quietly(self.source)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the source to end (EOF or error) without stopping it; True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """The source has ended (EOF or error) or the thread was stopped."""
        if self._stop.is_set():
            return True
        with self._cond:
            return self._eof or self._error is not None

    @property
    def real_fps(self) -> float:
        """Frames per second read from the source over the last ``fps_window`` frames."""
        with self._cond:
            if len(self._stamps) < 2:
                return 0.0
            span = self._stamps[-1] - self._stamps[0]
            return (len(self._stamps) - 1) / span if span > 0 else 0.0

    def expects_by(self, t: float, now: float | None = None) -> bool:
        """Whether the next frame may arrive by ``t`` (``time.perf_counter`` time): it is due one
        interval (the median of the last few) after the last frame. True when that cannot be told
        (a source read on demand, fewer than three frames yet); False when it is due after ``t``,
        or overdue by more than one interval at ``now`` (a camera that has stalled). A frame loop
        that waits to batch several streams waits only for the frames that are coming."""
        with self._cond:
            if self.lossless or len(self._stamps) < 3:
                return True
            recent = list(self._stamps)[-9:]
        interval = float(np.median(np.diff(recent)))
        due = recent[-1] + interval
        now = time.perf_counter() if now is None else now
        return due <= t and now <= due + interval

    # producer --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            bad = 0
            read_into = getattr(self.source, "read_into", None)
            while not self._stop.is_set():
                target = self.target
                frame = read_into(target()) if target is not None and read_into is not None else self.source.read()
                stage = self.stage
                if frame is not None and stage is not None:
                    try:
                        frame = stage(frame)
                    except CorruptFrame as exc:
                        self.corrupt += 1
                        bad += 1
                        if bad >= MAX_CORRUPT:
                            raise InputError(
                                f"{bad} corrupt frames in a row from {self.source!r} ({exc})",
                                hint="for a camera try [capture] fourcc = 'YUYV' or [capture] decode = 'cpu'; re-export a file",
                            ) from None
                        if self.corrupt == 1:
                            log.warning("skipped a corrupt frame from %r", self.source)
                        continue
                    bad = 0
                with self._cond:
                    if frame is None:
                        self._eof = True
                        self._cond.notify_all()
                        self._signal()
                        return
                    if self.lossless:
                        while self._slot is not None and not self._stop.is_set():
                            self._cond.wait()  # on demand: the consumer has not taken the last frame yet
                        # its latency counts from now, when the pipeline could take it, not from decoding
                        frame = dataclasses.replace(frame, t_capture=time.perf_counter())
                    self.delivered += 1
                    self._stamps.append(frame.t_capture)
                    if self._slot is not None:
                        self.dropped += 1
                    self._slot = frame
                    self._cond.notify_all()
                self._signal()
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            _close_quietly(self.source)
            with self._cond:
                self._eof = True
                self._cond.notify_all()
            self._signal()

    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # consumer --------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Frame | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._stop.is_set():
                    return None
                if self._slot is not None:
                    frame, self._slot = self._slot, None
                    self.taken += 1
                    self._cond.notify_all()  # a lossless producer waits for the slot
                    return frame
                if self._error is not None:
                    err = self._error
                    if isinstance(err, VcamError):
                        raise err
                    raise InputError(f"capture failed: {err!r}", hint="see the log; try another --input") from err
                if self._eof:
                    return None
                if not self._thread.ident:
                    raise RuntimeError("CaptureThread.get() before start()")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)


def _close_quietly(source: Source) -> None:
    try:
        source.close()
    except Exception:  # pragma: no cover - closing must not mask the real error
        log.debug("closing %r failed", source, exc_info=True)


__all__ = [
    "CaptureThread",
    "DemoSource",
    "ImageSource",
    "PatternSource",
    "Source",
    "VideoSource",
    "WebcamSource",
    "Delivery",
    "open_source",
    "parse_webcam_index",
    "plan_delivery",
    "read_image",
]
