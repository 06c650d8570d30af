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
