"""The frames a predicted frame's detection reads on CUDA: a copy of the converted frame, made once
the frame is converted, so the paste-back may write into the frame while the detection runs on the
back stream (:class:`~vcam.pipeline.planner.DetectionPlanner`).

Two ways (``apart``):

- default: one buffer, the copy queued on the back stream behind the detections before it; the
  paste-back waits for the copy (the frame's ``seen`` event recorded after it);
- ``apart`` (issue 39's A/B for four streams of six faces, ``$VCAM_DETECT_APART=1``): the copy on
  the compute stream, in order before the paste-back, which then waits for nothing on another
  stream, into one of :data:`COPIES` buffers, never one a detection still reads (the pending
  detection's, the kept one's); the back stream waits for the copy's event before the detection
  reads it. With four streams in one daemon the back stream is shared and of the lowest priority:
  each paste-back had waited for the other streams' detections queued there before its copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: ``apart``: the buffers: the pending detection's, the kept one's, and the one being written.
COPIES = 3


class DetectionCopies:
    """The copies of one pipeline on ``ops`` (see the module docstring). :meth:`reset` at each
    configure: the buffers are made at the first predicted frame after it. ``in_use``: the frames
    detections still read (:meth:`DetectionPlanner.frames_in_use`); asked only ``apart``, which
    writes none of them."""

    def __init__(self, ops: Any, *, apart: bool = False, in_use: Callable[[], Sequence[Any]] = tuple) -> None:
        self.ops = ops
        self.apart = bool(apart)
        self.in_use = in_use
        self.buffers: list[Any] = []
        self._copied: list[Any] = []

    def reset(self) -> None:
        self.buffers, self._copied = [], []

    def make(self, img: Any, ready: Any, seen: Any) -> tuple[Any, Any]:
        """Copy ``img`` once the event ``ready`` (the whole frame converted) is reached; record
        ``seen`` after the copy (the paste-back waits for it). Returns the copy and the event the
        detection's stream must wait for before it reads it (None: the copy is on that stream)."""
        ops = self.ops
        if not self.apart:
            with ops.back_stream():
                self._make_buffers(img.shape, 1)  # on the stream that copies: its zero fill goes first
                ops.wait(ready)
                ops.xp.copyto(self.buffers[0], img)
                ops.record(seen)
            return self.buffers[0], None
        with ops.activate():
            self._make_buffers(img.shape, COPIES)
            busy = self.in_use()
            i = next(k for k, buf in enumerate(self.buffers) if not any(buf is b for b in busy))
            ops.wait(ready)
            ops.xp.copyto(self.buffers[i], img)
            ops.record(self._copied[i])
            ops.record(seen)  # the same stream as the paste-back: its wait costs nothing
        return self.buffers[i], self._copied[i]

    def _make_buffers(self, shape: tuple, n: int) -> None:
        """The buffers (and ``apart``'s events), once: made on the current stream, which is the one
        that copies into them (the zero fill of :meth:`Ops.empty` is ordered before the copy)."""
        if not self.buffers:
            self.buffers = [self.ops.empty(shape, np.uint8) for _ in range(n)]
            self._copied = [self.ops.event() for _ in range(n)] if self.apart else []


__all__ = ["COPIES", "DetectionCopies"]
