"""Small pieces of the pipeline: which tracks a frame swaps (the face filters), the output size of
4:2:0 formats, and whether a tracker step's detection has arrived."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from vcam.types import PixelFormat, Track

#: ``face_filter(tracks, host_frame) -> tracks to swap``; ``host_frame()`` gives the frame on the host
#: (on the GPU: a download, so call it only when needed, e.g. once for a new track's embedding).
FaceFilter = Callable[[list[Track], Callable[[], np.ndarray]], list[Track]]


def arrived(step: Any) -> bool:
    """Has a tracker step's detection arrived (no wait; a step that cannot tell has)."""
    ready = getattr(step, "ready", None)
    return ready is None or bool(ready())


def select_all(tracks: list[Track], host_frame: Callable[[], np.ndarray]) -> list[Track]:
    return tracks


def select_largest(tracks: list[Track], host_frame: Callable[[], np.ndarray]) -> list[Track]:
    if not tracks:
        return tracks

    def area(t: Track) -> float:
        x1, y1, x2, y2 = (float(v) for v in t.box)
        return (x2 - x1) * (y2 - y1)

    return [max(tracks, key=area)]


def output_size(fmt: PixelFormat, width: int, height: int) -> tuple[int, int]:
    """4:2:0 outputs need even sizes: odd frames lose their last row/column."""
    if PixelFormat(fmt) in (PixelFormat.I420, PixelFormat.NV12):
        return width - width % 2, height - height % 2
    return width, height


__all__ = ["FaceFilter", "output_size", "select_all", "select_largest"]
