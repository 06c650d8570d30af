"""The per-frame pipeline: the stage order, written once for every device.

    upload -> convert (to BGR) -> detect/track -> align -> swap (all faces, one batch) ->
    masks -> paste-back [-> face enhancer] [-> frame enhancer] -> convert (output format) -> download

:class:`Pipeline` runs that order over an :class:`~vcam.ops.Ops` (NumPy on the CPU, CuPy kernels on
CUDA) with stages that run on the same ops; nothing here branches on the device. It is built once
with every stage chosen (:mod:`vcam.assemble` does that from the config) and its buffers sized for
the frame; a frame of another size or format rebuilds them. ``submit`` queues a frame and returns
its slot, ``collect`` waits for the slot's output: on CUDA, frame N+1 can be submitted before
frame N is collected; its upload, conversion and detection run on the ops' front stream beside
frame N's swap and paste-back on the compute stream (each slot has its own converted frame, and
events order the two streams); ``process`` is both in one call. A frame swapped with predicted
faces (``[track] predict``) has its detection queued after its swap, on the ops' back stream
(lowest priority), reading a copy of the frame; the next frame applies it. ``submit`` is
``begin`` (up to the aligned faces), the swap, and ``finish`` (masks to download): a daemon running
several streams calls ``begin`` on each stream's pipeline, swaps the faces of all of them in one
batch (:meth:`~vcam.swap.Swapper.swap_batch`) and calls ``finish`` on each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import align
from .convert import frame_shape
from .errors import InputError
from .state import Snapshot
from .types import Frame, FrameStats, PixelFormat, Track

#: ``face_filter(tracks, host_frame) -> tracks to swap``; ``host_frame()`` gives the frame on the host
#: (on the GPU: a download, so call it only when needed, e.g. once for a new track's embedding).
FaceFilter = Callable[[list[Track], Callable[[], np.ndarray]], list[Track]]

STAGES = ("convert_in", "detect_track", "swap", "mask", "blend", "upscale", "convert_out")

#: Optional stages the daemon may turn off under load (:mod:`vcam.degrade`), by name.
OPTIONAL_STAGES = ("upscale", "enhancer", "occlusion", "region")


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
    #: Swapped with predicted tracks: its detection is queued by :meth:`Pipeline.finish`, after the swap.
    detect_later: bool = False

    @property
    def n(self) -> int:
        return int(self.mats.shape[0])


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


class Pipeline:
    """One frame through every stage (see the module docstring).

    ``ops``: the device. ``tracker``: ``update(frame, seq) -> tracks`` (its detector on the same ops).
    ``swapper``: a :class:`~vcam.swap.Swapper` on the same ops. ``masker``: the mask stage
    (:class:`~vcam.mask.Masker`; None: the swapper's mask alone). ``assigner``: which source each
    face gets (:class:`~vcam.mapping.Assigner`; None: the active face for all). ``enhancer``:
    optional, after the paste-back. ``out_fmt``: the publisher's pixel format. ``face_filter``: which tracks to swap
    (default: all). ``ring``: frames in flight; an output returned by :meth:`collect` is valid until
    ``ring`` more frames are submitted. ``timing``: device-side stage times (CUDA events).
    ``predict``: swap with the tracks predicted for the frame while its detection runs
    (``[track] predict``, see :meth:`_track`).
    """

    def __init__(
        self,
        *,
        ops: Any,
        tracker: Any,
        swapper: Any,
        out_fmt: PixelFormat = PixelFormat.BGR,
        enhancer: Any = None,
        masker: Any = None,
        assigner: Any = None,
        face_filter: FaceFilter | None = None,
        upscaler: Any = None,
        stages_on: dict[str, bool] | None = None,
        max_faces: int = 8,
        ring: int = 2,
        timing: bool = False,
        predict: bool = False,
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
        self.degradable = True
        #: The latency budget the frame enhancer must fit (seconds; 0: always enhance): a frame it
        #: would push over the budget is resized instead (``[upscale] drop_first``).
        self.upscale_budget = 0.0
        self._upscale_cost: float | None = None  # EMA of the enhancer's own time (s)
        self._base_latency: float | None = None  # EMA of a frame's latency without it (s)
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
        #: Swap with predicted tracks while the frame's detection runs (``[track] predict``; needs a
        #: tracker with ``confident``/``predict``/``launch``/``complete``, see :mod:`vcam.track`).
        self.predict = bool(predict) and all(hasattr(tracker, m) for m in ("confident", "predict", "launch", "complete"))
        self._step: Any = None  # the tracker step of the frame before, applied at the next frame
        self._later: tuple[Work, Any] | None = None  # a detection finish() left to launch_detection()
        self.predicted = 0  # frames swapped with predicted tracks
        self.settled = 0  # their detections applied by settle(), before the next frame came

    # -- buffers ----------------------------------------------------------------------------------
    def configure(self, width: int, height: int, in_fmt: PixelFormat) -> None:
        """Allocate the frame ring and buffers for ``width`` x ``height`` frames in ``in_fmt``."""
        self.launch_detection()
        self.synchronize()
        ops = self.ops
        ow, oh = output_size(self.out_fmt, *self.frame_size(width, height))
        self.io = ops.frame_io(in_fmt, width, height, frame_shape(self.out_fmt, ow, oh), self.ring)
        # One converted frame per slot: frame N+1 is converted and detected (front stream) while
        # frame N is swapped and pasted (compute stream). Events per slot: ``_ready``, the frame is
        # converted (the swap may read it); ``_seen``, the detection's last read of it is queued
        # before this point (its detection on the front stream; for a predicted frame, the back
        # stream's copy of it: the paste-back waits for that); ``_free``, the compute stream is done
        # with it (reusable).
        self._bgr = [ops.empty((height, width, 3), np.uint8) for _ in range(self.ring)]
        self._det_frame: Any = None  # see _detect_later
        self._ready = [ops.event() for _ in range(self.ring)]
        self._seen = [ops.event() for _ in range(self.ring)]
        self._free = [ops.event() for _ in range(self.ring)]
        self._even = ops.empty((oh, ow, 3), np.uint8) if (ow, oh) != self.frame_size(width, height) else None
        self._clocks = ops.clocks(STAGES, self.ring, self.timing)
        # The enhancer's own time is always measured (CUDA events: read at collect, no extra wait).
        self._up_clocks = ops.clocks(("upscale",), self.ring, True) if self.upscaler is not None else None
        self._geometry = (int(width), int(height), PixelFormat(in_fmt))
        self._slot = 0

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
        :meth:`~vcam.swap.Swapper.swap_batch`) and :meth:`finish` follow."""
        geometry = (int(frame.width), int(frame.height), PixelFormat(frame.fmt))
        if geometry != self._geometry:
            if PixelFormat(frame.fmt) is PixelFormat.MJPEG and self.ops.device != "cpu":
                raise InputError(
                    "the GPU pipeline takes decoded frames, not MJPEG",
                    hint="decode them first with vcam.decode.open_decoder (the daemon does)",
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
            raw = self.io.upload(frame, slot)
            img = work.img = ops.to_bgr(raw, frame.fmt, frame.width, frame.height, out=self._bgr[slot])
            self.io.release(slot)
            ops.record(self._ready[slot])
            clock.mark("convert_in")
            tracks, work.detect_later = self._track(img, frame.seq)
            self.last_tracks = tracks
            stats.full_scan = bool(getattr(self.tracker, "last_full_scan", False))
            stats.faces = len(tracks)
            clock.mark("detect_track")
            if snap.swap_enabled and (snap.face is not None or snap.mapping) and tracks:
                host = self._host_frame(img)
                chosen = self.face_filter(tracks, host)[: self.max_faces]
                if self.assigner is not None:
                    pairs = self.assigner.assign(chosen, host, snap)
                else:
                    pairs = [(tr, snap.face) for tr in chosen] if snap.face is not None else []
                if pairs:
                    mats = self._mats[: len(pairs)]
                    for i, (tr, _) in enumerate(pairs):
                        mats[i] = align.estimate(tr.landmarks, self.swapper.template, self.swapper.crop_size)
                    work.mats = mats
                    faces = [src for _, src in pairs]
                    work.sources = faces[0] if all(f is faces[0] for f in faces) else faces
                    work.landmarks = np.stack([tr.landmarks for tr, _ in pairs])
                    work.boxes = np.stack([tr.box for tr, _ in pairs])
            if not work.detect_later:
                ops.record(self._seen[slot])
        with ops.activate():
            ops.wait(self._ready[slot])  # the swap and every later stage see the converted frame
        return work

    def _track(self, img: Any, seq: int) -> tuple[list[Track], bool]:
        """This frame's tracks, and whether its detection is still to be queued. With prediction on
        and the tracker confident: the tracks moved to this frame, and the frame's own detection is
        queued after its swap (:meth:`finish`: on the back stream, beside the swap and after it) and
        applied at the next frame; otherwise the frame waits for its detection. A detection still
        pending from the frame before is applied first (launched first, if the caller of
        :meth:`finish` has not)."""
        tracker = self.tracker
        self.launch_detection()
        if self._step is not None:
            step, self._step = self._step, None
            tracker.complete(step)
        if self.predict and tracker.confident(img, seq):
            self.predicted += 1
            return tracker.predict(seq), True
        return tracker.update(img, seq), False

    def settle(self) -> bool:
        """Apply the detection of the last predicted frame now, if it has arrived (never waits): the
        daemon calls this while it waits for the next frame, so that frame's :meth:`begin` does not
        pay for decoding and matching it (a scheduled full scan: milliseconds). True when no
        detection is pending any more."""
        step = self._step
        if step is None:
            return True
        ready = getattr(step, "ready", None)
        if ready is not None and not ready():
            return False
        self._step = None
        self.tracker.complete(step)
        self.settled += 1
        return True

    def _copy_for_detection(self, work: Work) -> Any:
        """The frame a predicted frame's detection reads (:meth:`_detect_later`). On CUDA, a copy
        made on the back stream once the frame is converted: the paste-back waits for that copy
        (``_seen``), not for the detection. On the CPU, which runs in order, the frame itself."""
        ops = self.ops
        if not ops.concurrent:
            return work.img
        with ops.back_stream():
            ops.wait(self._ready[work.slot])
            if self._det_frame is None:  # once per configure(), at the first predicted frame
                self._det_frame = ops.empty(work.img.shape, np.uint8)
            ops.xp.copyto(self._det_frame, work.img)
            ops.record(self._seen[work.slot])
        return self._det_frame

    def _detect_later(self, work: Work, frame: Any) -> None:
        """Queue the detection of a frame swapped with predicted tracks on the back stream (lowest
        priority: it takes what the swap leaves of the GPU); the next frame applies it."""
        with self.ops.back_stream():
            self._step = self.tracker.launch(frame, work.stats.seq, deferred=True)

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
        on = self.stages_on if self.degradable else {}
        detect = None
        if work.detect_later:
            detect = self._copy_for_detection(work)
            if not ops.concurrent:  # the CPU runs in order: the detection reads the frame before the paste
                self._detect_later(work, detect)
                detect = None
        with ops.activate():
            ops.wait(self._seen[slot])  # nothing is written into the frame before its detection has read it
            if n:
                clock.mark("swap")
                if self.masker is not None:
                    mask = self.masker.masks(img, work.mats, work.landmarks, work.boxes, n, mask, models=on)
                clock.mark("mask")
                ops.paste_back(img, crops, work.mats, mask, n)
                if self.enhancer is not None and on.get("enhancer", True):  # the swapped faces only
                    self.enhancer.enhance(img, work.landmarks)
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
            ops.from_bgr(img, self.out_fmt, out=self.io.output(slot))
            clock.mark("convert_out")
            ops.record(self._free[slot])
            self.io.download(slot)
        if detect is not None:  # queued after this frame's GPU work, so the host queues that first
            self._later = (work, detect)
            if detect_now:
                self.launch_detection()
        self._pending[slot] = stats
        return slot

    def launch_detection(self) -> None:
        """Queue the detection :meth:`finish` left (see there); nothing when there is none."""
        if self._later is not None:
            (work, frame), self._later = self._later, None
            self._detect_later(work, frame)

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

    def _host_frame(self, img: Any) -> Callable[[], np.ndarray]:
        """``host_frame()`` for the face filter and the assigner: one download, on first call only."""
        cache: list[np.ndarray] = []

        def host() -> np.ndarray:
            if not cache:
                cache.append(self.ops.to_host(img))
            return cache[0]

        return host

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


__all__ = ["FaceFilter", "OPTIONAL_STAGES", "Pipeline", "STAGES", "Work", "output_size", "select_all", "select_largest"]
