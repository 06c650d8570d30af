"""Overload never freezes the camera: when every frame finishes after the latency budget, frames
still go out at the stream's refresh interval (counted as late), and the status says so."""

from __future__ import annotations

import time

import numpy as np
import pytest
from media import Recorder

from vcam.config_file import build
from vcam.engines.gate import ROUND_TURNS
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import Mark
from vcam.stages.demo import DemoClip
from vcam.stages.sources import DemoSource
from vcam.state import Status
from vcam.status import status_parts

W, H, FPS = 320, 240, 15


@pytest.mark.slow
def test_frames_keep_coming_when_every_frame_is_over_the_budget():
    cfg = build(
        {
            "capture": {"width": W, "height": H, "fps": FPS},
            "pipeline": {"device": "cpu", "max_latency": "30ms", "early_frames": "off"},
        }
    )
    published: list[float] = []
    rounds: list[float] = []
    behind: list[bool] = []

    def slow_loop(mark: Mark) -> None:
        # An injected slowdown on the frame loop: 60 ms a frame, so every frame misses a 30 ms budget.
        if mark.phase == "collected":
            time.sleep(0.06)
            rounds.append(time.perf_counter())
        elif mark.phase == "published":
            published.append(mark.t)
            behind.append(ROUND_TURNS.behind)

    clip = DemoClip(width=W, height=H, fps=FPS, seconds=4.0)
    source = DemoSource(clip, loop=False, realtime=True)
    daemon = Daemon(cfg, source=source, output=Recorder(W, H), control=False, hook=slow_loop)
    summary = daemon.run()
    stream = daemon.streams[0]

    # Before the rule every one of these frames was dropped: nothing published for the whole run.
    assert summary.frames_out >= 5, summary.line()
    assert summary.published_late == summary.frames_out  # each one late, and counted so
    # The longest silence is the refresh interval plus about a round (the round that finds the
    # stream stale), whatever this machine's speed: measured against this run's own rounds.
    longest_round = float(np.max(np.diff(rounds)))
    gaps = np.diff(published)
    assert gaps.max() <= stream.stale_after() + 1.5 * longest_round, (gaps.max(), longest_round)
    # And the rate is what that interval allows (at least half of it, for the frames the clip has).
    seconds = published[-1] - published[0]
    assert len(published) - 1 >= 0.5 * seconds / (stream.stale_after() + longest_round)
    status = stream.live.status(0, {})
    assert status.overloaded and status.published_late == summary.published_late
    assert "published late" in summary.line()
    # Behind for the degrader's `after` seconds: the background work stopped stepping aside for the
    # rounds (vcam.engines.gate.RoundTurns.fall_behind), and the loop's end said so no longer.
    assert not behind[0] and behind[-1], behind
    assert not ROUND_TURNS.behind


def test_the_status_says_overloaded_and_what_is_shed():
    assert status_parts(Status(overloaded=True, degraded=("occlusion", "enhancer"))) == [
        "overloaded: shedding occlusion, enhancer"
    ]
    assert status_parts(Status(overloaded=True)) == ["overloaded: publishing late frames"]
    assert status_parts(Status(degraded=("upscale",))) == ["degraded: upscale off"]


def _slowed_run(early_frames: str, seconds: float = 7.0, slow: float = 1.0):
    """A live demo run whose pipeline takes ``slow`` seconds a frame (a 30 ms budget, 15 fps camera:
    the camera nearly stands still), with the degrader quick to act (0.3 s; the swap after 3 x 0.3 s)
    and slow to bring a stage back (60 s)."""
    cfg = build(
        {
            "capture": {"width": W, "height": H, "fps": FPS},
            "pipeline": {"device": "cpu", "max_latency": "30ms", "early_frames": early_frames},
            "degrade": {"after": "0.3s", "recover": "60s"},
        }
    )
    published: list[tuple[float, int]] = []  # (time, seq)
    piped: set[int] = set()  # the frames that went through the pipeline

    def slow_loop(mark: Mark) -> None:
        if mark.phase == "collected":
            time.sleep(slow)
            piped.add(mark.seq)
        elif mark.phase == "published":
            published.append((mark.t, mark.seq))

    clip = DemoClip(width=W, height=H, fps=FPS, seconds=seconds)
    out = Recorder(W, H)
    daemon = Daemon(cfg, source=DemoSource(clip, loop=False, realtime=True), output=out, control=False, hook=slow_loop)
    summary = daemon.run()
    return daemon, summary, published, piped, out, clip


@pytest.mark.slow
def test_the_last_rung_sheds_the_swap_and_publishes_pixelated_frames_at_the_camera_rate():
    from vcam.runtime.rounds import pixelate

    daemon, summary, published, piped, out, clip = _slowed_run("pixelate")
    stream = daemon.streams[0]
    assert daemon.degrader is not None and "swap" in daemon.degrader.off, daemon.degrader.off
    assert summary.shed_frames > 0 and "frames without the swap" in summary.line()
    # Once shed, frames stop going through the pipeline and come out at close to the camera's rate.
    shed = [(t, seq) for t, seq in published if seq not in piped]
    assert len(shed) == summary.shed_frames
    times = np.array([t for t, _ in shed])
    assert len(times) >= 10
    rate = (len(times) - 1) / (times[-1] - times[0])
    piped_times = np.array([t for t, seq in published if seq in piped])
    piped_rate = (len(piped_times) - 1) / max(piped_times[-1] - piped_times[0], 1e-9)
    assert rate > 2.0 * piped_rate, (rate, piped_rate)  # the shed frames are not held back by the slow pipeline
    gaps = np.diff(times)
    assert gaps.max() <= 0.5, gaps.max()  # once shed, the camera moves again
    # The shed frames are the camera's own frames in coarse blocks: no face to see, never a stale picture.
    first = [i for i, (_, seq) in enumerate(published) if seq not in piped][:3]
    for i in first:
        seq = published[i][1]
        np.testing.assert_array_equal(out.got[i + summary.early_frames], pixelate(clip.frame(seq)))
    status = stream.live.status(0, {}, degraded=daemon.degrader.off)
    assert "overloaded: shedding" in " ".join(status_parts(status)) and "swap" in status.degraded


@pytest.mark.slow
def test_with_early_frames_off_the_swap_is_never_shed():
    daemon, summary, published, piped, _, _ = _slowed_run("off", seconds=5.0)
    assert daemon.degrader is None or "swap" not in daemon.degrader.available
    assert summary.shed_frames == 0 and all(seq in piped for _, seq in published)
    assert summary.frames_out >= 3  # late frames still go out


@pytest.mark.slow
def test_a_slow_swap_that_still_moves_is_not_shed():
    # 90 ms a frame: every frame over the 30 ms budget, but late frames go out several times a second.
    daemon, summary, published, piped, _, _ = _slowed_run("pixelate", seconds=5.0, slow=0.09)
    assert daemon.degrader is not None and "swap" in daemon.degrader.available
    assert "swap" not in daemon.degrader.off and summary.shed_frames == 0
    assert summary.published_late > 5
