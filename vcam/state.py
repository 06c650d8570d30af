"""Runtime state that control channels may change while frames flow.

Control threads (OBS, local socket, CLI) only post changes here; the frame loop reads one
immutable :class:`Snapshot` per frame with :meth:`RuntimeState.snapshot`, which takes the lock for a
few attribute reads and never waits on I/O. Switching the active face is therefore a pointer swap:
the face's latents are computed before :meth:`set_face` is called.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from .errors import FaceError
from .types import SourceFace


@dataclass(frozen=True)
class Snapshot:
    face: SourceFace | None
    swap_enabled: bool
    version: int


@dataclass
class Status:
    """Live numbers published by the frame loop (read by the status line, OBS and `vcam ctl status`)."""

    fps_in: float = 0.0
    fps_out: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    frames_in: int = 0
    frames_out: int = 0
    dropped_capture: int = 0
    dropped_latency: int = 0
    over_budget: bool = False
    faces: int = 0
    guarded: int = 0
    full_scans: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class RuntimeState:
    """The active face, swap on/off, and the known faces, behind one lock."""

    def __init__(self, faces: dict[str, SourceFace] | None = None, active: str | None = None, swap_enabled: bool = True):
        self._lock = threading.Lock()
        self._loader: Callable[[str], SourceFace] | None = None
        self._faces: dict[str, SourceFace] = dict(faces or {})
        self._active = active if active in self._faces else None
        self._swap = swap_enabled
        self._version = 0
        self._listeners: list[Callable[[Snapshot], None]] = []
        self.status = Status()
        self._status_lock = threading.Lock()

    # -- frame loop side ---------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            face = self._faces.get(self._active) if self._active else None
            return Snapshot(face=face, swap_enabled=self._swap, version=self._version)

    def publish_status(self, status: Status) -> None:
        with self._status_lock:
            self.status = replace(status)

    def read_status(self) -> Status:
        with self._status_lock:
            return replace(self.status)

    # -- control side ------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._faces)

    @property
    def active(self) -> str | None:
        with self._lock:
            return self._active

    @property
    def swap_enabled(self) -> bool:
        with self._lock:
            return self._swap

    def add_face(self, face: SourceFace, *, activate: bool = False) -> None:
        with self._lock:
            self._faces[face.name] = face
            if activate or self._active is None:
                self._active = face.name
            self._version += 1
        self._notify()

    def remove_face(self, name: str) -> None:
        with self._lock:
            self._faces.pop(name, None)
            if self._active == name:
                self._active = None
            self._version += 1
        self._notify()

    def set_loader(self, loader: Callable[[str], SourceFace] | None) -> None:
        """``loader(name)`` prepares a face that is not loaded yet (e.g. added to the face bank while
        the daemon runs); :meth:`set_face` calls it in the calling (control) thread, never the frame loop."""
        with self._lock:
            self._loader = loader

    def set_face(self, name: str) -> str:
        """Make ``name`` (or ``next``/``prev``) active; returns the active name. Raises FaceError.

        A name that is not loaded is loaded first through the loader, if one is set (slow, but in the
        caller's thread and outside the lock: frames keep flowing meanwhile).
        """
        if name not in ("next", "prev"):
            with self._lock:
                loader = None if name in self._faces else self._loader
            if loader is not None:
                self.add_face(loader(name))
        with self._lock:
            names = sorted(self._faces)
            if not names:
                raise FaceError("no faces are loaded", hint="add one with `vcam faces add PHOTO`")
            if name in ("next", "prev"):
                i = names.index(self._active) if self._active in names else -1
                step = 1 if name == "next" else -1
                name = names[(i + step) % len(names)] if i >= 0 else names[0]
            elif name not in self._faces:
                raise FaceError(f"unknown face '{name}'", hint=f"known faces: {', '.join(names)}")
            changed = name != self._active
            self._active = name
            if changed:
                self._version += 1
        if changed:
            self._notify()
        return name

    def set_swap(self, value: str | bool) -> bool:
        """``on``/``off``/``toggle`` (or a bool; not 0, 1 or other numbers); returns the new state."""
        with self._lock:
            if isinstance(value, bool):
                new = value
            elif value == "toggle" and isinstance(value, str):
                new = not self._swap
            elif value in ("on", "off") and isinstance(value, str):
                new = value == "on"
            else:
                raise ValueError(f"swap must be on, off or toggle, got {value!r}")
            changed = new != self._swap
            self._swap = new
            if changed:
                self._version += 1
        if changed:
            self._notify()
        return new

    def subscribe(self, fn: Callable[[Snapshot], None]) -> None:
        """Call ``fn(snapshot)`` after every change (from the changing thread; keep it quick)."""
        with self._lock:
            self._listeners.append(fn)

    def _notify(self) -> None:
        snap = self.snapshot()
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(snap)
            except Exception:  # a listener must never break control
                import logging

                logging.getLogger(__name__).exception("state listener failed")
