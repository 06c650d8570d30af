"""The gate that holds the engines' background graph captures back while a start-up captures what
its first frame needs, then paces them beside the frames (no PyTorch here: the daemon holds it
whatever the backend)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Overrides the pacing (measurements): ``SETTLE,REST``, e.g. ``0,0`` captures as before (at once,
#: back to back).
PACE_ENV = "VCAM_BACKGROUND_PACE"


class BackgroundGate:
    """Holds the background captures (:class:`vcam.engines.threads.CaptureQueue`) back while a
    start-up captures what the first frame needs: held (:meth:`held`, counted, so loads may nest), a
    queue waits before its next size, at most ``patience`` seconds, so it never waits forever and
    nobody deadlocks on it.

    Once open the captures are paced (:meth:`turn`): one unit of background work at a time in the
    process, the first ``settle`` seconds after the gate opened, each next one ``rest`` times as
    long after the last one ended as that one took. On the H200 (eefa218) the three engines'
    captures of batches 2-8 (7 s of work) ran back to back from the GPU's first frame and the
    camera lost 3-12 frames a second for 3 s, p99 250-390 ms a second; paced, the frames get the
    interpreter and the GPU between two captures (the captures take twice as long: a size that a
    frame needs before is captured by that frame, as before).

    A unit the frames wait for goes first (``turn(urgent=...)``: a size a call runs without its
    graph): the others wait while one is urgent. Issue 39 (H100, 1080p clip, one stream,
    2026-12-06): the frames ran the swapper's batch 1 eagerly, and an eager call waits out a capture
    (:data:`vcam.engines.threads.CAPTURE_LOCK`); the first turn went to the detector's batch 2 (129
    ms), and the camera's longest pause of the run, 180 ms, was that wait. An urgent unit is not
    paced either (neither the settle nor the rest): four streams ran the swapper's batch 4 eagerly
    for the whole 2 s settle after the takeover, a round of 65-85 ms where the graph replays in a
    few (H100, 1080p, compiled cache, 2026-12-06: the capture of batch 4 began 2.0 s after the
    first GPU frame), and the camera published 72-79 % of its frames over the first 10 s."""

    #: How often a waiting unit looks again whether its turn came (an urgent one may have arrived).
    POLL_S = 0.02

    def __init__(self, patience: float = 20.0, settle: float = 2.0, rest: float = 1.0) -> None:
        self.patience = patience
        self.settle, self.rest = settle, rest
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._busy = False  # a unit runs (under _lock)
        self._waiting: list[Callable[[], bool]] = []  # each waiting unit's urgency (under _lock)
        self._holders = 0
        self._not_before = 0.0  # perf_counter: when the next unit of background work may begin

    @classmethod
    def from_env(cls) -> BackgroundGate:
        """The gate with ``$VCAM_BACKGROUND_PACE`` (``SETTLE,REST``) where it is set and valid."""
        try:
            settle, rest = (float(x) for x in os.environ.get(PACE_ENV, "").split(","))
        except ValueError:
            return cls()
        return cls(settle=max(0.0, settle), rest=max(0.0, rest))

    def hold(self) -> Callable[[], None]:
        """Hold the gate; returns the release (idempotent: call it as often as is convenient)."""
        with self._lock:
            self._holders += 1
            self._open.clear()
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._holders -= 1
                if self._holders == 0:
                    self._not_before = max(self._not_before, time.perf_counter() + self.settle)
                    self._open.set()

        return release

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        release = self.hold()
        try:
            yield
        finally:
            release()

    @property
    def is_open(self) -> bool:
        """Nobody holds it: the background work goes on."""
        return self._open.is_set()

    def wait(self) -> None:
        self._open.wait(self.patience)

    @contextlib.contextmanager
    def turn(self, stop: threading.Event | None = None, urgent: Callable[[], bool] | None = None) -> Iterator[None]:
        """One unit of paced background work (a graph capture): the gate open (or ``patience``
        over), no other unit running, no other waiting unit ``urgent()`` unless this one is too, and
        the pause after the last one over unless this one is urgent (see the class); the pause ends
        early when ``stop`` is set (a queue closing: the caller checks it inside). Urgency is asked
        again while waiting."""
        self.wait()
        stop = stop or threading.Event()

        def mine() -> bool:
            return urgent is not None and urgent()

        began = time.perf_counter()
        with self._lock:
            self._waiting.append(mine)
        try:
            while True:
                with self._lock:
                    now = time.perf_counter()
                    first = mine() or not any(w() for w in self._waiting if w is not mine)
                    if not self._busy and (first or stop.is_set()):
                        # an urgent unit is not paced: the frames run its size eagerly meanwhile
                        due = now if mine() else min(self._not_before, began + self.patience)
                        if now >= due or stop.is_set():
                            self._busy = True
                            break
                        wait = due - now
                    else:
                        wait = self.POLL_S
                stop.wait(min(wait, self.POLL_S))
        finally:
            with self._lock:
                self._waiting.remove(mine)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._lock:
                self._busy = False
                self._not_before = max(self._not_before, end + self.rest * (end - t0))


#: The process's gate (see :class:`BackgroundGate`); the daemon's load holds it.
BACKGROUND = BackgroundGate.from_env()

#: Turns stepping aside off (measurements): ``VCAM_STEP_ASIDE=0``.
STEP_ASIDE_ENV = "VCAM_STEP_ASIDE"
#: ``1``: a round waiting on the GPU (:meth:`RoundTurns.waiting`) lets background Python run meanwhile
#: (an experiment, off by default: not yet measured on a GPU).
WAITS_ENV = "VCAM_TURNS_RELEASE_WAITS"
#: ``0``: background Python steps aside even while the frames are over their budget anyway
#: (:meth:`RoundTurns.fall_behind`; measurements).
BEHIND_ENV = "VCAM_STEP_ASIDE_BEHIND"


class RoundTurns:
    """Background Python steps aside while the frame loop runs a round.

    The frame loop marks each round (:meth:`round`: from its frames gathered to their collection);
    a background thread that runs much Python (Inductor's imports, a compiled artifact's load) runs
    it inside :meth:`stepping_aside`, which installs a profile hook in that thread only: at its next
    Python call or return while a round runs, the thread parks until the round ends, so the round
    has the interpreter to itself. A thread parks at most once a round and at most ``longest``
    seconds, so a round that waits for something the parked thread holds (an import's lock) waits
    that long at worst, and a round that never ends stops nothing; and only after it ran
    ``between`` seconds since it last went on, so rounds back to back (a CPU run flat out) share
    every other one with it, as without turns, and it never starves. It never parks inside
    :meth:`staying` (a graph capture holding the lock an eager call of the frames waits for), nor
    in the thread that runs the rounds. What runs in C (a large copy, a convolution) is not
    interrupted: the hook sees Python's calls only.

    Why (issue 39, H100, 2026-12-06): beside the compiled loader's imports a round of 250 small
    CUDA calls took 24 ms (p50; 1.7 ms alone) at a 0.02 ms switch interval: the frame thread and
    the loader handed the interpreter back and forth at every call. With a compiled cache the
    camera published 81-91 % of its frames over the first 10 s (p99 63-127 ms). The same model on
    the CPU (``benchmarks.gil_background``, 2 runs): round p50 4.8 ms, longest 103 ms, against 0.7
    and 2 ms stepping aside (alone 0.5 ms); the load took 2.1 s against 2.8 s (the hook's calls).

    Nobody steps aside while the frame loop says it has fallen behind (:meth:`fall_behind`: most
    frames over their budget for a while, the degrader's overload): those frames are late or
    dropped whatever the background does, and the background work may be what ends the overload.
    Issue 39 (H200, four streams of the six-face clip, compiled cache, 2026-12-07): the swap took
    most of every round, the camera published 60 % of its frames, and the compiled artifact that
    would have carried the load (55-57 % of the GPU's time against 87-96 % uncompiled) stepped
    aside in every round: the load, started at 4.3 s, was still deserialising at 26 s, after the
    20-s run had ended (about 2 s alone). Measured since (H100, the same load, 9caede7 against
    00caa99, one run each): Inductor's import beside the frames took 10.8 against 12.0 s, and the
    share of frames published did not move (49 %): the rule is kept as harmless and right, not as
    the fix."""

    def __init__(
        self,
        longest: float = 0.04,
        on: bool = True,
        between: float = 0.005,
        release_waits: bool = False,
        behind_on: bool = True,
    ) -> None:
        self.longest = longest
        self.between = between
        self.on = on
        self.release_waits = release_waits
        self.behind_on = behind_on
        self._behind = False  # read by the hook at every call: a plain attribute
        self._clear = threading.Event()
        self._clear.set()
        self._local = threading.local()
        self._round = _Round(self)
        self._waiting = _Waiting(self)
        self._rounds = 0
        self._owner = -1  # the thread that runs the rounds: never parked
        self._busy = False  # read by the hook at every call: a plain attribute, not the event
        self.parked = 0  # times a background thread parked (counted as it parks: tests, measurements)
        self.parked_s = 0.0

    @classmethod
    def from_env(cls) -> RoundTurns:
        """On unless ``$VCAM_STEP_ASIDE`` is ``0``; waits released where ``$VCAM_TURNS_RELEASE_WAITS``
        is ``1``; stepping aside while behind where ``$VCAM_STEP_ASIDE_BEHIND`` is ``0``."""
        env = os.environ.get
        return cls(on=env(STEP_ASIDE_ENV, "1") != "0", release_waits=env(WAITS_ENV) == "1", behind_on=env(BEHIND_ENV, "1") != "0")

    @property
    def running(self) -> bool:
        """A round runs now."""
        return self._busy

    @property
    def behind(self) -> bool:
        """The frame loop has fallen behind: nobody steps aside for its rounds (see the class)."""
        return self._behind

    def fall_behind(self, behind: bool) -> None:
        """The frame loop says whether its frames are over their budget anyway (sustained overload);
        while they are, background Python does not step aside (see the class). Called by the frame
        loop as often as it likes (a plain write)."""
        self._behind = behind and self.behind_on

    def begin(self) -> None:
        """A round begins (the frame loop's thread; one frame loop at a time marks its rounds: a
        second daemon of the process ending its round meanwhile only lets the background run)."""
        self._rounds += 1
        self._owner = threading.get_ident()
        self._busy = True
        self._clear.clear()

    def end(self) -> None:
        self._busy = False
        self._clear.set()

    def round(self) -> _Round:
        """One round of the frame loop, as a context: background Python steps aside meanwhile. Once
        a frame: one object made at the start, no generator, no lock."""
        return self._round

    def waiting(self) -> _Waiting:
        """The frame loop's thread waits for the GPU inside a round (a frame's download), as a
        context. With ``release_waits`` the round counts as not running meanwhile: a background
        thread does not park for it (nor is a parked one held), as the waiting thread needs no
        interpreter; after the wait the rest of the round is a round of its own, which a thread
        parks for again (at most ``longest``). Issue 39 (H100, four streams of six faces, 2026-12-07): the loop waited about
        60 ms of each 73 ms round on the GPU, and the compiled artifact's load, parked in every
        round, ended 10 s after the takeover (about 2 s alone). Off: nothing changes (no
        allocation either way: one object made at the start)."""
        return self._waiting

    @contextlib.contextmanager
    def staying(self) -> Iterator[None]:
        """The calling thread does not step aside meanwhile (it holds what a round may wait for)."""
        local = self._local
        local.staying = getattr(local, "staying", 0) + 1
        try:
            yield
        finally:
            local.staying -= 1

    def _park(self, seen: list[float]) -> None:
        seen[0] = self._rounds
        if getattr(self._local, "staying", 0) or threading.get_ident() == self._owner:
            return
        t0 = time.perf_counter()
        if t0 - seen[1] < self.between:  # rounds back to back: this one is shared, as without turns
            return
        self.parked += 1
        self._clear.wait(self.longest)
        seen[1] = time.perf_counter()
        self.parked_s += seen[1] - t0

    def _hook(self) -> Callable[[Any, str, Any], None]:
        seen = [-1.0, -1.0]  # the round this thread last stepped aside for, and when it went on after

        def step_aside(frame: Any, event: str, arg: Any) -> None:
            if self._busy and seen[0] != self._rounds and not self._behind:
                self._park(seen)

        return step_aside

    @contextlib.contextmanager
    def stepping_aside(self) -> Iterator[None]:
        """The calling thread's Python steps aside for the rounds while it runs (see the class).
        Nothing changes where the thread is profiled already (a profiler's hook is kept) or the
        turns are off."""
        if not self.on or sys.getprofile() is not None:
            yield
            return
        sys.setprofile(self._hook())
        try:
            yield
        finally:
            sys.setprofile(None)


class _Round:
    """:meth:`RoundTurns.round`'s context (begin at the entry, end at the exit)."""

    __slots__ = ("_turns",)

    def __init__(self, turns: RoundTurns) -> None:
        self._turns = turns

    def __enter__(self) -> None:
        self._turns.begin()

    def __exit__(self, *exc: object) -> None:
        self._turns.end()


class _Waiting:
    """:meth:`RoundTurns.waiting`'s context: with ``release_waits``, a round in progress is let go
    at the entry and taken back at the exit."""

    __slots__ = ("_turns", "_released")

    def __init__(self, turns: RoundTurns) -> None:
        self._turns = turns
        self._released = False

    def __enter__(self) -> None:
        turns = self._turns
        self._released = turns.release_waits and turns._busy
        if self._released:
            turns.end()

    def __exit__(self, *exc: object) -> None:
        if self._released:
            self._released = False
            self._turns.begin()  # the rest of the round is a round of its own: a thread parks for it again


#: The process's turns (see :class:`RoundTurns`); the daemon's frame loop marks its rounds.
ROUND_TURNS = RoundTurns.from_env()


__all__ = [
    "BACKGROUND",
    "BEHIND_ENV",
    "PACE_ENV",
    "ROUND_TURNS",
    "STEP_ASIDE_ENV",
    "WAITS_ENV",
    "BackgroundGate",
    "RoundTurns",
]
