"""Background Python steps aside while the frame loop runs a round (``vcam.engines.gate.RoundTurns``):
issue 39's compiled rows, where the compiled loader's imports beside the frames cost the camera
frames (the rounds and the loader handing the interpreter back and forth at every call)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from vcam.engines.gate import RoundTurns
from vcam.engines.held import quiet_load


class Busy:
    """A thread running Python inside ``turns.stepping_aside()``, counting its laps."""

    def __init__(self, turns: RoundTurns, *, staying: bool = False) -> None:
        self.turns, self.staying = turns, staying
        self.laps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        while self.laps == 0:  # running, its hook installed
            time.sleep(0.001)

    def _step(self) -> None:
        self.laps += 1

    def _run(self) -> None:
        with self.turns.stepping_aside():
            if self.staying:
                with self.turns.staying():
                    while not self.stop.is_set():
                        self._step()
            else:
                while not self.stop.is_set():
                    self._step()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _laps_during(busy: Busy, turns: RoundTurns, seconds: float, *, parks: bool = True) -> tuple[int, int]:
    """The laps the thread ran until it parked (or a tenth of the round where it does not) and by
    the round's end, ``seconds`` later."""
    parked = turns.parked
    with turns.round():
        end = time.perf_counter() + 5.0  # a busy machine may not run the thread at once
        while parks and turns.parked == parked and time.perf_counter() < end:
            time.sleep(0.002)
        if not parks:
            time.sleep(seconds / 10)
        time.sleep(0.01)  # the count comes just before the wait
        a = busy.laps
        time.sleep(seconds)
        b = busy.laps
    return a, b


def test_a_background_thread_parks_while_a_round_runs_and_goes_on_after_it():
    turns = RoundTurns(longest=5.0)
    busy = Busy(turns)
    try:
        a, b = _laps_during(busy, turns, 0.3)
        assert b == a, f"the thread ran {b - a} laps during the round"
        assert turns.parked == 1
        end = time.perf_counter() + 5.0
        while busy.laps == b and time.perf_counter() < end:
            time.sleep(0.01)
        assert busy.laps > b, "the thread did not go on after the round"
    finally:
        busy.close()


def test_it_parks_at_most_longest_and_once_a_round():
    turns = RoundTurns(longest=0.05)
    busy = Busy(turns)
    try:
        a, b = _laps_during(busy, turns, 0.4)
        assert b > a, "a round longer than `longest` stopped the thread for good"
        assert turns.parked == 1, turns.parked
        assert 0.04 <= turns.parked_s < 0.4, turns.parked_s
        _laps_during(busy, turns, 0.1)
        assert turns.parked == 2  # the next round: once more
    finally:
        busy.close()


def test_rounds_back_to_back_never_starve_it():
    """A CPU run flat out: one round right after the other. The thread parks in one, then shares the
    next (it has not run ``between`` since it went on), so it keeps going."""
    turns = RoundTurns(longest=0.05, between=0.02)
    busy = Busy(turns)
    try:
        start = busy.laps
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            with turns.round():
                time.sleep(0.03)
        assert busy.laps > start, "rounds back to back stopped the thread"
        assert 0 < turns.parked < 33, turns.parked  # 33 rounds: parked in some, never in all
    finally:
        busy.close()


def test_it_never_parks_while_staying_off_or_in_the_rounds_own_thread():
    for turns, staying in ((RoundTurns(longest=5.0), True), (RoundTurns(longest=5.0, on=False), False)):
        busy = Busy(turns, staying=staying)
        try:
            a, b = _laps_during(busy, turns, 0.2, parks=False)
            assert b > a and turns.parked == 0, (staying, turns.on, a, b)
        finally:
            busy.close()
    turns = RoundTurns(longest=5.0)
    with turns.stepping_aside(), turns.round():
        t0 = time.perf_counter()
        for _ in range(100):
            len("x")
        assert time.perf_counter() - t0 < 1.0 and turns.parked == 0


def test_nobody_steps_aside_while_the_frames_are_behind_unless_turned_off():
    """``RoundTurns.fall_behind`` (the degrader's overload, from the frame loop): the frames are over
    their budget anyway, so a background thread runs through the rounds (issue 39: the compiled
    artifact that would end the overload stepped aside in every round); back within the budget it
    parks again; ``behind_on=False`` (``$VCAM_STEP_ASIDE_BEHIND=0``) keeps parking."""
    turns = RoundTurns(longest=5.0)
    busy = Busy(turns)
    try:
        turns.fall_behind(True)
        assert turns.behind
        a, b = _laps_during(busy, turns, 0.2, parks=False)
        assert b > a and turns.parked == 0, (a, b)
        turns.fall_behind(False)
        a, b = _laps_during(busy, turns, 0.2)
        assert b == a and turns.parked == 1, (a, b)
    finally:
        busy.close()
    stubborn = RoundTurns(longest=5.0, behind_on=False)
    busy = Busy(stubborn)
    try:
        stubborn.fall_behind(True)
        assert not stubborn.behind
        a, b = _laps_during(busy, stubborn, 0.2)
        assert b == a and stubborn.parked == 1, (a, b)
    finally:
        busy.close()


def test_the_environment_turns_stepping_aside_while_behind_off(monkeypatch):
    from vcam.engines.gate import BEHIND_ENV

    monkeypatch.setenv(BEHIND_ENV, "0")
    assert RoundTurns.from_env().behind_on is False
    monkeypatch.delenv(BEHIND_ENV)
    assert RoundTurns.from_env().behind_on is True


def test_a_round_waiting_on_the_gpu_lets_the_background_run_only_where_asked():
    """``RoundTurns.waiting`` (the frame's download inside a round): with ``release_waits`` a thread
    parked for the round goes on while the loop waits, and parks again for the rest of the round
    after the wait; off (the default) nothing changes."""
    for release in (True, False):
        turns = RoundTurns(longest=5.0, release_waits=release)
        busy = Busy(turns)
        try:
            parked = turns.parked
            with turns.round():
                end = time.perf_counter() + 5.0
                while turns.parked == parked and time.perf_counter() < end:
                    time.sleep(0.002)
                assert turns.parked == parked + 1 and turns.running
                time.sleep(0.01)
                a = busy.laps
                with turns.waiting():
                    assert turns.running is not release
                    time.sleep(0.2)
                b = busy.laps
                assert turns.running  # the round again after the wait
                if release:
                    assert b > a, "the thread did not run while the round waited"
                    end = time.perf_counter() + 5.0
                    while turns.parked == parked + 1 and time.perf_counter() < end:
                        time.sleep(0.002)
                    assert turns.parked == parked + 2, "the thread did not park again after the wait"
                    time.sleep(0.01)
                    c = busy.laps
                    time.sleep(0.1)
                    assert busy.laps == c, "the thread ran in the rest of the round"
                else:
                    assert b == a, f"the thread ran {b - a} laps while the round waited, not released"
        finally:
            busy.close()
    turns = RoundTurns(release_waits=True)
    with turns.waiting():  # outside a round: nothing to let go
        assert not turns.running
    assert not turns.running


def test_it_keeps_a_profiler_already_there_and_takes_its_hook_away_after():
    turns = RoundTurns()

    def mine(frame, event, arg):
        return None

    assert sys.getprofile() is None
    with turns.stepping_aside():
        assert sys.getprofile() is not None
    assert sys.getprofile() is None
    sys.setprofile(mine)
    try:
        with turns.stepping_aside():
            assert sys.getprofile() is mine
        assert sys.getprofile() is mine
    finally:
        sys.setprofile(None)


def test_a_quiet_load_steps_aside_for_the_process_rounds():
    """What the compiled loader runs in the background (Inductor's imports, an artifact's load)
    parks while the daemon's frame loop runs a round."""
    seen = []
    with quiet_load():
        seen.append(sys.getprofile())
    assert seen[0] is not None and sys.getprofile() is None


@pytest.mark.slow
def test_the_background_gil_benchmark_compares_stepping_aside_in_fresh_processes(tmp_path):
    """`python -m benchmarks.gil_background` on the CPU, plain against stepping aside: rounds of
    small PyTorch calls beside the compiled loader's real imports, each setting in fresh processes,
    and the loader parks in the rounds where it steps aside. Which is faster is the benchmark's to
    say, not this test's: on an idle machine stepping aside cut the rounds' p50 from 4.8 to 0.7 ms
    (CPU, 2026-12-06), but with both cores busy the plain rounds were as short (the threads seldom
    ran side by side); the parking itself is checked in the tests above. ``--wait`` adds the
    frame's download to each round, and ``+waits`` lets the load run meanwhile (RoundTurns.waiting)."""
    from conftest import need_torch

    need_torch()
    from benchmarks import gil_background

    res = gil_background.main(
        ["--intervals", "0.02,0.02+aside,0.02+aside+waits", "--runs", "1", "--wait", "1", "--json", str(tmp_path / "g.json")]
    )
    rows = {r["setting"]: r for r in res["table"]}
    assert set(rows) == {"0.02", "0.02+aside", "0.02+aside+waits"}, rows
    assert all(r["alone_ms"] >= 1.0 for r in rows.values()), rows  # each round waited its 1 ms
    assert all(r["load_s"] and r["alone_ms"] > 0 for r in rows.values()), rows
    assert any(r["parked"] > 0 for r in res["runs"] if r["aside"]), res["runs"]
    assert (tmp_path / "g.json").is_file()
