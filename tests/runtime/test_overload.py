"""Overload never freezes the camera: when every frame finishes after the latency budget, frames
still go out at the stream's refresh interval (counted as late), and the status says so."""

from __future__ import annotations

import time

import numpy as np
import pytest
from media import Recorder

from vcam.config_file import build
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

    def slow_loop(mark: Mark) -> None:
        # An injected slowdown on the frame loop: 60 ms a frame, so every frame misses a 30 ms budget.
        if mark.phase == "collected":
            time.sleep(0.06)
            rounds.append(time.perf_counter())
        elif mark.phase == "published":
            published.append(mark.t)

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


def test_the_status_says_overloaded_and_what_is_shed():
    assert status_parts(Status(overloaded=True, degraded=("occlusion", "enhancer"))) == [
        "overloaded: shedding occlusion, enhancer"
    ]
    assert status_parts(Status(overloaded=True)) == ["overloaded: publishing late frames"]
    assert status_parts(Status(degraded=("upscale",))) == ["degraded: upscale off"]
