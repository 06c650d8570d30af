"""The stream rounds: what the daemon's frame loop does with the frames of its streams.

One round, in named phases (each a method of :class:`Rounds`):

    gather   the newest frame of every stream that has one (waiting at most ``[pipeline]
             batch_deadline`` for the others); while idle, each pipeline settles its pending detection
    submit   per frame ``Pipeline.begin`` (up to the aligned faces), the faces of all of them through
             the swapper in one batch, per frame ``Pipeline.finish`` (its detection left for later)
    collect  per frame ``Pipeline.collect`` (wait for the output), pace, publish or drop it when over
             the stream's budget, feed the degrader, then ``Pipeline.launch_detection``

:meth:`Rounds.submit` returns a :class:`Round` (the frames in flight); :meth:`Rounds.collect` takes
it. The daemon submits round k+1 before it collects round k where the ops run work beside the host
(CUDA), so the next frames' upload and detection overlap this round's swap and download.

Measuring tools pass a :data:`RoundHook`: it is called with a :class:`Mark` at every phase boundary
of every frame (``gathered``, ``begun``, ``swapped``, ``finished``, ``collected``, then ``published``
or ``dropped``), so nothing needs to be patched to time the loop. Each mark carries the frame
loop's host CPU time so far (``Mark.cpu``: :func:`time.thread_time` of the thread that runs the
rounds), so a tool can tell the loop's CPU time per frame from its wall time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vcam.config import Config
from vcam.engines.gate import ROUND_TURNS
from vcam.errors import VcamError
from vcam.platform import process
from vcam.runtime.degrade import LAST_RESORT
from vcam.state import RuntimeState
from vcam.status import LiveStats, RunSummary
from vcam.types import Frame, FrameStats

if TYPE_CHECKING:
    from vcam.pipeline.pipeline import Pipeline, Work
    from vcam.runtime.degrade import Degrader
    from vcam.stages.capture import CaptureThread, Delivery
    from vcam.stages.decode import JpegDecoder
    from vcam.stages.outputs import Output
    from vcam.stages.sources import Source
    from vcam.telemetry import Telemetry

log = logging.getLogger(__name__)

#: Seconds: under overload a stream still publishes at least this often (see Stream.stale_after).
MIN_REFRESH = 0.1
#: The degrader's last rung (``[degrade] order``): frames skip the pipeline and go out as the early
#: frames do (pixelated, or the camera as it is, per ``[pipeline] early_frames``).
SHED_SWAP = LAST_RESORT

Phase = Literal["gathered", "begun", "swapped", "finished", "collected", "published", "dropped"]
PHASES: tuple[Phase, ...] = ("gathered", "begun", "swapped", "finished", "collected", "published", "dropped")


@dataclass
class Stream:
    """One input/output pair of the daemon: its source, capture thread, pipeline and output, its
    own state, summary and live statistics. Filled in at start-up (:mod:`vcam.runtime.startup`)."""

    name: str
    cfg: Config
    state: RuntimeState
    summary: RunSummary = field(default_factory=RunSummary)
    source: Source | None = None
    output: Output | None = None
    cap: CaptureThread | None = None
    pipeline: Pipeline | None = None
    delivery: Delivery | None = None
    live: LiveStats | None = None
    decoder: JpegDecoder | None = None  # the MJPG decoder of its capture thread, if the source sends MJPG
    stage: Callable[[Frame], Frame] | None = None  # what its capture thread does to each frame
    target: Callable[[], Any] | None = None  # the buffer its capture thread reads the next frame into
    last_pub: float = 0.0
    done: bool = False  # its source ended (or failed): no more frames
    #: Paused: its capture closed, a still card published instead (:mod:`vcam.runtime.pause`); the
    #: rounds neither gather nor publish its frames.
    paused: bool = False
    shown: Any = None  # the data of the last frame it published (the pause card is made from it)
    shown_seq: int = -1  # its frame number (-1: a frame of no input frame's, a card; the panel's before/after)
    #: The newest frame gathered (a load rehearses the first round on it: :func:`vcam.runtime.startup.rehearse`).
    newest: Frame | None = field(default=None, repr=False)

    @property
    def budget(self) -> float:
        """The latency budget in seconds (0: every frame is published, for lossless delivery)."""
        lossless = self.delivery is not None and self.delivery.lossless
        return 0.0 if lossless else float(self.cfg.pipeline.max_latency)

    def frame_budget(self) -> float:
        """The budget a frame must fit: the latency budget, or the frame interval where that is 0
        (the source's rate, else ``[capture] fps``). The degrader and the frame enhancer both use it."""
        fps = (self.source.fps if self.source is not None else 0.0) or self.cfg.capture.fps
        return self.budget or 1.0 / max(float(fps), 1.0)

    def stale_after(self) -> float:
        """How long the stream may go without publishing before a frame over the budget goes out
        anyway (counted as late): two frame intervals, at least :data:`MIN_REFRESH`. The budget
        decides which frames are published, never whether the camera moves at all."""
        fps = (self.source.fps if self.source is not None else 0.0) or self.cfg.capture.fps
        return max(2.0 / max(float(fps), 1.0), MIN_REFRESH)


@dataclass(frozen=True)
class Mark:
    """One phase boundary of one frame: ``phase``, the ``stream``, the frame's ``seq``, ``t``
    (``time.perf_counter()``), its capture time, its stats once collected, and ``cpu``: the host CPU
    seconds the frame loop's thread has used so far (``time.thread_time()``; the difference between
    two marks is the loop's CPU time between them, whatever it waited for meanwhile)."""

    phase: Phase
    stream: Stream
    seq: int
    t: float
    t_capture: float = 0.0
    stats: FrameStats | None = None
    cpu: float = 0.0


#: Called at every phase boundary (see the module docstring); it runs on the frame loop: keep it short.
RoundHook = Callable[[Mark], None]


@dataclass(frozen=True)
class Passed:
    """A frame that skipped the pipeline (the swap shed under overload): its output pixels and stats."""

    data: Any
    stats: FrameStats


@dataclass
class Round:
    """The frames of one submitted round, by stream: ``(stream, slot)`` for :meth:`Rounds.collect`."""

    slots: list[tuple[Stream, int | Passed]] = field(default_factory=list)
    #: Chunks whose swap was sent, not yet taken (a deferred swapper): ``(chunk, ticket)``.
    pending: list[tuple[list[tuple[Stream, Work]], Any]] = field(default_factory=list)
    #: The first round on an assembly (see :meth:`Rounds.adopt`): when the frame out before it went
    #: out (0: none), when its submit began and ended.
    timed: tuple[float, float, float] | None = None

    def __bool__(self) -> bool:
        return bool(self.slots or self.pending)


@dataclass(eq=False)
class Rounds:
    """Runs the rounds of ``streams`` over the shared ``swapper`` (see the module docstring).

    ``batch_deadline``: seconds a round waits for the other streams' frames; ``stages_on``: the
    optional stages on/off, shared by every pipeline (the degrader changes it); ``should_exit``:
    asked while waiting; ``exit_requested``: called when a preview window is closed.
    """

    streams: list[Stream]
    swapper: Any
    batch_deadline: float
    wake: threading.Event
    should_exit: Callable[[], bool]
    exit_requested: Callable[[], None]
    stages_on: dict[str, bool]
    degrader: Degrader | None = None
    telemetry: Telemetry | None = None
    hook: RoundHook | None = None
    #: Called with (stream, published data) after each publish (the panel's preview); keep it short.
    tap: Callable[[Stream, Any], None] | None = None
    #: Called the same way for the desk's recording (:mod:`vcam.runtime.record`); keep it short.
    record: Callable[[Stream, Any], None] | None = None
    #: Called with (stream, frame) for each frame gathered, before the pipeline touches it (the
    #: panel's before/after view keeps a small copy); keep it short.
    before: Callable[[Stream, Frame], None] | None = None
    #: The next round is the first on an adopted assembly: its times make one ``-v`` line.
    first_on_adopted: bool = field(default=False, repr=False)

    def adopt(self, swapper: Any, stages_on: dict[str, bool]) -> None:
        """Run on a loaded assembly's swapper and optional stages (at the start, and at an early
        swap's switch, between two rounds)."""
        self.swapper, self.stages_on = swapper, stages_on
        self.first_on_adopted = True

    def _mark(self, phase: Phase, st: Stream, seq: int, t_capture: float = 0.0, stats: FrameStats | None = None) -> None:
        if self.hook is not None:
            self.hook(Mark(phase, st, seq, time.perf_counter(), t_capture, stats, time.thread_time()))

    # -- gather -----------------------------------------------------------------------------------
    def gather(self, max_frames: int | None = None, timeout: float = 0.5, *, settle: bool = False) -> list[tuple[Stream, Frame]]:
        """The newest frame of each stream that has one: waits up to ``timeout`` for the first, then
        at most the batch deadline for the other running streams whose next frame is due within it
        (:meth:`CaptureThread.expects_by <vcam.stages.capture.CaptureThread.expects_by>`). A stream
        whose source ended is marked done; one whose source failed too (one error line), unless it
        is the only stream, whose error stops the daemon. With ``settle`` (models loaded), the time
        spent waiting applies the detections still pending (:meth:`Pipeline.settle`)."""
        ready: list[tuple[Stream, Frame]] = []
        taken: set[str] = set()

        def wants(st: Stream) -> bool:
            return (
                not st.done
                and not st.paused
                and st.name not in taken
                and (max_frames is None or st.summary.frames_in < max_frames)
            )

        t0 = time.perf_counter()
        first_at: float | None = None
        deadline = self.batch_deadline
        while not self.should_exit():
            self.wake.clear()
            for st in self.streams:
                if not wants(st):
                    continue
                cap = _cap(st)
                try:
                    frame = cap.get(timeout=0)
                except VcamError as exc:
                    if len(self.streams) == 1:
                        raise
                    log.error("stream %s stopped: %s", st.name, exc)
                    st.summary.error = str(exc)
                    st.done = True
                    continue
                if frame is not None:
                    st.newest = frame
                    ready.append((st, frame))
                    taken.add(st.name)
                    self._mark("gathered", st, frame.seq, frame.t_capture)
                elif cap.finished:
                    st.done = True
            now = time.perf_counter()
            if ready:
                first_at = first_at if first_at is not None else now
                # wait only for the streams whose next frame is due before the deadline (a camera
                # out of phase with the others, or stalled, is not waited for at all)
                waiting = any(wants(st) and _cap(st).expects_by(first_at + deadline, now) for st in self.streams)
                if not waiting or now - first_at >= deadline:
                    break
                self.wake.wait(first_at + deadline - now)
            else:
                if not any(wants(st) or st.paused for st in self.streams) or now - t0 >= timeout:
                    break  # a paused stream is waited for: its resume (or the next card) sets wake
                # Idle: apply the detections still pending (each stream's last predicted frame) now,
                # not at the next frame; until they have all arrived, look again every 0.5 ms.
                settled = not settle or all([_pipe(st).settle() for st in self.streams])  # each, every time
                woke = self.wake.wait(t0 + timeout - now if settled else min(t0 + timeout - now, 0.0005))
                if woke and any(st.paused for st in self.streams):
                    break  # a paused stream's resume is for the frame loop to see (vcam.runtime.pause)
        return ready

    # -- submit -----------------------------------------------------------------------------------
    def submit(self, ready: list[tuple[Stream, Frame]]) -> Round:
        """One frame of each ready stream: the stages up to the aligned faces per stream, the faces of
        all of them through the swapper in one batch (chunks of the swapper's capacity), the rest
        per stream. The returned round goes to :meth:`collect`."""
        works: list[tuple[Stream, Work]] = []
        out = Round()
        began = time.perf_counter() if self.first_on_adopted else 0.0  # only the first round is timed
        shed = not self.stages_on.get(SHED_SWAP, True)
        before = self.before
        for st, frame in ready:
            _live(st).frame_in(frame.t_capture)
            if before is not None:
                before(st, frame)
            if shed:
                data = early_frame(st, frame, pixelated=st.cfg.pipeline.early_frames != "camera")
                out.slots.append((st, Passed(data, FrameStats(seq=frame.seq, t_capture=frame.t_capture))))
                self._mark("finished", st, frame.seq, frame.t_capture)
                continue
            works.append((st, _pipe(st).begin(frame, st.state.snapshot())))
            self._mark("begun", st, frame.seq, frame.t_capture)
        swapper = self.swapper
        deferred = bool(getattr(swapper, "deferred", False))
        for chunk in _chunks(works, swapper.max_faces):
            faced = [w for _, w in chunk if w.n]
            if deferred:  # sent; the answer is taken in collect(), after the next round's begin
                ticket = swapper.swap_submit([(w.img, w.mats) for w in faced], _row_sources(faced)) if faced else None
                for _, w in chunk:
                    w.mats = w.mats.copy()  # the pipeline's next begin() reuses its buffer
                out.pending.append((chunk, ticket))
                continue
            crops: Any = None
            mask: Any = None
            if faced:
                crops, mask = swapper.swap_batch([(w.img, w.mats) for w in faced], _row_sources(faced))
            self._finish(chunk, crops, mask, out)
        if self.first_on_adopted and works:
            self.first_on_adopted = False
            out.timed = (max((st.last_pub for st in self.streams), default=0.0), began, time.perf_counter())
        return out

    def _finish(self, chunk: list[tuple[Stream, Work]], crops: Any, mask: Any, out: Round) -> None:
        """The stages after the swap for each frame of a chunk (its rows of ``crops``/``mask``)."""
        for st, w in chunk:
            self._mark("swapped", st, w.stats.seq, w.stats.t_capture)
        lo = 0
        for st, w in chunk:
            hi = lo + w.n
            rows = mask[lo:hi] if getattr(mask, "ndim", 2) == 3 else mask  # per-face masks, or one shared
            slot = _pipe(st).finish(w, crops[lo:hi] if w.n else None, rows, detect_now=False)
            out.slots.append((st, slot))
            self._mark("finished", st, w.stats.seq, w.stats.t_capture)
            lo = hi

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, rnd: Round) -> None:
        """Wait for each stream's output of a submitted round, then pace, drop if over the stream's
        budget, publish (frames of a stream are published in order: rounds are collected in order).
        Then the stream's predicted frame's detection is queued (left by :meth:`submit`): after the
        publish, so its host time is not in the frame's latency. A deferred swap's answer is taken
        first (a remote server's round trip overlapped the next round's capture and detection)."""
        for chunk, ticket in rnd.pending:
            crops, mask = self.swapper.swap_wait(ticket) if ticket is not None else (None, None)
            self._finish(chunk, crops, mask, rnd)
        rnd.pending.clear()
        for st, slot in rnd.slots:
            if isinstance(slot, Passed):
                st.summary.shed_frames += self.publish(st, slot.data, slot.stats)
                continue
            pipe = _pipe(st)
            with ROUND_TURNS.waiting():  # the frame's download (background Python may run: RoundTurns.waiting)
                data, stats = pipe.collect(slot)
            self._mark("collected", st, stats.seq, stats.t_capture, stats)
            self.publish(st, data, stats)
            pipe.launch_detection()
        rnd.slots.clear()
        if rnd.timed is not None:
            _first_round_line(rnd.timed)
            rnd.timed = None

    def run(self, ready: list[tuple[Stream, Frame]]) -> None:
        """One round without overlap: :meth:`submit` then :meth:`collect`."""
        self.collect(self.submit(ready))

    def publish(self, st: Stream, data: Any, stats: FrameStats) -> bool:
        """Pace to ``[output] fps``; a frame over the stream's budget is dropped, unless nothing has
        gone out for :meth:`Stream.stale_after`: then it is sent as a late frame (overload), so the
        camera never freezes on its last picture. Either way the degrader hears of the overload.
        True when the frame went out."""
        live, output = _live(st), st.output
        assert output is not None
        if st.paused:  # a frame of the round in flight when the stream paused: the card stays
            return False
        live.processed(stats)
        if st.cfg.output.fps:
            wait = st.last_pub + 1.0 / st.cfg.output.fps - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        budget = st.budget
        now = time.perf_counter()
        late = budget > 0 and now - stats.t_capture > budget
        if late and now - st.last_pub < st.stale_after():
            live.dropped_late()
            self._mark("dropped", st, stats.seq, stats.t_capture, stats)
            self.degrade(st, now, now - stats.t_capture, True)
            return False
        output.send(data)
        st.shown, st.shown_seq = data, stats.seq
        if self.tap is not None:
            self.tap(st, data)
        if self.record is not None:
            self.record(st, data)
        if output.user_closed:  # preview window closed by the user
            self.exit_requested()
        st.last_pub = time.perf_counter()
        live.published(stats.t_capture, st.last_pub, late=late)
        self._mark("published", st, stats.seq, stats.t_capture, stats)
        self.degrade(st, st.last_pub, st.last_pub - stats.t_capture, False)  # sent: a late one is judged by its time
        return True

    def publish_early(self, st: Stream, frame: Frame) -> bool:
        """``frame`` out as an early frame (:func:`early_frame`: pixelated, or as it came, per
        ``[pipeline] early_frames``), under the same budget rule as :meth:`publish`: a frame over the
        stream's budget is dropped unless nothing has gone out for :meth:`Stream.stale_after` (then
        it goes out counted as late): counted in ``early_frames`` (``early_dropped``,
        ``early_late``), its latency with the run's (the whole run's percentiles include the
        start). True when it went out."""
        assert st.output is not None
        if st.paused:
            return False
        s = st.summary
        if self._too_late(st, frame.t_capture, time.perf_counter()):
            s.early_dropped += 1
            return False
        data = early_frame(st, frame, pixelated=st.cfg.pipeline.early_frames != "camera")
        now = time.perf_counter()
        if self._too_late(st, frame.t_capture, now):  # the conversion took it over the budget
            s.early_dropped += 1
            return False
        st.output.send(data)
        st.shown, st.shown_seq = data, -1  # no before/after beside an early frame
        if self.tap is not None:
            self.tap(st, data)
        st.last_pub = time.perf_counter()
        if s.first_frame_s is None:
            s.first_frame_s = process.age()
        s.early_frames += 1
        s.latencies_ms.append((st.last_pub - frame.t_capture) * 1000.0)
        if st.live is not None:  # an early swap's CPU frames: the status line counts the early ones too
            st.live.published_early(frame.t_capture, st.last_pub)
        s.early_late += int(st.budget > 0 and now - frame.t_capture > st.budget)
        return True

    @staticmethod
    def _too_late(st: Stream, t_capture: float, now: float) -> bool:
        """Over the stream's budget at ``now`` and something went out lately: the frame is dropped
        (over the budget with the picture standing still for :meth:`Stream.stale_after`, it goes
        out, counted as late: the camera never freezes)."""
        budget = st.budget
        return budget > 0 and now - t_capture > budget and now - st.last_pub < st.stale_after()

    def degrade(self, st: Stream, now: float, frame_time: float, dropped: bool) -> None:
        """Feed one frame to the degrader; apply what it decides to every stream's pipeline."""
        degrader = self.degrader
        if degrader is None or st.summary.frames_in <= 3:
            return  # the first frames pay for warm-ups: not load
        sample = self.telemetry.latest() if self.telemetry is not None else None
        throttled = bool(sample is not None and sample.forced_slowdown)
        change = degrader.observe(now, frame_time=frame_time, budget=st.frame_budget(), dropped=dropped, throttled=throttled)
        ROUND_TURNS.fall_behind(degrader.behind)  # behind anyway: the background work does not step aside
        if change is not None:
            log.warning("%s", change.line())
            self.stages_on[change.stage] = change.on


def _first_round_line(timed: tuple[float, float, float]) -> None:
    """The ``-v`` line of an assembly's first round (issue 39: the camera paused for 150-250 ms
    between the load's end and the GPU's first frame): when it began after the frames before it
    went out, and where its time went."""
    before, began, submitted = timed
    now = time.perf_counter()
    what = (
        "start-up: first round on the loaded models began %.0f ms after the frame out before it, "
        "submit %.0f ms, collect %.0f ms (%.2f s after the start)"
    )
    log.info(what, (began - before) * 1e3 if before else -1.0, (submitted - began) * 1e3, (now - submitted) * 1e3, process.age())


def early_frame(st: Stream, frame: Frame, *, pixelated: bool) -> Any:
    """``frame`` converted on the CPU to the stream's output format without the pipeline: in coarse
    blocks (``pixelated``: no face can be recognised) or as it came. The early frames while the models
    load, and every frame while the swap is shed under overload (:data:`SHED_SWAP`); mirrored when the
    stream's mirror setting is on."""
    import numpy as np

    from vcam.kernels.convert import from_bgr_cv, to_bgr_cv

    assert st.output is not None
    bgr = to_bgr_cv(np.asarray(frame.data), frame.fmt, frame.width, frame.height)
    if st.state.snapshot().settings.get("mirror"):  # the desk's mirror, as the pipeline's frames have it
        bgr = np.ascontiguousarray(bgr[:, ::-1])
    return from_bgr_cv(pixelate(bgr) if pixelated else bgr, st.output.fmt)


def start_pixel_threads() -> None:
    """Start OpenCV's worker threads now, in the thread that publishes the early frames, before a
    load maps the GPU libraries (:mod:`vcam.runtime.gpu_ahead`). OpenCV starts its workers at its
    first parallel call: the first early frame's upscale. A thread started while the dynamic loader
    maps PyTorch's CUDA libraries waits until the mapping ends (the loader's lock). Measured on the
    H100 (2026-12-06, fresh processes): that first call took 271 ms beside the libraries' load
    (1,458 ms on a cold disk) against 1.1-1.2 ms with the workers started before; in ``vcam run``
    the frame loop stood 260-374 ms at its first early frame. Costs one upscale of a tiny image."""
    import cv2
    import numpy as np

    cv2.resize(np.zeros((2, 2, 3), np.uint8), (1920, 1080), interpolation=cv2.INTER_NEAREST)


#: Samples per block side that :func:`pixelate` averages (a block of a 1080p frame is 80 pixels).
PIXELATE_SAMPLES = 8


def pixelate(bgr: Any, blocks: int = 24) -> Any:
    """``bgr`` in ``blocks`` coarse blocks across (square blocks): the scene's colours and movement,
    no recognisable face (the early frames' default). Each block is the mean of an evenly spaced
    grid of at least :data:`PIXELATE_SAMPLES` x :data:`PIXELATE_SAMPLES` of its pixels, not of all
    of them: OpenCV's area mean over a whole 1080p frame took 5.3 of the 5.9 ms an early frame's
    pixelation took (2-core CPU), and four streams at 30 fps publish 120 early frames a second
    from one thread while the models load; from the grid it takes 0.75 ms."""
    import cv2

    h, w = bgr.shape[:2]
    bw = max(1, min(blocks, w))
    bh = max(1, min(h, round(bw * h / w)))
    step = max(1, min(h // (bh * PIXELATE_SAMPLES), w // (bw * PIXELATE_SAMPLES)))
    small = cv2.resize(bgr[::step, ::step] if step > 1 else bgr, (bw, bh), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)


def _pipe(st: Stream) -> Pipeline:
    assert st.pipeline is not None, f"stream {st.name} has no pipeline yet"
    return st.pipeline


def _cap(st: Stream) -> CaptureThread:
    assert st.cap is not None, f"stream {st.name} has no capture thread yet"
    return st.cap


def _live(st: Stream) -> LiveStats:
    assert st.live is not None, f"stream {st.name} is not running yet"
    return st.live


def _chunks(works: list[tuple[Stream, Work]], capacity: int) -> list[list[tuple[Stream, Work]]]:
    """Consecutive groups of ``(stream, work)`` whose faces fit ``capacity`` rows (a frame's faces
    are never split)."""
    out: list[list[tuple[Stream, Work]]] = [[]]
    rows = 0
    for item in works:
        n = item[1].n
        if out[-1] and rows + n > capacity:
            out.append([])
            rows = 0
        out[-1].append(item)
        rows += n
    return out


def _row_sources(works: list[Work]) -> Any:
    """The swapper's ``faces`` for the rows of ``works``: the one face when every row has the same
    (the swapper then uploads nothing per frame), else one per row."""
    rows: list[Any] = []
    for w in works:
        rows.extend([w.sources] * w.n if not isinstance(w.sources, (list, tuple)) else w.sources)
    return rows[0] if rows and all(f is rows[0] for f in rows) else rows


__all__ = [
    "PHASES",
    "SHED_SWAP",
    "Mark",
    "Passed",
    "Phase",
    "Round",
    "RoundHook",
    "Rounds",
    "Stream",
    "early_frame",
    "pixelate",
    "start_pixel_threads",
]
