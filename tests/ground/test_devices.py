"""Device discovery against fake sysfs trees laid out like the real /sys/class/video4linux."""

from __future__ import annotations

from pathlib import Path

from conftest import can_symlink, need_symlinks

from vcam import devices
from vcam.devices import VideoDevice, find_virtual_camera, free_video_nr, list_cameras, list_video_devices, modprobe_hint
from vcam.platform import registry


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


# -- Windows and macOS: OpenCV capture APIs and the registry's virtual cameras ----------------------


class FakeCapture:
    """``cv2.VideoCapture(index, api)`` stand-in: opens where ``cameras`` (api -> indices) says."""

    def __init__(self, index: int, api: int, cameras: dict[int, set[int]], log: list) -> None:
        self.opened = index in cameras.get(api, set())
        self.released = False
        log.append((index, api, self))

    def isOpened(self) -> bool:
        return self.opened

    def release(self) -> None:
        self.released = True


def opener(cameras: dict[int, set[int]], log: list):
    return lambda index, api: FakeCapture(index, api, cameras, log)


def test_capture_apis_per_platform():
    assert devices.capture_apis("linux") == (("V4L2", "CAP_V4L2"),)
    assert devices.capture_apis("win32") == (("DirectShow", "CAP_DSHOW"), ("Media Foundation", "CAP_MSMF"))
    assert devices.capture_apis("darwin") == (("AVFoundation", "CAP_AVFOUNDATION"),)
    assert devices.capture_apis("freebsd13") == (("default", "CAP_ANY"),)


def test_windows_probe_lists_directshow_cameras_and_releases_every_capture():
    import cv2

    log: list = []
    found = list_video_devices(probe=True, probe_count=4, platform="win32", opener=opener({cv2.CAP_DSHOW: {0, 2}}, log))
    cams = [d for d in found if not d.is_loopback]
    assert cams == [
        VideoDevice(path="0", name="camera 0 (DirectShow)", index=0, is_loopback=False),
        VideoDevice(path="2", name="camera 2 (DirectShow)", index=2, is_loopback=False),
    ]
    assert [(i, api) for i, api, _ in log] == [(i, cv2.CAP_DSHOW) for i in range(4)]  # MSMF not needed
    assert all(cap.released for _, _, cap in log)


def test_windows_probe_falls_back_to_media_foundation():
    import cv2

    log: list = []
    found = devices._probe_opencv(2, "win32", opener({cv2.CAP_MSMF: {1}}, log))
    assert found == [VideoDevice(path="1", name="camera 1 (Media Foundation)", index=1, is_loopback=False)]
    assert [api for _, api, _ in log] == [cv2.CAP_DSHOW, cv2.CAP_DSHOW, cv2.CAP_MSMF, cv2.CAP_MSMF]


def test_no_probe_off_linux_opens_nothing():
    log: list = []
    assert list_video_devices(platform="win32", opener=opener({}, log)) == [] and log == []


def fake_registry(entries: dict[str, str]):
    """A ``classes_root_default`` over ``HKEY_CLASSES_ROOT`` key -> default value."""
    return lambda key: entries.get(key)


UNITY0 = r"CLSID\{5C2CD55C-92AD-4999-8666-912BD3E70010}"  # 64-bit filter, device 1
UNITY1 = r"CLSID\{5C2CD55C-92AD-4999-8666-912BD3E70012}"  # device 2 (0x11 is the properties page)
OBS = r"CLSID\{A3FCE0F5-3493-419F-958A-ABA1250EC20B}"


def test_unity_capture_names_read_the_filter_keys_in_device_order():
    read = fake_registry({UNITY0: "FastSwap Cam", UNITY1: "FastSwap Cam #2 ", OBS: "OBS Virtual Camera"})
    assert devices.unity_capture_names(read) == ["FastSwap Cam", "FastSwap Cam #2"]
    assert devices.unity_capture_names(fake_registry({})) == []


def test_obs_camera_registered_and_the_windows_listing():
    read = fake_registry({UNITY0: "Unity Video Capture", OBS: ""})  # a key without a default value counts
    assert devices.obs_camera_registered(read) and not devices.obs_camera_registered(fake_registry({}))
    assert devices.registered_virtual_cameras(read) == [
        VideoDevice(path="Unity Capture", name="Unity Video Capture", index=-1, is_loopback=True),
        VideoDevice(path="OBS", name="OBS Virtual Camera", index=-1, is_loopback=True),
    ]


def test_registry_read_of_an_absent_key_is_none():
    # Off Windows there is no winreg; on Windows the key does not exist: None either way.
    assert registry.classes_root_default(r"CLSID\{00000000-0000-0000-0000-00000000FA57}") is None
