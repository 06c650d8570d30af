"""File conversions as a user runs them (issue 29): the real ``vcam`` process converting a real
video; progress (a bar on a terminal, a plain line when piped, nothing with ``--quiet``), a summary
that counts the input's frames and names the codec, pixel format and active face, and Ctrl-C
mid-conversion: exit 130 and a playable ``NAME.partial.mp4``, never the final name."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import POSIX_SIGNALS, at_terminal, ended, windows_lacks

from vcam.stages import demo
from vcam.stages.recording import FileOutput

W, H, N = 641, 361, 300  # odd on purpose: the output is padded to 642x362 4:2:0


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> Path:
    """A 10 s clip of the demo scene (a face that moves), odd-sized, written 4:4:4."""
    path = tmp_path_factory.mktemp("talk") / "talk.mp4"
    clip = demo.DemoClip(width=W, height=H, fps=30)
    with FileOutput(path, W, H, 30.0, timing="frames", chroma="444") as out:
        for i in range(N):
            out.send(np.ascontiguousarray(clip.frame(i % clip.n_frames)[:H, :W]))
    return path


def vcam(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        at_terminal([sys.executable, "-m", "vcam", "run", "--device", "cpu", *args]),
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"),
        **kw,
    )


def decoded(path: Path) -> tuple[str, int, int, int]:
    with av.open(str(path)) as c:
        cc = c.streams.video[0].codec_context
        return cc.pix_fmt, cc.width, cc.height, sum(1 for _ in c.decode(video=0))


@pytest.mark.slow
def test_piped_a_conversion_prints_plain_progress_lines_and_counts_the_input_frames(talk, tmp_path):
    out = tmp_path / "out.mp4"
    p = vcam("--input", str(talk), "--output", f"file:{out}", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text, _ = p.communicate(timeout=300)
    assert p.returncode == 0, text
    progress = [ln for ln in text.splitlines() if ln.startswith("converting:")]
    assert progress, text
    assert re.fullmatch(rf"converting: \d+ of {N} input frames \(\d+%\), [\d.]+ fps, ETA (\d+ s|unknown)", progress[0]), progress
    assert f"stopped: {N} frames published of {N} input frames" in text, text
    assert "face none (pass-through)" in text  # no --face: nothing is swapped in, and it says so
    assert f"output: out.mp4: H.264 (libx264) yuv420p 642x362 (padded from {W}x{H}), 30 fps" in text, text
    assert text.count("is padded to 642x362 with the edge pixels") == 1
    assert decoded(out) == ("yuv420p", 642, 362, N)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.mp4"]


@pytest.mark.slow
def test_quiet_silences_the_progress(talk, tmp_path):
    out = tmp_path / "q.mp4"
    p = vcam(
        "--input",
        str(talk),
        "--output",
        f"file:{out}",
        "--frames",
        "60",
        "--quiet",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    text, _ = p.communicate(timeout=300)
    assert p.returncode == 0, text
    assert "converting" not in text and "stopped: 60 frames published of 60 input frames" in text, text


@pytest.mark.slow
def test_on_a_terminal_a_conversion_shows_a_progress_bar(talk, tmp_path):
    pty = pytest.importorskip("pty", reason="pseudo-terminals (pty): not on Windows")
    out = tmp_path / "bar.mp4"
    master, slave = pty.openpty()
    p = vcam("--input", str(talk), "--output", f"file:{out}", "--frames", "120", stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.time() + 300
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    assert p.wait(timeout=60) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    assert "converting" in screen and "━" in screen and "ETA" in screen, screen[-2000:]
    assert re.search(r"120/120 frames [\d.]+ fps", screen), screen[-2000:]
    assert "stopped: 120 frames published of 120 input frames" in screen


@pytest.mark.slow
@windows_lacks(POSIX_SIGNALS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_conversion_exits_130_and_keeps_only_a_playable_partial(talk, tmp_path, sig):
    out = tmp_path / "swapped.mp4"
    face = Path(demo.__file__).resolve().parents[1] / "assets" / "astronaut.jpg"
    p = vcam(
        "--input", str(talk), "--output", f"file:{out}", "--face", str(face),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    try:
        assert p.stdout is not None
        for line in p.stdout:  # the first progress line: frames are being written
            lines.append(line)
            if line.startswith("converting:"):
                break
        p.send_signal(sig)
        rest = ended(p, 120)
    finally:
        if p.poll() is None:
            p.kill()
    text = "".join(lines) + rest
    assert p.returncode == 130, text
    m = re.search(rf"stopped \(interrupted\): (\d+) frames published of {N} input frames", text)
    assert m and 0 < int(m.group(1)) < N, text
    assert "cut short, kept as" in text and "swapped.partial.mp4" in text and "Traceback" not in text, text
    assert sorted(x.name for x in tmp_path.iterdir()) == ["swapped.partial.mp4"]  # never the final name, nothing hidden
    pix, w, h, frames = decoded(tmp_path / "swapped.partial.mp4")
    assert (pix, w, h) == ("yuv420p", 642, 362) and frames == int(m.group(1))
