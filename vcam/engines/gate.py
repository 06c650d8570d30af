"""The gate that holds the engines' background graph captures back while a start-up captures what
its first frame needs, then paces them beside the frames (no PyTorch here: the daemon holds it
whatever the backend)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

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
    frame needs before is captured by that frame, as before)."""

    def __init__(self, patience: float = 20.0, settle: float = 2.0, rest: float = 1.0) -> None:
        self.patience = patience
        self.settle, self.rest = settle, rest
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._turn = threading.Lock()
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
    def turn(self, stop: threading.Event | None = None) -> Iterator[None]:
        """One unit of paced background work (a graph capture): the gate open (or ``patience``
        over), no other unit running, and the pause after the last one over (see the class); the
        pause ends early when ``stop`` is set (a queue closing: the caller checks it inside)."""
        self.wait()
        with self._turn:
            delay = min(self._not_before - time.perf_counter(), self.patience)
            if delay > 0:
                (stop or threading.Event()).wait(delay)
            t0 = time.perf_counter()
            try:
                yield
            finally:
                end = time.perf_counter()
                with self._lock:
                    self._not_before = max(self._not_before, end + self.rest * (end - t0))


#: The process's gate (see :class:`BackgroundGate`); the daemon's load holds it.
BACKGROUND = BackgroundGate.from_env()


__all__ = ["BACKGROUND", "PACE_ENV", "BackgroundGate"]
