"""Pause and resume on a real daemon (the demo clip on the CPU, paced as a camera): paused, the
stream's input is closed and a still card goes out; resumed, the input is opened again and swapped
frames follow within a few frame times (vcam.runtime.pause)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from vcam.config import Config
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import Mark
from vcam.stages.outputs import NullOutput
from vcam.status import status_parts
from vcam.types import PixelFormat

W, H, FPS = 320, 240, 30.0


def live_cfg(**capture) -> Config:
    cfg = Config()
    cap = dict(input="demo", width=W, height=H, pacing="realtime", fps=FPS)
    cap.update(capture)
    return cfg.replace(
        capture=replace(cfg.capture, **cap),
        pipeline=replace(cfg.pipeline, device="cpu"),
        output=replace(cfg.output, target="null"),
    )


class Recording(NullOutput):
    """Every frame sent, with its time."""

    def __init__(self) -> None:
        super().__init__(W, H, FPS, fmt=PixelFormat.I420)
        self.sent: list[tuple[float, np.ndarray]] = []
        self.lock = threading.Lock()

    def send(self, data) -> None:
        super().send(data)
        with self.lock:
            self.sent.append((time.perf_counter(), np.array(data, copy=True)))

    def since(self, t: float) -> list[np.ndarray]:
        with self.lock:
            return [f for ts, f in self.sent if ts >= t]


class Swapped:
    """The times of the frames published with a face swapped (the daemon's round hook)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.latencies: list[float] = []

    def __call__(self, mark: Mark) -> None:
        if mark.phase == "published" and mark.stats is not None and mark.stats.swapped:
            self.times.append(mark.t)
            self.latencies.append(mark.t - mark.t_capture)

    def first_after(self, t: float, timeout: float = 10.0) -> float:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            later = [x for x in self.times if x >= t]
            if later:
                return later[0]
            time.sleep(0.001)
        raise AssertionError("no swapped frame")


def wait(pred, timeout: float = 5.0) -> None:
    end = time.perf_counter() + timeout
    while not pred():
        assert time.perf_counter() < end, "timed out"
        time.sleep(0.002)


def start(cfg: Config, *, paused: bool = False) -> tuple[Daemon, Recording, Swapped]:
    out, swapped = Recording(), Swapped()
    d = Daemon(cfg, output=out, control=False, hook=swapped)
    d.state.set_paused(paused)
    d.start()
    assert d.ready.wait(60) and d.summary.error is None, d.summary.error
    if not paused:
        swapped.first_after(0.0, 30.0)
    return d, out, swapped


def pause(d: Daemon) -> None:
    st = d.streams[0]
    d.state.set_paused(True)
    wait(lambda: st.paused and st.cap is not None and st.cap.join(0))


def resume(d: Daemon, swapped: Swapped) -> float:
    """Seconds from the resume asked for to the first swapped frame published."""
    t = time.perf_counter()
    d.state.set_paused(False)
    return swapped.first_after(t) - t


def test_a_paused_stream_closes_its_input_shows_a_card_and_swaps_again_on_resume():
    d, out, swapped = start(live_cfg())
    try:
        st = d.streams[0]
        source, cap = st.source, st.cap
        assert source is not None and not source.closed
        last_swapped = out.since(0.0)[-1]
        pause(d)
        # The input is closed (a camera's light goes off) and nothing is read from it any more.
        assert source.closed and cap.join(0) and not cap._thread.is_alive()
        delivered = cap.delivered
        n_swapped = len(swapped.times)
        t_paused = time.perf_counter()
        time.sleep(1.0)
        cards = out.since(t_paused)
        assert cap.delivered == delivered and len(swapped.times) == n_swapped
        # A still card at a low rate (CARD_FPS: 5 a second), every one the same, darker than the
        # picture and not the picture itself.
        assert 3 <= len(cards) <= 8, len(cards)
        assert all(np.array_equal(c, cards[0]) for c in cards)
        y = slice(0, H)  # I420: the luma plane first
        assert cards[0][y].mean() < 0.6 * last_swapped[y].mean()
        assert not np.array_equal(cards[0], last_swapped)
        wait(lambda: d.state.read_status().paused)  # at the next status interval
        status = d.state.read_status()
        assert status.paused and "paused (camera closed)" in status_parts(status)
        # Resume: the input opened again (a new source, going on from the frame it stopped at),
        # swapped frames published, the card gone.
        took = resume(d, swapped)
        assert st.source is not source and st.source is not None and not st.source.closed
        assert st.cap is not cap and not st.paused
        assert st.cap.delivered > delivered  # the counts carry on
        frame_time = float(np.median(swapped.latencies))
        print(f"resume -> first swapped frame {took * 1e3:.1f} ms (a frame's latency: {frame_time * 1e3:.1f} ms)")
        # Within a few frames' time: the input opened, one frame interval, one frame detected afresh.
        assert took < 3.0 / FPS + 6 * frame_time, (took, frame_time)
    finally:
        d.stop()
    assert d.summary.error is None
    # The shutdown closed the reopened input.
    assert st.source.closed


def test_a_pause_asked_for_during_start_up_holds_and_a_stop_while_paused_leaves_nothing_open():
    d, out, swapped = start(live_cfg(input="pattern"), paused=True)
    st = d.streams[0]
    wait(lambda: st.paused and st.cap is not None and st.cap.join(0))
    source = st.source
    assert source is not None and source.closed
    t = time.perf_counter()
    wait(lambda: len(out.since(t)) >= 2)  # cards
    d.stop()
    assert d.summary.error is None
    time.sleep(0.2)
    left = [t.name for t in threading.enumerate() if t.name.startswith(("vcam-open", "vcam-close", "vcam-capture"))]
    assert left == []


@pytest.mark.slow
def test_twenty_pause_resume_cycles_each_resume_swapping_within_a_few_frames():
    """The issue's measure: p99 of 20 pause -> resume cycles, resume to the first swapped frame
    (benchmarks/pause.py prints the same table). Compared with the frame's own latency in the same
    run, not with a fixed time: a busy 2-core machine slows both."""
    d, out, swapped = start(live_cfg())
    took = []
    try:
        for _ in range(20):
            pause(d)
            assert d.streams[0].source.closed
            time.sleep(0.25)
            took.append(resume(d, swapped))
            time.sleep(0.25)
    finally:
        d.stop()
    frame_time = float(np.median(swapped.latencies))
    p50, p99 = np.percentile(took, 50) * 1e3, np.percentile(took, 99) * 1e3
    print(f"resume -> first swapped frame over 20 cycles: p50 {p50:.1f} ms, p99 {p99:.1f} ms (frame {frame_time * 1e3:.1f} ms)")
    assert np.percentile(took, 50) < 3.0 / FPS + 6 * frame_time
    assert np.percentile(took, 99) < 6.0 / FPS + 12 * frame_time


def test_the_status_line_says_paused():
    from vcam.cli.run import format_status
    from vcam.state import Status

    assert "paused (camera closed)" in format_status(Status(paused=True), "alice", True)
    assert "paused" not in format_status(Status(), "alice", True)


def test_a_stream_that_keeps_every_frame_is_not_paused(caplog):
    """A conversion (every frame, in order) would start its file again when reopened: it refuses
    the pause with one warning and processes every frame."""
    out = Recording()
    d = Daemon(live_cfg(pacing="fast"), output=out, control=False)
    d.state.set_paused(True)
    s = d.run(max_frames=12)
    assert s.frames_out == 12 and not d.streams[0].paused
    assert [r.message for r in caplog.records].count(
        "stream s1 keeps every frame of its input (a conversion): it is not paused"
    ) == 1
