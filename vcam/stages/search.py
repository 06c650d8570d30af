"""The search for new faces beside the frame: the tracker's rolling search (the coarse scan, or a
share of the small-face tiles) run by a worker thread on its own detector, on a spare core.

On the CPU the frame's own work (its tracked faces' regions, the swap, the paste-back) leaves the
second core mostly idle, while the rolling search's coarse scan is the largest single cost of a
tracked frame. :class:`SearchWorker` takes that slice off the frame: :meth:`~SearchWorker.submit` hands it
a copy of frame ``seq`` and one slice, :meth:`~SearchWorker.collect` returns the faces found at frame
``seq + max_lag`` (never sooner, so a run does the same whatever the machine's speed while the
worker keeps up), and a face entering the frame is still found within a bounded number of frames
(the tracker shortens its cycle by that lag). A search not done by then is taken at the first
frame after it is (``wait=False``, the daemon's: a machine with no idle core delays new faces, never
the frame) or waited for (``wait=True``: the same frames on any machine, for tests and benchmarks).
Its faces are from an older frame: the tracker keeps those that lie apart from every face it
follows (new faces only) and lets their first region call place them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import weakref
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any

import numpy as np

from vcam.types import Detection

#: How much lower the worker's priority is than the frame's threads (Linux nice levels): on a machine with
#: no idle core it takes what the frame leaves rather than an equal share (it is waited for, at worst).
NICE = 5


class SearchWorker:
    """One worker thread searching frames for new faces with its own ``detector`` (not the
    tracker's: a detector is not thread-safe), one search at a time.

    ``max_lag``: the frames between a search's submission and its :meth:`collect` (default 2: a
    coarse scan on one core takes about a frame's time, so a search is rarely late; the tracker's
    search cycle is that much shorter). ``wait``: a late search holds the frame up (see above).
    The thread is a daemon, started at the first search and stopped by :meth:`close` or at exit,
    after the search in hand (an interpreter torn down under a search inside onnxruntime aborts:
    "terminate called without an active exception")."""

    def __init__(self, detector: Any, *, max_lag: int = 2, wait: bool = False) -> None:
        if max_lag < 1:
            raise ValueError(f"max_lag must be at least 1, got {max_lag}")
        self.detector = detector
        self.max_lag = int(max_lag)
        self.wait = bool(wait)
        self.searches = 0  # submitted since start
        self.late = 0  # frames a search was due and not done (waited for only with ``wait``)
        self._inbox: SimpleQueue = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._job: Future | None = None
        self._seq = 0
        #: The frame copy the worker reads, reused once the search that read it is done (a dropped
        #: search may still be reading its copy: then a new one is made).
        self._copy: tuple[np.ndarray, Future] | None = None

    @property
    def busy(self) -> bool:
        """A search is submitted and not collected yet (a new one would be refused)."""
        return self._job is not None

    def submit(self, frame: Any, seq: int, item: Any) -> bool:
        """Search a copy of frame ``seq`` for ``item``: ``"coarse"`` (the whole frame at the coarse
        scale) or an array (T, 3) of tiles (their small faces). False, doing nothing, while the last
        search is not collected."""
        if self._job is not None:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="vcam-search", daemon=True)
            self._thread.start()
            atexit.register(_close_at_exit, weakref.ref(self))
        job: Future = Future()
        self._inbox.put((self._frame_copy(frame, job), item, job))
        self._job, self._seq = job, int(seq)
        self.searches += 1
        return True

    def _frame_copy(self, frame: Any, job: Future) -> np.ndarray:
        src = np.asarray(frame)
        held = self._copy
        if held is None or held[0].shape != src.shape or held[0].dtype != src.dtype or not held[1].done():
            buf = np.empty_like(src)
        else:
            buf = held[0]
        np.copyto(buf, src)
        self._copy = (buf, job)
        return buf

    def collect(self, seq: int) -> tuple[int, list[Detection]] | None:
        """``(frame seq, faces)`` of the submitted search once it is ``max_lag`` frames old and done
        (with ``wait``: waited for at that age), else None (none submitted, younger, or still
        running). A search that failed raises its error here."""
        job = self._job
        if job is None or int(seq) - self._seq < self.max_lag:
            return None
        if not job.done():
            self.late += 1  # the machine has no core to spare
            if not self.wait:
                return None
        self._job = None
        return self._seq, job.result()

    def drop(self) -> None:
        """Forget the submitted search (a new source: its faces mean nothing); it finishes unread."""
        self._job = None

    def close(self) -> None:
        """Stop the thread after the search in hand (idempotent)."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=5.0)
            self._thread = None
        self._job = None

    def _loop(self) -> None:
        if sys.platform.startswith("linux"):  # below the frame's threads when they want the core (per thread on Linux)
            with contextlib.suppress(OSError):
                tid = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
        while True:
            msg = self._inbox.get()
            if msg is None:
                return
            frame, item, job = msg
            try:
                job.set_result(self._search(frame, item))
            except BaseException as exc:  # handed to the tracker's thread by collect
                job.set_exception(exc)

    def _search(self, frame: np.ndarray, item: Any) -> list[Detection]:
        if isinstance(item, str):
            return list(self.detector.detect_coarse(frame))
        per_tile = self.detector.detect_regions(frame, item)
        return list(self.detector.small_faces(per_tile, *frame.shape[:2]))


def _close_at_exit(ref: weakref.ref) -> None:
    worker = ref()
    if worker is not None:
        worker.close()


__all__ = ["SearchWorker"]
