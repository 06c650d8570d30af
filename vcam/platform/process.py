"""Processes: whether a PID runs, this process's age on vcam's own start-up clock, and child
processes in a group of their own (a terminal's Ctrl-C reaches the daemon, which stops them).

The start-up clock starts at the first instruction of ``vcam/__main__.py`` (:func:`mark_start`), so
a shell that ``exec``s vcam after ``pip install`` does not lend it pip's minutes, as the kernel's
process start time would; a program using vcam as a library starts it when this module is
imported. Windows never gets ``os.kill(pid, 0)`` (signal 0 there is ``CTRL_C_EVENT``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from vcam.platform import WINDOWS, cpu

#: When vcam started, on the monotonic clock: this module's import, moved back by :func:`mark_start`;
#: with the CPU's times then (what other programs did since is judged from them). The one
#: process-wide fact of this package (written once, by the ``vcam`` command).
_started = time.monotonic()
_cpu_started = cpu.sample()


def mark_start(at: float) -> None:
    """The ``vcam`` command started at ``at`` (``time.monotonic()`` taken at its first instruction)."""
    global _started, _cpu_started
    _started = at
    _cpu_started = cpu.sample()


def cpu_at_start() -> cpu.Sample | None:
    """The CPU's times when vcam started (:func:`vcam.platform.cpu.sample`; None where unreadable)."""
    return _cpu_started


def started() -> float:
    """When vcam started, on the ``time.monotonic()`` clock."""
    return _started


def age() -> float:
    """Seconds since vcam started (the interpreter and the imports of the command count too)."""
    return max(0.0, time.monotonic() - _started)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists (ours or another user's), and is not an exited one its
    parent has not reaped yet (a zombie, on Linux)."""
    if pid <= 0:
        return False
    if WINDOWS:
        return _alive_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): the signal's answer stands


def _alive_windows(pid: int) -> bool:
    """OpenProcess, then the exit code: STILL_ACTIVE while it runs; access denied means it exists
    (another user's, or a protected one)."""
    if sys.platform != "win32":  # for the type checker: this branch runs on Windows only
        raise OSError("Windows only")
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    kernel32.GetExitCodeProcess.argtypes = (wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD))
    kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: it exists; else (87) no such process
    try:
        code = wintypes.DWORD()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def own_group(*, windows: bool = WINDOWS) -> dict[str, Any]:
    """``subprocess.Popen`` keywords that start a child in a process group of its own: the
    terminal's Ctrl-C goes to vcam, which stops the child itself (POSIX: a new session; Windows: a
    new process group)."""
    if windows:
        return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200)}
    return {"start_new_session": True}


def stop_group(proc: subprocess.Popen, *, kill: bool = False) -> None:
    """Stop a child started with :func:`own_group` and everything in its group: POSIX SIGTERM (or,
    ``kill``, SIGKILL) to the group; Windows terminates the child. Gone already is fine."""
    if sys.platform == "win32":
        try:
            proc.kill() if kill else proc.terminate()
        except OSError:
            pass
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass
