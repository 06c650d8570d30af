"""The ``vcam`` command (``python -m vcam`` and the console script).

The start-up clock starts here, at the module's first instruction (so "first frame N s after start"
counts vcam's own start-up, never a shell's or an installer's before it: :mod:`vcam.platform.process`).

Stop signals are handled from the first instruction of :func:`main`: until the daemon installs its
own handling (a clean stop, then a forced one), a stop signal (Ctrl-C, SIGTERM or SIGHUP; on Windows
Ctrl-Break or closing the console too) during the imports and the set-up ends the process quietly
with status 130, never with a traceback or killed by the signal mid-import (during the command's
imports they are held, then handled)."""

from __future__ import annotations

import time

STARTED = time.monotonic()

import sys  # noqa: E402

from vcam.platform import process, signals  # noqa: E402


def _stop_early(sig: int, frame: object) -> None:
    raise SystemExit(130)


def main() -> None:
    process.mark_start(STARTED)
    signals.install(_stop_early)  # nohup ignores SIGHUP: so does vcam then
    # While the command's modules are imported the stop signals wait: a handler's SystemExit raised
    # inside the import machinery's own callbacks is "ignored" (printed with a traceback, and the
    # process goes on). A signal that came meanwhile is handled when they are let through.
    with signals.held():
        try:
            from vcam.cli import main as cli_main
        except KeyboardInterrupt:  # a signal that arrived before the handlers above
            sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
