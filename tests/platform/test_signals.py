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
