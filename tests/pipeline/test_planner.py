"""The detection schedule with a predicted frame's detection (vcam/pipeline/planner.py): the next
detection waits for the one before it (the host applies it first), and a restart applies what is
pending before the scene is forgotten. (Keeping them apart, never waiting, was an A/B of issue 39's
four streams of six faces: no gain on the H100, taken out.)"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from vcam.pipeline.planner import DetectionPlanner


class Ops:
    def __init__(self):
        self.log: list = []

    @contextlib.contextmanager
    def back_stream(self):
        self.log.append("back")
        yield

    def front_stream(self):
        return contextlib.nullcontext()


class Step:
    def __init__(self, frame, seq):
        self.frame, self.seq, self.arrived = frame, seq, False

    def ready(self):
        return self.arrived


class Tracker:
    """Records each detection queued, and each applied before it had arrived (a host wait)."""

    def __init__(self):
        self.launched: list[Step] = []
        self.applied: list[int] = []
        self.waited: list[int] = []
        self.resets = 0

    def launch(self, frame, seq, t=None, *, deferred=False):
        step = Step(frame, seq)
        self.launched.append(step)
        return step

    def complete(self, step):
        if not step.arrived:
            self.waited.append(step.seq)
        self.applied.append(step.seq)
        return []

    def confident(self, frame, seq):
        return True

    def predict(self, seq):
        return []

    def reset(self):
        self.resets += 1


def work(seq):
    return SimpleNamespace(stats=SimpleNamespace(seq=seq))


def test_the_next_detection_waits_for_the_one_before():
    ops, tracker = Ops(), Tracker()
    plan = DetectionPlanner(ops, tracker, predict=True, patient=False)
    plan.leave(work(1), "f1")
    plan.launch()
    plan.leave(work(2), "f2")
    plan.launch()  # 1 applied first, though it had not arrived
    assert tracker.waited == [1] and [s.seq for s in tracker.launched] == [1, 2]
    assert ops.log == ["back", "back"]  # each queued on the back stream


def test_a_restart_queues_and_applies_the_kept_detection_then_forgets_the_scene():
    tracker = Tracker()
    plan = DetectionPlanner(Ops(), tracker, predict=True, patient=False)
    plan.leave(work(1), "f1")
    plan.restart()
    assert [s.seq for s in tracker.launched] == [1] and tracker.applied == [1] and tracker.resets == 1
    assert plan.step is None and plan.later is None


def test_a_detection_is_applied_on_the_front_stream_whoever_asks():
    """settle(), a restart and the queueing of the next detection all apply on the front stream,
    where the tracker's looks of the applied tracks are read (see Pipeline._copy_for_detection)."""

    class StreamOps(Ops):
        def __init__(self):
            super().__init__()
            self.stream = "null"

        @contextlib.contextmanager
        def front_stream(self):
            before, self.stream = self.stream, "front"
            try:
                yield
            finally:
                self.stream = before

    ops, tracker = StreamOps(), Tracker()
    at: list[str] = []
    complete = tracker.complete
    tracker.complete = lambda step: (at.append(ops.stream), complete(step))[1]
    plan = DetectionPlanner(ops, tracker, predict=True, patient=False)
    plan.leave(work(1), "f1")
    plan.launch()
    tracker.launched[-1].arrived = True
    assert plan.settle()  # applied by settle
    plan.leave(work(2), "f2")
    plan.launch()
    plan.leave(work(3), "f3")
    plan.launch()  # 2 applied before 3 is queued
    plan.restart()  # 3 applied
    assert tracker.applied == [1, 2, 3] and at == ["front"] * 3
