"""What the panel shows, as one JSON-ready dict (:meth:`PanelView.snapshot`), and what the daemon
must offer the panel (:class:`Backend`).

The panel reads the daemon through :class:`Backend` only: each stream's
:class:`~vcam.state.RuntimeState` (face, swap, mappings and the status the frame loop publishes),
the people in view, where each model runs, and the face bank's changes made with the run's own
models. Commands go through :func:`vcam.control.local.handle_command`, the path of ``vcam ctl``.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Protocol

from vcam.control.commands import SETTINGS
from vcam.state import RuntimeState

HISTORY_S = 60  # the sparkline's span: one sample a second
#: The desk's settings as the page draws them (a switch or a slider each, in the table's order);
#: a stream shows those its ``settings`` offer.
CONTROLS = [{"key": s.key, "kind": s.kind, "label": s.label, "help": s.help} for s in SETTINGS]


class Backend(Protocol):
    """The running daemon as the panel sees it (implemented by :mod:`vcam.runtime.panel`)."""

    #: stream name -> its state, the first stream first
    states: dict[str, RuntimeState]
    faces_dir: Path

    def info(self) -> dict:
        """``{"device": ..., "models": [{"role", "model", "where"}, ...]}``."""
        ...

    def people(self, stream: str) -> list[dict]:
        """The people in view on ``stream``: ``{"track", "box", "target", "source"}`` each."""
        ...

    def map_person(self, stream: str, track: int, source: str) -> dict:
        """Give the person of track ``track`` the face ``source``; the control reply."""
        ...

    def add_face(self, photo: Path, name: str | None, pick: int | None = None) -> str:
        """Add the face in ``photo`` to the bank (as ``vcam faces add``; ``pick``: its face K of
        several, left to right) and load it; its name."""
        ...

    def remove_face(self, name: str) -> None:
        """Remove face ``name`` from the bank and from every stream."""
        ...

    def published(self, stream: str) -> int:
        """Frames ``stream`` has published so far (read live, not at the status interval)."""
        ...


class PanelView:
    """Builds the panel's state from a :class:`Backend`; keeps a minute of latency per stream."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.history: dict[str, deque] = {name: deque(maxlen=HISTORY_S) for name in backend.states}
        self._last_sample = 0.0

    def sample(self) -> None:
        """One history point per stream (called about once a second)."""
        now = time.monotonic()
        if now - self._last_sample < 0.9:
            return
        self._last_sample = now
        for name, state in self.backend.states.items():
            st = state.read_status()
            self.history[name].append([round(st.latency_p50_ms, 2), round(st.latency_p99_ms, 2), round(st.fps_out, 1)])

    def faces(self) -> list[dict]:
        from vcam.stages.faces import FaceBank

        first = next(iter(self.backend.states.values()))
        bank = set(FaceBank(self.backend.faces_dir).names())
        loaded = set(first.names)
        return [{"name": n, "bank": n in bank, "loaded": n in loaded} for n in sorted(bank | loaded)]

    def snapshot(self) -> dict:
        from vcam.status import status_parts
        from vcam.telemetry import gpu_text

        streams = []
        for name, state in self.backend.states.items():
            st = state.read_status()
            streams.append(
                {
                    "name": name,
                    "face": state.active,
                    "swap": state.swap_enabled,
                    "paused": state.paused,
                    "settings": state.settings,  # the desk's settings this run offers: the controls shown
                    "choices": state.choices(),  # a choice setting's values (the cameras)
                    "mappings": state.mappings,
                    "targets": state.targets,
                    "mapping_on": state.mapping_enabled,
                    "people": self.backend.people(name),
                    "status": st.as_dict(),
                    "gpu": gpu_text(st.gpu),  # the status line's own phrases, not rebuilt in the page
                    "notes": [p for p in status_parts(st) if not p.startswith("GPU")],
                    "history": list(self.history.get(name, ())),
                }
            )
        return {"streams": streams, "faces": self.faces(), "info": self.backend.info(), "controls": CONTROLS, "t": time.time()}

    def thumbnail(self, name: str) -> bytes | None:
        """A face's stored crop as PNG: the bank's ``crop_arcface_128.png``, else the loaded face's
        crop (a face given as a photo, the demo's); None when there is no such face."""
        import cv2

        from vcam.stages.faces import CLASSIC_TEMPLATE, FaceBank

        bank = FaceBank(self.backend.faces_dir)
        if name in bank:
            folder = bank.root / name
            path = folder / f"crop_{CLASSIC_TEMPLATE}.png"
            try:  # only the bank's own file (not a link out of the face's folder), and small
                if path.is_file() and path.resolve().parent == folder.resolve() and path.stat().st_size < 1 << 20:
                    return path.read_bytes()
            except OSError:
                pass
        for state in self.backend.states.values():
            face = state.face(name)
            if face is not None:
                ok, buf = cv2.imencode(".png", face.image)
                return buf.tobytes() if ok else None
        return None
