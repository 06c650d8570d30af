"""Settings of the whole interpreter held while some work runs beside the frames, put back after
the last holder (no PyTorch here: the start-up holds them before its imports).

- :data:`QUICK_SWITCHES`: the thread switch interval, shortened while a background load runs.
- :data:`NO_COLLECTION`: Python's cyclic garbage collector off while a CUDA graph capture or a load
  runs.
- :func:`collector_off`: the collector off while a load runs, and what it left alive frozen at its
  end (:func:`gc.freeze`), so no later full collection scans it again.
- :func:`quiet_load`: both settings, for a load of much Python beside the frames.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

from vcam.engines.gate import ROUND_TURNS


class _HeldSetting:
    """A setting of the whole process, changed while any holder holds it and put back after the
    last one (:meth:`held`; counted, because holders overlap): one instance per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0

    def _change(self) -> None:
        raise NotImplementedError

    def _restore(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._change()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._restore()


class QuickSwitches(_HeldSetting):
    """The interpreter's switch interval, shortened while any background load runs (Inductor's
    imports, an artifact's load: seconds of Python). A thread that gave up the interpreter's lock for
    a CUDA call (the frame loop, the warm-ups) may wait a whole interval before it gets it back from
    a thread busy in Python, and a GPU round makes hundreds of such calls: 0.02 ms here rather than
    the default 5 ms. Issue 39 (H100, 2026-12-06): with a compiled cache, one stream paused 133-184 ms
    eight times while Inductor loaded, at 0.5 ms. A CPU model (``benchmarks.gil_background``: rounds
    of 250 small PyTorch calls beside the loader's real imports, 4 runs) measured round p50 / p90
    16.9 / 40.0 ms at 0.5 ms, 10.3 / 17.5 ms at 0.1 ms, 5.9 / 9.7 ms at 0.02 ms, the load 1.89-2.00 s
    at each."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._was = (0.0, 0.0)

    def _change(self) -> None:
        self._was = shorten_switches(self.seconds)

    def _restore(self) -> None:
        restore_switches(*self._was)


def shorten_switches(seconds: float) -> tuple[float, float]:
    """The interpreter's switch interval set to ``seconds`` unless it is shorter already; returns
    ``(the interval before, the interval as set)`` for :func:`restore_switches`. The interval is
    read back: the interpreter keeps whole microseconds (0.00002 reads 1.9999999999999998e-05)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, seconds))
    return before, sys.getswitchinterval()


def restore_switches(before: float, set_to: float) -> None:
    """The interval ``before`` back, unless somebody changed it since it was set to ``set_to``."""
    if abs(sys.getswitchinterval() - set_to) < 1e-7:
        sys.setswitchinterval(before)


QUICK_SWITCHES = QuickSwitches(0.00002)


class NoCollection(_HeldSetting):
    """Python's cyclic garbage collector off while any holder runs: a CUDA graph capture, a load
    (:func:`quiet_load`, the start-up's). A collection inside a capture may free an engine nobody
    holds any more and, with it, its graphs: destroying a graph is illegal while the thread
    captures ("operation not permitted when stream is capturing (function reset)"), and the capture
    is void ("operation failed due to a previous error during capture": a GPU test creating an
    engine failed so on the H100, 2026-12-06). A collector the user turned off stays off; the
    holders are counted, so a capture inside a load keeps it off until both ended."""

    def __init__(self) -> None:
        super().__init__()
        self._was_on = False

    def _change(self) -> None:
        self._was_on = gc.isenabled()
        gc.disable()

    def _restore(self) -> None:
        if self._was_on:
            gc.enable()


#: See :class:`NoCollection`.
NO_COLLECTION = NoCollection()


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The collector off while it runs (:data:`NO_COLLECTION`), and at the end every object alive
    moved out of the collector's reach (:func:`gc.freeze`): what a load built is never scanned again.
    Issue 39 (H100, 2026-12-06, ``benchmarks.first_seconds --stalls``): the collector's full passes
    over what ``import torch`` and Inductor's imports leave alive (a million objects) held the GIL
    25-220 ms each, in the loading thread, and every stream stood still meanwhile. The price: cycles
    that were garbage at the freeze are never collected either; after the inswapper's native build
    from its ONNX graph (the heaviest load) they were 7,000 objects holding no resident memory (a
    full collection then gave none back), against 171 ms of GIL for that collection."""
    with NO_COLLECTION.held():
        try:
            yield
        finally:
            gc.freeze()


@contextlib.contextmanager
def quiet_load() -> Iterator[None]:
    """A load of much Python beside the frames (Inductor's imports, a compiled artifact's load): the
    switch interval short (:data:`QUICK_SWITCHES`), the collector off, what it left frozen at its
    end (:func:`collector_off`), and its Python parked while the frame loop runs a round
    (:data:`~vcam.engines.gate.ROUND_TURNS`)."""
    with QUICK_SWITCHES.held(), collector_off(), ROUND_TURNS.stepping_aside():
        yield


__all__ = [
    "NO_COLLECTION",
    "QUICK_SWITCHES",
    "NoCollection",
    "QuickSwitches",
    "collector_off",
    "quiet_load",
    "restore_switches",
    "shorten_switches",
]
