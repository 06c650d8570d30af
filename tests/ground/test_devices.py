"""Device discovery against fake sysfs trees laid out like the real /sys/class/video4linux."""

from __future__ import annotations

from pathlib import Path

from conftest import can_symlink, need_symlinks

from vcam import devices
from vcam.devices import VideoDevice, find_virtual_camera, free_video_nr, list_cameras, list_video_devices, modprobe_hint


def make_sysfs(root: Path, nodes: dict[int, tuple[str, str]]) -> Path:
    """``nodes``: N -> (card label, kind) with kind 'loopback', 'loopback-link' (driver symlink
    only), 'camera' or 'meta' (a camera's metadata node)."""
    base = root / "video4linux"
    base.mkdir(parents=True, exist_ok=True)
    drivers = root / "drivers"
    links = can_symlink(root)
    if any(kind == "loopback-link" for _, kind in nodes.values()):
        need_symlinks(root)  # only its driver link tells that node apart
    for n, (name, kind) in nodes.items():
        node = base / f"video{n}"
        node.mkdir()
        (node / "name").write_text(name + "\n")
        (node / "dev").write_text(f"81:{n}\n")
        if kind == "loopback":
            for attr, val in (("max_openers", "10"), ("buffers", "2"), ("format", "")):
                (node / attr).write_text(val + "\n")
        elif kind == "loopback-link":
            (drivers / "v4l2loopback" / f"v4l2loopback.{n}").mkdir(parents=True)
            (node / "device").symlink_to(drivers / "v4l2loopback" / f"v4l2loopback.{n}")
        else:
            (drivers / "uvcvideo" / f"usb{n}").mkdir(parents=True)
            if links:
                (node / "device").symlink_to(drivers / "uvcvideo" / f"usb{n}")
            else:  # no symlinks (Windows): a folder, which reads as no loopback driver just the same
                (node / "device").mkdir()
            (node / "index").write_text("1\n" if kind == "meta" else "0\n")
    return base


def test_lists_cameras_and_loopback_devices_by_index(tmp_path):
    root = make_sysfs(
        tmp_path,
        {
            2: ("OBS Virtual Camera", "loopback"),
            0: ("Integrated Camera: Integrated C", "camera"),
            1: ("Integrated Camera: Integrated C", "meta"),
            10: ("FastSwap Cam", "loopback"),
            11: ("Old Loopback", "loopback-link"),
        },
    )
    devs = list_video_devices(root)
    assert devs == [
        VideoDevice("/dev/video0", "Integrated Camera: Integrated C", 0, False),
        VideoDevice("/dev/video2", "OBS Virtual Camera", 2, True),
        VideoDevice("/dev/video10", "FastSwap Cam", 10, True),
        VideoDevice("/dev/video11", "Old Loopback", 11, True),
    ]
    assert [d.index for d in list_cameras(root)] == [0]


def test_find_virtual_camera_by_label_only(tmp_path):
    root = make_sysfs(
        tmp_path, {0: ("USB Cam", "camera"), 2: ("OBS Virtual Camera", "loopback"), 7: ("FastSwap Cam", "loopback")}
    )
    dev = find_virtual_camera("FastSwap Cam", root)
    assert dev == VideoDevice("/dev/video7", "FastSwap Cam", 7, True)
    # Another loopback device exists, but with a different label it is never picked.
    assert find_virtual_camera("Some Other Name", root) is None


def test_no_virtual_camera_when_only_other_loopback_devices(tmp_path):
    root = make_sysfs(tmp_path, {2: ("OBS Virtual Camera", "loopback"), 3: ("Dummy video device (0x0000)", "loopback")})
    assert find_virtual_camera("FastSwap Cam", root) is None


def test_missing_sysfs_root_gives_no_devices(tmp_path):
    assert list_video_devices(tmp_path / "absent") == []
    assert find_virtual_camera("FastSwap Cam", tmp_path / "absent") is None


def test_modprobe_hint_exact_line(tmp_path):
    empty = tmp_path / "none"
    assert (
        modprobe_hint("FastSwap Cam", empty)
        == 'sudo modprobe v4l2loopback video_nr=10 card_label="FastSwap Cam" exclusive_caps=1'
    )


def test_modprobe_hint_picks_a_free_video_nr(tmp_path):
    root = make_sysfs(tmp_path, {10: ("Webcam", "camera"), 11: ("Webcam", "meta"), 12: ("OBS Virtual Camera", "loopback")})
    assert free_video_nr(root) == 13
    assert (
        modprobe_hint("FastSwap Cam", root) == 'sudo modprobe v4l2loopback video_nr=13 card_label="FastSwap Cam" exclusive_caps=1'
    )


def test_describe_devices():
    cams = [VideoDevice("/dev/video0", "USB Cam", 0, False), VideoDevice("/dev/video4", "Other", 4, False)]
    assert devices.describe_devices(cams) == "0 (USB Cam), 4 (Other)"
    assert devices.describe_devices([]) == "none"
