"""benchmarks/gpu_window.py's summary of a profiler trace (issue 39/43: is a four-stream round
GPU-bound or host-bound): the GPU's busy share counts overlapping streams once, host events are not
GPU work, and the operations add up per round."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu_window import Window, report, summarize


def ev(name: str, ts: float, dur: float, stream: int, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_busy_share_counts_overlapping_streams_once_and_ignores_host_events():
    events = [
        ev("swap", 0, 600, 7),  # 0..600 us
        ev("detect", 400, 400, 13),  # 400..800: 200 us beside the swap
        ev("memcpy DtoH", 900, 100, 7, cat="gpu_memcpy"),  # 900..1000
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0, "dur": 5000},  # host: not GPU work
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 10},
    ]
    s = summarize(events, rounds=2)
    assert s["ops"] == 3
    assert s["window_ms"] == pytest.approx(1.0)
    assert s["busy_ms"] == pytest.approx(0.9)  # 0..800 and 900..1000
    assert s["busy_share"] == pytest.approx(0.9)
    assert s["busy_ms_per_round"] == pytest.approx(0.45)
    assert list(s["streams"]) == ["7", "13"]  # the busiest first
    assert s["streams"]["7"]["busy_ms"] == pytest.approx(0.7) and s["streams"]["13"]["ops"] == 1
    assert [o["name"] for o in s["top"]] == ["swap", "detect", "memcpy DtoH"]
    assert s["top"][0]["per_round_ms"] == pytest.approx(0.3)
    text = report(s)
    assert "busy 90.0 %" in text and "2 rounds: 0.45 ms busy a round" in text


def test_idle_gaps_are_counted_with_the_op_that_ended_them():
    """The GPU idle on every stream for 0.5 ms or more: each gap once (a stream busy beside another's
    gap is no gap), summed by the op that came after it (what the GPU waited for)."""
    events = [
        ev("swap", 0, 1000, 7),
        ev("detect", 500, 1000, 13),  # 0..1500 busy
        ev("upload", 3500, 100, 9, cat="gpu_memcpy"),  # 2.0 ms idle before it
        ev("swap", 3700, 100, 7),  # 0.1 ms: no gap
        ev("upload", 4800, 100, 9, cat="gpu_memcpy"),  # 1.0 ms idle before it
    ]
    s = summarize(events, rounds=2)
    g = s["gaps"]
    assert g["count"] == 2 and g["total_ms"] == pytest.approx(3.0) and g["longest_ms"] == pytest.approx(2.0)
    assert g["ended_by"] == [{"name": "upload", "count": 2, "total_ms": pytest.approx(3.0)}]
    assert s["busy_ms"] == pytest.approx(1.8)
    assert "idle gaps >= 0.5 ms: 2, 3.0 ms in all (1.50 ms a round), longest 2.00 ms" in report(s)


def test_no_gpu_work_is_said_not_divided_by_zero():
    s = summarize([{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}])
    assert s["ops"] == 0 and report(s).startswith("GPU window: no GPU operation recorded")


def test_the_window_starts_and_stops_on_the_ticks_and_reads_back_its_trace(tmp_path, monkeypatch):
    """The loop's ticks start the profiler once its time came and stop it once the window is over
    (here a stand-in for torch's profiler writes the trace); the result is that trace summarised with
    the rounds counted between the window's two ends. A failure is said by result(), the run goes on."""
    import sys
    import time
    import types

    calls: list[str] = []

    class FakeProfile:
        def __init__(self, activities):
            self.activities = activities

        def start(self):
            calls.append("start")

        def stop(self):
            calls.append("stop")

        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": [ev("swap", 0, 500, 7), ev("swap", 1000, 500, 7)]}, f)

    fake = types.ModuleType("torch.profiler")
    fake.profile = FakeProfile
    fake.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
    monkeypatch.setitem(sys.modules, "torch.profiler", fake)
    counts = iter([3, 5])
    w = Window(0.05, 0.05, tmp_path / "t.json", rounds=lambda: next(counts))
    w.tick()
    assert calls == []  # not yet
    with pytest.raises(TimeoutError):
        w.result()
    time.sleep(0.06)
    w.tick()
    assert calls == ["start"]
    time.sleep(0.06)
    w.tick()
    w.tick()  # once over, ticks do nothing
    assert calls == ["start", "stop"]
    s = w.result()
    assert s["rounds"] == 2 and s["busy_share"] == pytest.approx(2 / 3) and s["top"][0]["count"] == 2

    class Refused(FakeProfile):
        def start(self):
            raise RuntimeError("External init callback must run in same thread as registerClient")

    fake.profile = Refused
    w = Window(0.0, 1.0, tmp_path / "u.json")
    w.tick()
    with pytest.raises(RuntimeError, match="the GPU window failed: External init"):
        w.result()
