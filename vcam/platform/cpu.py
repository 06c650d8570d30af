"""What the CPU can do, as one line of text that changes when its instruction sets do (a cache key
for graphs optimised for them), how many cores this process may use, and how busy other programs
keep them (:func:`sample`, :func:`others_busy`)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from vcam.platform import WINDOWS

#: A window shorter than this says nothing about other programs (the system's times move in 10 ms ticks).
MIN_WINDOW_S = 0.1


def features_line(*, windows: bool = WINDOWS) -> str:
    """Linux: the ``flags`` (x86) or ``Features`` (ARM) line of ``/proc/cpuinfo``. Windows: the
    ``PROCESSOR_IDENTIFIER`` the system sets (family, model, stepping, vendor). Elsewhere, or when
    neither can be read: ''."""
    if windows:
        return os.environ.get("PROCESSOR_IDENTIFIER", "")
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def usable_cores() -> int:
    """The cores this process may run on: Linux's affinity mask (``taskset``, a container's CPU set),
    elsewhere the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Sample:
    """The CPU time spent up to one moment (:func:`sample`): ``busy``, every program's busy seconds
    on the ``cores`` this process may run on, added up; ``own``, this process's (all its threads);
    ``at``, the moment on the ``time.monotonic()`` clock; ``running``, other programs' threads
    runnable at that moment (None where unknown: Windows, or a process kept to part of the machine)."""

    at: float
    busy: float
    own: float
    cores: int
    running: int | None = None


def sample(*, windows: bool = WINDOWS) -> Sample | None:
    """Now's :class:`Sample`, or None where the system's times cannot be read (macOS, a /proc without
    them). Linux: the lines of ``/proc/stat`` of the cores in the affinity mask (busy: all but idle and
    iowait; steal counts: another guest had the core) and its ``procs_running`` less this process's
    running threads. Windows: ``GetSystemTimes``, the whole machine."""
    at = time.monotonic()
    t = os.times()
    got = _windows_busy() if windows else _linux_busy()
    if got is None:
        return None
    busy, cores, running = got
    return Sample(at=at, busy=busy, own=t.user + t.system, cores=cores, running=running)


def others_busy(since: Sample | None, now: Sample | None) -> float | None:
    """How many cores other programs kept busy from ``since`` to ``now``, or None where that cannot
    be said: a sample missing, a window shorter than :data:`MIN_WINDOW_S`, or the cores changed
    between them. Their busy time over the window (this process's own taken out) undercounts them
    where this process competed with them for the cores, so where the samples know it the larger
    figure is the threads other programs had runnable at both moments (the fewer of the two)."""
    if since is None or now is None or since.cores != now.cores:
        return None
    wall = now.at - since.at
    if wall < MIN_WINDOW_S:
        return None
    window = max(0.0, (now.busy - since.busy) - (now.own - since.own)) / wall
    if since.running is None or now.running is None:
        return window
    return max(window, float(min(since.running, now.running)))


def _linux_busy() -> tuple[float, int, int | None] | None:
    """(busy seconds, cores, other programs' running threads) of the cores this process may use,
    from ``/proc/stat`` (the running threads only where those are all the machine's cores)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = None
    try:
        tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as fh:
            text = fh.read().splitlines()
    except (OSError, ValueError, AttributeError):
        return None
    lines = [ln.split() for ln in text if ln.startswith("cpu") and ln[3:4].isdigit()]
    busy, cores = 0, 0
    for fields in lines:
        if allowed is not None and int(fields[0][3:]) not in allowed:
            continue
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        values = [int(v) for v in fields[1:9]]
        busy += sum(values) - values[3] - values[4]
        cores += 1
    if not cores:
        return None
    running = next((int(ln.split()[1]) for ln in text if ln.startswith("procs_running ")), None)
    if running is not None and cores == len(lines):
        return busy / tick, cores, max(0, running - _own_running())
    return busy / tick, cores, None


def _own_running() -> int:
    """This process's threads running or runnable now (the one asking among them)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as fh:
                count += fh.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return max(1, count)


def _windows_busy() -> tuple[float, int, int | None] | None:
    """(busy seconds, cores) of the whole machine, from ``GetSystemTimes`` (kernel time includes idle)."""
    if sys.platform != "win32":  # for the type checker: this branch runs on Windows only
        return None
    import ctypes
    from ctypes import wintypes

    idle, kernel, user = wintypes.FILETIME(), wintypes.FILETIME(), wintypes.FILETIME()
    if not ctypes.windll.kernel32.GetSystemTimes(ctypes.byref(idle), ctypes.byref(kernel), ctypes.byref(user)):
        return None

    def seconds(ft: wintypes.FILETIME) -> float:
        return ((ft.dwHighDateTime << 32) | ft.dwLowDateTime) / 1e7

    return seconds(kernel) + seconds(user) - seconds(idle), os.cpu_count() or 1, None
