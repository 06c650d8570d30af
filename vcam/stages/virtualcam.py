"""The virtual camera output: which backend writes it on this platform, and the output itself.

Backends (``[output] backend``), each a pyvirtualcam backend of the same name:

================ =================================================================================
``v4l2loopback`` Linux: the loopback device whose card label is the camera's name (sysfs); never
                 another program's loopback device
``unitycapture`` Windows: Unity Capture registered under the camera's name (once, with admin
                 rights); apps list that name
``obs``          Windows and macOS: OBS Studio's virtual camera; apps list "OBS Virtual Camera", and
                 OBS's own virtual camera must be off (one writer at a time)
``auto``         v4l2loopback on Linux; on Windows Unity Capture when it is registered under the
                 camera's name, else obs (with one line saying what apps will list); obs on macOS
================ =================================================================================

:func:`choose_backend` makes the choice (the platform and the Unity Capture probe are parameters,
so every platform's choice is tested here); it never falls back silently: a backend that cannot
work raises :class:`OutputError` whose hint is the exact step that sets it up
(:func:`setup_hint`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vcam import devices
from vcam.errors import OutputError
from vcam.stages.outputs import OutputBase, even_size
from vcam.types import PixelFormat

log = logging.getLogger("vcam.stages.publish")

VCAM_FORMATS = ("I420", "NV12", "RGB")
BACKENDS = ("v4l2loopback", "unitycapture", "obs")
OBS_CAMERA = "OBS Virtual Camera"
#: Where each backend works (``sys.platform`` values).
PLATFORMS = {"v4l2loopback": ("linux",), "unitycapture": ("win32",), "obs": ("win32", "darwin")}
UNITY_CAPTURE_URL = "github.com/schellingb/UnityCapture"


def _os(platform: str) -> str:
    return "linux" if platform.startswith("linux") else platform


def _system(platform: str) -> str:
    return {"linux": "Linux", "win32": "Windows", "darwin": "macOS"}.get(_os(platform), platform)


def unity_capture_step(device_name: str) -> str:
    """The one-time registration that makes Unity Capture show ``device_name``."""
    return (
        f'register Unity Capture as "{device_name}" once, from an administrator command prompt in the Install folder '
        f'of {UNITY_CAPTURE_URL}: regsvr32 "/i:UnityCaptureName={device_name}" UnityCaptureFilter64bit.dll'
    )


def setup_hint(backend: str, device_name: str, platform: str = sys.platform, sysfs_root: Path = devices.SYSFS_ROOT) -> str:
    """The exact step that makes ``backend`` work here (one line)."""
    if backend == "v4l2loopback":
        return devices.modprobe_hint(device_name, sysfs_root)
    if backend == "unitycapture":
        return unity_capture_step(device_name)
    if _os(platform) == "darwin":
        return "install OBS Studio 30+, click 'Start Virtual Camera' once, allow its camera extension, then stop it"
    return "install OBS Studio 26+ (it registers OBS Virtual Camera); keep OBS's own virtual camera stopped while vcam runs"


def obs_note(device_name: str, unity_names: list[str] | None = None) -> str:
    """The line said when the obs backend publishes (the camera cannot carry ``device_name``)."""
    note = (
        f'virtual camera: the OBS backend; apps list it as "{OBS_CAMERA}", not "{device_name}", '
        "and OBS's own virtual camera must be off while vcam runs"
    )
    others = ", ".join(f'"{n}"' for n in unity_names or [])
    if others:
        note += f'; Unity Capture is registered as {others}, not "{device_name}"'
    return note


@dataclass(frozen=True)
class Choice:
    """A virtual camera backend chosen for this platform. ``device``: what pyvirtualcam is given
    (the loopback node, the Unity Capture name, or None for OBS's one camera); ``shown_as``: the name
    apps list; ``note``: a line for the log ('' when the camera carries the configured name)."""

    backend: str
    device: str | None
    shown_as: str
    note: str = ""


def choose_backend(
    wanted: str,
    device_name: str = devices.DEFAULT_LABEL,
    *,
    platform: str = sys.platform,
    sysfs_root: Path = devices.SYSFS_ROOT,
    unity_names: Callable[[], list[str]] = devices.unity_capture_names,
) -> Choice:
    """The backend for ``wanted`` (``auto`` or one of :data:`BACKENDS`) on ``platform``.

    ``unity_names``: the names Unity Capture is registered under (default: read from the Windows
    registry, :func:`vcam.devices.unity_capture_names`). Raises OutputError, with the step that
    fixes it as hint, when ``wanted`` cannot work here.
    """
    system = _os(platform)
    if wanted == "auto":
        if system == "linux":
            wanted = "v4l2loopback"
        elif system == "win32" and device_name in unity_names():
            wanted = "unitycapture"
        else:
            wanted = "obs"
    elif wanted not in BACKENDS:
        raise OutputError(f"unknown virtual camera backend {wanted!r}", hint=f"use auto, {', '.join(BACKENDS)}")
    if system not in PLATFORMS[wanted]:
        works = ", ".join(_system(p) for p in PLATFORMS[wanted])
        native = {"linux": "v4l2loopback", "win32": "unitycapture or obs"}.get(system, "obs")
        raise OutputError(
            f"the {wanted} virtual camera works on {works} only, not {_system(platform)}",
            hint=f'set [output] backend = "auto" (or {native})',
        )
    if wanted == "v4l2loopback":
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
        return Choice("v4l2loopback", dev.path, device_name)
    if wanted == "unitycapture":
        names = unity_names()
        if device_name not in names:
            seen = f" (registered: {', '.join(repr(n) for n in names)})" if names else ""
            raise OutputError(f'Unity Capture is not registered as "{device_name}"{seen}', hint=unity_capture_step(device_name))
        return Choice("unitycapture", device_name, device_name)
    names = unity_names() if system == "win32" else []
    return Choice("obs", None, OBS_CAMERA, obs_note(device_name, names))


class VirtualCamOutput(OutputBase):
    """The virtual camera through the real ``pyvirtualcam.Camera``, on the backend
    :func:`choose_backend` picks for ``backend`` (see the module docstring); the choice is logged,
    with its note when apps will not list ``device_name``.

    ``pixel_format``: ``I420``, ``NV12`` or ``RGB``; ``auto`` opens with I420 and switches to the
    backend's native format (``Camera.native_fmt``) when that is NV12 or RGB, so the backend does not
    convert again. I420/NV12 need even sides: an odd ``width``/``height`` is cropped by one.

    ``writer``/``writer_options``: a registered pyvirtualcam backend that writes instead of the
    chosen one's, and its extra keyword arguments (tests register a capturing one);
    ``platform``/``unity_names``/``sysfs_root`` go to :func:`choose_backend`.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: float,
        *,
        device_name: str = devices.DEFAULT_LABEL,
        pixel_format: str = "auto",
        backend: str = "auto",
        writer: str | None = None,
        writer_options: dict[str, Any] | None = None,
        platform: str = sys.platform,
        unity_names: Callable[[], list[str]] = devices.unity_capture_names,
        sysfs_root: Path = devices.SYSFS_ROOT,
    ) -> None:
        super().__init__()
        import pyvirtualcam

        self._pvc = pyvirtualcam
        self._cam: Any = None
        self.fps = float(fps)
        self.device_name = device_name
        self._options = dict(writer_options or {})
        self._in_size = (int(width), int(height))
        if pixel_format not in ("auto", *VCAM_FORMATS):
            raise OutputError(
                f"unsupported virtual camera pixel format {pixel_format!r}", hint=f"use auto, {', '.join(VCAM_FORMATS)}"
            )
        if Path(sysfs_root) != devices.SYSFS_ROOT:
            platform = "linux"  # a test's sysfs tree stands for a Linux machine
        self.choice = choose_backend(backend, device_name, platform=platform, sysfs_root=sysfs_root, unity_names=unity_names)
        self._writer = writer or self.choice.backend
        self._hint = setup_hint(self.choice.backend, device_name, platform, sysfs_root)
        if self.choice.backend == "v4l2loopback":
            self._hint = "close other programs writing to it; v4l2loopback needs exclusive_caps=1 and a free device"
        self.device_path = ""
        chosen = "I420" if pixel_format == "auto" else pixel_format
        cam = self._cam = self._open(chosen)
        if pixel_format == "auto":
            native = cam.native_fmt
            if native is not None and native.name in VCAM_FORMATS and native.name != chosen:
                cam.close()
                cam = self._cam = self._open(native.name)
        self.device_path = cam.device
        self.backend_name = cam.backend
        if self.choice.note:
            log.warning("%s", self.choice.note)
        log.info('virtual camera: %s backend, apps list "%s" (%s)', self.choice.backend, self.choice.shown_as, self.device_path)
        self._ready = True

    def _open(self, fmt_name: str) -> Any:
        """A ``pyvirtualcam.Camera`` taking ``fmt_name`` frames (sets ``fmt``, ``width``, ``height``)."""
        fmt = PixelFormat(fmt_name)
        w, h = self._in_size
        if fmt in (PixelFormat.I420, PixelFormat.NV12):
            w, h = even_size(w, h)
        if self._writer not in self._pvc.camera.BACKENDS:
            raise OutputError(
                f"unknown pyvirtualcam backend {self._writer!r}",
                hint=f"use one of: {', '.join(self._pvc.camera.BACKENDS) or 'none installed'}",
            )
        device = self.choice.device
        try:
            cam = self._pvc.Camera(
                w, h, self.fps, fmt=self._pvc.PixelFormat[fmt.value], device=device, backend=self._writer, **self._options
            )
        except Exception as exc:  # pyvirtualcam raises RuntimeError naming the backend's failure
            what = " / ".join(str(exc).splitlines())
            raise OutputError(
                f"could not open the virtual camera: {device or self.choice.shown_as}: {what}", hint=self._hint
            ) from None
        self.fmt, self.width, self.height = fmt, w, h
        return cam

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


__all__ = ["BACKENDS", "Choice", "VirtualCamOutput", "choose_backend", "obs_note", "setup_hint"]
