"""The daemon: capture threads -> frame loop (the pipeline) -> publish, with live status and control.

Shaped like uvicorn's ``Server``: :meth:`Daemon.run` is startup (source, models via
:mod:`vcam.runtime.assemble`, faces, output, control, capture thread), a short loop whose body is
:meth:`Daemon.on_frame`, and shutdown (capture first, then source, output, control; a file output is
finalised). The daemon handles its own signals: the first SIGINT/SIGTERM sets ``should_exit`` (the
loop drains and stops cleanly), a second sets ``force_exit`` and leaves at once. Control channels
(OBS, local socket) only post changes to :class:`~vcam.state.RuntimeState`.

Latency: each frame carries its capture time; a frame older than ``pipeline.max_latency`` when it
would be published is dropped and counted, and the status shows the budget being exceeded.

Several streams (``[[streams]]``, ``--stream INPUT=OUTPUT``): one :class:`Stream` per input/output
pair, each with its own capture thread, tracker, latency budget, state (face, swap on/off,
mappings), status and summary; the models are loaded once. The frame loop takes the newest frame of
every stream that has one; once the first is there it waits at most ``[pipeline] batch_deadline``
for the others whose next frame is due by then (not at all when every running stream has one, or
when the others' frames come later: cameras out of phase), then runs each frame's stages up to
the aligned faces, the faces of all of them through the swapper in one batch, and each frame's
remaining stages, and publishes each to its own output. A stream that stalls (a camera unplugged, a
file at its end) is simply not ready: it never holds the others past the deadline; one whose
source fails is stopped with one error line while the others go on.

Overlap: a round is collected (its outputs waited for and published) only after the next round,
if its frames are already there, has been submitted, so on the GPU the next frames' upload,
conversion and detection (the ops' front stream) run while this round swaps and downloads (the
compute and copy streams). When no frame is waiting the round is collected at once, so frames
that come one at a time (a camera) gain no latency. Frames are published in order per stream.
On the CPU, where the work is done by the time a call returns, each round is collected at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vcam.config import Config
from vcam.errors import VcamError
from vcam.state import RuntimeState, Status
from vcam.status import LiveStats, RunSummary, process_age
from vcam.types import Frame, PixelFormat

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Stream:
    """One input/output pair of the daemon (see the module docstring)."""

    name: str
    cfg: Config
    state: RuntimeState
    summary: RunSummary = field(default_factory=RunSummary)
    source: Any = None
    output: Any = None
    cap: Any = None
    pipeline: Any = None
    delivery: Any = None
    live: LiveStats | None = None
    decoder: Any = None  # the MJPG decoder of its capture thread (vcam.stages.decode), if the source sends MJPG
    stage: Callable[[Frame], Frame] | None = None  # what its capture thread does to each frame (Daemon._capture_stage)
    target: Callable[[], np.ndarray] | None = None  # the buffer its capture thread reads the next frame into
    last_pub: float = 0.0
    done: bool = False  # its source ended (or failed): no more frames

    @property
    def budget(self) -> float:
        """The latency budget in seconds (0: every frame is published, for lossless delivery)."""
        return 0.0 if self.delivery.lossless else float(self.cfg.pipeline.max_latency)


class Daemon:
    """Owns the threads of one run. ``run()`` blocks; ``start()``/``stop()`` run it in the background.

    ``output``/``source``/``state``: given instead of opened from the config (tests, benchmarks),
    for the first stream; ``outputs``/``sources``: the same by stream name. ``on_status(status,
    active_face, swap_on)``: called at each status interval for the first stream;
    ``on_stream_status(name, status, active_face, swap_on)`` for every stream. ``control``: start
    the local socket and OBS control.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        state: RuntimeState | None = None,
        output: Any = None,
        source: Any = None,
        outputs: dict[str, Any] | None = None,
        sources: dict[str, Any] | None = None,
        on_status: Callable[[Status, str | None, bool], None] | None = None,
        on_stream_status: Callable[[str, Status, str | None, bool], None] | None = None,
        control: bool = True,
    ) -> None:
        self.cfg = cfg
        self.state = state or RuntimeState()
        self._on_status = on_status
        self._on_stream_status = on_stream_status
        self._control = control
        self.should_exit = False
        self.force_exit = False
        self._thread: threading.Thread | None = None
        self.streams: list[Stream] = [
            Stream(name, scfg, self.state if i == 0 else RuntimeState()) for i, (name, scfg) in enumerate(cfg.per_stream())
        ]
        self.summary = self.streams[0].summary
        first = self.streams[0].name
        self._outputs = dict(outputs or {})
        self._sources = dict(sources or {})
        if output is not None:
            self._outputs[first] = output
        if source is not None:
            self._sources[first] = source
        self.ready = threading.Event()
        self.assembly: Any = None
        self._components: list = []
        self._wake = threading.Event()
        self.telemetry: Any = None  # vcam.telemetry.Telemetry when NVML is there
        self.degrader: Any = None  # vcam.runtime.degrade.Degrader, set at start-up

    @property
    def device(self) -> str:
        return self.assembly.device if self.assembly is not None else "cpu"

    @property
    def detector(self) -> Any:
        return self.assembly.detector if self.assembly is not None else None

    @property
    def delivery(self) -> Any:
        return self.streams[0].delivery

    @property
    def pipeline(self) -> Any:
        return self.streams[0].pipeline

    @property
    def output(self) -> Any:
        return self.streams[0].output

    @property
    def summaries(self) -> dict[str, RunSummary]:
        return {st.name: st.summary for st in self.streams}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, **run_kwargs: Any) -> None:
        """Run in a background thread (signals stay with the caller)."""

        def target() -> None:
            try:
                self.run(**run_kwargs)
            except VcamError as exc:
                self.summary.error = str(exc)
                log.error("%s", exc)

        self._thread = threading.Thread(target=target, name="vcam-frame-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.should_exit = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def request_stop(self) -> None:
        self.should_exit = True
        self._wake.set()

    def install_signal_handlers(self) -> Callable[[], None]:
        """SIGINT/SIGTERM -> :meth:`handle_exit` (main thread only); returns a function that restores
        the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit:
            self.force_exit = True
            log.warning("forced exit")
            raise SystemExit(130)
        self.should_exit = True
        self._wake.set()

    def run(self, *, max_frames: int | None = None, duration: float | None = None) -> RunSummary:
        """Start up, run the loop until a limit, the end of the input or a stop request, shut down.
        Returns the first stream's summary (:attr:`summaries` has every stream's)."""
        restore = self.install_signal_handlers()
        self.summary.error = None
        try:
            self.startup(max_frames)
            self.main_loop(max_frames, duration)
        except BaseException:
            self.shutdown(raise_errors=False)  # the error in flight is the one to report
            raise
        else:
            self.shutdown(raise_errors=True)  # e.g. the output file could not be finished
        finally:
            restore()
            self.ready.set()
        return self.summary

    def startup(self, max_frames: int | None = None) -> None:
        """Open the sources, load the models, open the outputs, start capture and control. With
        early frames (``[pipeline] early_frames``, live runs without a frame enhancer) the outputs
        open first and the camera is published (pixelated by default) while the models load in a
        thread."""
        from vcam.stages import capture, publish

        check_streams([(st.name, st.cfg) for st in self.streams if st.name not in self._sources], self._outputs)
        for st in self.streams:
            given_output = st.name in self._outputs
            if not given_output:
                publish.refuse_overwriting_input(st.cfg.output.target, st.cfg.capture.input)
            st.delivery = capture.plan_delivery(st.cfg.capture, "" if given_output else st.cfg.output.target, max_frames)
            st.source = self._sources.get(st.name) or capture.open_source(st.cfg.capture, delivery=st.delivery, compressed=True)
            self._components.append(st.source)
        if self._early_frames():
            for st in self.streams:
                self._open_output(st, st.source.width, st.source.height)
            self._start_capture(early=True)
            if not self._load_while_passing_through():
                return  # stopped (Ctrl-C) before the models were loaded: nothing more to start
            for st in self.streams:
                st.cap.stage, st.cap.target = st.stage, st.target
        else:
            self._load()
            if self.assembly is None:
                return  # stopped while loading
            self._start_capture(early=False)
        self._start_telemetry()
        self._start_control()
        self.ready.set()

    def _early_frames(self) -> bool:
        """Publish the camera (pixelated, or as it is) while the models load: on for live runs (a
        camera, paced input), off when any stream keeps every frame (a file conversion must be swapped
        throughout) or has a frame enhancer (its output size is known only once it is loaded)."""
        if self.cfg.pipeline.early_frames == "off":
            return False
        return all(not st.delivery.lossless and not st.cfg.upscale.model for st in self.streams)

    def _open_output(self, st: Stream, width: int, height: int) -> None:
        from vcam.stages import publish

        output = self._outputs.get(st.name)
        if output is None:
            # Live input: stamp file frames by wall clock (plays at real speed even with drops);
            # lossless input: by frame count, so the file keeps the input's rate and every frame.
            timing = "frames" if st.delivery.lossless else "wall"
            fps = st.cfg.output.fps or st.source.fps or self.cfg.capture.fps
            output = publish.open_output(st.cfg.output, width, height, fps, file_timing=timing)
        self._components.append(output)
        st.output = output

    def _load(self) -> None:
        """The models (:mod:`vcam.runtime.assemble`), the faces, each stream's pipeline and output (opened
        here unless early frames opened it), every buffer and CUDA graph warmed up."""
        from vcam.runtime import assemble

        cfg = self.cfg
        fps = self.streams[0].source.fps or cfg.capture.fps
        asm = assemble.build(cfg, fps=fps)
        if self.should_exit:  # stopped while loading in the background (early frames): go no further
            return
        self.assembly = asm
        for st in self.streams:
            st.summary.device = asm.device
            st.summary.models = asm.describe()
        log.info("models: %s", self.summary.models)
        if not self.state.names:
            watcher = assemble.load_faces(
                asm,
                self.state,
                demo_input=self.streams[0].cfg.capture.input == "demo",
                source=self.streams[0].cfg.swap.source,
                others=[(st.state, st.cfg.swap.source, st.cfg.capture.input == "demo") for st in self.streams[1:]],
            )
            watcher.start()
            self._components.append(watcher)
        else:  # faces given with the state (tests, embedding): every stream gets them
            assemble.share_faces(self.state, [st.state for st in self.streams[1:]])
        for st in self.streams:
            src = st.source
            st.pipeline = asm.make_pipeline(PixelFormat.BGR)  # its output format is the output's, below
            if st.output is None:
                self._open_output(st, *st.pipeline.frame_size(src.width, src.height))
            st.pipeline.out_fmt = st.output.fmt
            st.pipeline.degradable = not st.delivery.lossless
            # MJPG is decoded in the capture thread (vcam.stages.decode): the pipeline gets BGR frames.
            st.pipeline.configure(src.width, src.height, PixelFormat.BGR if src.fmt == PixelFormat.MJPEG else src.fmt)
            asm.warmup(src.width, src.height)
            if st.pipeline.upscaler is not None and cfg.upscale.drop_first and not st.delivery.lossless:
                st.pipeline.upscale_budget = st.budget or 1.0 / max(src.fps or fps, 1.0)
            st.stage = self._capture_stage(st)  # the decoder is built here too, off the frame loop
            st.live = LiveStats(st.summary)

    def _start_capture(self, early: bool) -> None:
        """One capture thread per stream. Early (models still loading): an MJPG frame is decoded on
        the CPU there; the stream's own stage (:meth:`_capture_stage`) is set once the models are
        loaded."""
        from vcam.stages import capture
        from vcam.stages.decode import CpuJpegDecoder

        for st in self.streams:
            name = "vcam-capture" if len(self.streams) == 1 else f"vcam-capture-{st.name}"
            if early:
                stage = CpuJpegDecoder().decode if st.source.fmt == PixelFormat.MJPEG else None
            else:
                stage = st.stage
            target = None if early else st.target
            st.cap = capture.CaptureThread(
                st.source, lossless=st.delivery.lossless, name=name, wake=self._wake, stage=stage, target=target
            )
            st.cap.start()
            self._components.insert(0, st.cap)

    def _load_while_passing_through(self) -> bool:
        """:meth:`_load` in a thread while this one publishes each stream's newest frame, pixelated
        (``early_frames = "pixelate"``) or as it is (``"camera"``), converted on the CPU, so a video
        call sees the camera within a second of the start. Those frames are counted in
        ``early_frames``, not in ``frames_in``/``frames_out``. False when a stop was requested before
        the models were loaded (the loading thread is left to finish on its own)."""
        from vcam.kernels.convert import from_bgr_cv, to_bgr_cv

        pixelated = self.cfg.pipeline.early_frames == "pixelate"

        failure: list[BaseException] = []

        def load() -> None:
            try:
                self._load()
            except BaseException as exc:
                failure.append(exc)
            finally:
                self._wake.set()

        loader = threading.Thread(target=load, name="vcam-load", daemon=True)
        t0 = time.perf_counter()
        loader.start()
        while loader.is_alive() and not self.should_exit:
            for st, frame in self.gather(None, timeout=0.05):
                if not loader.is_alive():  # loaded meanwhile: the frame is dropped, the pipeline takes the next
                    break
                bgr = to_bgr_cv(np.asarray(frame.data), frame.fmt, frame.width, frame.height)
                st.output.send(from_bgr_cv(pixelate(bgr) if pixelated else bgr, st.output.fmt))
                s = st.summary
                if s.first_frame_s is None:
                    s.first_frame_s = process_age()
                s.early_frames += 1
        if loader.is_alive():  # a stop request: do not keep a Ctrl-C waiting for the models
            log.info("stopped before the models were loaded")
            return False
        loader.join()
        if failure:
            raise failure[0]
        passed = sum(st.summary.early_frames for st in self.streams)
        log.info("models loaded in %.1f s; %d early frames published meanwhile", time.perf_counter() - t0, passed)
        return True

    def _capture_stage(self, st: Stream) -> Callable[[Frame], Frame] | None:
        """What the capture thread does to each frame before handing it over: an MJPG frame is
        decoded (:mod:`vcam.stages.decode`: on the GPU into device memory, or on the CPU); a frame on the
        host is put in pinned staging on the GPU path: read into it by the source where it can
        (``st.target``), else copied."""
        from vcam.kernels.convert import frame_shape
        from vcam.stages.decode import open_decoder

        ops, src = self.assembly.ops, st.source
        fmt = src.fmt
        decoder = None
        if fmt == PixelFormat.MJPEG:
            decoder = st.decoder = open_decoder(st.cfg.capture.decode, ops)
            log.info("%s: MJPG decoded on the %s", st.name, "GPU (nvJPEG)" if decoder.device == "cuda" else "CPU")
            if decoder.device == "cuda":
                return decoder.decode
            fmt = PixelFormat.BGR
        staging = ops.staging(frame_shape(fmt, src.width, src.height))
        if staging is not None:
            self._components.append(staging)  # its copy threads stop with the daemon
        if decoder is None:
            st.target = staging.claim if staging is not None else None
            return staging.stage if staging is not None else None
        if staging is None:
            return decoder.decode
        decode, stage = decoder.decode, staging.stage
        return lambda frame: stage(decode(frame))

    def _start_telemetry(self) -> None:
        """The GPU sampler (NVML, off the frame loop) and the degrader (one for the shared GPU:
        its changes apply to every stream). A run where every stream converts a file (every frame
        kept) never degrades."""
        from vcam.runtime.degrade import Degrader, available_stages
        from vcam.telemetry import open_telemetry

        cfg = self.cfg
        self.telemetry = open_telemetry(cfg.telemetry, self.assembly.device, gpu_index=0)
        if self.telemetry is not None:
            self._components.append(self.telemetry)
        lossless = all(st.delivery.lossless for st in self.streams)
        available = available_stages(cfg)
        self.degrader = Degrader.from_config(cfg.degrade, available, enabled=bool(available) and not lossless)

    def _degrade(self, st: Stream, now: float, frame_time: float, dropped: bool) -> None:
        """Feed one frame to the degrader; apply what it decides to every stream's pipeline."""
        if not self.degrader.enabled or st.summary.frames_in <= 3:
            return  # the first frames pay for warm-ups: not load
        budget = st.budget or 1.0 / max(st.source.fps or self.cfg.capture.fps, 1.0)
        sample = self.telemetry.latest() if self.telemetry is not None else None
        throttled = bool(sample is not None and sample.forced_slowdown)
        change = self.degrader.observe(now, frame_time=frame_time, budget=budget, dropped=dropped, throttled=throttled)
        if change is not None:
            log.warning("%s", change.line())
            self.assembly.stages_on[change.stage] = change.on

    def _start_control(self) -> None:
        if not self._control:
            return
        from vcam.control.local import ControlServer

        states = {st.name: st.state for st in self.streams}
        try:
            srv = ControlServer(self.cfg.socket_path, self.state, streams=states if len(states) > 1 else None)
            srv.start()
            self._components.append(srv)
        except VcamError as exc:
            log.warning("local control disabled: %s", exc)
        if self.cfg.obs.enabled:
            from vcam.control.obs import ObsController

            for st in self.streams:
                several = len(self.streams) > 1
                obs = ObsController(
                    self.cfg.obs.for_stream(st.name, len(self.streams)), st.state, stream=st.name if several else None
                )
                obs.start()
                self._components.append(obs)

    # -- the loop -------------------------------------------------------------------------------
    def main_loop(self, max_frames: int | None, duration: float | None) -> None:
        if self.assembly is None or any(st.live is None for st in self.streams):
            return  # stopped during start-up, before the models were loaded
        interval = float(self.cfg.status.interval)
        t_start = last_status = time.perf_counter()
        # The round submitted last, not yet collected: while it runs on the GPU, the next round's
        # frames (those already there: no waiting for them) are submitted, so the upload, convert
        # and detection of round k+1 overlap the swap and download of round k. With no frame
        # waiting, round k is collected at once (no latency added when frames come one by one).
        inflight: list[tuple[Stream, int]] = []
        overlap = bool(getattr(self.assembly.ops, "concurrent", False))
        while not self.should_exit:
            if max_frames is not None and all(st.summary.frames_in >= max_frames or st.done for st in self.streams):
                break
            if duration is not None and time.perf_counter() - t_start >= duration:
                break
            ready = self.gather(max_frames, timeout=0.0 if inflight else 0.5, settle=True)
            submitted = self.submit_round(ready) if ready else []
            self.collect_round(inflight)
            inflight = submitted
            if not overlap:
                self.collect_round(inflight)
            if not ready and not inflight and all(st.done for st in self.streams):
                break
            now = time.perf_counter()
            if now - last_status >= interval:
                last_status = now
                self._publish_status()
        self.collect_round(inflight)  # the last round (a stop request keeps the frames in flight)
        elapsed = time.perf_counter() - t_start
        for st in self.streams:
            st.live.finish(elapsed, st.cap.dropped, st.pipeline.guarded_by_model())

    def _publish_status(self) -> None:
        guarded = self.streams[0].pipeline.guarded_by_model()  # a device read (shared models), once per interval
        gpu = self.telemetry.latest() if self.telemetry is not None else None
        for i, st in enumerate(self.streams):
            status = st.live.status(st.cap.dropped, guarded, gpu=gpu, degraded=self.degrader.off)
            st.state.publish_status(status)
            if i == 0 and self._on_status is not None:
                self._on_status(status, st.state.active, st.state.swap_enabled)
            if self._on_stream_status is not None:
                self._on_stream_status(st.name, status, st.state.active, st.state.swap_enabled)

    def gather(self, max_frames: int | None = None, timeout: float = 0.5, *, settle: bool = False) -> list[tuple[Stream, Frame]]:
        """The newest frame of each stream that has one: waits up to ``timeout`` for the first, then
        at most ``[pipeline] batch_deadline`` for the other running streams whose next frame is due
        within it (:meth:`CaptureThread.expects_by <vcam.stages.capture.CaptureThread.expects_by>`). A stream whose source
        ended is marked done; one whose source failed too (one error line), unless it is the only
        stream, whose error stops the daemon. With ``settle`` (the frame loop, models loaded), the
        time spent waiting applies the detections still pending (:meth:`Pipeline.settle`)."""
        ready: list[tuple[Stream, Frame]] = []
        taken: set[str] = set()

        def wants(st: Stream) -> bool:
            return not st.done and st.name not in taken and (max_frames is None or st.summary.frames_in < max_frames)

        t0 = time.perf_counter()
        first_at: float | None = None
        deadline = float(self.cfg.pipeline.batch_deadline)
        while not self.should_exit:
            self._wake.clear()
            for st in self.streams:
                if not wants(st):
                    continue
                try:
                    frame = st.cap.get(timeout=0)
                except VcamError as exc:
                    if len(self.streams) == 1:
                        raise
                    log.error("stream %s stopped: %s", st.name, exc)
                    st.summary.error = str(exc)
                    st.done = True
                    continue
                if frame is not None:
                    ready.append((st, frame))
                    taken.add(st.name)
                elif st.cap.finished:
                    st.done = True
            now = time.perf_counter()
            if ready:
                first_at = first_at if first_at is not None else now
                # wait only for the streams whose next frame is due before the deadline (a camera
                # out of phase with the others, or stalled, is not waited for at all)
                waiting = any(wants(st) and st.cap.expects_by(first_at + deadline, now) for st in self.streams)
                if not waiting or now - first_at >= deadline:
                    break
                self._wake.wait(first_at + deadline - now)
            else:
                if not any(wants(st) for st in self.streams) or now - t0 >= timeout:
                    break
                # Idle: apply the detections still pending (each stream's last predicted frame) now,
                # not at the next frame; until they have all arrived, look again every 0.5 ms.
                settled = not settle or all([st.pipeline.settle() for st in self.streams])  # each, every time
                self._wake.wait(t0 + timeout - now if settled else min(t0 + timeout - now, 0.0005))
        return ready

    def on_frames(self, ready: list[tuple[Stream, Frame]]) -> None:
        """One round without overlap: :meth:`submit_round` then :meth:`collect_round`."""
        self.collect_round(self.submit_round(ready))

    def submit_round(self, ready: list[tuple[Stream, Frame]]) -> list[tuple[Stream, int]]:
        """One frame of each ready stream: the stages up to the aligned faces per stream, the faces of
        all of them through the swapper in one batch (chunks of the swapper's capacity), the rest
        per stream. Returns each stream's slot for :meth:`collect_round`."""
        works = []
        for st, frame in ready:
            st.live.frame_in(frame.t_capture)
            works.append((st, st.pipeline.begin(frame, st.state.snapshot())))
        swapper = self.assembly.swapper
        slots = []
        for chunk in _chunks(works, swapper.max_faces):
            faced = [w for _, w in chunk if w.n]
            crops = mask = None
            if faced:
                crops, mask = swapper.swap_batch([(w.img, w.mats) for w in faced], _row_sources(faced))
            lo = 0
            for st, w in chunk:
                hi = lo + w.n
                rows = mask[lo:hi] if getattr(mask, "ndim", 2) == 3 else mask  # per-face masks, or one shared
                slots.append((st, st.pipeline.finish(w, crops[lo:hi] if w.n else None, rows, detect_now=False)))
                lo = hi
        return slots

    def collect_round(self, slots: list[tuple[Stream, int]]) -> None:
        """Wait for each stream's output of a submitted round, then pace, drop if over the stream's
        budget, publish (frames of a stream are published in order: rounds are collected in order).
        Then the stream's predicted frame's detection is queued (left by :meth:`submit_round`):
        after the publish, so its host time is not in the frame's latency."""
        for st, slot in slots:
            data, stats = st.pipeline.collect(slot)
            self._publish(st, data, stats)
            st.pipeline.launch_detection()
        slots.clear()

    def _publish(self, st: Stream, data: Any, stats: Any) -> None:
        live = st.live
        live.processed(stats)
        if st.cfg.output.fps:
            wait = st.last_pub + 1.0 / st.cfg.output.fps - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        budget = st.budget
        now = time.perf_counter()
        if budget > 0 and now - stats.t_capture > budget:
            live.dropped_late()
            self._degrade(st, now, now - stats.t_capture, True)
            return
        st.output.send(data)
        if getattr(st.output, "user_closed", False):  # preview window closed by the user
            self.should_exit = True
        st.last_pub = time.perf_counter()
        live.published(stats.t_capture, st.last_pub)
        self._degrade(st, st.last_pub, st.last_pub - stats.t_capture, False)

    def shutdown(self, raise_errors: bool = False) -> None:
        """Stop and close every component, whatever one of them does; with ``raise_errors`` the first
        :class:`VcamError` a component raised (a file output that could not be finished) is raised
        once all are closed, otherwise it is logged as one line."""
        # Order: capture threads first (stop reading), then the sources, the outputs, control.
        first: VcamError | None = None
        for comp in self._components:
            fn = getattr(comp, "stop", None) or getattr(comp, "close", None)
            if fn is None:
                continue
            try:
                fn()
            except VcamError as exc:
                if first is None and raise_errors:
                    first = exc
                else:
                    log.error("%s", exc)
            except Exception:  # a bug in a component: shutdown still finishes the others
                log.exception("error while closing %s", type(comp).__name__)
        self._components.clear()
        if first is not None:
            raise first


def pixelate(bgr: np.ndarray, blocks: int = 24) -> np.ndarray:
    """``bgr`` in ``blocks`` coarse blocks across (square blocks): the scene's colours and movement,
    no recognisable face (the early frames' default)."""
    import cv2

    h, w = bgr.shape[:2]
    bw = max(1, min(blocks, w))
    bh = max(1, min(h, round(bw * h / w)))
    small = cv2.resize(bgr, (bw, bh), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)


def check_streams(streams: list[tuple[str, Config]], given_outputs: dict[str, Any] | None = None) -> None:
    """ConfigError when two streams would open the same camera, write the same file or publish to
    the same virtual camera (``given_outputs``: streams whose output is given, not opened)."""
    from vcam.errors import ConfigError
    from vcam.stages.capture import parse_webcam_index
    from vcam.stages.publish import file_target

    seen: dict[tuple[str, str], str] = {}
    for name, cfg in streams:
        keys = []
        cam = parse_webcam_index(cfg.capture.input or "")
        if cam is not None:
            keys.append(("camera", f"webcam:{cam}"))
        if name not in (given_outputs or {}):
            target = (cfg.output.target or "").strip()
            path = file_target(target)
            if path is not None:
                keys.append(("file", str(path.expanduser().resolve())))
            elif target.lower() == "vcam":
                keys.append(("virtual camera", cfg.output.device_name))
        for key in keys:
            other = seen.setdefault(key, name)
            if other != name:
                what, value = key
                hint = {
                    "camera": "give each stream its own camera (`vcam devices` lists them)",
                    "file": "give each stream its own output file",
                    "virtual camera": "give each stream its own virtual camera: output = 'vcam:LABEL' with another "
                    "v4l2loopback label",
                }[what]
                raise ConfigError(f"streams {other} and {name} both use the {what} {value!r}", hint=hint)


def _chunks(works: list[tuple[Stream, Any]], capacity: int) -> list[list[tuple[Stream, Any]]]:
    """Consecutive groups of ``(stream, work)`` whose faces fit ``capacity`` rows (a frame's faces
    are never split)."""
    out: list[list[tuple[Stream, Any]]] = [[]]
    rows = 0
    for item in works:
        n = item[1].n
        if out[-1] and rows + n > capacity:
            out.append([])
            rows = 0
        out[-1].append(item)
        rows += n
    return out


def _row_sources(works: list) -> Any:
    """The swapper's ``faces`` for the rows of ``works``: the one face when every row has the same
    (the swapper then uploads nothing per frame), else one per row."""
    rows: list = []
    for w in works:
        rows.extend([w.sources] * w.n if not isinstance(w.sources, (list, tuple)) else w.sources)
    return rows[0] if rows and all(f is rows[0] for f in rows) else rows


__all__ = ["Daemon", "Stream", "check_streams"]
