"""Frame sources: a camera, a video file, a still image, a test pattern and the demo clip, each
delivering raw frames paced at their frame rate or on demand (:mod:`vcam.stages.capture` opens one
and runs it on the capture thread)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam import devices
from vcam.errors import InputError
from vcam.types import Closing, Frame, PixelFormat

log = logging.getLogger("vcam.stages.capture")

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".webp", ".tif", ".tiff", ".pgm", ".ppm", ".pbm", ".pnm"}
)


@runtime_checkable
class Source(Protocol):
    """A frame source. ``read()`` returns the next frame or None at the end of the stream; it raises
    :class:`InputError` when the source fails. ``close()`` is idempotent. Sources are context managers.

    Optional: ``reopen()`` returns a new source of the same input, its frames numbered on from this
    one's (a pause closes the source, the resume reopens it: :mod:`vcam.runtime.pause`)."""

    width: int
    height: int
    fps: float
    fmt: PixelFormat

    def read(self) -> Frame | None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Source: ...

    def __exit__(self, *exc: object) -> None: ...


class _Pacer:
    """Sleeps so that media time ``t`` is delivered at wall time ``start + t``.

    Falling more than ``slack`` seconds behind (a stall, a debugger) resets the clock instead of
    bursting frames to catch up. ``clock`` and ``sleep`` can be injected for tests.
    """

    def __init__(
        self,
        enabled: bool,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Any] = time.sleep,
        slack: float = 0.25,
    ) -> None:
        self.enabled = enabled
        self._clock = clock
        self._sleep = sleep
        self._slack = slack
        self._origin: float | None = None

    def reset(self) -> None:
        self._origin = None

    def wait(self, t_media: float) -> None:
        if not self.enabled:
            return
        now = self._clock()
        if self._origin is None:
            self._origin = now - t_media
            return
        due = self._origin + t_media
        if due > now:
            self._sleep(due - now)
        elif now - due > self._slack:
            self._origin = now - t_media


class _SourceBase(Closing):
    """Shared frame numbering and context management."""

    width: int
    height: int
    fps: float
    fmt: PixelFormat

    def __init__(self) -> None:
        self._seq = 0
        self._closed = False
        self._into: np.ndarray | None = None  # see read_into

    def read_into(self, buf: np.ndarray) -> Frame | None:
        """:meth:`read`, the frame's pixels written into ``buf`` (the capture thread's next pinned
        staging buffer, :class:`CaptureThread` ``target``) before its clock starts, as a camera's
        driver writes them into its buffer: the upload then needs no copy. A frame of another
        shape or type keeps its own array."""
        self._into = buf
        try:
            return self.read()
        finally:
            self._into = None

    def _emit(self, data: np.ndarray, fmt: PixelFormat | None = None, *, shared: bool = False) -> Frame:
        """The next frame of ``data``; ``shared``: the source keeps ``data`` (a still image, a clip's
        frame), so the frame gets a copy: the buffer of :meth:`read_into`, else a new array."""
        fmt = fmt or self.fmt
        into = self._into
        if into is not None and data is not into and data.shape == into.shape and data.dtype == into.dtype:
            np.copyto(into, data)
            data = into
        elif shared:
            data = data.copy()
        frame = Frame(
            data=data, width=int(data.shape[1]), height=int(data.shape[0]), fmt=fmt, t_capture=time.perf_counter(), seq=self._seq
        )
        self._seq += 1
        return frame

    def _emit_jpeg(self, data: np.ndarray, width: int, height: int) -> Frame:
        """A compressed (MJPEG) frame: ``data`` is the JPEG's bytes, the size the stream's."""
        frame = Frame(data=data, width=width, height=height, fmt=PixelFormat.MJPEG, t_capture=time.perf_counter(), seq=self._seq)
        self._seq += 1
        return frame

    def read(self) -> Frame | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _numbered_on(self, new: _SourceBase) -> Any:
        """``new`` (this input opened again), its frames numbered on from this source's."""
        new._seq = self._seq
        return new

    @property
    def frame_count(self) -> int | None:
        """The frames this source delivers before it ends; None when endless (a camera, a loop) or
        not known (a container without a frame count)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}x{self.height} {self.fmt.value} @ {self.fps:g} fps)"


def open_hint(platform: str = sys.platform) -> str:
    """What to try when a camera index does not open, in the words of ``platform``'s own settings."""
    if platform.startswith("win"):
        where = "check that Settings > Privacy > Camera lets desktop apps use the camera"
    elif platform == "darwin":
        where = "check that System Settings > Privacy & Security > Camera allows your terminal"
    else:
        where = "check its permissions (video group)"
    return f"close other programs using the camera, {where}, or run `vcam devices`"


def open_camera(index: int, apis: Sequence[tuple[str, str]], opener: Callable[[int, int], Any]) -> tuple[Any, str]:
    """``(capture, API label)`` of camera ``index`` opened through the first of ``apis``
    (:func:`vcam.devices.capture_apis`) that opens it; ``(None, "")`` when none does."""
    import cv2

    for label, const in apis:
        cap = opener(index, int(getattr(cv2, const)))
        if cap.isOpened():
            return cap, label
        cap.release()
    return None, ""


class WebcamSource(_SourceBase):
    """Camera ``index`` through OpenCV: V4L2 on Linux, DirectShow (then Media Foundation) on
    Windows, AVFoundation on macOS (:func:`vcam.devices.capture_apis`; ``platform`` and ``opener``,
    default ``cv2.VideoCapture``, are parameters for tests).

    Requests ``fourcc`` (MJPG by default, which cameras need for 720p/1080p at 30 fps) at the
    configured size and rate with a one-frame driver buffer (no stale frames); V4L2 and DirectShow
    honour it, Media Foundation and AVFoundation choose the camera's format themselves, and the
    format the backend agreed to is logged. ``width``/``height``
    are what the camera agreed to; ``fps`` starts as the driver's claim and becomes the rate measured
    over the first ``measure_frames`` frames (``real_fps``). Frames are BGR.
    """

    def __init__(
        self,
        index: int,
        *,
        width: int,
        height: int,
        fps: float,
        fourcc: str = "MJPG",
        measure_frames: int = 30,
        sysfs_root: Path = devices.SYSFS_ROOT,
        compressed: bool = False,
        platform: str = sys.platform,
        opener: Callable[[int, int], Any] | None = None,
    ) -> None:
        super().__init__()
        import cv2

        self.index = index
        self._cv2 = cv2
        self._asked = dict(
            width=width, height=height, fps=fps, fourcc=fourcc, measure_frames=measure_frames, sysfs_root=sysfs_root,
            compressed=compressed, platform=platform, opener=opener,
        )  # fmt: skip
        if platform.startswith("linux") or sysfs_root != devices.SYSFS_ROOT:
            nodes = devices.list_video_devices(sysfs_root, platform="linux")
            known = {d.index: d for d in nodes}
            cams = [d for d in nodes if not d.is_loopback]
            if index not in known:
                raise InputError(
                    f"camera {index} not found; cameras here: {devices.describe_devices(cams)}",
                    hint="run `vcam devices` and pass --input webcam:N, or use --input demo",
                )
            dev = known[index]
            if dev.is_loopback:
                raise InputError(
                    f"camera {index} is the virtual camera {dev.name!r}, not a real camera; "
                    f"cameras here: {devices.describe_devices(cams)}",
                    hint="run `vcam devices` and pick a real camera with --input webcam:N",
                )
            apis = devices.capture_apis("linux")
        else:
            apis = devices.capture_apis(platform)
        cap, self.api = open_camera(index, apis, opener or cv2.VideoCapture)
        if cap is None:
            raise InputError(
                f"camera {index} could not be opened",
                hint=open_hint(platform),
            )
        self._cap = cap
        if fourcc:
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*fourcc[:4].ljust(4)))
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
        cap.set(cv2.CAP_PROP_FPS, fps)
        cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        self.width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)) or width
        self.height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) or height
        self.fps = float(cap.get(cv2.CAP_PROP_FPS)) or fps
        self.fmt = PixelFormat.BGR
        agreed = (int(cap.get(cv2.CAP_PROP_FOURCC)) & 0xFFFFFFFF).to_bytes(4, "little").decode("ascii", "replace")
        if compressed and agreed == "MJPG" and cap.set(cv2.CAP_PROP_CONVERT_RGB, 0):
            # The camera's JPEG as it came (a few hundred KB): the decode stage decodes it, on the
            # GPU where there is one, and the frame's latency clock starts before that.
            self.fmt = PixelFormat.MJPEG
        self.real_fps: float | None = None
        self._measure = max(2, measure_frames)
        self._stamps: list[float] = []
        self._failures = 0
        if (self.width, self.height) != (width, height):
            log.info("camera %d delivers %dx%d (asked for %dx%d)", index, self.width, self.height, width, height)
        log.info("camera %d through %s: %s %dx%d", index, self.api, agreed.strip("\x00") or "?", self.width, self.height)

    def read(self) -> Frame | None:  # pragma: no cover - needs a real camera
        while True:
            into = self._into if self.fmt is not PixelFormat.MJPEG else None
            ok, img = self._cap.read(into) if into is not None else self._cap.read()  # OpenCV writes into ``into`` when it fits
            if ok and img is not None:
                break
            self._failures += 1
            if self._failures >= 10:
                raise InputError(
                    f"camera {self.index} stopped delivering frames", hint="check the cable, then restart; run `vcam devices`"
                )
            time.sleep(0.01)
        self._failures = 0
        if self.fmt is PixelFormat.MJPEG:
            frame = self._emit_jpeg(np.ascontiguousarray(img).reshape(-1), self.width, self.height)
        else:
            frame = self._emit(np.ascontiguousarray(img))
        if self.real_fps is None:
            self._stamps.append(frame.t_capture)
            if len(self._stamps) >= self._measure:
                span = self._stamps[-1] - self._stamps[0]
                if span > 0:
                    self.real_fps = (len(self._stamps) - 1) / span
                    self.fps = self.real_fps
                self._stamps = []
        return frame

    def reopen(self) -> WebcamSource:
        """The camera opened again as it was asked for (after :meth:`close`: a pause)."""
        return self._numbered_on(WebcamSource(self.index, **self._asked))

    def close(self) -> None:
        if not self._closed:
            self._cap.release()
        super().close()


class VideoSource(_SourceBase):
    """A video file decoded with PyAV; BGR frames, or GRAY ones for a grayscale video.

    ``loop``: start again at the end (the container is reopened, which works for every format; the
    next pass is opened and its first frame decoded ahead, in a thread, during the last second of
    a pass, so the loop costs the frames no pause: :class:`_NextPass`).
    ``realtime``: deliver at the file's timestamps; otherwise as fast as it decodes.
    ``compressed``: a Motion-JPEG video (``.mjpeg``, or MJPG in ``.avi``/``.mkv``/``.mov``) is
    delivered as a camera sends MJPG, one JPEG per frame (``MJPEG`` frames, not decoded here: the
    decode stage decodes them, on the GPU where there is one); other codecs are decoded as usual.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        loop: bool = False,
        realtime: bool = True,
        fallback_fps: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Any] = time.sleep,
        compressed: bool = False,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.loop = loop
        self._want_compressed = bool(compressed)
        self._pacer = _Pacer(realtime, clock=clock, sleep=sleep)
        self._timing = (realtime, clock, sleep)
        self._fallback_fps = fallback_fps
        self._container = None
        self._next: _NextPass | None = None
        self._open()
        self._pass_frames = 0
        self._first_pts = 0.0
        self._t_offset = 0.0  # media time of the start of the current pass
        self._last_t = 0.0

    def _open_container(self) -> Any:
        import av

        try:
            return av.open(str(self.path))
        except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(
                f"cannot read video {self.path}: {_av_reason(exc)}",
                hint="the file is corrupt or not a video; re-export it as H.264 .mp4",
            ) from None

    def _frames_of(self, container: Any) -> tuple[Any, Any]:
        """``(stream, iterator)``: the decoded frames (or a Motion-JPEG's packets) of ``container``'s picture."""
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if self.compressed:
            return stream, (p for p in container.demux(stream) if p.size)
        return stream, container.decode(stream)

    def _open(self) -> None:
        container = self._open_container()
        if not container.streams.video:
            container.close()
            raise InputError(
                f"{self.path} has no video stream", hint="pass a video file with a picture track, an image, or --input demo"
            )
        stream = container.streams.video[0]
        cc = stream.codec_context
        if not cc.width or not cc.height:
            container.close()
            raise InputError(
                f"cannot read video {self.path}: no frame size in the stream",
                hint="the file is corrupt; re-export it as H.264 .mp4",
            )
        self._container = container
        self.width, self.height = int(cc.width), int(cc.height)
        self.compressed = self._want_compressed and cc.name in ("mjpeg", "mjpegb")
        self._stream, self._frames = self._frames_of(container)
        if self.compressed:
            self.fmt = PixelFormat.MJPEG
        else:
            pix = (cc.format.name if cc.format is not None else "") or ""
            self.fmt = PixelFormat.GRAY if pix.startswith("gray") or pix in ("ya8", "monow", "monob") else PixelFormat.BGR
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        self.fps = float(rate) if rate else self._fallback_fps
        self._time_base = float(stream.time_base) if stream.time_base else None
        count = int(stream.frames or 0)
        if not count and container.duration and self.fps:  # no count in the header (MKV, raw streams): estimate
            count = round(container.duration / 1_000_000 * self.fps)
        self._count = count or None

    @property
    def frame_count(self) -> int | None:
        return None if self.loop else self._count

    def _next_decoded(self, frames: Any = None, at: int | None = None):
        """The next frame of ``frames`` (default: the pass being played), None at its end."""
        import av

        try:
            return next(frames if frames is not None else self._frames)
        except StopIteration:
            return None
        except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(
                f"video {self.path} is corrupt near frame {self._pass_frames if at is None else at}: {_av_reason(exc)}",
                hint="re-export the video, or use another file",
            ) from None

    def _next_pass(self) -> Any:
        """The next pass of a looped file in use (opened ahead where :meth:`read` began it); its first frame."""
        ahead, self._next = self._next, None
        self._container.close()
        if ahead is not None:
            container, stream, frames, vf = ahead.take()
        else:
            container = self._open_container()
            stream, frames = self._frames_of(container)
            vf = None
        self._container, self._stream, self._frames = container, stream, frames
        return vf if vf is not None else self._next_decoded()

    def read(self) -> Frame | None:
        if self._closed:
            return None
        vf = self._next_decoded()
        if vf is None:
            if not self.loop:
                return None
            if self._pass_frames == 0:
                raise InputError(f"video {self.path} has no decodable frames", hint="re-export the video, or use another file")
            self._t_offset = self._last_t + 1.0 / self.fps
            vf = self._next_pass()
            self._pass_frames = 0
            if vf is None:
                raise InputError(f"video {self.path} has no decodable frames", hint="re-export the video, or use another file")
        elif self.loop and self._next is None and self._count and self._pass_frames >= self._count - max(1.0, self.fps):
            self._next = _NextPass(self)  # the last second of a pass: the next one opens meanwhile
        if vf.pts is not None and self._time_base:
            pts_s = vf.pts * self._time_base
            if self._pass_frames == 0:
                self._first_pts = pts_s
            t = self._t_offset + pts_s - self._first_pts
        else:
            t = self._t_offset + self._pass_frames / self.fps
        self._last_t = t
        self._pass_frames += 1
        if self.compressed:  # the packet is one JPEG; a writable copy of its bytes
            data = np.frombuffer(bytearray(vf), dtype=np.uint8)
            self._pacer.wait(t)
            return self._emit_jpeg(data, self.width, self.height)
        if self.fmt is PixelFormat.GRAY:
            data = vf.to_ndarray(format="gray")
        else:
            data = vf.to_ndarray(format="bgr24")
        data = np.ascontiguousarray(data)
        self._pacer.wait(t)
        return self._emit(data)

    def reopen(self) -> VideoSource:
        """The file opened again, from its start."""
        realtime, clock, sleep = self._timing
        new = VideoSource(
            self.path, loop=self.loop, realtime=realtime, fallback_fps=self._fallback_fps, clock=clock, sleep=sleep,
            compressed=self._want_compressed,
        )  # fmt: skip
        return self._numbered_on(new)

    def close(self) -> None:
        if not self._closed:
            if self._next is not None:
                self._next.discard()
                self._next = None
            if self._container is not None:
                self._container.close()
        super().close()


class _NextPass:
    """A looped file's next pass, opened and its first frame decoded in a thread while the current
    pass plays its last second. Reopening at the end took the frames a pause each loop: the 1080p
    clip of ``benchmarks.first_seconds`` (5 s, four streams on an H100) lost 70-125 ms of frames
    every 5 s, the container's open and the decoder's threads filling before the first frame."""

    def __init__(self, source: VideoSource) -> None:
        import threading

        self._source = source
        self._got: tuple[Any, Any, Any, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vcam-video-next", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            container = self._source._open_container()
            stream, frames = self._source._frames_of(container)
            try:
                first = self._source._next_decoded(frames, at=0)
            except BaseException:
                container.close()
                raise
            self._got = (container, stream, frames, first)
        except BaseException as exc:  # raised in the reader's thread, at the loop (take)
            self._error = exc

    def take(self) -> tuple[Any, Any, Any, Any]:
        """``(container, stream, frames, first frame or None)``; what opening it raised is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._got is not None
        return self._got

    def discard(self) -> None:
        self._thread.join()
        if self._got is not None:
            self._got[0].close()
            self._got = None


def _av_reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc)
    return text.split(":")[0].strip() if text.count(":") > 1 else text.strip()


def read_image(path: str | Path) -> tuple[np.ndarray, PixelFormat]:
    """Decode an image file to 8-bit BGR ``(H, W, 3)`` or GRAY ``(H, W)``; alpha is dropped and
    16-bit images are scaled to 8 bits. Raises :class:`InputError` for a missing, truncated or
    undecodable file."""
    import cv2

    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"image not found: {path}", hint="check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not an image", hint="pass an image file") from None
    except OSError as exc:
        raise InputError(f"cannot read image {path}: {exc.strerror}", hint="check the file's permissions") from None
    if _looks_truncated(raw):
        raise InputError(f"image {path} is truncated", hint="the file was cut off; copy or download it again")
    img = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_UNCHANGED) if raw else None
    if img is None or img.size == 0:
        raise InputError(f"cannot decode image {path}", hint="it is corrupt or not an image; re-save it as PNG or JPEG")
    if img.dtype != np.uint8:
        if img.dtype == np.uint16:
            img = (img >> 8).astype(np.uint8)
        else:
            img = cv2.normalize(img.astype(np.float32), None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if img.ndim == 2:
        return np.ascontiguousarray(img), PixelFormat.GRAY
    if img.shape[2] == 4:
        img = img[..., :3]
    elif img.shape[2] == 2:  # gray + alpha
        return np.ascontiguousarray(img[..., 0]), PixelFormat.GRAY
    return np.ascontiguousarray(img), PixelFormat.BGR


def _looks_truncated(raw: bytes) -> bool:
    """JPEG/PNG files cut short still decode partially in OpenCV (grey bottom); catch them here.

    A complete JPEG ends with the EOI marker (FF D9), a PNG with its IEND chunk; a few bytes of
    padding after them are allowed. Inside JPEG entropy data FF D9 cannot occur, so a file cut
    mid-scan never has it near its end.
    """
    tail = raw[-64:]
    if raw[:3] == b"\xff\xd8\xff":
        return b"\xff\xd9" not in tail
    if raw[:8] == b"\x89PNG\r\n\x1a\n":
        return b"IEND" not in tail
    return False


class ImageSource(_SourceBase):
    """A still image repeated at ``fps`` (paced when ``realtime``); endless, or ``frames`` frames."""

    def __init__(
        self,
        path: str | Path,
        *,
        fps: float = 30.0,
        realtime: bool = True,
        frames: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self._image, self.fmt = read_image(path)
        self.height, self.width = self._image.shape[:2]
        self.fps = float(fps)
        self.frames = frames
        self._pacer = _Pacer(realtime, clock=clock, sleep=sleep)
        self._timing = (realtime, clock, sleep)

    @property
    def frame_count(self) -> int | None:
        return self.frames

    def reopen(self) -> ImageSource:
        realtime, clock, sleep = self._timing
        return self._numbered_on(
            ImageSource(self.path, fps=self.fps, realtime=realtime, frames=self.frames, clock=clock, sleep=sleep)
        )

    def read(self) -> Frame | None:
        if self._closed or (self.frames is not None and self._seq >= self.frames):
            return None
        self._pacer.wait(self._seq / self.fps)
        return self._emit(self._image, shared=True)


class PatternSource(_SourceBase):
    """A synthetic moving pattern: scrolling colour bars, a gradient and a bouncing white square.

    BGR, any size; endless; paced at ``fps`` when ``realtime``. Deterministic: frame ``i`` depends
    only on ``i`` (see :meth:`render`).
    """

    def __init__(
        self,
        width: int,
        height: int,
        *,
        fps: float = 30.0,
        realtime: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        super().__init__()
        self.width, self.height, self.fps = int(width), int(height), float(fps)
        self.fmt = PixelFormat.BGR
        self._pacer = _Pacer(realtime, clock=clock, sleep=sleep)
        self._timing = (realtime, clock, sleep)
        w, h = self.width, self.height
        # A period of 2 * width colour bars so scrolling wraps seamlessly.
        # Shaded bars over twice the width, so a scrolled view is one slice (plus a wrap-around).
        hue = (np.arange(2 * w) * 8 // max(1, w)) % 8
        palette = np.array(
            [[255, 255, 255], [0, 255, 255], [255, 255, 0], [0, 255, 0], [255, 0, 255], [0, 0, 255], [255, 0, 0], [32, 32, 32]],
            np.uint16,
        )
        shade = (np.linspace(1.0, 0.35, h, dtype=np.float32) * 256).astype(np.uint16)
        self._strip = ((palette[hue][None, :, :] * shade[:, None, None]) >> 8).astype(np.uint8)  # (h, 2w, 3)

    def render(self, i: int) -> np.ndarray:
        w, h = self.width, self.height
        shift = (i * 4) % (2 * w)
        img = np.empty((h, w, 3), np.uint8)
        first = min(w, 2 * w - shift)
        img[:, :first] = self._strip[:, shift : shift + first]
        if first < w:
            img[:, first:] = self._strip[:, : w - first]
        side = max(2, min(w, h) // 6)
        span_x, span_y = max(1, w - side), max(1, h - side)
        x = abs((i * 7) % (2 * span_x) - span_x)
        y = abs((i * 5) % (2 * span_y) - span_y)
        img[y : y + side, x : x + side] = 255
        return img

    def reopen(self) -> PatternSource:
        """The pattern again, going on from the frame this one stopped at."""
        realtime, clock, sleep = self._timing
        new = PatternSource(self.width, self.height, fps=self.fps, realtime=realtime, clock=clock, sleep=sleep)
        return self._numbered_on(new)

    def read(self) -> Frame | None:
        if self._closed:
            return None
        self._pacer.wait(self._seq / self.fps)
        return self._emit(self.render(self._seq))


class DemoSource(_SourceBase):
    """The generated demo clip (``vcam.stages.demo.DemoClip``): BGR, ``loop`` and ``realtime`` honoured."""

    def __init__(
        self,
        clip: Any,
        *,
        loop: bool = True,
        realtime: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        super().__init__()
        self.clip = clip
        self.loop = loop
        self.width, self.height = int(clip.width), int(clip.height)
        self.fps = float(clip.fps)
        self.fmt = PixelFormat.BGR
        self._n = int(clip.n_frames)
        if self._n <= 0:
            raise InputError("the demo clip has no frames", hint="set a positive length for the demo clip")
        self._pacer = _Pacer(realtime, clock=clock, sleep=sleep)
        self._timing = (realtime, clock, sleep)

    def reopen(self) -> DemoSource:
        """The same clip (not generated again), going on from the frame this one stopped at."""
        realtime, clock, sleep = self._timing
        return self._numbered_on(DemoSource(self.clip, loop=self.loop, realtime=realtime, clock=clock, sleep=sleep))

    @property
    def frame_count(self) -> int | None:
        return None if self.loop else self._n

    def read(self) -> Frame | None:
        if self._closed:
            return None
        i = self._seq
        if i >= self._n and not self.loop:
            return None
        self._pacer.wait(i / self.fps)
        img = np.ascontiguousarray(self.clip.frame(i % self._n), dtype=np.uint8)
        return self._emit(img, shared=not img.flags.writeable)
