"""The ``vcam`` command (``python -m vcam`` and the console script).

Stop signals are handled from the first instruction: until the daemon installs its own handling
(a clean stop, then a forced one), Ctrl-C, SIGTERM or SIGHUP during the imports and the set-up end
the process quietly with status 130, never with a traceback or killed by the signal mid-import
(during the command's imports they are held, then handled)."""

from __future__ import annotations

import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_early(sig: int, frame: object) -> None:
    raise SystemExit(130)


def main() -> None:
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup ignores SIGHUP: so does vcam then
            signal.signal(sig, _stop_early)
    # While the command's modules are imported the stop signals wait: a handler's SystemExit raised
    # inside the import machinery's own callbacks is "ignored" (printed with a traceback, and the
    # process goes on). A signal that came meanwhile is handled when they are let through, below.
    block = hasattr(signal, "pthread_sigmask")
    if block:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        from vcam.cli import main as cli_main
    except KeyboardInterrupt:  # a signal that arrived before the handlers above
        sys.exit(130)
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    cli_main()


if __name__ == "__main__":
    main()
