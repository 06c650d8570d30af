"""What a start-up opened, closed in reverse by one :class:`contextlib.ExitStack`.

Each component is added as it is opened; :meth:`Opened.close` stops or closes them last first,
whatever one of them does: a :class:`~vcam.errors.VcamError` (a file output that could not be
finished) is kept for the caller, any other failure is logged, and the others are closed all the
same. A component that may be replaced while the daemon runs (a stream's source and capture
thread, reopened by a resume) is added as a getter: the one there at the end is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, TypeVar

from vcam.errors import VcamError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Opened:
    """Components in the order they were opened (see the module docstring)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._errors: list[VcamError] = []

    def add(self, comp: T) -> T:
        """``comp`` closed (its ``stop``, else its ``close``) before everything added earlier."""
        self._stack.callback(self._close, lambda: comp)
        return comp

    def add_current(self, get: Callable[[], Any]) -> None:
        """Whatever ``get()`` returns at the end, closed in this place (None: nothing)."""
        self._stack.callback(self._close, get)

    def _close(self, get: Callable[[], Any]) -> None:
        comp = get()
        fn = getattr(comp, "stop", None) or getattr(comp, "close", None)
        if fn is None:
            return
        try:
            fn()
        except VcamError as exc:
            self._errors.append(exc)
        except Exception:  # a bug in a component: the others are closed all the same
            log.exception("error while closing %s", type(comp).__name__)

    def stop(self) -> None:
        """:meth:`close`, raising the first error: an ``Opened`` added to another (a load's)."""
        errors = self.close()
        if errors:
            raise errors[0]

    def close(self) -> list[VcamError]:
        """Close everything, last opened first; the :class:`VcamError` they raised, in order."""
        self._stack.close()
        errors, self._errors = self._errors, []
        return errors
