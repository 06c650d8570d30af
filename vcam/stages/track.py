"""Track stage: follow faces across frames with few full-frame scans, stable IDs and smooth landmarks.

Per frame, :class:`Tracker` either scans the whole frame or, between scans, runs the detector only
inside one square region around each track's predicted position (all regions in one batched call),
plus one slice of a rolling search for new faces: over ``rolling`` frames it covers the coarse scan
and every tile a full scan uses (:meth:`vcam.stages.detect.FaceDetector.tiles`), so a face entering
anywhere is found within ``rolling`` frames while the cost per frame stays bounded. On the CPU the
slices run beside the frame (:class:`~vcam.stages.search.SearchWorker`, ``[track] search``) on a
core the frame's own work leaves idle; tracked frames then need no scheduled full scan.
A full scan (:meth:`vcam.stages.detect.FaceDetector.detect`: the coarse pass plus the tiles) happens on
the first frame, every ``rescan_every`` frames, whenever a track is not found in its region (same
frame), and — while nothing is tracked — on every other frame (every frame with ``rescan_every =
1``), so a face that comes back is found within two frames. A scheduled scan that misses a tracked
face (too small for the whole-frame input) looks in that face's region too before counting a miss. A new frame size or
a sequence number going backwards (a restarted source) starts over.

:meth:`Tracker.update` is :meth:`~Tracker.launch` (the detector calls queued on the device) then
:meth:`~Tracker.complete` (wait, decode, match). A pipeline that does not want a frame's swap to wait
for its detection asks :meth:`~Tracker.confident` (every tracked face found in the last frame), swaps
with :meth:`~Tracker.predict`'s tracks (moved by their velocity), and completes that frame's
detection when the next one comes (``[track] predict``).

A track's region stays where it is while its face stays near its centre (:data:`_HOLD_SHIFT`):
the detector's landmarks move with the crop it is given, so a still face is seen through one crop
and its landmarks hold still; a full scan also runs the tracks' regions and takes a tracked
face's landmarks from there, at the region's scale, not the scan's coarser one.

Detections are matched to tracks by IoU (falling back to centre distance), IDs are never reused,
and a track survives ``max_missed`` frames without a detection; while missed it is swapped only
where its face still looks as it did (:meth:`Tracker._look_again`). Boxes and landmarks are
smoothed in the head's own coordinates (:class:`~vcam.stages.smoothing.HeadFilter`: the head's
pose by a One-Euro cutoff around its own velocity, the landmarks' shape on the head slowly), so a
still face stops jittering while a moving one is followed without lag.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vcam.stages.association import associate
from vcam.stages.detect import Detector
from vcam.stages.detections import box_iou, inside_larger, merge, plausible_face, smallest_searched
from vcam.stages.search import SearchWorker
from vcam.stages.smoothing import HeadFilter
from vcam.types import Detection, Track

_DUPLICATE_IOU = 0.6  # two tracks this overlapped follow one face: the younger one goes
_KEEP_BONUS = 1.5  # an existing track keeps its slot unless a new face is this much larger
_VEL_GAIN = 0.6  # weight of the newest motion in the velocity estimate
#: A confirmed track whose last detections score a median below the hit score goes back to a
#: candidate (not swapped, not counted) until it is confirmed again. Measured on the real-photo
#: set (benchmarks/precision_real.py, 1080p and 4K): every track on a real face scores a median
#: of 0.996-1.0 and a 5th percentile of 0.85 or more; the candidates that followed real objects
#: (a clock, a coffee cup on its plate, a motorcycle's lamp) for up to 5 frames scored 0.6-0.77
#: there, what a shiny object that once got confirmed keeps scoring in its own region.
_HISTORY = 5
#: A new track needs a face of at least this share of the smallest face a full scan promises to
#: find (:func:`~vcam.stages.detections.smallest_searched`: 40 px at 1080p, 60 px at 4K). Smaller
#: ones (a crowd far away, a cartoon on a poster) are only ever seen near a tracked face, inside its
#: region, never by the search itself: swapped, they would come and go with that face's region.
_NEW_FACE_SHARE = 0.75
#: A track missed in a frame stays swapped while the grey look of the box its motion predicts
#: correlates this well with its look at the last detection (_PATCH x _PATCH samples). Measured on
#: the real-photo set (benchmarks/precision_real.py, 1080p): a face in view against its look a
#: frame before, median 0.88, 1st percentile 0.54; the box of a track missed because its face
#: vanished or went behind an object -0.3 to 0.47 (a face partly hidden: 0.54-0.75).
_LOOK_ALIKE = 0.5
_PATCH = 16
#: A track's region stays where it is while its predicted face is within this share of the face's
#: side of the region's centre and within this ratio of the size the region was made for: the
#: detector's landmarks move with the crop it is given (a CNN is not shift-invariant), so a region
#: re-centred on every frame's noisy box made a still head's raw landmarks jump a median 4.9 px at
#: 1080p where one fixed crop gave 0.29 px (benchmarks/precision_real.py's still head, 40 frames).
#: Small, because a held region that finally moves makes the landmarks step: on that scene's moving
#: head 0.03 / 1.05 gave a median jump of 0.61 px, max 1.92; 0.08 / 1.1 0.82 and 2.39; 0.15 / 1.15
#: 0.78 and 2.24 (the still head 0.04-0.06 px with each).
_HOLD_SHIFT = 0.03
_HOLD_SCALE = 1.05


@dataclass(frozen=True)
class TrackParams:
    """What the tracker reads: full-scan cadence, the rolling search, ROI scale, how long a track
    survives unseen, and the head filter's cutoffs. The ``[track]`` section of the config documents each
    and carries the same defaults (tests/runtime check that they agree)."""

    rescan_every: int = 30
    rolling: int = 5
    roi_scale: float = 2.0
    max_missed: int = 2
    min_cutoff: float = 0.2
    beta: float = 2.0
    confirm_hits: int = 2
    confirm_score: float = 0.9
    confirm_at_once: float = 0.95
    confirm_within: int = 5


@dataclass
class _State:
    """Tracker-private state of one track (the public view is ``track``)."""

    track: Track
    raw_box: np.ndarray  # last detected box (unsmoothed), float64
    seen_seq: int  # seq of that detection
    filter: HeadFilter
    smooth_box: np.ndarray  # the filter's last box and landmarks (the track's, before any prediction)
    smooth_landmarks: np.ndarray
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(4))  # box change per frame
    hits: int = 1  # detections that were hits (score and landmark check: what confirms a new track)
    confirmed: bool = True  # swapped and counted; a new track is not until confirmed
    scores: list[float] = field(default_factory=list)  # its last _HISTORY detections' scores
    window_from: int = 0  # the age its confirmation window opened at (0, or when it was doubted)
    look: Any = None  # its face at the last detection, a small grey patch (see _patch)
    shown: bool = True  # swapped and counted while missed: its face still looks the same where it went
    region: np.ndarray | None = None  # the square it was last searched in (x0, y0, side), held (_HOLD_SHIFT)

    def predict(self, seq: int) -> np.ndarray:
        """Box expected at ``seq`` (constant velocity from the last detection)."""
        return self.raw_box + self.velocity * max(0, seq - self.seen_seq)


def _box_side(box: np.ndarray) -> float:
    return float(max(box[2] - box[0], box[3] - box[1]))


@dataclass
class Step:
    """One frame between :meth:`Tracker.launch` and :meth:`Tracker.complete`: the frame, its
    detector calls in flight, and the boxes the tracks were expected at."""

    frame: Any
    seq: int
    t: float
    full: bool
    predicted: np.ndarray
    pending: Any = None
    coarse: Any = None
    regions: int = 0
    deferred: bool = False
    refine: Any = None  # a full scan's tracks' own regions (their faces at the regions' scale)

    def ready(self) -> bool:
        """Its detector calls have finished on the device: :meth:`Tracker.complete` will not wait."""
        return all(p.ready() for p in (self.pending, self.coarse, self.refine) if p is not None)


def _launch(detector: Detector, kind: str, frame: Any, rects: np.ndarray | None = None) -> Any:
    """A detector call queued (``launch_*`` of :class:`vcam.stages.detect.FaceDetector`), or run at once
    for a detector with only the blocking calls (wrapped so that ``result()`` gives it)."""
    from vcam.stages.detect import Pending

    if kind == "regions":
        fn = getattr(detector, "launch_regions", None)
        return fn(frame, rects) if fn is not None else Pending.done(detector.detect_regions(frame, rects))
    if kind == "coarse":
        fn = getattr(detector, "launch_coarse", None)
        if fn is not None:
            return fn(frame)
        return Pending.done(getattr(detector, "detect_coarse", detector.detect)(frame))
    fn = getattr(detector, "launch_full", None)
    return fn(frame) if fn is not None else Pending.done(detector.detect(frame))


class FaceTracker(Protocol):
    """What the pipeline asks of a tracker: :class:`Tracker` (the bench's fixed tracker is another)."""

    def update(self, frame_bgr: Any, seq: int, t: float | None = None) -> list[Track]: ...
    def launch(self, frame_bgr: Any, seq: int, t: float | None = None, *, deferred: bool = False) -> Any: ...
    def complete(self, step: Any) -> list[Track]: ...
    def confident(self, frame_bgr: Any, seq: int) -> bool: ...
    def predict(self, seq: int) -> list[Track]: ...


class Tracker:
    """Faces across frames: ROI detection between full scans, stable IDs, smoothing on the head.

    ``detector``: a :class:`vcam.stages.detect.Detector`; ``track_cfg``: scan interval, ROI size and scale,
    misses allowed, filter settings; ``max_faces``: most tracks kept (largest faces first).
    ``fps``: frame rate used for the filter's clock when :meth:`update` gets no timestamp.
    ``search``: a :class:`~vcam.stages.search.SearchWorker` that runs the rolling search beside the
    frame (its cycle ``max_lag`` frames shorter, so new faces come as soon); None: in the frame.

    After each :meth:`update`: ``last_full_scan`` (whether this frame was scanned whole),
    ``frames`` and ``full_scans`` (counts since start), ``roi_calls`` (batched region calls),
    ``last_detections`` (detections of this frame, frame pixels) and ``last_matched``
    (track id -> the raw detection that updated it this frame).
    """

    def __init__(
        self,
        detector: Detector,
        track_cfg: TrackParams | None = None,
        max_faces: int = 8,
        *,
        fps: float = 30.0,
        search: SearchWorker | None = None,
    ) -> None:
        if max_faces < 1:
            raise ValueError(f"max_faces must be at least 1, got {max_faces}")
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.detector = detector
        self.cfg = track_cfg or TrackParams()
        self.max_faces = int(max_faces)
        self.fps = float(fps)
        self.search = search
        #: A new face lying on a larger one starts no track, and the coarse scan's copy of a face
        #: its region found is left out (off only to measure what that gains).
        self.admit_check = True
        dcfg = getattr(detector, "cfg", None)
        self._small_face = float(getattr(dcfg, "small_face", 0) or 0)
        self._hit_score = max(float(getattr(dcfg, "score", 0.6)), self.cfg.confirm_score - 0.1)
        #: How far (track sides) a tracked face may have moved and still be matched: the half side
        #: of the region its track searches (see :func:`associate`).
        self._reach = 0.5 * float(self.cfg.roi_scale)
        self._next_id = 1
        self.reset()

    def reset(self) -> None:
        """Forget every track and counter (IDs keep increasing)."""
        self._states: list[_State] = []
        self._cycle: list | None = None  # the rolling search's slices for this frame size
        if getattr(self, "search", None) is not None:
            self.search.drop()  # type: ignore[union-attr]
        self._cursor = 0
        self._last_scan_seq: int | None = None
        self._shape: tuple[int, ...] | None = None
        self._last_seq: int | None = None
        self.frames = 0
        self.full_scans = 0
        self.roi_calls = 0
        self.last_full_scan = False
        self.last_detections: list[Detection] = []
        self.last_matched: dict[int, Detection] = {}
        self.last_seq: int | None = None  # the frame the last_* fields describe

    def warmup(self, frame_bgr: Any) -> None:
        """Run a track's look (:func:`_patches`, :func:`_alike`) once on ``frame_bgr``, a frame of
        the kind the frames will be (its content does not matter): on CUDA each CuPy kernel they
        use is built at its first call (NVRTC, or CuPy's disk cache), so the first face a frame
        misses would pay for it (on the H100, four streams of six faces stood still 0.55 s at the
        first lost track, seven builds of 70-90 ms; the first detection applied: four more)."""
        h, w = np.shape(frame_bgr)[:2]
        for n in (1, 2):  # the looks of one face and of several (a reduction may pick its kernel by size)
            looks = _patches(frame_bgr, np.tile([0.0, 0.0, w / 2.0, h / 2.0], (n, 1)))
            _alike(looks[0], looks[-1])

    @property
    def tracks(self) -> list[Track]:
        """Live confirmed tracks, by id: what is swapped and counted. A new track is followed (its
        region searched every frame) but left out until confirmed: ``confirm_hits`` detections
        whose landmarks make a face (:func:`~vcam.stages.detections.plausible_face`) within its
        first ``confirm_within`` frames (one more where none scores ``confirm_score``), or at once
        when its first detection scores at least ``confirm_at_once`` and its landmarks make a face;
        one not confirmed in time is dropped. A confirmed track whose last detections score a
        median below the hit score is a candidate again (:data:`_HISTORY`), with a fresh window to
        confirm in."""
        return [s.track for s in self._states if s.confirmed and s.shown]

    @property
    def candidates(self) -> int:
        """Tracks followed but not confirmed yet."""
        return sum(not s.confirmed for s in self._states)

    # -- the per-frame step ------------------------------------------------------------------
    def update(self, frame_bgr: np.ndarray, seq: int, t: float | None = None) -> list[Track]:
        """Process frame ``seq`` (timestamp ``t`` seconds, default ``seq / fps``); returns live tracks.

        A track with ``missed > 0`` was not found in this frame: it is returned, moved by its motion,
        only while its face still looks as at its last detection there (else it is kept hidden).
        The same :class:`Track` object is returned for an id on every frame (its arrays are
        replaced, never written in place), so a caller may keep per-track data on it, such as
        ``similarity``. :meth:`update` is :meth:`launch` then :meth:`complete`.
        """
        return self.complete(self.launch(frame_bgr, seq, t))

    def launch(self, frame_bgr: Any, seq: int, t: float | None = None, *, deferred: bool = False) -> Step:
        """Queue frame ``seq``'s detector calls (the regions and rolling slice, or a full scan)
        without waiting for them; :meth:`complete` applies them, and nothing else may reach the
        tracker in between. The frame must stay unchanged until then (a lost track is looked for
        again in it), unless ``deferred``: the frame may have changed by then (it was swapped with
        :meth:`predict`'s tracks meanwhile), so a track its detection misses is counted as missed,
        and the next frame, no longer :meth:`confident`, is scanned as :meth:`update` does."""
        seq = int(seq)
        t = seq / self.fps if t is None else float(t)
        shape = tuple(np.shape(frame_bgr))
        if shape != self._shape or (self._last_seq is not None and seq < self._last_seq):
            # A new source, a new size, or a restarted one (a looping file): old positions mean nothing.
            self._states = []
            self._last_scan_seq = None
            self._shape = shape
            self._cycle = None
            if self.search is not None:
                self.search.drop()
        self._last_seq = seq
        # A deferred frame's detection after a tracked face was missed (see predictable): the whole
        # frame, so the face is found wherever it went.
        full = self._scan_due(seq) or (deferred and any(s.track.missed for s in self._states if s.confirmed))
        predicted = np.array([s.predict(seq) for s in self._states]).reshape(-1, 4)
        step = Step(frame=frame_bgr, seq=seq, t=t, full=full, predicted=predicted, deferred=deferred)
        if full:
            step.pending = _launch(self.detector, "full", frame_bgr)
            if self._states and not deferred:
                # The tracks' regions too: a full scan sees a face coarser than its region does, and
                # its landmarks differ by several pixels (the paste jumped on every scan).
                step.refine = _launch(self.detector, "regions", frame_bgr, self._held_regions(predicted))
                self.roi_calls += 1
        elif self._states:
            # The tracks' regions, and this frame's slice of the rolling search for new faces (a
            # share of the tiles in the same batch, or the coarse scan), so a face entering anywhere
            # is found within ``rolling`` frames at a bounded cost per frame.
            item = self._rolling_item(shape)
            if self.search is not None:  # the slice goes to the worker (held back while it is busy)
                if item is not None and not self.search.submit(frame_bgr, seq, item):
                    self._cursor -= 1
                item = None
            tiles = item if isinstance(item, np.ndarray) else None
            rects = self._held_regions(predicted)
            step.regions = len(rects)
            if tiles is not None and len(tiles):
                rects = np.concatenate([rects, tiles])
            step.pending = _launch(self.detector, "regions", frame_bgr, rects)
            self.roi_calls += 1
            if isinstance(item, str):  # "coarse"
                step.coarse = _launch(self.detector, "coarse", frame_bgr)
        return step

    def complete(self, step: Step) -> list[Track]:
        """Apply the detections of a :meth:`launch` (waiting for them if they are not there yet);
        returns live tracks, as :meth:`update` does."""
        frame_bgr, seq, t, predicted = step.frame, step.seq, step.t, step.predicted
        self.frames += 1
        self.last_matched = {}
        full = step.full
        dets: list[Detection] | None = None
        matches: list[tuple[int, int]] = []
        lost: list[int] = []
        fresh: list[int] = []
        searched = self.search.collect(seq) if self.search is not None else None
        if full:
            dets = list(step.pending.result())
            matches, lost, fresh = associate(predicted, [d.box for d in dets])
            own = step.refine.result() if step.refine is not None else None
            if own is not None:
                for ti, di in matches:
                    dets[di] = _finer(dets[di], own[ti])
            if lost and not step.deferred:
                # The scheduled scan missed a tracked face (the whole-frame input may be too coarse
                # for a small one): look where it should be before counting a miss.
                if own is not None:
                    extra = self._found([own[k] for k in lost], len(lost), frame_bgr.shape[:2])
                else:
                    extra = self._detect_regions(frame_bgr, predicted[lost])
                found, lost_k, _ = associate(predicted[lost], [d.box for d in extra])
                for k, e in found:
                    dets.append(extra[e])
                    matches.append((lost[k], len(dets) - 1))
                lost = [lost[k] for k in lost_k]
        elif step.pending is not None:
            dets = self._found(step.pending.result(), step.regions, frame_bgr.shape[:2], predicted)
            if step.coarse is not None:  # new faces (with admit_check: a tracked face's region found it finer)
                coarse = step.coarse.result()
                dets = merge(dets + (_apart(coarse, [d.box for d in dets], 0.3) if self.admit_check else coarse), 0.5)
            if searched is not None and searched[1]:
                dets += _apart(searched[1], [d.box for d in dets] + list(predicted))
            matches, lost, fresh = associate(predicted, [d.box for d in dets])
            if lost and not step.deferred:
                # A track left its region (fast motion, occlusion, or it left the frame): look
                # everywhere before counting a miss.
                full = True
                dets = self.detector.detect(frame_bgr)
                matches, lost, fresh = associate(predicted, [d.box for d in dets])
        if lost and fresh and dets:
            # What is left after every look: a detection inside the region a lost track searches,
            # of its size, is that face having moved fast (or a predicted frame's face), not a new
            # face beside a stale track (see associate).
            more, lost_k, fresh_k = associate(predicted[lost], [dets[d].box for d in fresh], self._reach)
            matches += [(lost[t], fresh[d]) for t, d in more]
            lost, fresh = [lost[k] for k in lost_k], [fresh[k] for k in fresh_k]
        if full:
            self.full_scans += 1
            self._last_scan_seq = seq
        self.last_full_scan = full
        self.last_detections = list(dets or [])
        self.last_seq = seq

        for ti, di in matches:
            self._apply(self._states[ti], dets[di], seq, t)  # type: ignore[index]
        if matches:  # each face's look at this detection (for the frames it may be missed in), at once
            applied = [self._states[ti] for ti, _ in matches]
            for st, look in zip(applied, _patches(frame_bgr, np.array([st.raw_box for st in applied]))):
                st.look = look
        for ti in lost:
            self._states[ti].track.missed += 1
        if not step.deferred:  # a deferred frame may have been swapped since: nothing to look at
            self._look_again(frame_bgr, seq, [self._states[ti] for ti in lost])
        for s in self._states:
            s.track.age += 1
        window = self.cfg.confirm_within
        self._states = [
            s
            for s in self._states
            if s.track.missed <= self.cfg.max_missed and (s.confirmed or s.track.age - s.window_from < window)
        ]
        if dets and fresh:
            cands = [dets[d] for d in fresh]
            if self.admit_check:
                # A new face on a larger one (a thumbnail by the ear, a face in a face's texture) is
                # not a person, nor is one far smaller than the search looks for (_NEW_FACE_SHARE):
                # it starts no track, whichever scan found it.
                larger = [d.box for d in dets] + [s.track.box for s in self._states]
                on_face = inside_larger(cands, np.asarray(larger, dtype=np.float64).reshape(-1, 4))
                least = _NEW_FACE_SHARE * smallest_searched(self._small_face, *np.shape(frame_bgr)[:2])
                cands = [c for c, inside in zip(cands, on_face) if not inside and _box_side(c.box) >= least]
            self._admit(cands, seq, t, frame_bgr)
        self._drop_duplicates()
        if self.admit_check:
            self._drop_on_larger()
        return self.tracks

    # -- prediction (the swap need not wait for the detection) --------------------------------
    def confident(self, frame_bgr: Any, seq: int) -> bool:
        """Can frame ``seq`` be swapped with :meth:`predict`'s tracks while its detection runs?
        Yes when faces are tracked, each was found in the last frame applied, and this frame
        continues that source (same size, later sequence number)."""
        return (
            bool(self._states)
            and all(s.track.missed == 0 for s in self._states)
            and tuple(np.shape(frame_bgr)) == self._shape
            and self._last_seq is not None
            and int(seq) > self._last_seq
        )

    def predictable(self, frame_bgr: Any, seq: int) -> bool:
        """Like :meth:`confident`, also through a miss: confirmed faces are tracked, none missed
        in as many frames as ``max_missed`` allows (so a face gone is predicted on no frame the
        waiting path would not have swapped it on), and this frame continues that source. Faces not
        confirmed yet (not swapped) are not asked about. A frame predicted after a miss has its
        (deferred) detection scan the whole frame (:meth:`launch`)."""
        live = [s for s in self._states if s.confirmed]
        return (
            bool(live)
            and all(s.track.missed < max(1, self.cfg.max_missed) for s in live)
            and tuple(np.shape(frame_bgr)) == self._shape
            and self._last_seq is not None
            and int(seq) > self._last_seq
        )

    def predict(self, seq: int) -> list[Track]:
        """The live tracks moved to frame ``seq``: each box and its landmarks shifted and scaled by
        the track's motion per frame since its last detection (constant velocity from the smoothed
        position). Sets the tracks' arrays (replaced, not written in place) and returns them; the
        detection of ``seq`` later corrects them (:meth:`complete`)."""
        for s in self._states:
            gap = max(0, int(seq) - s.seen_seq)
            s.track.box, s.track.landmarks = _moved(s.smooth_box, s.smooth_landmarks, s.velocity * gap)
        return self.tracks

    # -- helpers -----------------------------------------------------------------------------
    def _scan_due(self, seq: int) -> bool:
        if self._last_scan_seq is None:
            return True
        since = seq - self._last_scan_seq
        if not self._states:  # nothing to track: look again soon (every other frame at most)
            return since >= min(2, self.cfg.rescan_every)
        # The search beside the frame covers it every few frames, coarse scan and tiles: no frame
        # waits for a scheduled scan.
        return self.search is None and since >= self.cfg.rescan_every

    def _regions(self, boxes: np.ndarray) -> np.ndarray:
        centre = (boxes[:, :2] + boxes[:, 2:]) / 2
        side = self.cfg.roi_scale * np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]).clip(1.0)
        return np.column_stack([centre - side[:, None] / 2, side])

    def _held_regions(self, predicted: np.ndarray) -> np.ndarray:
        """The tracks' regions for boxes ``predicted`` (one per state): each track keeps the square
        it was searched in last while its predicted face stays near that square's centre and of
        the size it was made for (:data:`_HOLD_SHIFT`), so a still face is seen through the same
        crop frame after frame; else a square centred on the prediction (:meth:`_regions`)."""
        fresh = self._regions(predicted)
        for k, s in enumerate(self._states):
            old = s.region
            if old is not None:
                face = max(_box_side(predicted[k]), 1.0)
                made_for = old[2] / self.cfg.roi_scale
                shift = np.abs((predicted[k, :2] + predicted[k, 2:]) / 2 - (old[:2] + old[2] / 2)).max()
                if shift <= _HOLD_SHIFT * face and 1 / _HOLD_SCALE <= face / made_for <= _HOLD_SCALE:
                    fresh[k] = old
            s.region = fresh[k].copy()
        return fresh

    def _rolling_item(self, shape: tuple) -> Any:
        """This frame's slice of the rolling search: ``"coarse"``, an array of tiles, or None."""
        if self.cfg.rolling <= 0:
            return None
        if self._cycle is None:
            tiles_of = getattr(self.detector, "tiles", None)
            tiles = tiles_of(shape[0], shape[1]) if tiles_of is not None else np.zeros((0, 3))
            # Beside the frame a slice's faces come max_lag frames late: a cycle that much shorter.
            slots = self.cfg.rolling if self.search is None else max(2, self.cfg.rolling - self.search.max_lag)
            parts = slots - 1
            chunks = [c for c in np.array_split(tiles, parts) if len(c)] if parts and len(tiles) else []
            self._cycle = ["coarse", *chunks] + [None] * (slots - 1 - len(chunks))
        item = self._cycle[self._cursor % len(self._cycle)]
        self._cursor += 1
        return item

    def _detect_regions(self, frame: np.ndarray, predicted: np.ndarray) -> list[Detection]:
        rects = self._regions(predicted)
        per_region = self.detector.detect_regions(frame, rects)
        self.roi_calls += 1
        return self._found(per_region, len(rects), frame.shape[:2])

    def _found(self, per_region: list[list[Detection]], n: int, hw: tuple, tracked: Any = ()) -> list[Detection]:
        """The faces of a regions call: those of the ``n`` tracks' regions, and the small ones of
        the tiles after them (none inside or on a face found or ``tracked``, boxes); each face once."""
        found = [d for dets in per_region[:n] for d in dets]
        if len(per_region) > n:
            others = [d.box for d in found] + [b for b in np.asarray(tracked).reshape(-1, 4)]
            found += self.detector.small_faces(per_region[n:], *hw, others=others)
        if len(found) < 2:
            return found
        return merge(found, 0.5)  # overlapping regions can see the same face twice

    def _look_again(self, frame: Any, seq: int, held: list[_State]) -> None:
        """A track missed in this frame stays swapped and counted only while its face still looks
        as at its last detection where its motion takes it (:data:`_LOOK_ALIKE`); it then follows
        that motion. Else (the face left, vanished or went behind something) it is kept, hidden,
        for the ``max_missed`` frames it may be found again in."""
        looks = _patches(frame, np.array([s.predict(seq) for s in held])) if held else []
        for s, look in zip(held, looks):
            s.shown = s.look is not None and _alike(look, s.look) >= _LOOK_ALIKE
            if s.shown:
                s.track.box, s.track.landmarks = _moved(s.smooth_box, s.smooth_landmarks, s.velocity * (seq - s.seen_seq))

    def _apply(self, state: _State, det: Detection, seq: int, t: float) -> None:
        """Update a track with its detection in frame ``seq`` (its ``look`` is left to the caller,
        which takes every matched face's at once)."""
        box = det.box.astype(np.float64)
        gap = max(1, seq - state.seen_seq)
        step = (box - state.raw_box) / gap
        state.velocity = state.velocity + _VEL_GAIN * (step - state.velocity)
        state.raw_box = box
        state.seen_seq = seq
        state.smooth_landmarks, state.smooth_box = state.filter(det.landmarks, box, t)
        tr = state.track
        tr.landmarks = state.smooth_landmarks.astype(np.float32)
        tr.box = state.smooth_box.astype(np.float32)
        tr.score = float(det.score)
        tr.missed = 0
        tr.last_seen = seq
        state.shown = True
        self.last_matched[tr.id] = det
        state.scores = [*state.scores[1 - _HISTORY :], float(det.score)]
        if not state.confirmed and self._hit(det):
            state.hits += 1
            # one hit more where none of them scored as faces do (_confirms: a coffee cup, 0.82 0.65 0.80)
            need = self.cfg.confirm_hits + self._smaller(det) + (not self._confirms(state))
            state.confirmed = state.hits >= need
        elif state.confirmed and self._doubted(state):
            # A face's detections keep scoring near 1; a shiny object found in its own region
            # drifts down to the detector's threshold: a candidate again, with a fresh window.
            state.confirmed, state.hits, state.window_from = False, 0, tr.age
            state.scores = []

    def _confirms(self, state: _State) -> bool:
        """Has one of a candidate's detections (its last :data:`_HISTORY`) scored ``confirm_score``?
        Else it needs a hit more. Two hits alone (within 0.1 of it) confirmed an object: on the
        real-photo set's 2,000 frames (1080p and 4K, 1,000 each) the 52 tracks on objects peaked at
        0.86 and none had three hits (a coffee cup 0.82, 0.65, 0.80: confirmed, pasted for 3 frames
        at 4K), while every face track confirmed by hits had reached 0.93 by then. A face the
        detector keeps scoring 0.8-0.9 (dim light) is still swapped, a frame later."""
        return max(state.scores, default=0.0) >= self.cfg.confirm_score

    def _doubted(self, state: _State) -> bool:
        """Has a confirmed track's score history fallen below a face's (see :data:`_HISTORY`)?"""
        if self.cfg.confirm_hits <= 1 or len(state.scores) < 3:
            return False
        return statistics.median(state.scores) < self._hit_score  # a few floats: no NumPy call

    def _new_state(self, det: Detection, seq: int, t: float, frame: Any = None) -> _State:
        flt = HeadFilter(self.cfg.min_cutoff, self.cfg.beta)
        box = det.box.astype(np.float64)
        flt.reset(det.landmarks, box, t)
        track = Track(
            id=self._next_id,
            box=det.box.astype(np.float32).copy(),
            landmarks=det.landmarks.astype(np.float32).copy(),
            score=float(det.score),
            age=0,
            missed=0,
            last_seen=seq,
        )
        self._next_id += 1
        self.last_matched[track.id] = det
        return _State(
            track=track,
            raw_box=box,
            seen_seq=seq,
            filter=flt,
            smooth_box=box.copy(),
            smooth_landmarks=det.landmarks.astype(np.float64).copy(),
            confirmed=self.cfg.confirm_hits <= 1
            # at once only above what objects reach: the real-photo set's objects were first found at up
            # to 0.924 (a cat, 1080p, search beside the frame: pasted for a frame at 0.9), faces 0.6-1.0
            or (det.score >= self.cfg.confirm_at_once and not self._smaller(det) and plausible_face(det)),
            scores=[float(det.score)],
            # Its first detection counts toward confirming it only when it is a hit itself (on the
            # real-photo set a motorcycle's lamp found at 0.72 then once at 0.91 was confirmed).
            hits=int(self._hit(det)),
            look=_patch(frame, box) if frame is not None else None,
        )

    def _smaller(self, det: Detection) -> int:
        """1 for a face smaller than the detector's ``small_face`` (what a full scan promises to
        find; below it cartoon faces, prints and far crowds look alike): it needs one hit more and
        no first score confirms it at once; else 0."""
        side = max(float(det.box[2] - det.box[0]), float(det.box[3] - det.box[1]))
        return int(side < self._small_face)

    def _hit(self, det: Detection) -> bool:
        """A detection that counts toward confirming a new track: its landmarks make a face and it
        scores within 0.1 of ``confirm_score`` (what a shiny ball or a texture rarely keeps doing)."""
        return det.score >= self._hit_score and plausible_face(det)

    def _admit(self, candidates: list[Detection], seq: int, t: float, frame: Any = None) -> None:
        """Start tracks for unmatched detections, keeping the ``max_faces`` largest faces."""
        if not candidates:
            return
        pool: list[tuple[float, _State | Detection]] = [(_area(s.track.box) * _KEEP_BONUS, s) for s in self._states]
        pool += [(d.area, d) for d in candidates]
        pool.sort(key=lambda p: -p[0])
        kept = [item for _, item in pool[: self.max_faces]]
        states = [k for k in kept if isinstance(k, _State)]
        states += [self._new_state(k, seq, t, frame) for k in kept if isinstance(k, Detection)]
        self._states = sorted(states, key=lambda s: s.track.id)

    def _drop_duplicates(self) -> None:
        if len(self._states) < 2:
            return
        boxes = np.array([s.track.box for s in self._states])
        iou = box_iou(boxes, boxes)
        drop = set()
        for i in range(len(self._states)):
            for j in range(i + 1, len(self._states)):
                if i not in drop and j not in drop and iou[i, j] > _DUPLICATE_IOU:
                    drop.add(j)  # states are in id order: j is the younger track
        if drop:
            self._states = [s for k, s in enumerate(self._states) if k not in drop]

    def _drop_on_larger(self) -> None:
        """A track that lies mostly (70%) on a larger face seen in this frame (its box with the ears
        and hair around it) goes: a thumbnail by the ear that started while that face was hidden,
        or a part of a face found as a face. A face crossing in front of another hides it (that
        one is not seen), so it stays."""
        if len(self._states) < 2:
            return
        boxes = np.array([s.track.box for s in self._states], dtype=np.float64)
        side = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
        seen = np.array([s.track.missed == 0 for s in self._states])
        drop = set()
        for i, st in enumerate(self._states):
            others = boxes[(side > side[i]) & seen]
            d = Detection(st.track.box, st.track.landmarks, st.track.score)
            if len(others) and inside_larger([d], others, frac=0.7, larger=1.0, margin=0.15)[0]:
                drop.add(i)
        if drop:
            self._states = [s for k, s in enumerate(self._states) if k not in drop]


def _moved(box: np.ndarray, landmarks: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A box and its landmarks after the box's corners moved by ``shift``: the landmarks shifted
    and scaled with the box (float32 copies)."""
    new = box + shift
    old_c, new_c = (box[:2] + box[2:]) / 2, (new[:2] + new[2:]) / 2
    scale = max(_box_side(new), 1.0) / max(_box_side(box), 1.0)
    return new.astype(np.float32), (new_c + (landmarks - old_c) * scale).astype(np.float32)


def _finer(det: Detection, own: list[Detection]) -> Detection:
    """A full scan's detection of a tracked face, or the one its track's region found of the same
    face (IoU >= 0.5), which saw it at the region's finer scale."""
    if not own:
        return det
    iou = box_iou(np.asarray([det.box], np.float64), np.asarray([d.box for d in own], np.float64))[0]
    k = int(np.argmax(iou))
    return own[k] if iou[k] >= 0.5 else det


def _patch(frame: Any, box: np.ndarray) -> Any:
    """The grey look of ``box`` in ``frame`` (see :func:`_patches`)."""
    return _patches(frame, np.asarray(box, np.float64).reshape(1, 4))[0]


def _patches(frame: Any, boxes: np.ndarray) -> Any:
    """The grey looks of ``boxes`` (T, 4) in ``frame``: (T, _PATCH, _PATCH) samples of the channels'
    sum, in the frame's own kind of array, all in one gather (a device tensor stays on its device,
    its indices sent there in one copy: no wait for it)."""
    h, w = np.shape(frame)[:2]
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    t = np.linspace(0.0, 1.0, _PATCH)
    ys = (boxes[:, 1:2] + (boxes[:, 3:4] - boxes[:, 1:2]) * t).clip(0, h - 1).astype(np.intp)
    xs = (boxes[:, 0:1] + (boxes[:, 2:3] - boxes[:, 0:1]) * t).clip(0, w - 1).astype(np.intp)
    if isinstance(frame, np.ndarray):
        p = frame[ys[:, :, None], xs[:, None, :]]
        return p.sum(-1, dtype=np.float32) if p.ndim == 4 else p.astype(np.float32)
    if type(frame).__module__.split(".")[0] == "torch":  # a torch tensor: indices on its device
        import torch

        idx = torch.as_tensor(np.stack([ys, xs]), device=frame.device)
        p = frame[idx[0][:, :, None], idx[1][:, None, :]]
        return p.sum(-1, dtype=torch.float32) if p.ndim == 4 else p.float()
    import cupy  # a CuPy array (the GPU pipeline's frames): indices on its device

    idx = cupy.asarray(np.stack([ys, xs]))
    p = frame[idx[0][:, :, None], idx[1][:, None, :]]
    return p.sum(-1, dtype=cupy.float32) if p.ndim == 4 else p.astype(cupy.float32)


def _alike(a: Any, b: Any) -> float:
    """Normalised cross-correlation of two patches (1: the same look up to light and contrast)."""
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (((a * a).sum() * (b * b).sum()) ** 0.5 + 1e-6))


def _area(box: np.ndarray) -> float:
    return float(max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1]))


def _apart(found: list[Detection], boxes: list, iou: float = 0.0) -> list[Detection]:
    """The faces of an earlier frame's search (or of the coarse scan) that overlap none of
    ``boxes`` (this frame's faces and tracks) by more than ``iou``: new faces; the others are
    tracked faces where they were a frame or two ago (or found coarser than their regions did)."""
    if not boxes or not found:
        return list(found)
    over = box_iou(np.array([d.box for d in found]), np.asarray(boxes, dtype=np.float64).reshape(-1, 4))
    return [d for d, row in zip(found, over) if not np.any(row > iou)]
