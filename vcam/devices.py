"""Device discovery: cameras to capture from and the virtual camera to publish to.

On Linux everything comes from sysfs (``/sys/class/video4linux/videoN``), which is cheap and never
opens a device (so no camera light turns on). A v4l2loopback node is recognised by the sysfs
attributes only that driver creates (``max_openers``, ``buffers``, ``format``) or by a driver link
naming it. Only the *main* node of a camera is listed: nodes whose sysfs ``index`` is not 0 are the
metadata nodes UVC cameras add beside each capture node.

The virtual camera is found by its card label only; this module never picks "some" loopback device,
because writing into another program's loopback device (OBS's, a screen share's) would hijack it.

Elsewhere (Windows, macOS) there is no sysfs: :func:`list_video_devices` returns an empty list
unless ``probe=True``, which opens OpenCV indices ``0..probe_count-1`` one by one through the
platform's capture API (:func:`capture_apis`: DirectShow, then Media Foundation on Windows).

Windows virtual cameras are DirectShow filters registered under ``HKEY_CLASSES_ROOT\\CLSID``:
:func:`unity_capture_names` and :func:`obs_camera_registered` read that (through the registry seam,
:mod:`vcam.platform.registry`; anywhere else they find nothing) and never open a device.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vcam.platform.registry import classes_root_default

SYSFS_ROOT = Path("/sys/class/video4linux")
DEFAULT_LABEL = "FastSwap Cam"
_LOOPBACK_ATTRS = ("max_openers", "buffers", "format")
_NODE_RE = re.compile(r"^video(\d+)$")


@dataclass(frozen=True, slots=True)
class VideoDevice:
    """A video node. ``path``: ``/dev/videoN`` on Linux (the OpenCV index as text elsewhere);
    ``name``: card label; ``index``: N of ``/dev/videoN`` (the OpenCV camera index);
    ``is_loopback``: a v4l2loopback (virtual) device."""

    path: str
    name: str
    index: int
    is_loopback: bool


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _is_loopback(node: Path) -> bool:
    if any((node / attr).exists() for attr in _LOOPBACK_ATTRS):
        return True
    for link in (node / "device" / "driver", node / "device"):
        try:
            if "v4l2loopback" in os.path.realpath(link):
                return True
        except OSError:  # pragma: no cover - unreadable link
            pass
    modalias = _read(node / "device" / "modalias") or ""
    return "v4l2loopback" in modalias


def _sysfs_devices(sysfs_root: Path) -> list[VideoDevice]:
    try:
        entries = list(Path(sysfs_root).iterdir())
    except OSError:
        return []
    out = []
    for node in entries:
        m = _NODE_RE.match(node.name)
        if not m:
            continue
        sub_index = _read(node / "index")
        if sub_index not in (None, "", "0"):
            continue  # a camera's metadata node, not something to capture from
        name = _read(node / "name") or node.name
        out.append(VideoDevice(path=f"/dev/{node.name}", name=name, index=int(m.group(1)), is_loopback=_is_loopback(node)))
    return sorted(out, key=lambda d: d.index)


#: OpenCV's capture APIs per platform, tried in order (``cv2`` constant names). Windows: DirectShow
#: first, which honours a requested MJPG format and opens at once; Media Foundation when DirectShow
#: cannot open the camera.
CAPTURE_APIS: dict[str, tuple[tuple[str, str], ...]] = {
    "linux": (("V4L2", "CAP_V4L2"),),
    "win32": (("DirectShow", "CAP_DSHOW"), ("Media Foundation", "CAP_MSMF")),
    "darwin": (("AVFoundation", "CAP_AVFOUNDATION"),),
}


def capture_apis(platform: str = sys.platform) -> tuple[tuple[str, str], ...]:
    """``(label, cv2 constant name)`` of the capture APIs to try on ``platform``, in order
    (OpenCV's own choice, ``CAP_ANY``, where none is listed)."""
    key = "linux" if platform.startswith("linux") else platform
    return CAPTURE_APIS.get(key, (("default", "CAP_ANY"),))


def _probe_opencv(count: int, platform: str = sys.platform, opener: Callable[[int, int], Any] | None = None) -> list[VideoDevice]:
    """Cameras ``0..count-1`` that open through the first capture API of ``platform`` that opens
    any (``opener(index, api)``: default ``cv2.VideoCapture``). OpenCV gives no names: a camera is
    ``camera N (API)``."""
    import cv2

    open_ = opener or cv2.VideoCapture
    for label, const in capture_apis(platform):
        out = []
        for i in range(count):
            cap = open_(i, int(getattr(cv2, const)))
            try:
                if cap.isOpened():
                    out.append(VideoDevice(path=str(i), name=f"camera {i} ({label})", index=i, is_loopback=False))
            finally:
                cap.release()
        if out:
            return out
    return []


def list_video_devices(
    sysfs_root: Path = SYSFS_ROOT,
    *,
    probe: bool = False,
    probe_count: int = 4,
    platform: str = sys.platform,
    opener: Callable[[int, int], Any] | None = None,
) -> list[VideoDevice]:
    """Every video node, cameras and loopback devices alike, sorted by index.

    Linux: read from ``sysfs_root``; nothing is opened. Elsewhere: ``[]`` unless ``probe`` is true,
    then OpenCV indices ``0..probe_count-1`` are opened one at a time (slow, lights cameras up)
    through :func:`capture_apis` (``opener``: see :func:`_probe_opencv`), and on Windows the
    registered virtual cameras follow (:func:`registered_virtual_cameras`). DirectShow lists the
    virtual cameras among the indices too, and OpenCV names none of them.
    """
    if platform.startswith("linux") or Path(sysfs_root) != SYSFS_ROOT:
        return _sysfs_devices(Path(sysfs_root))
    if not probe:
        return []
    return _probe_opencv(probe_count, platform, opener) + (registered_virtual_cameras() if platform == "win32" else [])


def list_cameras(sysfs_root: Path = SYSFS_ROOT, *, probe: bool = False) -> list[VideoDevice]:
    """The real cameras (loopback devices left out)."""
    return [d for d in list_video_devices(sysfs_root, probe=probe) if not d.is_loopback]


def find_virtual_camera(label: str = DEFAULT_LABEL, sysfs_root: Path = SYSFS_ROOT) -> VideoDevice | None:
    """The loopback device whose card label is ``label`` (exact, surrounding spaces ignored).

    Returns None when there is none; never falls back to another device. A node carrying the label
    but not recognised as loopback is still accepted when no recognised one exists (older driver
    builds lack the sysfs attributes), since no real camera carries our label.
    """
    want = label.strip()
    matches = [d for d in list_video_devices(sysfs_root) if d.name.strip() == want]
    matches.sort(key=lambda d: (not d.is_loopback, d.index))
    return matches[0] if matches else None


def free_video_nr(sysfs_root: Path = SYSFS_ROOT, start: int = 10) -> int:
    """The first ``/dev/videoN`` number >= ``start`` that no node uses (metadata nodes included)."""
    used = set()
    try:
        for node in Path(sysfs_root).iterdir():
            m = _NODE_RE.match(node.name)
            if m:
                used.add(int(m.group(1)))
    except OSError:
        pass
    n = start
    while n in used:
        n += 1
    return n


def modprobe_hint(label: str = DEFAULT_LABEL, sysfs_root: Path = SYSFS_ROOT) -> str:
    """The command that creates the virtual camera on Linux, with a free ``video_nr``."""
    quoted = label.replace("\\", "\\\\").replace('"', '\\"')
    return f'sudo modprobe v4l2loopback video_nr={free_video_nr(sysfs_root)} card_label="{quoted}" exclusive_caps=1'


def describe_devices(devices: list[VideoDevice]) -> str:
    """``0 (Integrated Camera), 2 (USB Cam)`` or ``none``."""
    return ", ".join(f"{d.index} ({d.name})" for d in devices) or "none"


# -- Windows: DirectShow virtual cameras in the registry ---------------------------------------------

#: Unity Capture's capture filter: device ``n`` (0-based) is ``HKEY_CLASSES_ROOT\CLSID\{...E700XX}``
#: with XX = 0x10 + n + (1 if n else 0) for the 64-bit filter (0x20 + ... for the 32-bit one: the
#: filter's own numbering, which pyvirtualcam reads the same way); the key's default value is the
#: name apps list (``/i:UnityCaptureName=NAME`` at registration, "Unity Video Capture" without).
UNITY_CAPTURE_KEY = "CLSID\\{{5C2CD55C-92AD-4999-8666-912BD3E700{:02X}}}"
UNITY_CAPTURE_DEVICES = 74  # the filter's most devices ('z' - '0')
#: OBS Studio's virtual camera filter (registered by OBS 26+ at install).
OBS_CAMERA_KEY = "CLSID\\{A3FCE0F5-3493-419F-958A-ABA1250EC20B}"


def unity_capture_names(read: Callable[[str], str | None] = classes_root_default) -> list[str]:
    """The names Unity Capture's devices are registered under, in device order (``[]``: not
    registered, or not Windows). ``read``: :func:`classes_root_default` (tests pass a fake registry)."""
    base = 0x10 if struct.calcsize("P") == 8 else 0x20
    names = []
    for n in range(UNITY_CAPTURE_DEVICES):
        name = read(UNITY_CAPTURE_KEY.format(base + n + (1 if n else 0)))
        if name:
            names.append(name.strip())
    return names


def obs_camera_registered(read: Callable[[str], str | None] = classes_root_default) -> bool:
    """Whether OBS Studio's virtual camera filter is registered (Windows)."""
    return read(OBS_CAMERA_KEY) is not None


def registered_virtual_cameras(read: Callable[[str], str | None] = classes_root_default) -> list[VideoDevice]:
    """Windows: the virtual cameras registered here, as apps list them: Unity Capture's devices
    (``path`` "Unity Capture") and OBS's (``path`` "OBS"); ``index`` -1 (not an OpenCV index)."""
    found = [VideoDevice(path="Unity Capture", name=n, index=-1, is_loopback=True) for n in unity_capture_names(read)]
    if obs_camera_registered(read):
        found.append(VideoDevice(path="OBS", name="OBS Virtual Camera", index=-1, is_loopback=True))
    return found
