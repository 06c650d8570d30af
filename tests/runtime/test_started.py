"""Start-up as one object (vcam.runtime.startup.Started): what it opened is closed in reverse by one
exit stack, the capture threads first and the locks last; start-up writes no daemon attribute."""

from __future__ import annotations

import pytest
from test_daemon import Capturing, demo_cfg

from vcam.errors import OutputError
from vcam.runtime.daemon import Daemon
from vcam.runtime.opened import Opened


class Part:
    def __init__(self, name, log, fail=None):
        self.name, self.log, self.fail = name, log, fail

    def close(self):
        self.log.append(self.name)
        if self.fail is not None:
            raise self.fail


def test_opened_closes_in_reverse_whatever_one_does_and_keeps_the_errors():
    log: list[str] = []
    opened = Opened()
    current = {"cap": Part("old capture", log)}
    opened.add(Part("source", log))
    opened.add(Part("output", log, fail=OutputError("the file could not be finished", hint="h")))
    opened.add_current(lambda: current["cap"])
    opened.add(Part("buggy", log, fail=RuntimeError("bug")))
    opened.add(Part("panel", log))
    current["cap"] = Part("new capture", log)  # replaced meanwhile (a resume): the new one is closed
    errors = opened.close()
    assert log == ["panel", "buggy", "new capture", "output", "source"]
    assert [e.message for e in errors] == ["the file could not be finished"]
    assert opened.close() == [] and len(log) == 5  # closed once


@pytest.mark.slow
def test_start_up_builds_one_object_and_sets_no_daemon_attribute():
    d = Daemon(demo_cfg(), output=Capturing(640, 360), control=False)
    before = {k: v for k, v in vars(d).items() if k != "up"}
    empty = d.up
    d.run(max_frames=3)
    after = {k: v for k, v in vars(d).items() if k != "up"}
    assert set(after) == set(before)
    changed = {k for k in before if after[k] is not before[k] and k not in ("_max_frames", "should_exit")}
    assert not changed, changed
    up = d.up
    assert up is not empty and up.loaded is not None and d.assembly is up.loaded.assembly
    assert not any(st.cap._thread.is_alive() for st in d.streams) and up.locks is None  # all closed


@pytest.mark.slow
def test_waiting_for_the_compiled_engines_before_the_first_frame_lets_the_background_work_go():
    """Start-up holds the engines' background work (graph captures, the compiled load) until the
    first frame is out; a benchmark that waits for it before running any frame must release it
    first, or it waits on work that waits on a frame that never comes (issue 43: the CUDA
    benchmarks.streams deadlock)."""
    from vcam.engines.gate import BACKGROUND

    d = Daemon(demo_cfg(), output=Capturing(640, 360), control=False, early_swap=False)
    d.startup()
    try:
        assert not BACKGROUND.is_open  # held for the first frame
        assert d.wait_compiled(60)
        assert BACKGROUND.is_open
    finally:
        d.shutdown()


def test_short_switches_shorten_the_interval_until_closed_never_lengthen_it_and_two_at_once_end_as_before():
    import sys

    from vcam.runtime.startup import LOADING_SWITCH_S, ShortSwitches

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        short = ShortSwitches()
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_S, rel=0.05)
        short.close()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        short.close()  # once
        assert sys.getswitchinterval() == pytest.approx(0.005)
        a = ShortSwitches()  # two daemons of one process loading at once, ending in any order
        b = ShortSwitches()
        a.close()
        assert sys.getswitchinterval() == pytest.approx(0.005)  # a's old one (b's load keeps going without)
        b.close()
        assert sys.getswitchinterval() == pytest.approx(0.005), "b put a's short interval back for good"
        a, b = ShortSwitches(), ShortSwitches()
        b.close()
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_S, rel=0.05)  # a still loading
        a.close()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(0.00001)  # already shorter: left as it is, and as it was after
        short = ShortSwitches()
        assert sys.getswitchinterval() == pytest.approx(0.00001, rel=0.05)
        short.close()
        assert sys.getswitchinterval() == pytest.approx(0.00001, rel=0.05)
    finally:
        sys.setswitchinterval(before)


def test_the_held_collector_is_off_until_closed_then_freezes_the_load_and_counts_with_a_capture():
    """HeldCollector (the start-up's load beside the early frames): the collector off until it is
    closed, once; then what the load left alive is frozen; a capture's hold (NO_COLLECTION) under way
    keeps it off until that one ends too; a collector the user turned off stays off."""
    import gc

    from vcam.engines.held import NO_COLLECTION
    from vcam.runtime.startup import HeldCollector

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        held = HeldCollector()
        kept = [{} for _ in range(500)]
        assert not gc.isenabled()
        held.close()
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
        held.close()  # once
        assert gc.isenabled()
        held = HeldCollector()
        with NO_COLLECTION.held():  # a background capture that began while the load ran
            held.close()
            assert not gc.isenabled(), "the collector ran again inside a capture"
        assert gc.isenabled()
        gc.disable()
        held = HeldCollector()
        held.close()
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("early_swap", [False, True], ids=["pixelated", "early swap"])
def test_the_early_frames_get_short_thread_switches_while_the_models_load_and_the_default_after(early_swap):
    """While the models load in a thread beside the early frames (pixelated, or swapped on the CPU
    until the switch), the interpreter hands the GIL over every 0.5 ms, not every 5 ms: a load
    running Python held four early streams to a quarter of their frames (startup.LOADING_SWITCH_S);
    once the models in use are the run's own, the interval is what it was. Python's collector is off
    meanwhile too, and on again after, with what the load left alive frozen (startup.HeldCollector)."""
    import gc
    import sys
    import threading

    from vcam.runtime.startup import LOADING_SWITCH_S

    before = sys.getswitchinterval()
    seen: list[float] = []
    collecting: list[bool] = []
    stop = threading.Event()
    frozen = gc.get_freeze_count()

    def watch():
        while not stop.wait(0.02):
            seen.append(sys.getswitchinterval())
            collecting.append(gc.isenabled())

    d = Daemon(demo_cfg(pacing="realtime"), output=Capturing(640, 360), control=False, early_swap=early_swap, load_delay=1.0)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        s = d.run(duration=3.0)
    finally:
        stop.set()
        watcher.join()
        after = gc.get_freeze_count()
        gc.unfreeze()  # the test process's collector as it was
    assert s.early_frames > 0 and s.frames_out > 0, s.line()
    if early_swap:
        assert s.cpu_frames > 0 and s.switched_s is not None, s.line()
    short = [k for k, v in enumerate(seen) if v == pytest.approx(LOADING_SWITCH_S, rel=0.05)]
    assert short, "never short while loading"
    assert seen[short[-1] + 1 :] and all(v == pytest.approx(before) for v in seen[short[-1] + 1 :]), (
        "not put back at the end of the load"
    )
    assert sys.getswitchinterval() == before
    assert not all(collecting[: short[-1]]), "the collector ran throughout the load"
    assert gc.isenabled() and after > frozen, "the load's objects not frozen, or the collector left off"


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True])
def test_the_load_rehearses_the_first_frame_on_a_copy_of_the_newest_camera_frame_before_the_takeover(monkeypatch, caplog, fail):
    """A GPU load runs each stream's pipeline once on a copy of the newest frame the early frames
    gathered, in the load's thread, before the pipelines are put in use (startup.rehearse): the
    first round's first uses are paid while the early frames go on. A rehearsal that fails says so in
    one line and the run goes on. (Rehearsed here on the CPU, which the product leaves out.)"""
    import logging
    import threading

    import numpy as np

    from vcam.pipeline.pipeline import Pipeline
    from vcam.runtime import startup

    monkeypatch.setattr(startup, "REHEARSED_ON", frozenset({"cpu", "cuda"}))
    calls: list[tuple[str, int, bool, bool]] = []
    real = Pipeline.process

    def process(self, frame, snap):
        d = daemon
        st = d.streams[0]
        calls.append(
            (
                threading.current_thread().name,
                frame.seq,
                st.newest is not None and frame.data is not st.newest.data,
                st.pipeline is self,
            )
        )
        if fail:
            raise RuntimeError("no such kernel")
        return real(self, frame, snap)

    monkeypatch.setattr(Pipeline, "process", process)
    caplog.set_level(logging.INFO, logger="vcam.runtime.startup")
    daemon = Daemon(demo_cfg(pacing="realtime"), output=Capturing(640, 360), control=False, early_swap=False, load_delay=0.5)
    s = daemon.run(max_frames=5)
    assert s.early_frames > 0 and s.frames_out == 5, s.line()
    assert len(calls) == 1, calls
    thread, seq, copied, in_use = calls[0]
    assert thread == "vcam-load" and seq >= 0 and copied and not in_use, calls  # a copy, before the pipeline was in use
    lines = [r.getMessage() for r in caplog.records if "rehears" in r.getMessage()]
    if fail:
        assert len(lines) == 1 and "failed (RuntimeError: no such kernel)" in lines[0], lines
    else:
        assert len(lines) == 1 and lines[0].startswith("start-up: first frame rehearsed on 1 stream(s)"), lines
    assert isinstance(daemon.streams[0].newest.data, np.ndarray)
