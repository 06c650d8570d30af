"""Publish stage: the real pyvirtualcam.Camera with a capturing backend registered through
pyvirtualcam.register_backend, real mp4 files written and decoded with PyAV, and a real window
under Xvfb."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import av
import numpy as np
import pytest
import pyvirtualcam
from conftest import require
from pyvirtualcam.util import decode_fourcc, encode_fourcc

from vcam.config import OutputConfig
from vcam.errors import OutputError
from vcam.kernels.convert import from_bgr_ref, to_bgr_ref
from vcam.stages.outputs import NullOutput, prepare
from vcam.stages.publish import open_output
from vcam.stages.recording import FileOutput
from vcam.stages.virtualcam import VirtualCamOutput
from vcam.types import PixelFormat

BACKEND = "vcam-test-capture"
MODPROBE = 'sudo modprobe v4l2loopback video_nr=10 card_label="FastSwap Cam" exclusive_caps=1'


class CapturingBackend:
    """A pyvirtualcam backend that records what the Camera hands it (see pyvirtualcam.Backend).

    Extra keyword arguments arrive through ``Camera(**kw)``: ``sink`` (a list that receives one
    record per opened camera), ``native`` (the fourcc to report as native) and ``fail``.
    """

    def __init__(self, *, width, height, fps, fourcc, device, sink, native=None, fail=None):
        if fail:
            raise RuntimeError(fail)
        self.rec = {
            "width": width,
            "height": height,
            "fps": fps,
            "fourcc": decode_fourcc(fourcc),
            "device": device,
            "frames": [],
            "closed": 0,
        }
        self.native = native
        sink.append(self.rec)

    def send(self, frame):
        assert frame.ndim == 1 and frame.flags.c_contiguous
        self.rec["frames"].append(frame.copy())

    def close(self):
        self.rec["closed"] += 1

    def device(self):
        return self.rec["device"]

    def native_fourcc(self):
        return encode_fourcc(self.native or self.rec["fourcc"])


@pytest.fixture
def backend():
    pyvirtualcam.register_backend(BACKEND, CapturingBackend)
    yield BACKEND
    pyvirtualcam.camera.BACKENDS.pop(BACKEND, None)


def make_sysfs(root: Path, nodes: dict[int, str]) -> Path:
    """Loopback devices N -> card label, laid out like /sys/class/video4linux."""
    base = root / "video4linux"
    base.mkdir(parents=True, exist_ok=True)
    for n, label in nodes.items():
        d = base / f"video{n}"
        d.mkdir()
        (d / "name").write_text(label + "\n")
        for attr, val in (("max_openers", "10"), ("buffers", "2"), ("format", "")):
            (d / attr).write_text(val + "\n")
    return base


@pytest.fixture
def sysfs(tmp_path):
    # Ours at video10 and another program's loopback device at video2, listed first.
    return make_sysfs(tmp_path / "sys", {2: "OBS Virtual Camera", 10: "FastSwap Cam"})


def frames_bgr(n: int, width: int, height: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        img = np.empty((height, width, 3), np.uint8)
        img[:] = ((40 * i) % 256, 100, (200 - 10 * i) % 256)
        img[: height // 2, : width // 3] = rng.integers(0, 256, 3)  # a block so content differs
        out.append(img)
    return out


# -- virtual camera ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["I420", "NV12", "RGB"])
def test_vcam_delivers_configured_format_size_and_count(fmt, backend, sysfs):
    sink: list[dict] = []
    cfg = OutputConfig(target="vcam", pixel_format=fmt)
    frames = frames_bgr(6, 64, 48)
    with open_output(cfg, 64, 48, 25.0, sysfs_root=sysfs, writer=backend, writer_options={"sink": sink}) as out:
        assert isinstance(out, VirtualCamOutput)
        assert (out.fmt, out.width, out.height) == (PixelFormat(fmt), 64, 48)
        for f in frames:
            out.send(prepare(out, f))
        assert out.frames == 6 and out.device_path == "/dev/video10" and out.backend_name == backend
    (rec,) = sink
    assert rec["device"] == "/dev/video10"  # ours, not OBS's /dev/video2
    assert (rec["width"], rec["height"], rec["fps"], rec["fourcc"]) == (64, 48, 25.0, pyvirtualcam.PixelFormat[fmt].value)
    assert len(rec["frames"]) == 6 and rec["closed"] == 1
    shape = (48 * 3 // 2, 64) if fmt != "RGB" else (48, 64, 3)
    for got, f in zip(rec["frames"], frames):
        np.testing.assert_array_equal(got, from_bgr_ref(f, PixelFormat(fmt)).reshape(-1))
        back = to_bgr_ref(got.reshape(shape), PixelFormat(fmt), 64, 48)
        assert np.abs(back.astype(int) - f.astype(int)).mean() < 3  # the format means what it says


def test_vcam_auto_switches_to_the_native_format(backend, sysfs):
    sink: list[dict] = []
    cfg = OutputConfig(target="vcam", pixel_format="auto")
    with open_output(cfg, 32, 16, 30.0, sysfs_root=sysfs, writer=backend, writer_options={"sink": sink, "native": "NV12"}) as out:
        assert out.fmt is PixelFormat.NV12 and out.native_fmt is PixelFormat.NV12
        out.send_bgr(np.zeros((16, 32, 3), np.uint8))
    first, second = sink
    assert first["fourcc"] == "I420" and first["closed"] == 1 and not first["frames"]
    assert second["fourcc"] == "NV12" and len(second["frames"]) == 1


def test_vcam_auto_keeps_i420_when_native(backend, sysfs):
    sink: list[dict] = []
    with open_output(
        OutputConfig(target="vcam"), 32, 16, 30.0, sysfs_root=sysfs, writer=backend, writer_options={"sink": sink}
    ) as out:
        assert out.fmt is PixelFormat.I420
    assert len(sink) == 1


@pytest.mark.parametrize("fmt,size", [("I420", (64, 48)), ("NV12", (64, 48)), ("RGB", (65, 49))])
def test_vcam_odd_size(fmt, size, backend, sysfs):
    sink: list[dict] = []
    f = frames_bgr(1, 65, 49)[0]
    with open_output(
        OutputConfig(target="vcam", pixel_format=fmt),
        65,
        49,
        30.0,
        sysfs_root=sysfs,
        writer=backend,
        writer_options={"sink": sink},
    ) as out:
        assert (out.width, out.height) == size
        out.send_bgr(f)
    rec = sink[0]
    assert (rec["width"], rec["height"]) == size
    np.testing.assert_array_equal(rec["frames"][0], from_bgr_ref(f[: size[1], : size[0]], PixelFormat(fmt)).reshape(-1))


def test_vcam_missing_device_gives_the_modprobe_fix(backend, tmp_path):
    sink: list[dict] = []
    root = make_sysfs(tmp_path / "sys", {2: "OBS Virtual Camera"})
    with pytest.raises(OutputError, match=r'no virtual camera named "FastSwap Cam" found') as ei:
        open_output(OutputConfig(target="vcam"), 64, 48, 30.0, sysfs_root=root, writer=backend, writer_options={"sink": sink})
    assert ei.value.hint == MODPROBE
    assert '/dev/video2 "OBS Virtual Camera"' in ei.value.message and "left alone" in ei.value.message
    assert sink == []  # the other loopback device was never opened


def test_vcam_missing_device_without_v4l2loopback(backend, tmp_path):
    with pytest.raises(OutputError, match="no virtual camera") as ei:
        open_output(
            OutputConfig(target="vcam"),
            64,
            48,
            30.0,
            sysfs_root=tmp_path / "nothing",
            writer=backend,
            writer_options={"sink": []},
        )
    assert ei.value.hint == MODPROBE
    assert str(ei.value) == f'no virtual camera named "FastSwap Cam" found ({MODPROBE})'


def test_vcam_custom_name(backend, tmp_path):
    sink: list[dict] = []
    root = make_sysfs(tmp_path / "sys", {3: "FastSwap Cam", 5: "Studio Cam"})
    cfg = OutputConfig(target="vcam", device_name="Studio Cam", pixel_format="RGB")
    with open_output(cfg, 16, 16, 30.0, sysfs_root=root, writer=backend, writer_options={"sink": sink}):
        pass
    assert sink[0]["device"] == "/dev/video5"


def test_vcam_backend_failure_is_an_output_error(backend, sysfs):
    with pytest.raises(
        OutputError, match="could not open the virtual camera: /dev/video10: 'vcam-test-capture' backend: device busy"
    ):
        open_output(
            OutputConfig(target="vcam"),
            16,
            16,
            30.0,
            sysfs_root=sysfs,
            writer=backend,
            writer_options={"sink": [], "fail": "device busy"},
        )


def test_vcam_unknown_backend(sysfs):
    with pytest.raises(OutputError, match="unknown pyvirtualcam backend 'nope'"):
        open_output(OutputConfig(target="vcam"), 16, 16, 30.0, sysfs_root=sysfs, writer="nope")


def test_vcam_rejects_wrong_shapes_and_sends_after_close(backend, sysfs):
    sink: list[dict] = []
    out = open_output(
        OutputConfig(target="vcam", pixel_format="I420"),
        32,
        16,
        30.0,
        sysfs_root=sysfs,
        writer=backend,
        writer_options={"sink": sink},
    )
    with pytest.raises(ValueError, match=r"unexpected frame shape: \(16, 32, 3\) != \(24, 32\)"):
        out.send(np.zeros((16, 32, 3), np.uint8))
    out.close()
    out.close()  # idempotent
    assert sink[0]["closed"] == 1
    with pytest.raises(OutputError, match="closed"):
        out.send(np.zeros((24, 32), np.uint8))


def test_vcam_output_fps_from_config(backend, sysfs):
    sink: list[dict] = []
    with open_output(
        OutputConfig(target="vcam", fps=15.0), 16, 16, 30.0, sysfs_root=sysfs, writer=backend, writer_options={"sink": sink}
    ) as out:
        assert out.fps == 15.0
    assert sink[0]["fps"] == 15.0


# -- file ------------------------------------------------------------------------------------------


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="bgr24") for f in c.decode(video=0)]


def test_file_output_decodes_with_count_and_size(tmp_path):
    path = tmp_path / "out.mp4"
    frames = frames_bgr(12, 96, 64)
    with open_output(OutputConfig(target=f"file:{path}"), 96, 64, 30.0, file_timing="frames") as out:
        assert isinstance(out, FileOutput) and out.fmt is PixelFormat.BGR
        for f in frames:
            out.send(prepare(out, f))
        assert not path.exists()  # written under a temporary name until closed
    got = decode(path)
    assert len(got) == 12
    for g, f in zip(got, frames):
        assert g.shape == (64, 96, 3)
        assert np.abs(g.astype(int) - f.astype(int)).mean() < 6
    assert [p.name for p in tmp_path.iterdir()] == ["out.mp4"]  # no temporary left behind
    with av.open(str(path)) as c:
        assert c.streams.video[0].codec_context.name in ("h264", "mpeg4")
        assert float(c.streams.video[0].average_rate) == pytest.approx(30.0)


def test_file_output_wall_timing_keeps_real_speed(tmp_path):
    path = tmp_path / "live.mp4"
    stamps = iter([50.0, 50.1, 50.15, 50.5, 50.5])  # the last two collide: pts must still grow

    with FileOutput(path, 32, 32, 30.0, clock=lambda: next(stamps)) as out:
        assert out.timing == "wall"
        for f in frames_bgr(5, 32, 32):
            out.send(f)
    with av.open(str(path)) as c:
        times = [round(float(f.time), 3) for f in c.decode(video=0)]
    assert times == [0.0, 0.1, 0.15, 0.5, 0.501]


def pix_fmt_of(path: Path) -> tuple[str, int, int]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return s.codec_context.pix_fmt, s.codec_context.width, s.codec_context.height


def test_an_odd_size_is_padded_to_even_4_2_0_with_its_edge_pixels(tmp_path, caplog):
    """Plays everywhere by default: H.264 yuv420p, the odd side padded with the edge pixels, said
    in one line; the file's pix_fmt as PyAV reads it back."""
    path = tmp_path / "odd.mp4"
    frames = frames_bgr(5, 1281, 721)
    for f in frames:
        f[:, -1] = (0, 255, 0)  # a green last column and a red last row: the padding repeats them
        f[-1, :] = (0, 0, 255)
    with caplog.at_level("WARNING", logger="vcam.stages.publish"):
        out = open_output(OutputConfig(target=f"file:{path}"), 1281, 721, 25.0)
    with out:
        assert (out.width, out.height, out.coded_width, out.coded_height) == (1281, 721, 1282, 722)
        assert (out.codec, out.pix_fmt) == ("libx264", "yuv420p")
        assert out.describe() == "odd.mp4: H.264 (libx264) yuv420p 1282x722 (padded from 1281x721), 25 fps"
        out.send(frames[0])
        for f in frames[1:]:
            out.send_bgr(f)
    said = [r.getMessage() for r in caplog.records if "padded" in r.getMessage()]
    assert len(said) == 1 and "1281x721 is padded to 1282x722 with the edge pixels" in said[0] and "\n" not in said[0]
    assert pix_fmt_of(path) == ("yuv420p", 1282, 722)
    got = decode(path)
    assert len(got) == 5 and all(g.shape == (722, 1282, 3) for g in got)
    assert np.abs(got[2][:721, :1281].astype(int) - frames[2].astype(int)).mean() < 6
    assert np.abs(got[2][:700, 1281].astype(int) - (0, 255, 0)).mean() < 40  # the edge column, repeated
    assert np.abs(got[2][721, :1200].astype(int) - (0, 0, 255)).mean() < 40  # the edge row, repeated


def test_4_4_4_on_request_keeps_the_exact_size(tmp_path, caplog):
    path = tmp_path / "odd444.mp4"
    frames = frames_bgr(3, 641, 361)
    with caplog.at_level("WARNING", logger="vcam.stages.publish"):
        with open_output(OutputConfig(target=f"file:{path}", chroma="444"), 641, 361, 25.0) as out:
            assert out.describe() == "odd444.mp4: H.264 (libx264) yuv444p 641x361, 25 fps"
            for f in frames:
                out.send(f)
    assert not [r for r in caplog.records if "padded" in r.getMessage()]
    assert pix_fmt_of(path) == ("yuv444p", 641, 361)
    assert decode(path)[1].shape == (361, 641, 3)


def test_the_mpeg4_fallback_pads_too(tmp_path):
    with FileOutput(tmp_path / "odd4.mp4", 65, 49, 20.0, codecs=("mpeg4",)) as out:
        assert (out.width, out.height, out.coded_width, out.coded_height) == (65, 49, 66, 50)
        out.send(frames_bgr(1, 65, 49)[0])
    assert pix_fmt_of(tmp_path / "odd4.mp4") == ("yuv420p", 66, 50)


def test_a_file_cut_short_is_kept_as_partial_never_under_its_name(tmp_path):
    path = tmp_path / "conv.mp4"
    out = FileOutput(path, 64, 48, 30.0, timing="frames")
    for f in frames_bgr(6, 64, 48):
        out.send(f)
    out.close(complete=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.partial.mp4"] and out.kept == out.partial_path
    assert len(decode(out.partial_path)) == 6  # finished properly: every frame plays


@pytest.mark.parametrize("where", ["writing", "closed-not-moved"])
def test_salvage_after_a_forced_exit_leaves_no_hidden_file(tmp_path, where):
    """A second Ctrl-C can cut a recording off while frames are written or while close() runs:
    salvage() leaves it playable, under its name when it was finished, else as NAME.partial.mp4."""
    path = tmp_path / "rec.mp4"
    out = FileOutput(path, 64, 48, 30.0, timing="frames")
    for f in frames_bgr(70, 64, 48):  # more than two one-second fragments
        out.send(f)
    if where == "closed-not-moved":  # the signal came after the container was finished, before the rename
        for packet in out._stream.encode(None):
            out._container.mux(packet)
        out._container.close()
        out._file.close()
        out._container_done = True
    kept = out.salvage()
    names = sorted(p.name for p in tmp_path.iterdir())
    if where == "writing":
        assert names == ["rec.partial.mp4"] and kept == out.partial_path
        assert 30 <= len(decode(kept)) <= 70
    else:
        assert names == ["rec.mp4"] and kept == path and len(decode(path)) == 70
    assert out.salvage() == kept  # idempotent


def test_salvage_that_cannot_check_the_file_still_leaves_no_hidden_file(tmp_path, monkeypatch):
    """A salvage whose own checks fail (the trim or the probe raising) keeps what was written as
    NAME.partial.mp4 as it is: never the hidden temporary file, never nothing."""
    from vcam.stages import recording

    path = tmp_path / "rec.mp4"
    out = FileOutput(path, 64, 48, 30.0, timing="frames")
    for f in frames_bgr(40, 64, 48):
        out.send(f)

    def broken(*a, **k):
        raise OSError("probe failed")

    monkeypatch.setattr(recording, "_trim_to_whole_fragments", broken)
    kept = out.salvage()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.partial.mp4"] and kept == out.partial_path
    monkeypatch.undo()
    assert len(decode(kept)) >= 1  # what reached the disk plays


def test_a_stop_signal_while_the_file_is_opened_leaves_no_hidden_file(tmp_path, monkeypatch):
    """A forced exit (SystemExit from the second Ctrl-C) that lands while the encoder is set up
    removes the hidden temporary file already made and goes on as a SystemExit."""

    def stopped(*a, **k):
        raise SystemExit(130)

    monkeypatch.setattr(av, "open", stopped)
    with pytest.raises(SystemExit):
        FileOutput(tmp_path / "rec.mp4", 64, 48, 30.0)
    assert list(tmp_path.iterdir()) == []


def test_file_output_mpeg4_fallback(tmp_path):
    path = tmp_path / "fallback.mp4"
    out = FileOutput(path, 64, 48, 20.0, codecs=("no-such-encoder", "mpeg4"))
    assert out.codec == "mpeg4"
    for f in frames_bgr(4, 64, 48):
        out.send(f)
    out.close()
    out.close()
    assert len(decode(path)) == 4


def test_file_output_falls_back_when_an_encoder_fails_to_open(tmp_path):
    path = tmp_path / "fb.mp4"
    with FileOutput(path, 64, 48, 20.0, codecs=("libx264", "mpeg4"), preset="no-such-preset") as out:
        assert out.codec == "mpeg4"
        for f in frames_bgr(3, 64, 48):
            out.send(f)
    with av.open(str(path)) as c:
        assert len(c.streams) == 1  # the failed attempt left no dead stream
    assert len(decode(path)) == 3


def test_file_output_missing_folder(tmp_path):
    with pytest.raises(OutputError, match=r"folder .*missing does not exist") as ei:
        open_output(OutputConfig(target=f"file:{tmp_path / 'missing' / 'out.mp4'}"), 64, 48, 30.0)
    assert "mkdir -p" in ei.value.hint


def test_file_output_refuses_to_overwrite_a_non_video(tmp_path):
    path = tmp_path / "thesis.mp4"
    path.write_text("my only copy")
    with pytest.raises(OutputError, match="exists and is not a video; refusing to overwrite it"):
        open_output(OutputConfig(target=f"file:{path}"), 64, 48, 30.0)
    assert path.read_text() == "my only copy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.mp4"]


def test_file_output_replaces_an_existing_video(tmp_path):
    path = tmp_path / "take.mp4"
    for n in (3, 5):
        with FileOutput(path, 32, 32, 30.0) as out:
            for f in frames_bgr(n, 32, 32):
                out.send(f)
        assert len(decode(path)) == n


def test_file_output_without_frames_leaves_nothing(tmp_path):
    path = tmp_path / "empty.mp4"
    FileOutput(path, 32, 32, 30.0).close()
    assert list(tmp_path.iterdir()) == []


def test_file_target_needs_a_path():
    with pytest.raises(OutputError, match="file: needs a path"):
        open_output(OutputConfig(target="file:"), 32, 32, 30.0)


# -- null, window, unknown ------------------------------------------------------------------------


def test_null_output_counts_and_checks():
    out = open_output(OutputConfig(target="null"), 33, 21, 30.0)
    assert isinstance(out, NullOutput) and (out.width, out.height, out.fmt) == (33, 21, PixelFormat.BGR)
    for f in frames_bgr(7, 33, 21):
        out.send_bgr(f)
    assert out.frames == 7
    with pytest.raises(ValueError, match="unexpected frame shape"):
        out.send(np.zeros((5, 5, 3), np.uint8))
    out.close()


def test_unknown_target_lists_the_valid_forms():
    with pytest.raises(OutputError, match=r"unknown output 'screen'") as ei:
        open_output(OutputConfig(target="screen"), 32, 32, 30.0)
    assert ei.value.hint == "use one of: vcam, file:PATH (.mp4, .mkv, .mov), window, null, or obs-source"


def test_window_without_a_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(OutputError, match="cannot open a preview window") as ei:
        open_output(OutputConfig(target="window"), 32, 32, 30.0)
    assert "file:" in ei.value.hint and "vcam" in ei.value.hint


def test_window_under_xvfb(tmp_path):
    if shutil.which("Xvfb") is None:
        require("xvfb", "Xvfb is not installed")
    # Qt aborts the whole process when it cannot reach a display, so the window runs in a child.
    r, w = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(w), "-screen", "0", "320x240x24", "-nolisten", "tcp"], pass_fds=(w,), stderr=subprocess.DEVNULL
    )
    os.close(w)
    try:
        with os.fdopen(r) as fh:
            display = fh.readline().strip()
        assert display, "Xvfb did not report a display"
        code = textwrap.dedent(
            """
            import numpy as np
            from vcam.stages.outputs import WindowOutput
            out = WindowOutput(64, 48, title="vcam test")
            for i in range(3):
                out.send(np.full((48, 64, 3), 60 * i, np.uint8))
            print("frames", out.frames, "closed", out.user_closed)
            out.close(); out.close()
            """
        )
        env = {**os.environ, "DISPLAY": f":{display}", "QT_QPA_PLATFORM": "xcb"}
        env.pop("WAYLAND_DISPLAY", None)
        res = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert "frames 3 closed False" in res.stdout
    finally:
        xvfb.terminate()
        xvfb.wait(10)
