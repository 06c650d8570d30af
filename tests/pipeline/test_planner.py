"""The detection schedule's two ways with a predicted frame's detection (vcam/pipeline/planner.py):
by default the next detection waits for the one before it (the host applies it first); kept
apart (``wait_pending=False``, issue 39's A/B for four streams of six faces), a detection the GPU has
not got to is never waited for: the next one is kept, queued once the one before arrived, or replaced
by a newer frame's."""

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

    def wait(self, event):
        self.log.append(("wait", event))


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


def test_kept_apart_a_pending_detection_is_never_waited_for():
    ops, tracker = Ops(), Tracker()
    plan = DetectionPlanner(ops, tracker, predict=True, patient=False, wait_pending=False)
    plan.leave(work(1), "f1", "copied1")
    plan.launch()
    assert [s.seq for s in tracker.launched] == [1] and ops.log == ["back", ("wait", "copied1")]
    plan.leave(work(2), "f2", "copied2")
    plan.launch()  # 1 has not arrived: 2 is kept, nobody waits
    assert [s.seq for s in tracker.launched] == [1] and tracker.applied == []
    assert plan.frames_in_use() == ("f1", "f2")
    plan.leave(work(3), "f3", "copied3")  # a newer frame's replaces it
    assert plan.skipped == 1 and plan.frames_in_use() == ("f1", "f3")
    assert plan.settle() is False  # 1 still pending
    tracker.launched[0].arrived = True
    assert plan.settle() is False  # 1 applied, 3 queued at once (now pending)
    assert tracker.applied == [1] and [s.seq for s in tracker.launched] == [1, 3]
    assert ops.log[-1] == ("wait", "copied3") and plan.frames_in_use() == ("f3",)
    tracker.launched[1].arrived = True
    assert plan.settle() is True
    assert tracker.applied == [1, 3] and tracker.waited == []


def test_kept_apart_an_arrived_detection_is_applied_and_the_next_queued_at_launch():
    tracker = Tracker()
    plan = DetectionPlanner(Ops(), tracker, predict=True, patient=False, wait_pending=False)
    for seq in range(1, 6):
        plan.leave(work(seq), f"f{seq}")
        plan.launch()
        tracker.launched[-1].arrived = True
    assert [s.seq for s in tracker.launched] == [1, 2, 3, 4, 5] and tracker.applied == [1, 2, 3, 4]
    assert tracker.waited == [] and plan.skipped == 0


def test_by_default_the_next_detection_waits_for_the_one_before():
    ops, tracker = Ops(), Tracker()
    plan = DetectionPlanner(ops, tracker, predict=True, patient=False)
    plan.leave(work(1), "f1")
    plan.launch()
    plan.leave(work(2), "f2")
    plan.launch()  # 1 applied first, though it had not arrived
    assert tracker.waited == [1] and [s.seq for s in tracker.launched] == [1, 2]
    assert ("wait", None) not in ops.log  # no event given: nothing waited on the back stream


def test_a_patient_planner_always_waits_whatever_it_is_asked():
    plan = DetectionPlanner(Ops(), Tracker(), predict=True, patient=True, wait_pending=False)
    assert plan.wait_pending is True


def test_kept_apart_a_restart_drops_the_kept_detection_of_the_old_scene():
    tracker = Tracker()
    plan = DetectionPlanner(Ops(), tracker, predict=True, patient=False, wait_pending=False)
    plan.leave(work(1), "f1")
    plan.launch()
    plan.leave(work(2), "f2")
    plan.launch()
    tracker.launched[0].arrived = True
    plan.restart()
    assert [s.seq for s in tracker.launched] == [1] and tracker.applied == [1] and tracker.resets == 1
    assert plan.frames_in_use() == ()
