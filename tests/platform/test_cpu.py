"""The CPU's features line, a cache key for graphs optimised for its instruction sets; the cores usable."""

from __future__ import annotations

import sys

import pytest

from vcam.platform import cpu


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/cpuinfo: Linux only, not on Windows or macOS")
def test_linux_reads_the_flags_line_of_proc_cpuinfo():
    with open("/proc/cpuinfo") as f:
        want = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    assert cpu.features_line(windows=False) == want


def test_windows_reads_the_processor_identifier(monkeypatch):
    monkeypatch.setenv("PROCESSOR_IDENTIFIER", "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel")
    assert cpu.features_line(windows=True) == "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel"
    monkeypatch.delenv("PROCESSOR_IDENTIFIER")
    assert cpu.features_line(windows=True) == ""


def test_the_usable_cores_follow_the_affinity_mask_where_there_is_one(monkeypatch):
    """A process pinned to one core of many (``taskset``, a container's CPU set) counts one, as the
    pipeline's and onnxruntime's thread choices must; without a mask (Windows, macOS) the machine's."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert cpu.usable_cores() == 1
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert cpu.usable_cores() == 16


def test_other_programs_busy_cores_are_the_system_s_busy_time_less_this_process_s_over_the_window():
    since = cpu.Sample(at=5.0, busy=40.0, own=2.0, cores=2)
    assert cpu.others_busy(since, cpu.Sample(at=5.5, busy=40.9, own=2.4, cores=2)) == pytest.approx(1.0)
    assert cpu.others_busy(since, cpu.Sample(at=5.5, busy=40.3, own=2.4, cores=2)) == 0.0  # ticks: never below 0
    assert cpu.others_busy(since, cpu.Sample(at=5.05, busy=40.1, own=2.0, cores=2)) is None  # too short to say
    assert cpu.others_busy(since, cpu.Sample(at=5.5, busy=41.0, own=2.0, cores=3)) is None  # the cores changed
    assert cpu.others_busy(None, since) is None and cpu.others_busy(since, None) is None


def test_other_programs_runnable_at_both_ends_count_where_they_shared_the_cores_with_this_start():
    """Two programs spinning on a 2-core machine beside a start-up that itself takes a core show as
    only ~1.1 cores of busy time: the threads they had runnable at both samples (the fewer) say 2."""
    since = cpu.Sample(at=5.0, busy=40.0, own=2.0, cores=2, running=2)
    now = cpu.Sample(at=5.5, busy=40.95, own=2.4, cores=2, running=3)
    assert cpu.others_busy(since, now) == 2.0
    assert cpu.others_busy(since, cpu.Sample(at=5.5, busy=40.95, own=2.4, cores=2, running=0)) == pytest.approx(1.1)
    assert cpu.others_busy(cpu.Sample(at=5.0, busy=40.0, own=2.0, cores=2), now) == pytest.approx(1.1)  # unknown


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS gives no system-wide CPU times without a library")
def test_a_program_spinning_beside_counts_and_this_process_s_own_work_does_not():
    """The real times: a child spinning for the whole window shows as about a core of other programs'
    work; the same spin in this process's own thread is counted as its own."""
    import subprocess
    import threading
    import time

    code = "import time\nprint('go', flush=True)\nt = time.time() + 3\nwhile time.time() < t: pass"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "go\n"  # up and spinning
        since = cpu.sample()
        time.sleep(0.6)
        now = cpu.sample()
    finally:
        child.kill()
        child.wait()
    assert since is not None and now is not None
    others = cpu.others_busy(since, now)
    assert others is not None and others >= 0.6, others

    def spin() -> None:  # 0.3 s of this thread's CPU, however busy the machine is
        end, deadline = time.thread_time() + 0.3, time.monotonic() + 30
        while time.thread_time() < end and time.monotonic() < deadline:
            pass

    since, cpu0 = cpu.sample(), time.process_time()
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    now, used = cpu.sample(), time.process_time() - cpu0
    assert now is not None and since is not None
    assert used >= 0.25 and now.own - since.own >= used - 0.05, (used, now.own - since.own)  # Windows: 15.6 ms ticks
