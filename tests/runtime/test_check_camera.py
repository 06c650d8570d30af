"""`vcam check`'s virtual camera and cameras, per platform (the platform and the Windows registry
probes injected), word for word."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vcam.config import Config
from vcam.runtime.check import CheckItem, check_cameras, check_virtual_camera

UNITY_STEP = (
    'register Unity Capture as "FastSwap Cam" once, from an administrator command prompt in the Install folder of '
    'github.com/schellingb/UnityCapture: regsvr32 "/i:UnityCaptureName=FastSwap Cam" UnityCaptureFilter64bit.dll'
)
OBS_STEP = "install OBS Studio 26+ (it registers OBS Virtual Camera); keep OBS's own virtual camera stopped while vcam runs"
OBS_SHOWN = (
    'the OBS backend: apps list "OBS Virtual Camera", not "FastSwap Cam", and OBS\'s own virtual camera must be off '
    "while vcam runs"
)


def make_sysfs(root: Path, nodes: dict[int, str]) -> Path:
    """v4l2loopback nodes N -> card label, laid out like /sys/class/video4linux."""
    for n, label in nodes.items():
        node = root / "video4linux" / f"video{n}"
        node.mkdir(parents=True)
        (node / "name").write_text(label + "\n")
        (node / "max_openers").write_text("10\n")
    return root / "video4linux"


def cfg(backend: str = "auto") -> Config:
    c = Config()
    return c.replace(output=replace(c.output, backend=backend))


def windows(backend: str = "auto", *, unity: tuple[str, ...] = (), obs: bool = False) -> list[CheckItem]:
    return check_virtual_camera(cfg(backend), platform="win32", unity_names=lambda: list(unity), obs_registered=lambda: obs)


def test_windows_with_unity_capture_registered():
    assert windows(unity=("FastSwap Cam",)) == [
        CheckItem("virtual camera", "ok", 'Unity Capture is registered as "FastSwap Cam"; apps list "FastSwap Cam"')
    ]


def test_windows_with_obs_only_says_what_apps_list_and_how_to_get_our_name():
    assert windows(obs=True) == [CheckItem("virtual camera", "ok", OBS_SHOWN, f'for a camera named "FastSwap Cam": {UNITY_STEP}')]
    assert windows("obs", obs=True) == [CheckItem("virtual camera", "ok", OBS_SHOWN, "")]


def test_windows_without_either_gives_both_steps():
    assert windows() == [
        CheckItem(
            "virtual camera",
            "fail",
            'no virtual camera: Unity Capture is not registered as "FastSwap Cam" and OBS Virtual Camera is not installed',
            f"{UNITY_STEP}; or {OBS_STEP}",
        )
    ]


def test_windows_unitycapture_asked_but_missing():
    assert windows("unitycapture", obs=True) == [
        CheckItem("virtual camera", "fail", 'Unity Capture is not registered as "FastSwap Cam"', UNITY_STEP)
    ]


def test_macos_says_obs_and_its_one_time_step():
    (item,) = check_virtual_camera(cfg(), platform="darwin")
    assert (item.level, item.fix) == (
        "info",
        "install OBS Studio 30+, click 'Start Virtual Camera' once, allow its camera extension, then stop it",
    )
    assert item.detail.endswith(OBS_SHOWN)


def test_linux_keeps_the_modprobe_line(tmp_path):
    empty = tmp_path / "none"
    assert check_virtual_camera(cfg(), platform="linux", sysfs_root=empty) == [
        CheckItem(
            "virtual camera",
            "fail",
            'no virtual camera named "FastSwap Cam" found',
            'sudo modprobe v4l2loopback video_nr=10 card_label="FastSwap Cam" exclusive_caps=1',
        )
    ]
    root = make_sysfs(tmp_path / "sys", {10: "FastSwap Cam"})
    assert check_virtual_camera(cfg(), platform="linux", sysfs_root=root) == [
        CheckItem("virtual camera", "ok", '/dev/video10 is "FastSwap Cam" (v4l2loopback)')
    ]


def test_linux_refuses_the_obs_backend():
    assert check_virtual_camera(cfg("obs"), platform="linux") == [
        CheckItem(
            "virtual camera",
            "fail",
            "the obs virtual camera works on Windows, macOS only, not Linux",
            'set [output] backend = "auto" (or v4l2loopback)',
        )
    ]


def test_cameras_off_linux_point_at_vcam_devices():
    assert check_cameras(platform="win32") == [
        CheckItem("cameras", "info", "found by opening them here (OpenCV gives no names)", "vcam devices")
    ]
