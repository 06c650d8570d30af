"""Benchmarks (not imported by the runtime modules): ``vcam bench`` (:mod:`.pipeline`, the pipeline
against a naive loop on synthetic frames), ``python -m benchmarks.demo`` (:mod:`.demo`, the real
daemon on the demo clip), ``python -m benchmarks.detect`` (:mod:`.detect`, small and new faces
and what finding them costs), ``python -m benchmarks.streams`` (:mod:`.streams`, several streams
in one daemon against one process each), ``python -m benchmarks.upscale`` (:mod:`.upscale`, the
frame enhancer), ``python -m benchmarks.predict`` (:mod:`.predict`, swapping with predicted faces:
time and accuracy), ``python -m benchmarks.startup`` (:mod:`.startup`, start-up time) and
``python -m benchmarks.control`` (:mod:`.control`, control clients against a running daemon) and
``python -m benchmarks.panel`` (:mod:`.panel`, what the control panel costs the frame loop);
``python -m benchmarks.idle_connections`` and ``python -m benchmarks.soak`` (issue 27);
``python -m benchmarks.obs_source`` (:mod:`.obs_source`, the direct OBS source in Chromium)."""

from __future__ import annotations

import json
import platform
import time
from typing import Any


def write_report(path: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the machine and the date, written to ``path`` as JSON; returned."""
    payload = {**payload, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)
    return payload


def demo_daemon(sock: Any, *, width: int = 320, height: int = 240, control: bool = True, **pipeline: Any) -> tuple[Any, Any]:
    """A daemon on the demo clip paced like a 30 fps camera (CPU, the classic swap, two plain faces,
    ``pipeline`` into ``[pipeline]``), its control socket at ``sock``, publishing to a null output
    whose ``stamps`` are the times frames went out. Returns ``(daemon, output)``, not started."""
    import numpy as np

    from vcam.config_file import build
    from vcam.runtime.daemon import Daemon
    from vcam.stages.outputs import NullOutput
    from vcam.state import RuntimeState
    from vcam.types import PixelFormat, SourceFace

    class Stamped(NullOutput):
        def __init__(self) -> None:
            super().__init__(width, height, 30.0, fmt=PixelFormat.BGR)
            self.stamps: list[float] = []

        def send(self, data: Any) -> None:
            super().send(data)
            self.stamps.append(time.perf_counter())

    cfg = build(
        {
            "capture": {"input": "demo", "width": width, "height": height, "fps": 30, "pacing": "realtime"},
            "pipeline": {"device": "cpu", **pipeline},
            "control": {"socket": str(sock)},
        }
    )
    faces = {n: SourceFace(name=n, image=np.full((128, 128, 3), c, np.uint8)) for n, c in (("alice", 60), ("bob", 200))}
    out = Stamped()
    return Daemon(cfg, state=RuntimeState(faces, active="alice"), output=out, control=control), out
