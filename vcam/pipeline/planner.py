"""The detection schedule of one pipeline: which frame waits for its detection, which is swapped with
the tracks predicted for it, and when a predicted frame's detection is queued and applied.

This is the host's half of a frame, and the half that changes from frame to frame. The other half
(upload, convert, align, swap, masks, paste-back, convert back, download: :class:`~vcam.pipeline.pipeline.Pipeline`)
has fixed shapes once the face count is known, which is what a per-frame CUDA graph replays; keeping
the schedule here makes that split explicit (issue 43).

The rules (``predict``: ``[track] predict``; ``patient``: the pipeline's mode):

- a frame is swapped with predicted tracks when prediction is on and the tracker is confident
  (patient) or has tracks to predict, also through a miss (not patient); its own detection is then
  queued after its swap (:meth:`DetectionPlanner.leave` / :meth:`launch`, on the ops' back stream)
  and applied at the next frame or while the daemon waits for it (:meth:`settle`);
- any other frame waits for its detection; a detection still pending goes first (not patient: one
  not queued yet is dropped, counted in :attr:`skipped`);
- the tracker takes its frames in order: a pending detection is always applied before the next is
  queued.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vcam.pipeline.parts import arrived
from vcam.types import Track

if TYPE_CHECKING:
    from vcam.ops.base import Ops
    from vcam.stages.track import FaceTracker

#: A predicted frame's band of rows (y0, y1), or None for the whole frame.
Band = tuple[int, int] | None
#: What :meth:`DetectionPlanner.plan` gives: the tracks predicted for a frame (None: it waits for its
#: detection) and their band.
Plan = tuple[list[Track] | None, Band]


class DetectionPlanner:
    """The detection schedule (see the module docstring) over ``tracker`` on ``ops``.

    ``predict`` needs a tracker with ``confident``/``predict``/``launch``/``complete`` (see
    :mod:`vcam.stages.track`); without them it stays off."""

    def __init__(self, ops: Ops, tracker: FaceTracker, *, predict: bool = False, patient: bool = True) -> None:
        self.ops = ops
        self.tracker = tracker
        self.predict = bool(predict) and all(hasattr(tracker, m) for m in ("confident", "predict", "launch", "complete"))
        #: Wait for a pending detection before a frame, and predict only confident frames.
        self.patient = bool(patient)
        self.predicted = 0  # frames swapped with predicted tracks
        self.settled = 0  # their detections applied by settle(), before the next frame came
        self.skipped = 0  # predicted frames whose detection a newer frame's replaced (not patient)
        #: The tracker step of the frame before, applied at the next frame.
        self.step: Any = None
        #: (the frame's work, the frame its detection reads) that :meth:`leave` kept for :meth:`launch`.
        self.later: tuple[Any, Any] | None = None
        #: The next frame's plan, worked out while the daemon waits for it: (seq, tracks or None, band).
        #: Dropped whenever the tracker moves on.
        self.planned: tuple[int, list[Track] | None, Band] | None = None
        #: The sequence number the next frame is expected to carry (for :meth:`settle`'s plan).
        self.next_seq: int | None = None

    # -- one frame ----------------------------------------------------------------------------------
    def track(self, img: Any, seq: int) -> tuple[list[Track], bool]:
        """This frame's tracks, and whether its detection is still to be queued: the predicted
        tracks (queued after the swap) when :meth:`predicted` gives them, else the frame's own
        detection, waited for."""
        tracks = self.predicted_tracks(img, seq)
        if tracks is not None:
            return tracks, True
        if not self.patient and self.later is not None:
            self.later = None
            self.skipped += 1
        self.launch()
        self.apply()
        return self.tracker.update(img, seq), False

    def predicted_tracks(self, img: Any, seq: int) -> list[Track] | None:
        """The tracks predicted for frame ``seq`` when prediction is on and the frame is
        :meth:`predictable` (which looks at ``img``'s shape only, so it may be asked before the
        frame's pixels arrive), else None. Patient: a detection still pending is applied first
        (launched first if need be), waiting for it. Not: only if it has arrived (else
        :meth:`launch` applies it after this frame is published)."""
        if self.patient:
            self.launch()
            self.apply()
        elif self.step is not None and arrived(self.step):
            self.apply()  # it is there: decoding it costs no wait, and the prediction is fresher
        if self.predict and self.predictable(img, seq):
            return self.tracker.predict(seq)
        return None

    def predictable(self, img: Any, seq: int) -> bool:
        """Patient: the tracker is confident; not: it has tracks to predict, also through a miss
        (:meth:`~vcam.stages.track.Tracker.predictable`)."""
        tracker = self.tracker
        predictable = None if self.patient else getattr(tracker, "predictable", None)
        return bool(predictable(img, seq)) if predictable is not None else bool(tracker.confident(img, seq))

    def plan(self, seq: int, shape_of: Any, band_of: Callable[[list[Track]], Band]) -> Plan | None:
        """(the tracks predicted for frame ``seq`` or None, their band from ``band_of``), as
        :meth:`settle` planned them or worked out now (``shape_of``: an array of the frame's shape,
        all that :meth:`predictable` reads); None, leaving everything as it is, while a patient
        pipeline's detection of the frame before has not arrived (the frame then moves whole and
        waits for it after its upload is queued)."""
        planned = self.planned
        if planned is not None and planned[0] == seq:
            return planned[1], planned[2]
        if self.patient and (self.later is not None or (self.step is not None and not arrived(self.step))):
            return None
        tracks = self.predicted_tracks(shape_of, seq)
        band = band_of(tracks) if tracks else None
        self.planned = (seq, tracks, band)
        return tracks, band

    def begin(self, seq: int) -> None:
        """Frame ``seq`` begins: its plan is spent, the next one is ``seq + 1``."""
        self.planned, self.next_seq = None, seq + 1

    # -- detections ---------------------------------------------------------------------------------
    def apply(self) -> None:
        """Apply the pending detection, waiting for it if it has not arrived."""
        if self.step is not None:
            step, self.step = self.step, None
            self.planned = None
            self._complete(step)

    def _complete(self, step: Any) -> None:
        """Apply ``step`` on the front stream: the tracks' looks it reads from the detection's frame
        (a copy the back stream made) and the look-alike checks of later frames, which read them,
        queue in one order there (see :meth:`Pipeline._copy_for_detection`)."""
        with self.ops.front_stream():
            self.tracker.complete(step)

    def queue(self, seq: int, frame: Any) -> None:
        """Queue the detection of predicted frame ``seq`` (reading ``frame``) on the back stream
        (lowest priority: it takes what the swap leaves of the GPU); the pending one is applied
        first (waiting for it)."""
        self.apply()
        with self.ops.back_stream():
            self.step = self.tracker.launch(frame, seq, deferred=True)

    def leave(self, work: Any, frame: Any) -> None:
        """Keep a predicted frame's detection for :meth:`launch` (not patient: an older one not
        queued yet is dropped, its frame's copy overwritten)."""
        if self.later is not None:
            self.skipped += 1
        self.later = (work, frame)

    def launch(self) -> None:
        """Queue the detection :meth:`leave` kept; nothing when there is none."""
        if self.later is not None:
            (work, frame), self.later = self.later, None
            self.queue(work.stats.seq, frame)

    def settle(self) -> bool:
        """Apply the detection of the last predicted frame if it has arrived (never waits). True when
        no detection is pending any more (the caller may then plan the next frame)."""
        step = self.step
        if step is not None:
            if not arrived(step):
                return False
            self.step, self.planned = None, None
            self._complete(step)
            self.settled += 1
        return True

    def restart(self) -> None:
        """Forget the scene (after a pause): the pending detection applied, every track dropped, so
        the next frame is detected afresh."""
        self.launch()
        self.apply()
        self.planned = None
        reset = getattr(self.tracker, "reset", None)  # a fixed tracker (the bench's) has nothing to forget
        if reset is not None:
            reset()


__all__ = ["Band", "DetectionPlanner", "Plan"]
