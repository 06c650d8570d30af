"""Media the tests make and keep: solid-colour clips written with PyAV, and an output that records
every frame it is sent."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vcam.stages.outputs import NullOutput

# A palette of well-separated colours (BGR); frame i of a test clip is solid COLORS[i % len].
COLORS = [(0, 0, 220), (0, 200, 0), (210, 0, 0), (0, 200, 200), (200, 0, 200), (200, 200, 0), (40, 40, 40), (230, 230, 230)]


def write_clip(
    path: Path,
    n: int,
    width: int = 64,
    height: int = 48,
    fps: int = 25,
    *,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    gray: bool = False,
) -> list[np.ndarray]:
    """Write ``n`` solid-colour frames; return what was written (BGR, or gray levels)."""
    written = []
    with av.open(str(path), mode="w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = width, height, pix_fmt
        for i in range(n):
            if gray:
                img = np.full((height, width), 20 + 25 * (i % 9), np.uint8)
                vf = av.VideoFrame.from_ndarray(img, format="gray")
            else:
                img = np.empty((height, width, 3), np.uint8)
                img[:] = COLORS[i % len(COLORS)]
                vf = av.VideoFrame.from_ndarray(img, format="bgr24")
            vf.pts = i
            vf.time_base = Fraction(1, fps)
            written.append(img)
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return written


class Recorder(NullOutput):
    """An output that keeps a copy of every frame it is sent."""

    def __init__(self, width: int = 320, height: int = 240) -> None:
        super().__init__(width, height)
        self.got: list[np.ndarray] = []

    def send(self, data) -> None:
        super().send(data)
        self.got.append(np.array(data, copy=True))
