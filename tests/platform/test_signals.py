"""Stop signals: installed where not ignored (nohup), held during imports, ignored once the stop is
under way; and the Windows console's close event asking for the same stop (run here through a
signal this OS has)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from vcam.platform import signals

#: The console handler's signal in these tests: SIGBREAK on Windows, a harmless one elsewhere.
STAND_IN = getattr(signal, "SIGUSR1", None) or getattr(signal, "SIGBREAK")  # noqa: B009


@pytest.fixture
def saved_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (*signals.STOP_SIGNALS, STAND_IN)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.skipif(os.name == "nt", reason="SIGHUP: not on Windows (its own signals are tested below)")
def test_posix_stop_signals_are_int_term_and_hup():
    assert signals.STOP_SIGNALS == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def test_install_takes_every_stop_signal_not_ignored_and_restore_gives_them_back(saved_handlers):
    def handler(sig, frame):
        pass

    first, *others = signals.STOP_SIGNALS
    signal.signal(first, signal.SIG_IGN)  # as nohup leaves SIGHUP
    for sig in others:  # whatever this process started with (under nohup: SIGHUP ignored)
        signal.signal(sig, signal.SIG_DFL)
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    restore = signals.install(handler)
    assert signal.getsignal(first) is signal.SIG_IGN, "a signal started ignored must stay ignored"
    assert all(signal.getsignal(sig) is handler for sig in others)
    restore()
    assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == before


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="pthread_sigmask: not on Windows (no holding signals)")
def test_held_signals_wait_for_the_end_of_the_block(saved_handlers):
    seen: list[int] = []
    signals.install(lambda sig, frame: seen.append(sig))
    sig = signals.STOP_SIGNALS[1]
    with signals.held():
        signal.pthread_kill(threading.get_ident(), sig)
        time.sleep(0.05)
        inside = list(seen)
    assert inside == [] and seen == [sig]


def test_ignore_ignores_every_stop_signal(saved_handlers):
    signals.install(lambda sig, frame: None)
    signals.ignore()
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in signals.STOP_SIGNALS)


def test_a_console_close_asks_the_main_thread_for_the_stop_then_waits(saved_handlers):
    seen: list[int] = []
    signal.signal(STAND_IN, lambda sig, frame: seen.append(sig))
    stop = signals.ConsoleStop(STAND_IN, grace=0.3)
    assert stop(0) is False and stop(1) is False  # Ctrl-C, Ctrl-Break: the C runtime's own signals
    answers: list[bool] = []
    t0 = time.monotonic()
    closing = threading.Thread(target=lambda: answers.append(stop(2)))  # CTRL_CLOSE_EVENT
    closing.start()
    while not seen and time.monotonic() - t0 < 10:
        time.sleep(0.01)  # the main thread runs the handler between two bytecodes, as for a signal
    closing.join(10)
    assert seen == [STAND_IN] and answers == [True]
    assert time.monotonic() - t0 >= stop.grace  # it waited for the process to end by itself


def test_a_console_close_once_the_stop_is_under_way_only_waits(saved_handlers):
    signal.signal(STAND_IN, signal.SIG_IGN)
    assert signals.ConsoleStop(STAND_IN, grace=0.05)(6) is True  # CTRL_SHUTDOWN_EVENT


def test_the_wake_event_behaves_as_an_event():
    w = signals.Wake()
    assert isinstance(w, threading.Event) and not w.is_set() and w.wait(0.01) is False
    threading.Timer(0.05, w.set).start()
    assert w.wait(5.0) is True and w.is_set()
    w.clear()
    assert not w.is_set() and w.wait(0) is False


def test_the_wake_event_can_be_set_by_a_handler_that_interrupted_its_own_wait():
    """A stop signal's handler runs in the main thread between two bytecodes, possibly inside the
    event's own ``wait()`` with its lock held: setting it there returns (a plain ``threading.Event``
    waits forever for a lock its own thread holds)."""
    w = signals.Wake()
    done = threading.Event()

    def interrupted() -> None:
        with w._guard:  # what the main thread holds inside wait() or clear()
            w.set()  # what the handler does there
        done.set()

    threading.Thread(target=interrupted, daemon=True).start()
    assert done.wait(5.0), "set() waited for the lock its own thread held"
    assert w.is_set()


STORM = """
import os, signal, subprocess, sys, time
from vcam.platform.signals import Wake
wake, count = Wake(), [0]
def handler(sig, frame):
    count[0] += 1
    wake.set()
signal.signal(signal.SIGUSR1, handler)
sender = [sys.executable, "-c", "import os, signal, sys, time\\nend = time.time() + 1.5\\n"
          "while time.time() < end:\\n    os.kill(int(sys.argv[1]), signal.SIGUSR1)\\n    time.sleep(0.0002)", str(os.getpid())]
p = subprocess.Popen(sender)
while p.poll() is None:  # the frame loop's way: clear, then short waits
    wake.clear()
    wake.wait(0.0005)
print("handled", count[0])
"""


@pytest.mark.skipif(os.name == "nt", reason="signals sent by another process (SIGUSR1): POSIX only, not on Windows")
def test_a_loop_waiting_on_the_wake_event_survives_a_storm_of_signals_that_set_it():
    """Thousands of signals from another process land at every point of the loop's ``clear()`` and
    ``wait()``; the handler sets the event each time. With ``threading.Event`` this loop blocks (or
    overflows the stack with nested handlers) within about a second."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", STORM], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 100, out.stdout
