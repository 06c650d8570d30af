"""The longest a thread asking for the GIL every 2 ms waited while a block of code ran: what the
camera's frames would have waited for the interpreter meanwhile.

    with LongestWait() as w:
        work()
    w.seconds
"""

from __future__ import annotations

import threading
import time
from types import TracebackType


class LongestWait:
    """A thread that sleeps 2 ms at a time and keeps the longest gap between two wake-ups while the
    ``with`` block runs (``seconds``; :meth:`reset` starts over)."""

    def __init__(self, step: float = 0.002) -> None:
        self.step = step
        self.seconds = 0.0
        self._stop = threading.Event()
        self._ticking = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="gil-wait", daemon=True)

    def _tick(self) -> None:
        last = time.perf_counter()
        self._ticking.set()
        while not self._stop.is_set():
            time.sleep(self.step)
            now = time.perf_counter()
            self.seconds, last = max(self.seconds, now - last), now

    def reset(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> LongestWait:
        self._thread.start()
        self._ticking.wait()
        time.sleep(10 * self.step)  # ticking before the block begins
        self.reset()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        time.sleep(10 * self.step)  # a wait that ends just after the block still counts
        self._stop.set()
        self._thread.join()
