"""Stop a conversion with a console control event (Windows side of tools/windows-tests).

``python stop_console.py c|break OUT.mp4 INPUT``: starts ``vcam run --input INPUT --output
file:OUT.mp4 --frames 5000`` on a console of its own, attaches to that console, waits for the first
progress line and sends CTRL_C_EVENT or CTRL_BREAK_EVENT to every process on it
(GenerateConsoleCtrlEvent to group 0; this helper ignores both). A python.exe started from Linux with
piped streams has no console, and Wine refuses it AllocConsole: hence the child's console.
Prints ``sent=yes|no (why) exit=N`` and the child's last lines; the caller checks the files."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
import time

EVENTS = {"c": signal.CTRL_C_EVENT, "break": signal.CTRL_BREAK_EVENT}


def failure() -> str:
    """The last Windows error of this thread, as "error N: text"."""
    code = ctypes.get_last_error()
    return f"error {code}: {ctypes.FormatError(code).strip()}"


def main() -> int:
    event, out, source = EVENTS[sys.argv[1]], sys.argv[2], sys.argv[3]
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    args = [sys.executable, "-m", "vcam", "run", "--input", source, "--output", f"file:{out}", "--frames", "5000"]
    p = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
        errors="replace",
        creationflags=subprocess.CREATE_NEW_CONSOLE,
    )
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
    for sig in (signal.SIGINT, signal.SIGBREAK):
        signal.signal(sig, lambda *_: None)  # the event goes to the whole console, this helper too
    sent = "no: no progress line in 240 s"
    if started.wait(240):
        time.sleep(2)  # some frames into the file
        kernel32.FreeConsole()  # none, as a rule
        if not kernel32.AttachConsole(p.pid):
            sent = f"no: AttachConsole failed ({failure()})"
        elif not kernel32.GenerateConsoleCtrlEvent(event, 0):
            sent = f"no: GenerateConsoleCtrlEvent failed ({failure()})"
        else:
            sent = "yes"
    try:
        code = p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
        sent += ", still converting after 120 s: killed"
    reader.join(10)
    print(f"sent={sent} exit={code}")
    print("".join(lines[-6:]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
