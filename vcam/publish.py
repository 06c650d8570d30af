"""Publish stage: where finished frames go.

:func:`open_output` builds an :class:`Output` from ``OutputConfig.target``:

================ =================================================================================
``vcam``         the virtual camera (pyvirtualcam), found by its name ``OutputConfig.device_name``
``file:PATH``    an mp4 (H.264 when available, else MPEG-4 Part 2; yuv420p) written with PyAV
``window``       a preview window (OpenCV ``imshow``)
``null``         nothing; counts frames (benchmarks)
================ =================================================================================

Every output states what :meth:`Output.send` takes: ``fmt`` at ``width`` x ``height``. The pipeline
turns its BGR frame into that with :func:`prepare` (crop, then ``convert.from_bgr``), or calls
:meth:`send_bgr`. Outputs whose format is 4:2:0 (I420, NV12, the mp4's yuv420p) need an even width
and height: for an odd input size they take the frame cropped by one column and/or row at the
right/bottom edge, so ``width``/``height`` may be one less than the size passed to
:func:`open_output`. A BGR/RGB output (the mp4 file) also accepts the uncropped frame and crops it
itself, so a pipeline that only crops for 4:2:0 formats works with every output. Outputs do not
pace; the publish loop decides when to send.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import devices
from .config import OutputConfig
from .convert import frame_shape, from_bgr
from .errors import OutputError
from .types import PixelFormat

log = logging.getLogger(__name__)

TARGET_FORMS = "vcam, file:PATH (an .mp4), window, or null"
_VCAM_FORMATS = ("I420", "NV12", "RGB")


@runtime_checkable
class Output(Protocol):
    """A frame sink. ``send(data)`` takes ``fmt`` data for a ``width`` x ``height`` frame;
    ``close()`` is idempotent; outputs are context managers."""

    fmt: PixelFormat
    width: int
    height: int

    def send(self, data: Any) -> None: ...

    def send_bgr(self, frame: np.ndarray) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Output: ...

    def __exit__(self, *exc: object) -> None: ...


def even_size(width: int, height: int) -> tuple[int, int]:
    """The size a 4:2:0 output takes for a ``width`` x ``height`` input (odd sides lose one pixel)."""
    return width - (width % 2), height - (height % 2)


def prepare(output: Output, frame: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Crop a BGR ``(H, W, 3)`` frame to the output's size and convert it to the output's format."""
    h, w = frame.shape[:2]
    if (h, w) != (output.height, output.width):
        if h < output.height or w < output.width:
            raise ValueError(f"frame {w}x{h} is smaller than the output's {output.width}x{output.height}")
        frame = frame[: output.height, : output.width]
    if output.fmt is PixelFormat.BGR and out is None:
        return np.ascontiguousarray(frame)
    return from_bgr(frame, output.fmt, out)


class _OutputBase:
    fmt: PixelFormat
    width: int
    height: int

    def __init__(self) -> None:
        self.frames = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self, data: Any) -> np.ndarray:
        """``data`` as an array of the expected shape. A BGR/RGB frame one column and/or row larger
        (an odd input size on an even-size output) is cropped at the right/bottom edge."""
        a = np.asarray(data)
        want = frame_shape(self.fmt, self.width, self.height)
        if a.dtype != np.uint8:
            raise ValueError(f"unexpected frame dtype: {a.dtype} != uint8")
        if (
            len(want) == 3
            and a.ndim == 3
            and a.shape[2] == want[2]
            and 0 <= a.shape[0] - want[0] <= 1
            and 0 <= a.shape[1] - want[1] <= 1
        ):
            a = a[: want[0], : want[1]]
        if a.shape != want:
            raise ValueError(f"unexpected frame shape: {a.shape} != {want} ({self.fmt.value} {self.width}x{self.height})")
        return a

    def send(self, data: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def send_bgr(self, frame: np.ndarray) -> None:
        """Convenience: :func:`prepare` then :meth:`send`."""
        self.send(prepare(self, frame))

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self.__dict__.get("_ready"):
            return  # __init__ failed and cleaned up after itself
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}x{self.height} {self.fmt.value})"


# --------------------------------------------------------------------------------------------------


class NullOutput(_OutputBase):
    """Discards frames and counts them (``frames``). ``fmt`` defaults to BGR; pass another format to
    include the output conversion in a benchmark."""

    def __init__(self, width: int, height: int, fps: float = 30.0, *, fmt: PixelFormat = PixelFormat.BGR) -> None:
        super().__init__()
        self.fmt = PixelFormat(fmt)
        self.width, self.height = (
            even_size(width, height) if self.fmt in (PixelFormat.I420, PixelFormat.NV12) else (width, height)
        )
        self.fps = fps
        self._ready = True

    def send(self, data: Any) -> None:
        if self._closed:
            raise OutputError("the null output is closed")
        self._check(data)
        self.frames += 1


# --------------------------------------------------------------------------------------------------


class VirtualCamOutput(_OutputBase):
    """The virtual camera through the real ``pyvirtualcam.Camera``.

    Linux: the v4l2loopback device whose card label is ``device_name`` (found in sysfs); when none
    exists, :class:`OutputError` with the ``modprobe`` line as hint. Never another loopback device.
    Windows/macOS: pyvirtualcam's backends (OBS Virtual Camera, Unity Capture).

    ``pixel_format``: ``I420``, ``NV12`` or ``RGB``; ``auto`` opens with I420 and switches to the
    backend's native format (``Camera.native_fmt``) when that is NV12 or RGB, so the backend does not
    convert again. I420/NV12 need even sides: an odd ``width``/``height`` is cropped by one (see
    the module docstring). ``backend``/``backend_options`` pick a registered pyvirtualcam backend and
    its extra keyword arguments (tests register a capturing one).
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: float,
        *,
        device_name: str = devices.DEFAULT_LABEL,
        pixel_format: str = "auto",
        backend: str | None = None,
        backend_options: dict[str, Any] | None = None,
        sysfs_root: Path = devices.SYSFS_ROOT,
    ) -> None:
        super().__init__()
        import pyvirtualcam

        self._pvc = pyvirtualcam
        self._cam = None
        self.fps = float(fps)
        self.device_name = device_name
        self._backend = backend
        self._options = dict(backend_options or {})
        self._in_size = (int(width), int(height))
        if pixel_format not in ("auto", *_VCAM_FORMATS):
            raise OutputError(
                f"unsupported virtual camera pixel format {pixel_format!r}", hint=f"use auto, {', '.join(_VCAM_FORMATS)}"
            )
        self._device_arg: str | None = None
        self.device_path = ""
        if devices.is_linux() or Path(sysfs_root) != devices.SYSFS_ROOT:
            dev = devices.find_virtual_camera(device_name, sysfs_root)
            if dev is None:
                others = [d for d in devices.list_video_devices(sysfs_root) if d.is_loopback]
                note = ""
                if others:
                    listed = ", ".join(f'{d.path} "{d.name}"' for d in others)
                    note = (
                        f"; other loopback devices are left alone ({listed}); v4l2loopback is loaded, so remove it first "
                        "with `sudo modprobe -r v4l2loopback` or add a device with v4l2loopback-ctl"
                    )
                raise OutputError(
                    f'no virtual camera named "{device_name}" found{note}', hint=devices.modprobe_hint(device_name, sysfs_root)
                )
            self._device_arg = dev.path
        chosen = "I420" if pixel_format == "auto" else pixel_format
        self._open(chosen)
        if pixel_format == "auto":
            native = self._cam.native_fmt
            if native is not None and native.name in _VCAM_FORMATS and native.name != chosen:
                self._cam.close()
                self._open(native.name)
        self.device_path = self._cam.device
        self.backend_name = self._cam.backend
        self._ready = True

    def _open(self, fmt_name: str) -> None:
        fmt = PixelFormat(fmt_name)
        w, h = self._in_size
        if fmt in (PixelFormat.I420, PixelFormat.NV12):
            w, h = even_size(w, h)
        if self._backend is not None and self._backend not in self._pvc.camera.BACKENDS:
            raise OutputError(
                f"unknown pyvirtualcam backend {self._backend!r}",
                hint=f"use one of: {', '.join(self._pvc.camera.BACKENDS) or 'none installed'}",
            )
        attempts = [self._device_arg]
        if self._device_arg is None and self.device_name:  # Windows/macOS: the name, then the default
            attempts = [self.device_name, None]
        errors = []
        for device in attempts:
            try:
                self._cam = self._pvc.Camera(
                    w, h, self.fps, fmt=self._pvc.PixelFormat[fmt.value], device=device, backend=self._backend, **self._options
                )
                break
            except Exception as exc:  # pyvirtualcam raises RuntimeError listing every backend's failure
                errors.append(f"{device or 'default device'}: {' / '.join(str(exc).splitlines())}")
        else:
            hint = (
                devices.virtual_camera_hint(self.device_name)
                if self._device_arg is None
                else ("close other programs writing to it; v4l2loopback needs exclusive_caps=1 and a free device")
            )
            raise OutputError(f"could not open the virtual camera: {'; '.join(errors)}", hint=hint)
        self.fmt, self.width, self.height = fmt, w, h

    @property
    def native_fmt(self) -> PixelFormat | None:
        native = self._cam.native_fmt if self._cam is not None else None
        return PixelFormat(native.name) if native is not None and native.name in PixelFormat.__members__ else None

    def send(self, data: Any) -> None:
        if self._closed or self._cam is None:
            raise OutputError("the virtual camera is closed")
        a = self._check(data)
        try:
            self._cam.send(np.ascontiguousarray(a))
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            raise OutputError(
                f"writing to the virtual camera {self.device_path} failed: {exc}", hint="was the device removed? restart vcam"
            ) from exc
        self.frames += 1

    def close(self) -> None:
        if not self._closed and self._cam is not None:
            try:
                self._cam.close()
            finally:
                self._cam = None
        super().close()

    def __repr__(self) -> str:
        return f"VirtualCamOutput({self.device_path} {self.width}x{self.height} {self.fmt.value} @ {self.fps:g})"


# --------------------------------------------------------------------------------------------------


class FileOutput(_OutputBase):
    """An mp4 written with PyAV: H.264 (libx264) when available, else MPEG-4 Part 2; yuv420p.

    Takes BGR frames (``fmt`` BGR; PyAV's swscale converts to yuv420p). Odd sizes are cropped to
    even. Frames go to a hidden temporary file beside ``path`` which replaces ``path`` only on
    :meth:`close`, so a crash never leaves a half-written file under the user's name. An existing
    ``path`` is replaced only if it is itself a video; any other file is refused. With no frames
    written, close removes the temporary file and leaves ``path`` untouched.

    ``timing``: ``"wall"`` (default) stamps each frame with the time :meth:`send` was called, so a
    live recording plays at real speed even when frames were dropped; ``"frames"`` stamps frame
    ``i`` at ``i / fps`` (constant rate: batch conversion of a file, tests). ``preset``: libx264's
    speed/size trade-off (``superfast`` costs about 18 ms per 720p frame on 2 cores).
    """

    CODECS = ("libx264", "h264", "mpeg4")
    _WALL_TB = Fraction(1, 1000)

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: float,
        *,
        codecs: tuple[str, ...] | None = None,
        preset: str = "superfast",
        timing: str = "wall",
        clock: Any = None,
    ) -> None:
        super().__init__()
        import time

        import av

        self._av = av
        self.path = Path(path).expanduser()
        self.fmt = PixelFormat.BGR
        self.width, self.height = even_size(int(width), int(height))
        if self.width < 2 or self.height < 2:
            raise OutputError(f"frame size {width}x{height} is too small for a video file", hint="use a larger input")
        if timing not in ("wall", "frames"):
            raise ValueError(f"timing must be 'wall' or 'frames', got {timing!r}")
        self.timing = timing
        self._clock = clock or time.perf_counter
        self.fps = float(fps) if fps and fps > 0 else 30.0
        parent = self.path.parent
        if not parent.is_dir():
            raise OutputError(
                f"folder {parent} does not exist", hint=f"create it first (mkdir -p {parent}) or write to another path"
            )
        if self.path.is_dir():
            raise OutputError(f"{self.path} is a folder", hint="give a file name such as file:out.mp4")
        if self.path.exists() and not _is_video(self.path):
            raise OutputError(
                f"{self.path} exists and is not a video; refusing to overwrite it",
                hint="choose another file name or move that file away",
            )
        suffix = self.path.suffix.lower()
        container_format = None if suffix in (".mp4", ".mov", ".mkv", ".m4v") else "mp4"
        fd, tmp = tempfile.mkstemp(
            prefix=f".{self.path.stem}.", suffix=".partial" + (suffix if container_format is None else ".mp4"), dir=parent
        )
        os.close(fd)
        self._tmp = Path(tmp)
        rate = Fraction(self.fps).limit_denominator(1001)
        self._frame_tb = self._WALL_TB if timing == "wall" else 1 / rate
        errors = []
        self._stream = None
        for name in codecs or self.CODECS:
            try:  # a fresh container per attempt, so a failed encoder leaves no dead stream behind
                container = av.open(str(self._tmp), mode="w", format=container_format)
            except Exception as exc:
                self._tmp.unlink(missing_ok=True)
                raise OutputError(
                    f"cannot write {self.path}: {exc}", hint="check the folder's permissions and free space"
                ) from exc
            try:
                stream = container.add_stream(name, rate=rate)
                stream.width, stream.height = self.width, self.height
                stream.pix_fmt = "yuv420p"
                stream.codec_context.time_base = self._frame_tb
                if name == "libx264":
                    stream.options = {"preset": preset, "crf": "20"}
                elif name == "mpeg4":
                    stream.bit_rate = max(1_000_000, int(self.width * self.height * self.fps * 0.15))
                stream.codec_context.open()
            except Exception as exc:  # unknown here, or listed but not usable in this FFmpeg build
                errors.append(f"{name}: {exc}")
                container.close()
                continue
            self._container, self._stream, self.codec = container, stream, name
            break
        if self._stream is None:
            self._tmp.unlink(missing_ok=True)
            raise OutputError(
                f"no usable video encoder for {self.path} ({'; '.join(errors)})",
                hint="install a PyAV build with libx264 (pip install av)",
            )
        self._t0: float | None = None
        self._last_pts = -1
        self._ready = True

    def send(self, data: Any) -> None:
        if self._closed:
            raise OutputError(f"the file output {self.path} is closed")
        a = self._check(data)
        vf = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="bgr24")
        if self.timing == "wall":
            now = self._clock()
            if self._t0 is None:
                self._t0 = now
            pts = max(self._last_pts + 1, round((now - self._t0) / self._frame_tb))
        else:
            pts = self.frames
        vf.pts = self._last_pts = int(pts)
        vf.time_base = self._frame_tb
        try:
            for packet in self._stream.encode(vf):
                self._container.mux(packet)
        except Exception as exc:
            raise OutputError(f"writing {self.path} failed: {exc}", hint="check free disk space") from exc
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder, finalise the file and move it to ``path``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.frames:
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
        finally:
            self._container.close()
            if self.frames:
                os.replace(self._tmp, self.path)
            else:
                self._tmp.unlink(missing_ok=True)
                log.warning("no frames were written; %s left untouched", self.path)

    def __repr__(self) -> str:
        return f"FileOutput({self.path} {self.width}x{self.height} @ {self.fps:g})"


def _is_video(path: Path) -> bool:
    """True when PyAV opens ``path`` as a container with a video stream."""
    import av

    try:
        with av.open(str(path)) as c:
            return bool(c.streams.video)
    except Exception:
        return False


# --------------------------------------------------------------------------------------------------


def gui_available() -> tuple[bool, str]:
    """Whether ``cv2.imshow`` can open a window here, and if not why."""
    import cv2

    info = cv2.getBuildInformation()
    gui = ""
    for line in info.splitlines():
        if line.strip().startswith("GUI:"):
            gui = line.split(":", 1)[1].strip()
            break
    if not gui or gui.upper() == "NONE":
        return False, "this OpenCV build has no GUI support (opencv-python-headless)"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False, "no display (DISPLAY/WAYLAND_DISPLAY is not set)"
    return True, gui


class WindowOutput(_OutputBase):
    """A preview window (``cv2.imshow``), BGR. ``user_closed`` becomes true when the user presses
    q or Esc or closes the window; the daemon may treat that as a stop request."""

    def __init__(self, width: int, height: int, fps: float = 30.0, *, title: str = "FastSwap Cam") -> None:
        super().__init__()
        ok, why = gui_available()
        if not ok:
            raise OutputError(f"cannot open a preview window: {why}", hint="use --output file:out.mp4 or --output vcam instead")
        import cv2

        self._cv2 = cv2
        self.fmt = PixelFormat.BGR
        self.width, self.height, self.fps = width, height, fps
        self.title = title
        self.user_closed = False
        try:
            cv2.namedWindow(title, cv2.WINDOW_NORMAL)
            cv2.resizeWindow(title, width, height)
        except cv2.error as exc:
            raise OutputError(
                f"cannot open a preview window: {exc}", hint="use --output file:out.mp4 or --output vcam instead"
            ) from exc
        self._shown = False
        self._ready = True

    def send(self, data: Any) -> None:
        if self._closed:
            raise OutputError("the preview window is closed")
        a = self._check(data)
        cv2 = self._cv2
        cv2.imshow(self.title, a)
        key = cv2.waitKey(1) & 0xFF
        if key in (ord("q"), 27):
            self.user_closed = True
        if self._shown:
            try:
                if cv2.getWindowProperty(self.title, cv2.WND_PROP_VISIBLE) < 1:
                    self.user_closed = True
            except cv2.error:
                self.user_closed = True
        self._shown = True
        self.frames += 1

    def close(self) -> None:
        if not self._closed:
            try:
                self._cv2.destroyWindow(self.title)
                self._cv2.waitKey(1)
            except Exception:  # already gone
                pass
        super().close()


# --------------------------------------------------------------------------------------------------


def open_output(
    cfg: OutputConfig,
    width: int,
    height: int,
    fps: float,
    *,
    sysfs_root: Path = devices.SYSFS_ROOT,
    backend: str | None = None,
    backend_options: dict[str, Any] | None = None,
    file_timing: str = "wall",
) -> Output:
    """Open the output named by ``cfg.target`` for ``width`` x ``height`` frames.

    ``fps``: the input's rate, used unless ``cfg.fps`` is set (> 0). ``backend`` and
    ``backend_options`` go to pyvirtualcam for ``vcam``. ``file_timing`` is :class:`FileOutput`'s
    ``timing`` (``"frames"`` suits as-fast-as-possible runs). Raises :class:`OutputError` naming the fix.
    """
    target = (cfg.target or "").strip()
    rate = cfg.fps if cfg.fps and cfg.fps > 0 else fps
    low = target.lower()
    if low == "vcam":
        return VirtualCamOutput(
            width,
            height,
            rate,
            device_name=cfg.device_name,
            pixel_format=cfg.pixel_format,
            backend=backend,
            backend_options=backend_options,
            sysfs_root=sysfs_root,
        )
    if low.startswith("file:"):
        path = target[5:].strip()
        if not path:
            raise OutputError("file: needs a path", hint="use --output file:out.mp4")
        return FileOutput(path, width, height, rate, timing=file_timing)
    if low == "window":
        return WindowOutput(width, height, rate)
    if low == "null":
        return NullOutput(width, height, rate)
    raise OutputError(f"unknown output {target!r}", hint=f"use one of: {TARGET_FORMS}")


__all__ = [
    "FileOutput",
    "NullOutput",
    "Output",
    "VirtualCamOutput",
    "WindowOutput",
    "even_size",
    "gui_available",
    "open_output",
    "prepare",
]
