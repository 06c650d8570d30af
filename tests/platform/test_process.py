"""Processes: whether a PID runs, vcam's start-up clock, children in a group of their own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from vcam.platform import process
from vcam.platform.signals import STOP_SIGNALS

POSIX = os.name == "posix"


def test_a_running_process_is_alive_and_an_ended_one_is_not():
    assert process.alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process.alive(child.pid)
    assert not process.alive(0) and not process.alive(-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="zombies in /proc: Linux only, not on Windows or macOS")
def test_an_exited_child_not_yet_reaped_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process.alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not process.alive(child.pid)  # a zombie: os.kill(pid, 0) alone would say it runs
    child.wait()


def test_the_start_up_clock_starts_at_vcams_own_start_not_the_shells():
    """`sh -c 'pip install ... && vcam run'`: the shell execs vcam, so the kernel's start time of
    the process is the shell's; vcam's clock starts at its own first instruction."""
    sh = shutil.which("sh")
    if sh is None or os.name == "nt":
        pytest.skip("a shell that execs vcam in its own process: not on Windows (no exec there)")
    code = "import time; import vcam.__main__ as m; from vcam.platform import process; print(m.STARTED, process.started())"
    before = time.monotonic()
    out = subprocess.run(
        [sh, "-c", f'sleep 1; exec "{sys.executable}" -c "{code}"'], capture_output=True, text=True, check=True
    ).stdout.split()
    started, library_start = float(out[0]), float(out[1])
    assert started - before >= 1.0, "the clock counted the shell's second"
    assert abs(library_start - started) < 1.0  # imported as a library: the seam's import time


def test_main_sets_the_clock_and_age_counts_from_it(monkeypatch):
    import vcam.__main__ as entry
    import vcam.cli

    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}  # main() installs its early handler
    monkeypatch.setattr(vcam.cli, "main", lambda: None)
    monkeypatch.setattr(entry, "STARTED", time.monotonic() - 100.0)
    was = process.started()
    try:
        entry.main()
        assert process.started() == entry.STARTED
        assert 100.0 <= process.age() < 200.0
    finally:
        process.mark_start(was)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_own_group_keywords_per_os():
    assert process.own_group(windows=False) == {"start_new_session": True}
    assert process.own_group(windows=True)["creationflags"] == 0x200  # CREATE_NEW_PROCESS_GROUP


@pytest.mark.skipif(not POSIX, reason="process groups (killpg): not on Windows, where the child is ended alone")
def test_stop_group_ends_the_child_and_its_own_children():
    child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True, **process.own_group())
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)  # a group of its own
        process.stop_group(child)
        assert child.wait(10) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while process.alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not process.alive(grandchild)
        process.stop_group(child, kill=True)  # gone already: fine
    finally:
        if child.poll() is None:
            child.kill()
