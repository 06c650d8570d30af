"""The gate that holds the engines' background graph captures back while a start-up captures what
its first frame needs (no PyTorch here: the daemon holds it whatever the backend)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class BackgroundGate:
    """Holds the background captures (:class:`vcam.engines.threads.CaptureQueue`) back while a start-up captures what the
    first frame needs: held (:meth:`held`, counted, so loads may nest), a queue waits before its
    next size, at most ``patience`` seconds, so it never waits forever and nobody deadlocks on it."""

    def __init__(self, patience: float = 20.0) -> None:
        self.patience = patience
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._holders = 0

    def hold(self) -> Callable[[], None]:
        """Hold the gate; returns the release (idempotent: call it as often as is convenient)."""
        with self._lock:
            self._holders += 1
            self._open.clear()
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._holders -= 1
                if self._holders == 0:
                    self._open.set()

        return release

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        release = self.hold()
        try:
            yield
        finally:
            release()

    @property
    def is_open(self) -> bool:
        """Nobody holds it: the background work goes on."""
        return self._open.is_set()

    def wait(self) -> None:
        self._open.wait(self.patience)


#: The process's gate (see :class:`BackgroundGate`); the daemon's load holds it.
BACKGROUND = BackgroundGate()


__all__ = ["BACKGROUND", "BackgroundGate"]
