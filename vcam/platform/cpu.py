"""What the CPU can do, as one line of text that changes when its instruction sets do (a cache key
for graphs optimised for them), and how many cores this process may use."""

from __future__ import annotations

import os

from vcam.platform import WINDOWS


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
