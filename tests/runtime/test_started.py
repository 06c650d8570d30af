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
