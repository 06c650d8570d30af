"""The direct OBS source (issue 42): every published frame, full size, served by the panel's server
to whoever holds the source's key, and shown in a real browser (headless Chromium opening the URL
as OBS's Browser Source does) at the daemon's rate without slowing it."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import WINDOWS, require

from vcam.config_file import build
from vcam.panel.source import SourceTap, published_of
from vcam.runtime.daemon import Daemon
from vcam.runtime.panel import obs_source_address
from vcam.stages.outputs import ObsSourceOutput
from vcam.stages.publish import open_output
from vcam.types import PixelFormat


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as res:
            return res.status, res.read(200)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _parts(url: str, count: int) -> list[tuple[dict, bytes]]:
    """The first ``count`` parts of the source's multipart answer: (headers, JPEG), each part
    ended by the boundary (each is sent with the next one's head behind it: no Content-Length)."""
    data = b""
    with urllib.request.urlopen(url, timeout=30) as res:
        assert res.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
        while data.count(b"--frame\r\n") <= count:
            data += res.read1(1 << 16)
    assert data.startswith(b"--frame\r\n")
    found = []
    for part in data.split(b"--frame\r\n")[1 : count + 1]:
        head, _, body = part.partition(b"\r\n\r\n")
        fields = dict(line.decode().lower().split(": ", 1) for line in head.split(b"\r\n"))
        assert body.endswith(b"\r\n")
        found.append((fields, body[:-2]))
    return found


def test_the_source_serves_full_size_frames_to_its_key_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    cfg = build(
        {
            "capture": {"input": "demo", "width": 640, "height": 360, "pacing": "realtime"},
            "output": {"target": "obs-source"},
            "control": {"socket": str(run / "vcam.sock")},
            "panel": {"port": 0},
        }
    )
    lines: list[str] = []
    out = open_output(cfg.output, 640, 360, 30.0)
    assert isinstance(out, ObsSourceOutput) and out.fmt is PixelFormat.BGR
    d = Daemon(cfg, output=out, panel=True, announce=lines.append)
    d.start()
    try:
        end = time.monotonic() + 120
        while not any(x.startswith("OBS source: ") for x in lines) and time.monotonic() < end:
            time.sleep(0.05)
        url = next(x for x in lines if x.startswith("OBS source: ")).split(": ", 1)[1]
        base, code = next(x for x in lines if x.startswith("panel: ")).split(": ", 1)[1].split("/#once=")
        key = json.loads((run / "vcam.sock.sourcekey").read_text())["key"]  # kept across runs, 0600
        token = json.loads((run / "vcam.sock.panel").read_text())["token"]
        assert token not in code
        assert url == f"{base}/obs/source?key={key}"
        if not WINDOWS:  # Windows has no POSIX file modes (the key file sits in the user's own folder there)
            assert (run / "vcam.sock.sourcekey").stat().st_mode & 0o077 == 0
        assert obs_source_address(cfg) == (url, 640, 360)  # what `vcam obs setup` gives OBS: the running daemon's
        parts = _parts(url, 3)
        for _head, jpeg in parts:
            assert cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).shape == (360, 640, 3)
        assert all(h == {"content-type": "image/jpeg"} for h, _ in parts)
        stamps = [published_of(jpeg) for _, jpeg in parts]
        assert stamps == sorted(stamps) and len(set(stamps)) == 3  # three frames, newest each time
        assert _get(f"{base}/obs/source")[0] == 401
        assert _get(f"{base}/obs/source?key={key[:-1]}x")[0] == 401
        assert _get(f"{base}/obs/source", {"X-Vcam-Token": token})[0] == 401  # the panel's token is not the key
        assert _get(f"{base}/api/state?key={key}")[0] == 401  # the key opens the picture and nothing else
        status, body = _get(f"{url}&stream=nope")
        assert status == 404 and b"no stream 'nope'" in body
    finally:
        d.stop()
    assert re.search(r"\d+ frames to the OBS source", out.describe())


def test_the_tap_keeps_the_newest_frame_and_drops_one_overwritten_while_copied():
    tap = SourceTap()
    tap.watch("s1")
    frame = np.zeros((32, 48, 3), np.uint8)
    count = [0]
    for value in (10, 20, 30):  # no encoder running yet: each offer replaces the last
        frame[...] = value
        tap.offer("s1", frame.copy(), PixelFormat.BGR)
    assert (tap.offered, tap.replaced) == (3, 2)
    tap.offer("s1", frame, PixelFormat.BGR, counter=lambda: count[0], slack=0)
    count[0] = 1  # the ring moved past it before the encoder copied it
    got = threading.Event()
    tap.start(on_frame=lambda _s: got.set())
    try:
        time.sleep(0.5)
        assert tap.stale == 1 and "s1" not in tap.frames  # never shown torn
        frame[...] = 30
        tap.offer("s1", frame, PixelFormat.BGR, counter=lambda: count[0], slack=1)
        assert got.wait(10)
        shown = cv2.imdecode(np.frombuffer(tap.frames["s1"].jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert shown.shape == (32, 48, 3) and abs(int(shown.mean()) - 30) <= 2
    finally:
        tap.stop()
    tap.unwatch("s1")
    tap.offer("s1", frame, PixelFormat.BGR)  # nobody watching: nothing taken
    assert tap.offered == 5


def test_the_encoder_copies_the_frame_into_a_kept_buffer_and_checks_the_ring_after_the_copy(monkeypatch):
    """The frame is copied out of the ring into a buffer made once for its size (no allocation a
    frame), the ring checked after the copy, and the copy encoded: a slot begun again during the
    copy is never shown; one begun again during the (longer) encode no longer matters."""
    from vcam.panel import source

    tap = SourceTap()
    tap.watch("s1")
    frame = np.full((36, 64, 3), 90, np.uint8)
    count = [0]
    copied: list[np.ndarray] = []
    real_copy, real_encode = source.copy_out, source.encode_bgr

    def copying(kept, data):
        out = real_copy(kept, data)
        copied.append(out)
        if len(copied) == 1:
            count[0] += 2  # two frames begun while the first one was copied: its slot is written
        return out

    def encoding(data, fmt, width, height, quality):
        count[0] += 5  # the ring moves on during the encode: the copy is the encoder's own
        return real_encode(data, fmt, width, height, quality)

    monkeypatch.setattr(source, "copy_out", copying)
    monkeypatch.setattr(source, "encode_bgr", encoding)
    got = threading.Event()
    tap.offer("s1", frame, PixelFormat.BGR, counter=lambda: count[0], slack=1)
    tap.start(on_frame=lambda _s: got.set())
    try:
        end = time.monotonic() + 10
        while tap.stale == 0 and time.monotonic() < end:
            time.sleep(0.01)
        assert tap.stale == 1 and "s1" not in tap.frames  # never shown torn
        tap.offer("s1", frame, PixelFormat.BGR, counter=lambda: count[0], slack=1)
        assert got.wait(10)
        assert tap.stale == 1 and tap.frames["s1"].version == 1
        # The encoder's CPU is counted, where the thread clock resolves one small encode (Windows
        # counts thread time in 15.6 ms ticks: a 64x36 JPEG is often 0 there).
        assert tap.encode_cpu > 0 or sys.platform == "win32"
        assert copied[0] is copied[1] and copied[1] is not frame  # one buffer, reused; not the ring's
        bigger = np.zeros((48, 64, 3), np.uint8)
        assert source.copy_out(tap._copies, bigger).shape == (48, 64, 3) and len(tap._copies) == 1
    finally:
        tap.stop()


def test_each_frame_is_one_part_built_once_for_every_reader():
    """The encoder builds what readers are sent of a frame, the next part's head behind it; readers
    are sent that same object (no encode, join or copy per reader), and it parses back to the JPEG
    and its publish time."""
    import asyncio

    tap = SourceTap()
    tap.watch("s1")
    frame = np.full((40, 60, 3), (10, 200, 30), np.uint8)
    tap.offer("s1", frame, PixelFormat.BGR)
    got = threading.Event()
    tap.start(on_frame=lambda _s: got.set())
    try:
        assert got.wait(10)
    finally:
        tap.stop()
    done = tap.frames["s1"]

    class Hub:
        count = 0

        async def wait(self, _timeout):
            await asyncio.sleep(0)

    async def first_chunks(readers: int) -> list[list[bytes]]:
        gens = [tap.parts("s1", Hub(), lambda: False) for _ in range(readers)]
        try:
            return [[await g.__anext__(), await g.__anext__()] for g in gens]
        finally:
            for g in gens:
                await g.aclose()

    chunks = asyncio.run(first_chunks(3))
    head = b"--frame\r\nContent-Type: image/jpeg\r\n\r\n"
    assert all(c[0] == head and c[1] is done.part for c in chunks) and tap.sent == 3
    # the next part's head right behind the picture: Chromium shows a part once it has read that
    assert done.part == done.jpeg + b"\r\n" + head
    assert published_of(done.jpeg) == pytest.approx(done.published, abs=1e-5)
    shown = cv2.imdecode(np.frombuffer(done.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert shown.shape == (40, 60, 3) and np.abs(shown.astype(int) - (10, 200, 30)).max() <= 12
    assert tap.watching("s1") == 1  # the readers closed: the first watch only is left


@pytest.mark.parametrize("fmt", [PixelFormat.I420, PixelFormat.NV12, PixelFormat.RGB, PixelFormat.GRAY])
def test_the_source_encodes_every_published_format_at_its_full_size(fmt):
    from vcam.kernels.convert import from_bgr_cv
    from vcam.panel.source import encode_bgr, frame_size

    bgr = np.full((48, 64, 3), (40, 120, 220), np.uint8)
    data = from_bgr_cv(bgr, fmt) if fmt is not PixelFormat.GRAY else np.full((48, 64), 128, np.uint8)
    assert frame_size(data, fmt) == (64, 48)
    shown = cv2.imdecode(np.frombuffer(encode_bgr(data, fmt, 64, 48), np.uint8), cv2.IMREAD_COLOR)
    want = bgr if fmt is not PixelFormat.GRAY else np.full((48, 64, 3), 128, np.uint8)
    assert shown.shape == (48, 64, 3) and np.abs(shown.astype(int) - want).max() <= 12
    assert frame_size(b"x", PixelFormat.MJPEG) is None


def test_the_encoders_wakeup_behaves_as_an_event_for_its_one_waiter():
    """The frame thread wakes the encoders through Wakeup (a SimpleQueue's put: no lock the waiter
    can hold, unlike an Event's set): a set wakes a waiting thread; sets before the waiter clears
    make one wake-up; a wait times out unset."""
    from vcam.panel.preview import Wakeup

    w = Wakeup()
    assert w.wait(0.01) is False and not w.is_set()
    for _ in range(3):
        w.set()
    assert w.is_set() and w.wait(5) is True
    w.clear()
    assert w.wait(0.01) is False  # the three sets made one wake-up, cleared
    woke = threading.Event()

    def waiter() -> None:
        if w.wait(30):
            woke.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    w.set()
    assert woke.wait(30)
    t.join(30)
    w.clear()
    assert not w.is_set() and w.wait(0.01) is False


@pytest.mark.slow
def test_a_browser_shows_the_published_frames_without_slowing_the_daemon(tmp_path):
    """headless Chromium on the source, alternated with nobody watching and a plain reader, in one
    run (ratios: a busy 2-core machine; benchmarks.obs_source measures 1080p)."""
    try:
        import selenium  # noqa: F401
    except ImportError as exc:
        require("chromium", f"selenium is not installed ({exc}); pip install selenium")
    if not (os.path.exists("/usr/bin/chromium") and os.path.exists("/usr/bin/chromedriver")):
        require("chromium", "apt-get install chromium chromium-driver")
    from benchmarks.obs_source import measure

    folder = Path(tmp_path) / "run"
    folder.mkdir(mode=0o700)
    seconds = 5.0
    res = measure(640, 360, seconds, 2, folder, log=lambda _line: None)
    assert res["shown_ratio"] >= 0.6, res  # the target, 95 % at 1080p30, is measured by the benchmark
    # within 5 % in the benchmark; here Chromium decodes every frame on the same 2 cores as the daemon (0.69-1.32
    # seen on a loaded machine): only a gross slowdown (encoding on the frame thread) fails
    assert res["fps_ratio"] >= 0.5, res
    assert res["fps_ratio_reader"] >= 0.5 and res["encode_ms_per_frame_reader"] > 0, res  # the source alone
    assert res["sent_per_s_reader"] > 0 and res["sent_per_s_off"] == 0, res  # nobody watching: nothing encoded
    assert 0 < res["p50_ms"] < seconds * 1000 / 4, res  # shown after it was published, well within the segment


def test_obs_source_output_is_a_live_run_and_needs_the_panel(tmp_path, caplog):
    from vcam.runtime import startup

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    # no latency budget: a busy machine's late frame is dropped under one, and this counts frames
    base = {
        "capture": {"input": "demo", "width": 160, "height": 120},
        "control": {"socket": str(run / "vcam.sock")},
        "pipeline": {"max_latency": 0},
    }
    null = Daemon(build({**base, "output": {"target": "null"}}))
    assert startup.standalone(null) and not null.cfg.obs_source
    cfg = build({**base, "output": {"target": "obs-source"}, "panel": {"enabled": False}})
    d = Daemon(cfg, panel=True)
    assert not startup.standalone(d) and cfg.obs_source  # it takes the control socket, as the camera does
    with caplog.at_level("WARNING"):
        summary = d.run(max_frames=3)
    assert summary.error is None and summary.frames_out == 3
    assert "the OBS source is off: the panel's server serves it, and the panel is off" in caplog.text


def test_a_run_without_the_source_serves_none_and_keeps_no_key(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    cfg = build(
        {
            "capture": {"input": "demo", "width": 160, "height": 120},
            "output": {"target": "null"},
            "control": {"socket": str(run / "vcam.sock")},
            "panel": {"port": 0},
        }
    )
    lines: list[str] = []
    d = Daemon(cfg, output=open_output(cfg.output, 160, 120, 30.0), panel=True, announce=lines.append)
    d.start()
    try:
        end = time.monotonic() + 120
        while not lines and time.monotonic() < end:
            time.sleep(0.05)
        base = lines[0].split(": ", 1)[1].split("/#once=")[0]
        status, body = _get(f"{base}/obs/source?key=anything")
        assert status == 401 and b"the OBS source is off in this run" in body
    finally:
        d.stop()
    assert not any(x.startswith("OBS source") for x in lines) and not (run / "vcam.sock.sourcekey").exists()
