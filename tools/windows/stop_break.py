"""Stop a conversion with CTRL_BREAK_EVENT (Windows side of tools/windows-tests).

``python stop_break.py OUT.mp4``: starts ``vcam run --input demo --output file:OUT.mp4`` in a new
process group, waits for its first progress line, sends CTRL_BREAK_EVENT to that group and waits for
the end. GenerateConsoleCtrlEvent reaches only processes on the sender's console, and a python.exe
started from Linux with piped streams has none: one is allocated first (the child inherits it).
Prints ``sent=yes|no exit=N`` and the child's output; the caller checks the files."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> int:
    out = sys.argv[1]
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    if not kernel32.GetConsoleWindow():
        kernel32.AllocConsole()
    args = [sys.executable, "-m", "vcam", "run", "--input", "demo", "--output", f"file:{out}", "--frames", "100000"]
    p = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
        errors="replace",
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
    )
    assert p.stdout is not None
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if line.startswith("converting:"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = "no"
    if started.wait(240):
        time.sleep(2)  # a few frames into the file
        try:
            os.kill(p.pid, signal.CTRL_BREAK_EVENT)
            sent = "yes"
        except OSError as exc:
            sent = f"no ({exc})"
    try:
        code = p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
        sent += ", not stopped in 90 s: killed"
    reader.join(10)
    print(f"sent={sent} exit={code}")
    print("".join(lines[-15:]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
