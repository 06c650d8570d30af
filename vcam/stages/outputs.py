"""Where finished frames go: the :class:`Output` protocol and its shared base, and the live outputs
(nothing, the virtual camera through pyvirtualcam, a preview window). :mod:`vcam.stages.recording`
writes files; :func:`vcam.stages.publish.open_output` picks one for a target."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam import devices
from vcam.errors import OutputError
from vcam.kernels.convert import frame_shape, from_bgr_ref
from vcam.types import Closing, PixelFormat

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
    return from_bgr_ref(frame, output.fmt, out)


class OutputBase(Closing):
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

    def __del__(self) -> None:
        if not self.__dict__.get("_ready"):
            return  # __init__ failed and cleaned up after itself
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}x{self.height} {self.fmt.value})"


class NullOutput(OutputBase):
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


class VirtualCamOutput(OutputBase):
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


def reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__


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


class WindowOutput(OutputBase):
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
