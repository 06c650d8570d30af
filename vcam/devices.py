"""Device discovery: cameras to capture from and the virtual camera to publish to.

On Linux everything comes from sysfs (``/sys/class/video4linux/videoN``), which is cheap and never
opens a device (so no camera light turns on). A v4l2loopback node is recognised by the sysfs
attributes only that driver creates (``max_openers``, ``buffers``, ``format``) or by a driver link
naming it. Only the *main* node of a camera is listed: nodes whose sysfs ``index`` is not 0 are the
metadata nodes UVC cameras add beside each capture node.

The virtual camera is found by its card label only; this module never picks "some" loopback device,
because writing into another program's loopback device (OBS's, a screen share's) would hijack it.

Elsewhere (Windows, macOS) there is no sysfs: :func:`list_video_devices` returns an empty list
unless ``probe=True``, which opens OpenCV indices ``0..probe_count-1`` one by one.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

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


def is_linux() -> bool:
    return sys.platform.startswith("linux")


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


def _probe_opencv(count: int) -> list[VideoDevice]:  # pragma: no cover - needs real cameras
    import cv2

    out = []
    for i in range(count):
        cap = cv2.VideoCapture(i)
        try:
            if cap.isOpened():
                out.append(VideoDevice(path=str(i), name=f"camera {i}", index=i, is_loopback=False))
        finally:
            cap.release()
    return out


def list_video_devices(sysfs_root: Path = SYSFS_ROOT, *, probe: bool = False, probe_count: int = 4) -> list[VideoDevice]:
    """Every video node, cameras and loopback devices alike, sorted by index.

    Linux: read from ``sysfs_root``; nothing is opened. Elsewhere: ``[]`` unless ``probe`` is true,
    then OpenCV indices ``0..probe_count-1`` are opened one at a time (slow, lights cameras up).
    """
    if is_linux() or Path(sysfs_root) != SYSFS_ROOT:
        return _sysfs_devices(Path(sysfs_root))
    return _probe_opencv(probe_count) if probe else []


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


def virtual_camera_hint(label: str = DEFAULT_LABEL, sysfs_root: Path = SYSFS_ROOT) -> str:
    """How to create the virtual camera on this platform (one line)."""
    if sys.platform == "win32":
        return "install OBS Studio and click 'Start Virtual Camera' once (or install Unity Capture)"
    if sys.platform == "darwin":
        return "install OBS Studio, click 'Start Virtual Camera' once and allow its camera extension"
    return modprobe_hint(label, sysfs_root)


def describe_devices(devices: list[VideoDevice]) -> str:
    """``0 (Integrated Camera), 2 (USB Cam)`` or ``none``."""
    return ", ".join(f"{d.index} ({d.name})" for d in devices) or "none"
