"""The per-frame pipeline: the stage order, written once for every device.

    upload -> convert (to BGR) -> detect/track -> align -> swap (all faces, one batch) ->
    masks -> paste-back [-> face enhancer] [-> frame enhancer] -> convert (output format) -> download

:class:`Pipeline` runs that order over an :class:`~vcam.ops.Ops` (NumPy on the CPU, CuPy kernels on
CUDA) with stages that run on the same ops; nothing here branches on the device. It is built once
with every stage chosen (:mod:`vcam.runtime.assemble` does that from the config) and its buffers sized for
the frame; a frame of another size or format rebuilds them. ``submit`` queues a frame and returns
its slot, ``collect`` waits for the slot's output: on CUDA, frame N+1 can be submitted before
frame N is collected; its upload, conversion and detection run on the ops' front stream beside
frame N's swap and paste-back on the compute stream (each slot has its own converted frame, and
events order the two streams); ``process`` is both in one call. A frame swapped with predicted
faces (``[track] predict``) has its detection queued after its swap, on the ops' back stream
(lowest priority), reading a copy of the frame; the next frame applies it. ``submit`` is
``begin`` (up to the aligned faces), the swap, and ``finish`` (masks to download): a daemon running
several streams calls ``begin`` on each stream's pipeline, swaps the faces of all of them in one
batch (:meth:`~vcam.stages.swap.Swapper.swap_batch`) and calls ``finish`` on each.

A predicted frame moves in two row bands (``band``, on by default): its faces are known before the
frame is uploaded, so the rows their crops cover (the band) are uploaded and converted first and
the swap starts on them; the other rows are uploaded, converted, converted to the output format and
downloaded beside the swap, and after the paste-back only the band is converted and downloaded.
On a 1080p frame this takes most of the frame's transfers off its critical path. A frame that waits
for its detection, and a pipeline with an enhancer (which reaches past the swap's crops or changes
the whole frame), moves whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vcam import align
from vcam.errors import InputError
from vcam.kernels import convert
from vcam.kernels.convert import frame_shape
from vcam.kernels.records import recording
from vcam.pipeline.parts import FaceFilter, output_size, select_all
from vcam.pipeline.planner import Band, DetectionPlanner
from vcam.stages.swap import paste_faces
from vcam.state import Snapshot
from vcam.types import Frame, FrameStats, PixelFormat, Track

if TYPE_CHECKING:
    from vcam.ops.base import Ops
    from vcam.stages.enhance import Enhancer
    from vcam.stages.mapping import Assigner
    from vcam.stages.mask import Masker
    from vcam.stages.swap import Swapper
    from vcam.stages.track import FaceTracker
    from vcam.stages.upscale import FrameEnhancer

STAGES = ("convert_in", "detect_track", "swap", "mask", "blend", "upscale", "convert_out")


@dataclass
class Work:
    """One frame between :meth:`Pipeline.begin` and :meth:`Pipeline.finish`: its slot, stats, the
    converted frame (in the ops' memory), and the faces to swap: ``mats`` (n, 2, 3) crop-from-frame,
    ``sources`` (one face, or one per row), their ``landmarks`` (n, 5, 2) and ``boxes`` (n, 4)."""

    slot: int
    stats: FrameStats
    img: Any
    mats: np.ndarray
    sources: Any = None
    landmarks: np.ndarray | None = None
    boxes: np.ndarray | None = None
    #: Swapped with predicted tracks: its detection is queued after the swap (:meth:`Pipeline.finish`).
    detect_later: bool = False
    #: The rows (y0, y1) the swap reads and the paste-back writes, moved and converted first; the
    #: rest of the frame follows beside the swap (:meth:`Pipeline.finish`). None: the whole frame.
    band: tuple[int, int] | None = None
    #: (frame, its raw device copy) while its rows outside ``band`` are still to be uploaded and
    #: converted.
    rest: tuple[Frame, Any] | None = None
    #: The desk's settings of its snapshot (:data:`vcam.control.commands.SETTINGS`): the enhancer,
    #: its amount, the mouth and occlusion masks, mirror.
    settings: Mapping[str, object] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.mats.shape[0])


class Pipeline:
    """One frame through every stage (see the module docstring).

    ``ops``: the device. ``tracker``: ``update(frame, seq) -> tracks`` (its detector on the same ops).
    ``swapper``: a :class:`~vcam.stages.swap.Swapper` on the same ops. ``masker``: the mask stage
    (:class:`~vcam.stages.mask.Masker`; None: the swapper's mask alone). ``assigner``: which source each
    face gets (:class:`~vcam.stages.mapping.Assigner`; None: the active face for all). ``enhancer``:
    optional, after the paste-back. ``out_fmt``: the publisher's pixel format. ``face_filter``: which tracks to swap
    (default: all). ``ring``: frames in flight; an output returned by :meth:`collect` is valid until
    ``ring`` more frames are submitted. ``timing``: device-side stage times (CUDA events).
    ``predict``: swap with the tracks predicted for the frame while its detection runs
    (``[track] predict``, see :meth:`_track`); ``patient``: see :meth:`_predicted`. ``band``: move
    such a frame in two row bands (see the module docstring). ``degradable``: False for a stream
    whose every frame is kept (its optional stages stay on whatever the load). ``upscale_budget``:
    the latency budget the frame enhancer must fit (``[upscale] drop_first``; 0: always enhance).
    """

    def __init__(
        self,
        *,
        ops: Ops,
        tracker: FaceTracker,
        swapper: Swapper,
        out_fmt: PixelFormat = PixelFormat.BGR,
        enhancer: Enhancer | None = None,
        masker: Masker | None = None,
        assigner: Assigner | None = None,
        face_filter: FaceFilter | None = None,
        upscaler: FrameEnhancer | None = None,
        stages_on: dict[str, bool] | None = None,
        max_faces: int = 8,
        ring: int = 2,
        timing: bool = False,
        predict: bool = False,
        patient: bool = True,
        band: bool = True,
        degradable: bool = True,
        upscale_budget: float = 0.0,
        param_records: bool = False,
    ) -> None:
        self.ops = ops
        self.tracker = tracker
        self.swapper = swapper
        self.enhancer = enhancer
        self.masker = masker
        self.assigner = assigner
        self.upscaler = upscaler
        # Optional stages on/off (OPTIONAL_STAGES; missing = on): a dict the daemon's degrader changes
        # between frames, shared by the pipelines of all streams.
        self.stages_on: dict[str, bool] = stages_on if stages_on is not None else {}
        #: False for a stream whose every frame is kept (a file conversion): its optional stages stay
        #: on whatever the load, so the file's quality does not change half-way.
        self.degradable = bool(degradable)
        #: The latency budget the frame enhancer must fit (seconds; 0: always enhance): a frame it
        #: would push over the budget is resized instead (``[upscale] drop_first``).
        self.upscale_budget = float(upscale_budget)
        self._upscale_cost: float | None = None  # EMA of the enhancer's own time (s)
        self._base_latency: float | None = None  # EMA of a frame's latency without it (s)
        #: The masks' and paste-back's per-frame structs from one parameter record per ring slot
        #: (:mod:`vcam.kernels.records`; a per-frame CUDA graph's groundwork, off: by value).
        self.param_records = bool(param_records)
        self.out_fmt = PixelFormat(out_fmt)
        self.face_filter = face_filter or select_all
        self.max_faces = int(max_faces)
        self.ring = int(ring)
        self.timing = bool(timing)
        self._mats = np.zeros((self.max_faces, 2, 3), dtype=np.float64)
        self._geometry: tuple[int, int, PixelFormat] | None = None
        self._pending: dict[int, FrameStats] = {}
        self._slot = 0
        self.last_tracks: list[Track] = []
        #: The detection schedule: which frames are swapped with predicted tracks (``[track] predict``)
        #: and when their detections are queued and applied (:mod:`vcam.pipeline.planner`).
        self.planner = DetectionPlanner(ops, tracker, predict=predict, patient=patient)
        #: Move a predicted frame in two row bands (see the module docstring).
        self.band = bool(band)
        self.banded = 0  # frames moved in bands
        # id(track) -> (its landmarks, (template, crop size), crop-from-frame): see _crop_from_frame.
        self._aligned: dict[int, tuple[np.ndarray, tuple[str, int], np.ndarray]] = {}
        self._flipped: dict[tuple, Any] = {}  # the mirrored frame's buffer, by shape

    # The planner's switches and counts, as the daemon, the benchmarks and the tests read and set them.
    @property
    def predict(self) -> bool:
        return self.planner.predict

    @predict.setter
    def predict(self, on: bool) -> None:
        self.planner.predict = bool(on)

    @property
    def patient(self) -> bool:
        return self.planner.patient

    @patient.setter
    def patient(self, on: bool) -> None:
        self.planner.patient = bool(on)

    @property
    def predicted(self) -> int:
        return self.planner.predicted

    @property
    def settled(self) -> int:
        return self.planner.settled

    @property
    def skipped_detections(self) -> int:
        return self.planner.skipped

    # -- buffers ----------------------------------------------------------------------------------
    def configure(self, width: int, height: int, in_fmt: PixelFormat) -> None:
        """Allocate the frame ring and buffers for ``width`` x ``height`` frames in ``in_fmt``."""
        self.launch_detection()
        self.synchronize()
        ops = self.ops
        ow, oh = output_size(self.out_fmt, *self.frame_size(width, height))
        self.io = ops.frame_io(in_fmt, width, height, frame_shape(self.out_fmt, ow, oh), self.ring, out_fmt=self.out_fmt)
        # One converted frame per slot: frame N+1 is converted and detected (front stream) while
        # frame N is swapped and pasted (compute stream). Events per slot: ``_ready``, the frame is
        # converted (the swap may read it); ``_seen``, the detection's last read of it is queued
        # before this point (its detection on the front stream; for a predicted frame, the back
        # stream's copy of it: the paste-back waits for that); ``_free``, the compute stream is done
        # with it (reusable).
        self._bgr = [ops.empty((height, width, 3), np.uint8) for _ in range(self.ring)]
        self._det_frames: list[Any] = []  # see _copy_for_detection
        self._det_turn = 0
        self._ready = [ops.event() for _ in range(self.ring)]
        self._band_ready = [ops.event() for _ in range(self.ring)]  # a banded frame's band is converted
        self._seen = [ops.event() for _ in range(self.ring)]
        self._free = [ops.event() for _ in range(self.ring)]
        self._even = ops.empty((oh, ow, 3), np.uint8) if (ow, oh) != self.frame_size(width, height) else None
        self._clocks = ops.clocks(STAGES, self.ring, self.timing)
        self._records = [ops.param_record() for _ in range(self.ring)] if self.param_records and ops.concurrent else None
        # The enhancer's own time is always measured (CUDA events: read at collect, no extra wait).
        self._up_clocks: Any = ops.clocks(("upscale",), self.ring, True) if self.upscaler is not None else None
        self._geometry = (int(width), int(height), PixelFormat(in_fmt))
        self._slot = 0
        self.planner.planned = None

    def frame_size(self, width: int, height: int) -> tuple[int, int]:
        """The size of the frames this pipeline publishes for ``width`` x ``height`` input (the frame
        enhancer's output size when there is one; before 4:2:0 rounding)."""
        if self.upscaler is None:
            return int(width), int(height)
        return tuple(int(v) for v in self.upscaler.output_size(width, height))  # type: ignore[return-value]

    def host_slot(self) -> np.ndarray | None:
        """The host buffer the next frame is uploaded from (pinned, on CUDA), for zero-copy capture."""
        return self.io.host_slot() if self._geometry is not None else None

    # -- one frame --------------------------------------------------------------------------------
    def submit(self, frame: Frame, snap: Snapshot, *, detect_now: bool = True) -> int:
        """Queue one frame; returns its slot for :meth:`collect`. Waits only for the detection
        readback. ``detect_now``: see :meth:`finish`."""
        work = self.begin(frame, snap)
        crops, mask = self.swapper.swap_batch([(work.img, work.mats)], work.sources) if work.n else (None, None)
        return self.finish(work, crops, mask, detect_now=detect_now)

    def begin(self, frame: Frame, snap: Snapshot) -> Work:
        """The stages before the swap: upload, convert, detect/track, choose and align the faces.
        The swap of :attr:`Work.mats` (possibly batched with other pipelines' faces, see
        :meth:`~vcam.stages.swap.Swapper.swap_batch`) and :meth:`finish` follow."""
        geometry = (int(frame.width), int(frame.height), PixelFormat(frame.fmt))
        if geometry != self._geometry:
            if PixelFormat(frame.fmt) is PixelFormat.MJPEG and self.ops.device != "cpu":
                raise InputError(
                    "the GPU pipeline takes decoded frames, not MJPEG",
                    hint="decode them first with vcam.stages.decode.open_decoder (the daemon does)",
                )
            self.configure(*geometry)
        ops = self.ops
        slot = self._slot
        self._slot = (slot + 1) % self.ring
        clock = self._clocks[slot]
        stats = FrameStats(seq=frame.seq, t_capture=frame.t_capture)
        work = Work(slot=slot, stats=stats, img=None, mats=self._mats[:0])
        with ops.activate(), ops.front_stream():
            ops.wait(self._free[slot])  # the frame that last used this slot has been pasted and converted
            clock.start()
            # A predicted frame's faces are known before its pixels (planned while the daemon waited
            # for it, or now): its band goes first.
            plan = self._plan(frame.seq) if self.predict else None
            ahead, band = plan if plan is not None else (None, None)
            swapping = snap.swap_enabled and (snap.face is not None or bool(snap.mapping))
            work.settings = snap.settings
            work.band = band if swapping and not snap.settings.get("mirror") else None  # a band is not mirrored
            self.planner.begin(frame.seq)
            raw = self.io.upload(frame, slot, rows=work.band)
            img = work.img = convert.to_bgr(ops, raw, frame.fmt, frame.width, frame.height, out=self._bgr[slot], rows=work.band)
            if work.band is None:
                self.io.release(slot)
                ops.record(self._ready[slot])
            else:
                ops.record(self._band_ready[slot])
                work.rest = (frame, raw)
                self.banded += 1
            clock.mark("convert_in")
            if ahead is not None:
                tracks, work.detect_later = ahead, True
            else:
                tracks, work.detect_later = self.planner.track(img, frame.seq)
            self.planner.predicted += work.detect_later
            self.last_tracks = tracks
            stats.full_scan = bool(getattr(self.tracker, "last_full_scan", False))
            stats.faces = len(tracks)
            clock.mark("detect_track")
            if swapping and tracks:
                host = _host_frame(self, img, work)
                chosen = self.face_filter(tracks, host)[: self.max_faces]
                if self.assigner is not None:
                    pairs = self.assigner.assign(chosen, host, snap)
                else:
                    pairs = [(tr, snap.face) for tr in chosen] if snap.face is not None else []
                if pairs:
                    mats = self._mats[: len(pairs)]
                    for i, (tr, _) in enumerate(pairs):
                        mats[i] = self._crop_from_frame(tr)
                    work.mats = mats
                    faces = [src for _, src in pairs]
                    work.sources = faces[0] if all(f is faces[0] for f in faces) else faces
                    work.landmarks = np.stack([tr.landmarks for tr, _ in pairs])
                    work.boxes = np.stack([tr.box for tr, _ in pairs])
            if not work.detect_later:
                ops.record(self._seen[slot])
        self._aligned.clear()  # the plan's alignments serve this frame only
        with ops.activate():
            # The swap and every later stage see the converted frame (a banded frame: its band).
            ops.wait(self._ready[slot] if work.band is None else self._band_ready[slot])
        return work

    def _bands(self) -> bool:
        """Can predicted frames move in bands? (On, frames with rows (not MJPEG), and no stage that
        reads or writes past the swap's crops, nor a crop of odd frames to even 4:2:0 outputs.)"""
        return (
            self.band
            and self.enhancer is None
            and self.upscaler is None
            and self._even is None
            and self._geometry is not None
            and self._geometry[2] is not PixelFormat.MJPEG
        )

    #: A band covering more of the frame than this moves the frame whole (nothing to gain).
    BAND_MAX_SHARE = 0.8

    def _band_rows(self, tracks: list[Track], height: int) -> tuple[int, int] | None:
        """The rows every stage of the swap reads or writes for ``tracks``: each face's crop square,
        one crop pixel wider on each side (a mask model's larger crop reaches half a pixel past it),
        mapped into the frame, two rows more each way for the bilinear taps, rounded out to even rows
        (4:2:0 chroma rows cover two). None when that is most of the frame."""
        size = float(self.swapper.crop_size)
        lo, hi = float(height), 0.0
        self._aligned.clear()
        for tr in tracks:
            # the corners' rows in the frame (align.apply of the inverse, written out in floats)
            _, (c, d, ty) = align.invert(self._crop_from_frame(tr)).tolist()
            ys = [u * c + v * d + ty for u, v in ((-1.0, -1.0), (size, -1.0), (-1.0, size), (size, size))]
            lo, hi = min(lo, min(ys)), max(hi, max(ys))
        y0 = max(0, int(np.floor(lo)) - 2)
        y1 = min(int(height), int(np.ceil(hi)) + 3)
        y0 -= y0 % 2
        y1 = min(int(height), y1 + y1 % 2)
        if y1 <= y0 or y1 - y0 > self.BAND_MAX_SHARE * height:
            return None
        return y0, y1

    def _crop_from_frame(self, tr: Track) -> np.ndarray:
        """The swapper's alignment of ``tr`` (crop-from-frame), worked out once per predicted
        position: :meth:`_band_rows` aligns the planned tracks, and :meth:`begin` reuses that while
        the track still has those landmarks and the swapper the same template and size."""
        sw = self.swapper
        hit = self._aligned.get(id(tr))
        if hit is not None and hit[0] is tr.landmarks and hit[1] == (sw.template, sw.crop_size):
            return hit[2]
        mat = align.estimate(tr.landmarks, sw.template, sw.crop_size)
        self._aligned[id(tr)] = (tr.landmarks, (sw.template, sw.crop_size), mat)
        return mat

    def _convert_rest(self, work: Work) -> None:
        """A banded frame's other rows: uploaded and converted on the front stream (then the whole
        frame is ready: ``_ready``), and, as the paste-back leaves them as they are, converted to the
        output format and downloaded there too, beside the swap. Nothing for a frame moved whole or
        already completed."""
        rest, work.rest = work.rest, None
        if rest is None:
            return
        frame, raw = rest
        ops, slot = self.ops, work.slot
        y0, y1 = work.band  # type: ignore[misc]
        outside = [r for r in ((0, y0), (y1, int(frame.height))) if r[1] > r[0]]
        with ops.activate(), ops.front_stream():
            self.io.upload_rest(slot)
            for rows in outside:
                convert.to_bgr(ops, raw, frame.fmt, frame.width, frame.height, out=work.img, rows=rows)
            self.io.release(slot)
            ops.record(self._ready[slot])
            out = self.io.output(slot)
            for rows in outside:
                convert.from_bgr(ops, work.img, self.out_fmt, out=out, rows=rows)
            self.io.download(slot, outside, last=False)

    def _plan(self, seq: int) -> tuple[list[Track] | None, Band] | None:
        """The planner's plan for frame ``seq`` (:meth:`DetectionPlanner.plan`), its band from this
        pipeline's geometry."""
        height = self._geometry[1] if self._geometry is not None else 0

        def band_of(tracks: list[Track]) -> Band:
            return self._band_rows(tracks, height) if self._bands() else None

        return self.planner.plan(seq, self._bgr[0], band_of)  # a converted frame's shape: all confident() reads

    def restart(self) -> None:
        """Forget the scene (after a pause: the camera closed, then opened again): the pending
        detection is applied, then every track dropped, so the next frame is detected afresh, never
        swapped where the faces were before the pause."""
        self.planner.restart()

    def settle(self) -> bool:
        """Apply the detection of the last predicted frame now, if it has arrived (never waits), and
        work out the next frame's predicted tracks and band: the daemon calls this while it waits
        for the next frame, so that frame's :meth:`begin` does not pay for decoding and matching the
        detection (a scheduled full scan: milliseconds) and moves its band at once. True when no
        detection is pending any more."""
        if not self.planner.settle():
            return False
        if self.predict and self.planner.next_seq is not None and self._geometry is not None:
            self._plan(self.planner.next_seq)
        return True

    def _copy_for_detection(self, work: Work) -> Any:
        """The frame a predicted frame's detection reads (:meth:`DetectionPlanner.queue`). On CUDA, a copy
        made on the back stream once the frame is converted: the paste-back waits for that copy
        (``_seen``), not for the detection. On the CPU, which runs in order, the frame itself.

        Two copies, in turn: a detection that has not arrived by the next frame is applied (its
        tracks' looks read from its copy) after that frame's copy was made, which one buffer would
        have overwritten. The looks are read on the front stream (the planner applies detections
        there), and a copy waits for its frame's conversion there (``_ready``), queued after every
        look read before it."""
        ops = self.ops
        if not ops.concurrent:
            return work.img
        with ops.back_stream():
            ops.wait(self._ready[work.slot])
            if not self._det_frames:  # once per configure(), at the first predicted frame
                self._det_frames = [ops.empty(work.img.shape, np.uint8) for _ in range(2)]
            turn = self._det_turn = (self._det_turn + 1) % 2
            ops.xp.copyto(self._det_frames[turn], work.img)
            ops.record(self._seen[work.slot])
        return self._det_frames[turn]

    def finish(self, work: Work, crops: Any, mask: Any, *, detect_now: bool = True) -> int:
        """The stages after the swap for ``work`` (its ``crops``/``mask`` rows of the swap): masks,
        paste-back, the enhancers, convert, download. Returns the slot for :meth:`collect`.

        A predicted frame's detection is queued after all of that; with ``detect_now=False`` it is
        left to :meth:`launch_detection` (the daemon calls it once the frame is published, so the
        host's half millisecond of queueing it is not in the frame's latency; the next
        :meth:`begin` calls it if nobody has)."""
        ops = self.ops
        slot, stats, img, n = work.slot, work.stats, work.img, work.n
        clock = self._clocks[slot]
        on = desk_stages(self.stages_on if self.degradable else {}, work.settings)
        self._convert_rest(work)  # a banded frame: the rows outside the band, beside the swap
        detect = None
        if work.detect_later:
            detect = self._copy_for_detection(work)
            if not ops.concurrent:  # the CPU runs in order: the detection reads the frame before the paste
                self.planner.queue(work.stats.seq, detect)
                detect = None
        with ops.activate():
            ops.wait(self._seen[slot])  # nothing is written into the frame before its detection has read it
            if n:
                lms, boxes = work.landmarks, work.boxes
                assert lms is not None and boxes is not None  # set by begin() whenever there are faces
                clock.mark("swap")
                record = self._records[slot] if self._records is not None else None
                if record is not None:
                    record.clear()
                with recording(ops, record):
                    if self.masker is not None:
                        mask = self.masker.masks(img, work.mats, lms, boxes, n, mask, models=on)
                    clock.mark("mask")
                    dense = getattr(self.masker, "last_landmarks", None)  # 68 points, when the masks found them
                    paste_faces(ops, self.swapper, img, crops, work.mats, mask, n, work.sources, lms, dense)
                if record is not None:
                    record.close(ops)
                if self.enhancer is not None and on.get("enhancer", True):  # the swapped faces only
                    self.enhancer.enhance(img, lms, amount=work.settings.get("enhancer_amount"))
                clock.mark("blend")
                stats.swapped = n
            if self.upscaler is not None:
                if on.get("upscale", True) and self.upscale_wanted():
                    up = self._up_clocks[slot]
                    up.start()
                    img = self.upscaler.enhance(img)
                    up.mark("upscale")
                    stats.upscaled = True
                else:
                    stats.upscale_skipped = on.get("upscale", True)  # skipped for time, not turned off
                    img = self.upscaler.resize(img)
                clock.mark("upscale")
            if self._even is not None:
                oh, ow = self._even.shape[:2]
                ops.xp.copyto(self._even, img[:oh, :ow])
                img = self._even
            if work.settings.get("mirror"):
                img = mirrored(ops, img, self._flipped)
            convert.from_bgr(ops, img, self.out_fmt, out=self.io.output(slot), rows=work.band)
            clock.mark("convert_out")
            ops.record(self._free[slot])
            self.io.download(slot, None if work.band is None else [work.band])
        if detect is not None:  # queued after this frame's GPU work, so the host queues that first
            self.planner.leave(work, detect)
            if detect_now:
                self.planner.launch()
        self._pending[slot] = stats
        return slot

    def launch_detection(self) -> None:
        """Queue the detection :meth:`finish` left (see there); nothing when there is none. The
        detection pending before it is applied first (a pipeline that is not patient leaves it to
        here, after the frame was published, when it had not arrived by the frame's start)."""
        self.planner.launch()

    def upscale_wanted(self) -> bool:
        """Run the frame enhancer on this frame? No when the frame would then miss the budget: the
        latency of recent frames without the enhancer plus its measured cost (both running
        averages; the first frames always run it)."""
        if self.upscale_budget <= 0 or self._upscale_cost is None or self._base_latency is None:
            return True
        return self._base_latency + self._upscale_cost <= self.upscale_budget

    def _learn_upscale(self, stats: FrameStats, slot: int) -> None:
        cost = self._up_clocks[slot].durations().get("upscale", 0.0) if stats.upscaled else 0.0
        base = max(0.0, stats.t_publish - stats.t_capture - cost)
        a = 0.2
        if stats.upscaled:
            self._upscale_cost = cost if self._upscale_cost is None else (1 - a) * self._upscale_cost + a * cost
        self._base_latency = base if self._base_latency is None else (1 - a) * self._base_latency + a * base

    def collect(self, slot: int) -> tuple[np.ndarray, FrameStats]:
        """Wait for ``slot``'s output; returns (host output, stats with per-stage seconds)."""
        out = self.io.result(slot)
        stats = self._pending.pop(slot)
        stats.stages = self._clocks[slot].durations()
        stats.t_publish = time.perf_counter()
        if self.upscaler is not None:
            self._learn_upscale(stats, slot)
        return out, stats

    def process(self, frame: Frame, snap: Snapshot) -> tuple[np.ndarray, FrameStats]:
        return self.collect(self.submit(frame, snap))

    def synchronize(self) -> None:
        """Wait for every submitted frame (their outputs stay collectable)."""
        for slot in list(self._pending):
            self.io.result(slot)

    def guarded(self) -> int:
        """Faces passed through so far because a model produced NaN/Inf (a device read: call rarely)."""
        return sum(self.guarded_by_model().values())

    def guarded_by_model(self) -> dict[str, int]:
        """The same count per model name (swapper, enhancer, mask models); a device read: call rarely."""
        out = {self.swapper.name: self.swapper.guarded()}
        if self.enhancer is not None:
            out[self.enhancer.name] = out.get(self.enhancer.name, 0) + self.enhancer.guarded()
        if self.upscaler is not None:
            out[self.upscaler.name] = out.get(self.upscaler.name, 0) + self.upscaler.guarded()
        if self.masker is not None:
            for name, count in self.masker.guarded_by_model().items():
                out[name] = out.get(name, 0) + count
        return out


def _host_frame(pipe: Pipeline, img: Any, work: Work) -> Callable[[], np.ndarray]:
    """``host_frame()`` for the face filter and the assigner: one download, on first call only
    (of a banded frame, once its other rows are converted)."""
    cache: list[np.ndarray] = []

    def host() -> np.ndarray:
        if not cache:
            pipe._convert_rest(work)
            cache.append(pipe.ops.to_host(img))
        return cache[0]

    return host


#: The desk's switches that turn a stage off for the frames that carry them (the setting -> the
#: stage key of :attr:`Pipeline.stages_on` and :meth:`vcam.stages.mask.Masker.masks`'s ``models``).
DESK_STAGES = {"enhancer": "enhancer", "occlusion_mask": "occlusion", "mouth_mask": "mouth"}


def desk_stages(on: Mapping[str, bool], settings: Mapping[str, object]) -> Mapping[str, bool]:
    """The stages on for one frame: ``on`` (the degrader's; missing = on) with the desk's switches
    of ``settings`` laid over it. A stage either turned off is off; ``mouth`` is the one a switch
    can also turn on (the mask needs no model). ``on`` itself when no switch is set."""
    if not any(k in settings for k in DESK_STAGES):
        return on
    out = dict(on)
    for key, stage in DESK_STAGES.items():
        if key in settings:
            out[stage] = bool(settings[key]) and (stage == "mouth" or out.get(stage, True))
    return out


def mirrored(ops: Ops, img: Any, buffers: dict[tuple, Any]) -> Any:
    """``img`` (H, W, 3) flipped left to right, into a buffer of ``buffers`` kept for its shape."""
    key = tuple(img.shape)
    out = buffers.get(key)
    if out is None:
        out = buffers[key] = ops.empty(key, img.dtype)
    ops.xp.copyto(out, img[:, ::-1])
    return out
