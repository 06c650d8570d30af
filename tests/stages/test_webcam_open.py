"""Opening a camera off Linux: the capture API tried in order (DirectShow, then Media Foundation on
Windows) and MJPG asked for before the size, through a stand-in for cv2.VideoCapture (no camera
here; the platform is a parameter)."""

from __future__ import annotations

import cv2
import pytest

from vcam.errors import InputError
from vcam.stages.sources import WebcamSource
from vcam.types import PixelFormat


class FakeCamera:
    """``cv2.VideoCapture(index, api)``: opens on ``apis``; takes a FOURCC only where ``fourcc_ok``;
    records every ``set`` in order; ``raw``: whether CONVERT_RGB=0 is honoured."""

    def __init__(self, index, api, *, apis, fourcc_ok, raw, log):
        self.api, self.opened = api, api in apis
        self.props = {cv2.CAP_PROP_FRAME_WIDTH: 640.0, cv2.CAP_PROP_FRAME_HEIGHT: 480.0, cv2.CAP_PROP_FPS: 30.0}
        self.props[cv2.CAP_PROP_FOURCC] = float(cv2.VideoWriter_fourcc(*"YUY2"))
        self.fourcc_ok, self.raw, self.sets, self.released = fourcc_ok, raw, [], False
        log.append(self)

    def isOpened(self):
        return self.opened

    def set(self, prop, value):
        self.sets.append((prop, value))
        if prop == cv2.CAP_PROP_FOURCC and not self.fourcc_ok:
            return False
        if prop == cv2.CAP_PROP_CONVERT_RGB:
            return self.raw
        self.props[prop] = float(value)
        return True

    def get(self, prop):
        return self.props.get(prop, 0.0)

    def release(self):
        self.released = True


def opener(log, *, apis, fourcc_ok=True, raw=True):
    return lambda index, api: FakeCamera(index, api, apis=apis, fourcc_ok=fourcc_ok, raw=raw, log=log)


def test_windows_opens_through_directshow_and_asks_mjpg_before_the_size():
    log: list[FakeCamera] = []
    src = WebcamSource(
        0, width=1280, height=720, fps=30, platform="win32", compressed=True, opener=opener(log, apis={cv2.CAP_DSHOW})
    )
    try:
        (cam,) = log
        assert cam.api == cv2.CAP_DSHOW and src.api == "DirectShow"
        props = [p for p, _ in cam.sets]
        assert props[:3] == [cv2.CAP_PROP_FOURCC, cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT]
        assert cam.sets[0][1] == cv2.VideoWriter_fourcc(*"MJPG")
        assert (src.width, src.height) == (1280, 720)
        assert src.fmt is PixelFormat.MJPEG  # the camera's JPEGs as they came: the decode stage decodes them
    finally:
        src.close()
    assert cam.released


def test_windows_falls_back_to_media_foundation_and_takes_the_format_it_chose():
    log: list[FakeCamera] = []
    src = WebcamSource(
        1,
        width=1280,
        height=720,
        fps=30,
        platform="win32",
        compressed=True,
        opener=opener(log, apis={cv2.CAP_MSMF}, fourcc_ok=False),
    )
    try:
        assert [c.api for c in log] == [cv2.CAP_DSHOW, cv2.CAP_MSMF] and log[0].released
        assert src.api == "Media Foundation" and src.fmt is PixelFormat.BGR  # YUY2 agreed: OpenCV converts
    finally:
        src.close()


def test_macos_uses_avfoundation():
    log: list[FakeCamera] = []
    src = WebcamSource(0, width=640, height=480, fps=30, platform="darwin", opener=opener(log, apis={cv2.CAP_AVFOUNDATION}))
    src.close()
    assert src.api == "AVFoundation" and [c.api for c in log] == [cv2.CAP_AVFOUNDATION]


def test_a_camera_no_api_opens_is_an_input_error():
    log: list[FakeCamera] = []
    with pytest.raises(InputError, match="camera 3 could not be opened"):
        WebcamSource(3, width=640, height=480, fps=30, platform="win32", opener=opener(log, apis=set()))
    assert [c.api for c in log] == [cv2.CAP_DSHOW, cv2.CAP_MSMF] and all(c.released for c in log)
