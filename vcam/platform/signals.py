"""The stop signals: what ends a run cleanly (the camera released, the output finalised, an
interrupted conversion kept as ``NAME.partial.mp4``), and a second one forces the exit.

POSIX: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (a closed terminal or a dropped ssh session ends the run
as Ctrl-C does; under nohup or a service manager it never comes). Windows: SIGINT (Ctrl-C), SIGBREAK
(Ctrl-Break) and SIGTERM (never sent by Windows itself, but ``signal.raise_signal`` can), and the
console's close, logoff and shutdown events: Windows ends the process about 5 s after one of those,
so the console handler asks for the same stop as a Ctrl-Break and waits, at most :data:`GRACE`
seconds, for the process to finish it.

A signal the process was started ignoring (SIGHUP under nohup) stays ignored: :func:`install` never
takes it over."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from vcam.platform import WINDOWS

Handler = Callable[[int, FrameType | None], Any]

if WINDOWS:
    STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, getattr(signal, "SIGBREAK"), signal.SIGTERM)  # noqa: B009
else:
    STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP"))  # noqa: B009

#: Windows: seconds a console close (logoff, shutdown) waits for the clean stop; the system ends the
#: process after about 5 s whatever the handler does.
GRACE = 4.5

#: Windows console control events: CTRL_C_EVENT and CTRL_BREAK_EVENT (0, 1) are the C runtime's,
#: which raises SIGINT and SIGBREAK; these end the session and are this module's.
CLOSE_EVENTS = {2: "close", 5: "logoff", 6: "shutdown"}


def install(handler: Handler) -> Callable[[], None]:
    """``handler`` for every stop signal the process was not started ignoring (main thread only, as
    ``signal.signal``); on Windows the console events too (:class:`ConsoleStop`). Returns a function
    that puts the previous handlers back."""
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    if WINDOWS:
        _watch_console()

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def ignore() -> None:
    """Every stop signal ignored from now on (the stop is under way: a second one must not land in
    an earlier handler). A console close then only waits for the process to end."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The stop signals wait while the block runs and are handled when it ends (``pthread_sigmask``;
    where the OS has none, as Windows, they are handled at once)."""
    if sys.platform == "win32" or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class Wake(threading.Event):
    """An event a stop signal's handler may set. A handler runs in the main thread between two of
    its bytecodes, so it can interrupt that thread inside ``wait()`` or ``clear()`` of the very
    event it sets: ``threading.Event`` guards its flag with a plain lock, and ``set()`` from the
    handler then waits forever for the lock its own thread holds (a run that ignored its stop
    signal, seen once in a busy test run). Here the lock is re-entrant: the handler sets the flag
    and returns. A ``wait()`` interrupted between reading the flag and sleeping sleeps out its
    own timeout at worst (the frame loop's waits are at most half a second)."""

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Condition(threading.RLock())
        self._on = False

    def is_set(self) -> bool:
        return self._on

    def set(self) -> None:
        with self._guard:
            self._on = True
            self._guard.notify_all()

    def clear(self) -> None:
        with self._guard:
            self._on = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._guard:
            if not self._on:
                self._guard.wait(timeout)
            return self._on


class ConsoleStop:
    """What a console close, logoff or shutdown does: the stop a Ctrl-Break asks for (``signum``'s
    Python handler, run by the main thread as for a real signal; nothing when it is ignored), then a
    wait of at most ``grace`` seconds for the process to end by itself; True: handled. Ctrl-C and
    Ctrl-Break are left (False) to the C runtime's own handler, which raises SIGINT and SIGBREAK."""

    def __init__(self, signum: int, grace: float = GRACE) -> None:
        self.signum, self.grace = signum, grace
        self._never = threading.Event()

    def __call__(self, event: int) -> bool:
        if event not in CLOSE_EVENTS:
            return False
        _thread.interrupt_main(signal.Signals(self.signum))
        self._never.wait(self.grace)  # the process ends meanwhile (that ends this thread too)
        return True


#: Windows: the console handler registered (once per process; the OS keeps it for the process's life,
#: so its ctypes callback must live as long).
_console: list[Any] = []


def _watch_console() -> None:
    if _console or sys.platform != "win32":
        return
    import ctypes
    from ctypes import wintypes

    stop = ConsoleStop(getattr(signal, "SIGBREAK"))  # noqa: B009
    routine = ctypes.WINFUNCTYPE(wintypes.BOOL, wintypes.DWORD)(lambda event: bool(stop(event)))
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.SetConsoleCtrlHandler.argtypes = (ctypes.c_void_p, wintypes.BOOL)
    if not kernel32.SetConsoleCtrlHandler(ctypes.cast(routine, ctypes.c_void_p), True):
        raise ctypes.WinError(ctypes.get_last_error())
    _console.append(routine)
