"""The virtual camera's backend per platform: the choice (platform and Unity Capture probe injected),
its messages word for word, and the real pyvirtualcam.Camera writing through a capturing backend
registered with pyvirtualcam.register_backend under the chosen backend's own name."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import pyvirtualcam
from test_publish import CapturingBackend, make_sysfs

from vcam.config import OutputConfig
from vcam.errors import OutputError
from vcam.stages.publish import open_output
from vcam.stages.virtualcam import Choice, VirtualCamOutput, choose_backend, setup_hint
from vcam.types import PixelFormat

UNITY_STEP = (
    'register Unity Capture as "FastSwap Cam" once, from an administrator command prompt in the Install folder of '
    'github.com/schellingb/UnityCapture: regsvr32 "/i:UnityCaptureName=FastSwap Cam" UnityCaptureFilter64bit.dll'
)
OBS_NOTE = (
    'virtual camera: the OBS backend; apps list it as "OBS Virtual Camera", not "FastSwap Cam", '
    "and OBS's own virtual camera must be off while vcam runs"
)


def names(*registered: str):
    return lambda: list(registered)


@pytest.fixture
def as_backends():
    """Register the capturing backend under the given pyvirtualcam names (restoring what was there)."""
    saved = dict(pyvirtualcam.camera.BACKENDS)

    def register(*backends: str) -> None:
        for b in backends:
            pyvirtualcam.register_backend(b, CapturingBackend)

    yield register
    pyvirtualcam.camera.BACKENDS.clear()
    pyvirtualcam.camera.BACKENDS.update(saved)


# -- the choice ------------------------------------------------------------------------------------


def test_auto_on_windows_takes_unity_capture_registered_under_our_name():
    choice = choose_backend("auto", platform="win32", unity_names=names("FastSwap Cam"))
    assert choice == Choice("unitycapture", "FastSwap Cam", "FastSwap Cam", "")


def test_auto_on_windows_without_unity_capture_takes_obs_and_says_what_apps_list():
    assert choose_backend("auto", platform="win32", unity_names=names()) == Choice("obs", None, "OBS Virtual Camera", OBS_NOTE)


def test_auto_on_windows_leaves_unity_capture_registered_under_another_name_alone():
    choice = choose_backend("auto", platform="win32", unity_names=names("Unity Video Capture"))
    assert choice.backend == "obs"
    assert choice.note == OBS_NOTE + '; Unity Capture is registered as "Unity Video Capture", not "FastSwap Cam"'


def test_auto_on_macos_takes_obs_without_asking_the_windows_registry():
    def never() -> list[str]:
        raise AssertionError("the Windows registry was read on macOS")

    assert choose_backend("auto", platform="darwin", unity_names=never) == Choice("obs", None, "OBS Virtual Camera", OBS_NOTE)


def test_auto_on_linux_takes_the_loopback_device_by_label(tmp_path):
    root = make_sysfs(tmp_path / "sys", {2: "OBS Virtual Camera", 10: "FastSwap Cam"})
    assert choose_backend("auto", platform="linux", sysfs_root=root) == Choice("v4l2loopback", "/dev/video10", "FastSwap Cam")


def test_unitycapture_asked_but_not_registered_gives_the_registration_step():
    with pytest.raises(OutputError) as ei:
        choose_backend("unitycapture", platform="win32", unity_names=names("Unity Video Capture"))
    assert ei.value.message == "Unity Capture is not registered as \"FastSwap Cam\" (registered: 'Unity Video Capture')"
    assert ei.value.hint == UNITY_STEP


@pytest.mark.parametrize(
    "wanted,platform,message,hint",
    [
        (
            "v4l2loopback",
            "win32",
            "the v4l2loopback virtual camera works on Linux only, not Windows",
            'set [output] backend = "auto" (or unitycapture or obs)',
        ),
        (
            "unitycapture",
            "darwin",
            "the unitycapture virtual camera works on Windows only, not macOS",
            'set [output] backend = "auto" (or obs)',
        ),
        (
            "obs",
            "linux",
            "the obs virtual camera works on Windows, macOS only, not Linux",
            'set [output] backend = "auto" (or v4l2loopback)',
        ),
    ],
)
def test_a_backend_of_another_platform_is_refused(wanted, platform, message, hint):
    with pytest.raises(OutputError) as ei:
        choose_backend(wanted, platform=platform, unity_names=names())
    assert (ei.value.message, ei.value.hint) == (message, hint)


def test_unknown_backend():
    with pytest.raises(
        OutputError, match=r"unknown virtual camera backend 'dshow' \(use auto, v4l2loopback, unitycapture, obs\)"
    ):
        choose_backend("dshow", platform="win32", unity_names=names())


def test_setup_hints_per_backend(tmp_path):
    assert setup_hint("unitycapture", "FastSwap Cam", "win32") == UNITY_STEP
    assert setup_hint("obs", "FastSwap Cam", "win32") == (
        "install OBS Studio 26+ (it registers OBS Virtual Camera); keep OBS's own virtual camera stopped while vcam runs"
    )
    assert setup_hint("obs", "FastSwap Cam", "darwin") == (
        "install OBS Studio 30+, click 'Start Virtual Camera' once, allow its camera extension, then stop it"
    )
    empty = tmp_path / "none"
    assert setup_hint("v4l2loopback", "FastSwap Cam", "linux", empty) == (
        'sudo modprobe v4l2loopback video_nr=10 card_label="FastSwap Cam" exclusive_caps=1'
    )


# -- the output on each backend, through pyvirtualcam ------------------------------------------------


def test_windows_auto_publishes_through_unity_capture_by_name(as_backends, caplog):
    as_backends("unitycapture", "obs")
    sink: list[dict] = []
    cfg = OutputConfig(target="vcam", pixel_format="RGB")
    with caplog.at_level(logging.INFO, logger="vcam.stages.publish"):
        with open_output(
            cfg, 32, 16, 30.0, platform="win32", unity_names=names("FastSwap Cam"), writer_options={"sink": sink}
        ) as out:
            assert isinstance(out, VirtualCamOutput)
            assert out.backend_name == "unitycapture" and out.device_path == "FastSwap Cam"
            out.send_bgr(np.zeros((16, 32, 3), np.uint8))
    (rec,) = sink
    assert rec["device"] == "FastSwap Cam" and len(rec["frames"]) == 1 and rec["closed"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        'virtual camera: unitycapture backend, apps list "FastSwap Cam" (FastSwap Cam)'
    ]


def test_windows_auto_without_unity_capture_publishes_through_obs_with_one_warning(as_backends, caplog):
    as_backends("unitycapture", "obs")
    sink: list[dict] = []
    with caplog.at_level(logging.INFO, logger="vcam.stages.publish"):
        with open_output(
            OutputConfig(target="vcam"), 32, 16, 30.0, platform="win32", unity_names=names(), writer_options={"sink": sink}
        ) as out:
            assert out.backend_name == "obs" and out.fmt is PixelFormat.I420
    assert sink[0]["device"] is None  # OBS's one camera: never a name it does not carry
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [OBS_NOTE]


def test_a_failing_backend_is_an_error_with_its_setup_step_never_a_fallback(as_backends):
    as_backends("unitycapture", "obs")
    sink: list[dict] = []
    with pytest.raises(OutputError) as ei:
        open_output(
            OutputConfig(target="vcam", backend="obs"),
            32,
            16,
            30.0,
            platform="win32",
            unity_names=names("FastSwap Cam"),
            writer_options={"sink": sink, "fail": "OBS Virtual Camera device not found! Did you install OBS?"},
        )
    assert ei.value.message == (
        "could not open the virtual camera: OBS Virtual Camera: 'obs' backend: OBS Virtual Camera device not found! "
        "Did you install OBS?"
    )
    assert ei.value.hint == setup_hint("obs", "FastSwap Cam", "win32")
    assert sink == []  # unitycapture, though registered, was not tried behind the user's back


def test_the_stream_target_names_the_camera(as_backends):
    as_backends("unitycapture")
    sink: list[dict] = []
    with open_output(
        OutputConfig(target="vcam:Studio Cam"),
        16,
        16,
        30.0,
        platform="win32",
        unity_names=names("FastSwap Cam", "Studio Cam"),
        writer_options={"sink": sink},
    ):
        pass
    assert sink[0]["device"] == "Studio Cam"
