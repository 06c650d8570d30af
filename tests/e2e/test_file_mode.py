"""Files processed the way a user converting a recording expects (issue 11): every frame once and in
order however slow the pipeline is, a still image that ends, outputs that never destroy the input,
honour the umask, and fail on a full disk or a vanished folder with one line and a playable partial
file. Everything goes through the real ``vcam run`` (in process, so the pipeline can be slowed down
and the file boundary given faults) or the real :class:`FileOutput`."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from conftest import can_symlink, vcam_cli, windows_lacks
from typer.testing import CliRunner

import vcam.stages.recording
from vcam.cli import app
from vcam.errors import OutputError
from vcam.pipeline.pipeline import Pipeline
from vcam.stages.recording import FileOutput

runner = CliRunner()
W, H, FPS, BITS = 320, 240, 30.0, 7
BLOCK = W // BITS


def numbered(i: int) -> np.ndarray:
    """A frame whose index is written in BITS black/white blocks (survives H.264 easily)."""
    f = np.full((H, W, 3), 60, np.uint8)
    for b in range(BITS):
        if i >> b & 1:
            f[60:180, b * BLOCK + 4 : (b + 1) * BLOCK - 4] = 230
    return f


def number_of(f: np.ndarray) -> int:
    return sum(1 << b for b in range(BITS) if f[120, b * BLOCK + BLOCK // 2].mean() > 145)


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [fr.to_ndarray(format="bgr24") for fr in c.decode(video=0)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "numbered.mp4"
    with FileOutput(path, W, H, FPS, timing="frames") as out:
        for i in range(45):
            out.send(numbered(i))
    assert [number_of(f) for f in decode(path)] == list(range(45))  # the oracle reads its own clip
    return path


@pytest.fixture
def slow_pipeline(monkeypatch):
    """Every frame takes at least 60 ms in the pipeline: slower than the clip's 30 fps."""
    begin = Pipeline.begin

    def slow(self, frame, snap):
        time.sleep(0.06)
        return begin(self, frame, snap)

    monkeypatch.setattr(Pipeline, "begin", slow)


def vcam_run(*args: str):
    return runner.invoke(app, ["run", "--device", "cpu", "--quiet", *args])


def one_error_line(r, code: int) -> str:
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


# -- lossless -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_file_to_file_keeps_every_frame_in_order_with_a_slow_pipeline(clip, tmp_path, slow_pipeline):
    out = tmp_path / "out.mp4"
    r = vcam_run("--input", str(clip), "--output", f"file:{out}")  # the input plays once: no --no-loop needed
    assert r.exit_code == 0, r.output
    assert "published of 45" in r.output and "dropped 0 at capture, 0 over" in r.output, r.output
    got = decode(out)
    assert [number_of(f) for f in got] == list(range(45))
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert (s.width, s.height) == (W, H) and float(s.average_rate) == pytest.approx(FPS)


@pytest.mark.slow
def test_realtime_flag_restores_camera_pacing_with_drops(clip, tmp_path, slow_pipeline):
    out = tmp_path / "rt.mp4"
    r = vcam_run("--input", str(clip), "--output", f"file:{out}", "--no-loop", "--realtime")
    assert r.exit_code == 0, r.output
    numbers = [number_of(f) for f in decode(out)]
    assert 0 < len(numbers) < 45, numbers  # a 30 fps clip through a 16 fps pipeline: the newest frame wins
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_fast_and_realtime_together_is_a_flag_error(clip):
    line = one_error_line(vcam_run("--input", str(clip), "--output", "null", "--fast", "--realtime"), 2)
    assert "--fast and --realtime" in line


@pytest.mark.slow
@pytest.mark.parametrize("frames,expect", [(None, 1), (5, 5)])
def test_a_still_image_to_a_file_ends_and_pads_an_odd_size(tmp_path, frames, expect, caplog):
    img = tmp_path / "still.png"
    yy, xx = np.mgrid[0:481, 0:641]
    cv2.imwrite(str(img), np.dstack([xx % 256, yy % 256, (xx + yy) % 256]).astype(np.uint8))
    out = tmp_path / "still.mp4"
    args = ["--input", str(img), "--output", f"file:{out}"] + (["--frames", str(frames)] if frames else [])
    r = vcam_run(*args)
    assert r.exit_code == 0, r.output
    got = decode(out)
    assert len(got) == expect and got[0].shape == (482, 642, 3)  # 4:2:0 plays everywhere: padded to even
    assert "641x481 is padded to 642x482 with the edge pixels" in caplog.text


# -- outputs that cannot destroy anything ---------------------------------------------------------


def test_output_that_is_the_input_is_refused_and_the_input_untouched(clip, tmp_path, monkeypatch):
    links = can_symlink(tmp_path)  # Windows without developer mode (and Wine): the other names only
    mine = tmp_path / "talk.mp4"
    shutil.copy(clip, mine)
    before = mine.read_bytes()
    link = tmp_path / "link.mp4"
    if links:
        link.symlink_to(mine)
    monkeypatch.chdir(tmp_path)
    for target in (str(mine), *([str(link)] if links else []), "./talk.mp4", "sub/../talk.mp4"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        line = one_error_line(vcam_run("--input", str(mine), "--output", f"file:{target}", "--no-loop"), 4)
        assert "is the input video" in line and "--output file:" in line
        assert mine.read_bytes() == before
    if links:
        r = vcam_run("--input", str(link), "--output", f"file:{mine}", "--no-loop")  # the link as input
        assert "is the input video" in one_error_line(r, 4)
        assert mine.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.mp4", "sub", "talk.mp4"][0 if links else 1 :]


def test_an_extension_the_container_cannot_write_is_refused(tmp_path):
    line = one_error_line(vcam_run("--input", "demo", "--frames", "2", "--output", f"file:{tmp_path / 'x.txt'}"), 4)
    assert ".txt is not a video container" in line and ".mp4" in line
    assert list(tmp_path.iterdir()) == []


@windows_lacks("the umask and POSIX file modes")
@pytest.mark.parametrize("umask,mode", [(0o027, 0o640), (0o002, 0o664)])
def test_output_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with FileOutput(tmp_path / "m.mp4", 32, 32, 30.0) as out:
            out.send(np.zeros((32, 32, 3), np.uint8))
    finally:
        os.umask(old)
    assert (tmp_path / "m.mp4").stat().st_mode & 0o777 == mode


# -- full disk, vanished folder ---------------------------------------------------------------------


class FullAfter:
    """A file that takes ``room`` bytes and then fails every write with ENOSPC, like a full disk."""

    def __init__(self, path: Path, room: int) -> None:
        self._f = open(path, "xb")
        self.room = room

    def write(self, data) -> int:
        n = len(data)
        if self._f.tell() + n > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def noise(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(n)]


def test_a_disk_filling_mid_recording_stops_with_one_line_and_a_playable_partial(tmp_path):
    out = FileOutput(tmp_path / "rec.mp4", 128, 96, 5.0, opener=lambda p: FullAfter(p, 200_000))
    sent = 0
    with pytest.raises(OutputError) as ei:
        for f in noise(200):
            out.send(f)
            sent += 1
    msg = str(ei.value)
    assert "\n" not in msg and "No space left on device" in msg and "rec.partial.mp4" in msg
    assert "playable" in msg and 0 < sent < 200
    out.close()  # after the failure: nothing more to say, nothing muxed again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.partial.mp4"]  # no hidden temporary
    got = decode(tmp_path / "rec.partial.mp4")  # every frame kept decodes (the cut fragment is trimmed)
    assert 5 <= len(got) <= sent
    with pytest.raises(OutputError, match="failed earlier"):
        out.send(noise(1)[0])


def test_a_disk_full_from_the_start_leaves_nothing_behind(tmp_path):
    with pytest.raises(OutputError) as ei:
        out = FileOutput(tmp_path / "rec.mp4", 128, 96, 5.0, opener=lambda p: FullAfter(p, 0))
        for f in noise(20):
            out.send(f)
        out.close()
    assert "No space left on device" in str(ei.value) and "\n" not in str(ei.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_vcam_run_on_a_full_disk_exits_4_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(vcam.stages.recording, "_open_with_umask", lambda p: FullAfter(p, 1_000_000))
    out = tmp_path / "demo.mp4"
    line = one_error_line(vcam_run("--input", "demo", "--frames", "300", "--output", f"file:{out}"), 4)
    assert "No space left on device" in line and "demo.partial.mp4" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.partial.mp4"]
    assert len(decode(tmp_path / "demo.partial.mp4")) >= 30


@windows_lacks("removing a folder while a file in it is open")
def test_a_vanished_folder_is_one_clear_line(tmp_path):
    folder = tmp_path / "takes"
    folder.mkdir()
    out = FileOutput(folder / "t.mp4", 64, 48, 10.0)
    for f in noise(5):
        out.send(f[:48, :64])
    shutil.rmtree(folder)
    with pytest.raises(OutputError) as ei:
        for f in noise(5):
            out.send(f[:48, :64])
        out.close()
    assert "\n" not in str(ei.value) and "folder was removed" in str(ei.value)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs, where this machine lets the test mount one (root with CAP_SYS_ADMIN)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'mount failed'}); the fault-injection tests cover it")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("free_kib,kept", [(700, True), (0, False)])
def test_vcam_run_on_a_real_full_filesystem(small_tmpfs, free_kib, kept):
    (small_tmpfs / "fill").write_bytes(b"\0" * (1024 - free_kib) * 1024)
    while True:  # fill whatever rounding left
        try:
            with open(small_tmpfs / "fill", "ab") as fh:
                if free_kib:
                    break
                fh.write(b"\0" * 4096)
        except OSError:
            break
    target = f"file:{small_tmpfs / 'out.mp4'}"
    p = vcam_cli("run", "--input", "demo", "--frames", "300", "--device", "cpu", "--quiet", "--output", target)
    assert p.returncode == 4, (p.returncode, p.stdout, p.stderr)  # not a crash (was 139)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], lines
    names = sorted(q.name for q in small_tmpfs.iterdir())
    assert names == (["fill", "out.partial.mp4"] if kept else ["fill"])
    if kept:
        assert len(decode(small_tmpfs / "out.partial.mp4")) >= 30
