"""The daemon: capture thread -> frame loop (the pipeline) -> publish, with live status and control.

Shaped like uvicorn's ``Server``: :meth:`Daemon.run` is startup (source, models via
:mod:`vcam.assemble`, faces, output, control, capture thread), a short loop whose body is
:meth:`Daemon.on_frame`, and shutdown (capture first, then source, output, control; a file output is
finalised). The daemon handles its own signals: the first SIGINT/SIGTERM sets ``should_exit`` (the
loop drains and stops cleanly), a second sets ``force_exit`` and leaves at once. Control channels
(OBS, local socket) only post changes to :class:`~vcam.state.RuntimeState`.

Latency: each frame carries its capture time; a frame older than ``pipeline.max_latency`` when it
would be published is dropped and counted, and the status shows the budget being exceeded.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import Config
from .errors import VcamError
from .state import RuntimeState, Status
from .status import LiveStats, RunSummary
from .types import Frame

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Daemon:
    """Owns the threads of one run. ``run()`` blocks; ``start()``/``stop()`` run it in the background.

    ``output``/``source``: given instead of opened from the config (tests, benchmarks).
    ``on_status(status, active_face, swap_on)``: called at each status interval. ``control``: start
    the local socket and OBS control.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        state: RuntimeState | None = None,
        output: Any = None,
        source: Any = None,
        on_status: Callable[[Status, str | None, bool], None] | None = None,
        control: bool = True,
    ) -> None:
        self.cfg = cfg
        self.state = state or RuntimeState()
        self._output = output
        self._source = source
        self._on_status = on_status
        self._control = control
        self.should_exit = False
        self.force_exit = False
        self._thread: threading.Thread | None = None
        self.summary = RunSummary()
        self.ready = threading.Event()
        self.assembly: Any = None
        self._components: list = []
        self.delivery: Any = None  # capture.Delivery, set at start-up

    @property
    def device(self) -> str:
        return self.assembly.device if self.assembly is not None else "cpu"

    @property
    def detector(self) -> Any:
        return self.assembly.detector if self.assembly is not None else None

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
        if self._thread is not None:
            self._thread.join(timeout)

    def request_stop(self) -> None:
        self.should_exit = True

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

    def run(self, *, max_frames: int | None = None, duration: float | None = None) -> RunSummary:
        """Start up, run the loop until a limit, the end of the input or a stop request, shut down."""
        restore = self.install_signal_handlers()
        self.summary.error = None
        try:
            cap = self.startup(max_frames)
            self.main_loop(cap, max_frames, duration)
        except BaseException:
            self.shutdown(raise_errors=False)  # the error in flight is the one to report
            raise
        else:
            self.shutdown(raise_errors=True)  # e.g. the output file could not be finished
        finally:
            restore()
            self.ready.set()
        return self.summary

    def startup(self, max_frames: int | None = None) -> Any:
        from . import assemble, capture, publish

        cfg = self.cfg
        if self._output is None:
            publish.refuse_overwriting_input(cfg.output.target, cfg.capture.input)
        self.delivery = capture.plan_delivery(cfg.capture, "" if self._output is not None else cfg.output.target, max_frames)
        source = self._source or capture.open_source(cfg.capture, delivery=self.delivery)
        self._components.append(source)
        fps = source.fps or cfg.capture.fps
        asm = self.assembly = assemble.build(cfg, fps=fps)
        self.summary.device = asm.device
        self.summary.models = asm.describe()
        log.info("models: %s", self.summary.models)
        if not self.state.names:
            watcher = assemble.load_faces(asm, self.state, demo_input=cfg.capture.input == "demo")
            watcher.start()
            self._components.append(watcher)
        output = self._output
        if output is None:
            # Live input: stamp file frames by wall clock (plays at real speed even with drops);
            # lossless input: by frame count, so the file keeps the input's rate and every frame.
            timing = "frames" if self.delivery.lossless else "wall"
            output = publish.open_output(cfg.output, source.width, source.height, cfg.output.fps or fps, file_timing=timing)
        self._components.append(output)
        self.output = output
        self.pipeline = asm.make_pipeline(output.fmt, source.width, source.height, source.fmt)
        self._start_control()
        cap = capture.CaptureThread(source, lossless=self.delivery.lossless)
        cap.start()
        self._components.insert(0, cap)
        self.ready.set()
        return cap

    def _start_control(self) -> None:
        if not self._control:
            return
        from .control.local import ControlServer

        try:
            srv = ControlServer(self.cfg.socket_path, self.state)
            srv.start()
            self._components.append(srv)
        except VcamError as exc:
            log.warning("local control disabled: %s", exc)
        if self.cfg.obs.enabled:
            from .control.obs import ObsController

            obs = ObsController(self.cfg.obs, self.state)
            obs.start()
            self._components.append(obs)

    # -- the loop -------------------------------------------------------------------------------
    def main_loop(self, cap: Any, max_frames: int | None, duration: float | None) -> None:
        live = LiveStats(self.summary)
        pipeline = self.pipeline
        interval = float(self.cfg.status.interval)
        t_start = last_status = time.perf_counter()
        self._last_pub = 0.0
        while not self.should_exit:
            if max_frames is not None and self.summary.frames_in >= max_frames:
                break
            if duration is not None and time.perf_counter() - t_start >= duration:
                break
            frame = cap.get(timeout=0.5)
            if frame is None:
                if cap.finished:
                    break
                continue
            self.on_frame(frame, pipeline, live)
            now = time.perf_counter()
            if now - last_status >= interval:
                last_status = now
                status = live.status(cap.dropped, pipeline.guarded_by_model())  # a device read, once per interval
                self.state.publish_status(status)
                if self._on_status is not None:
                    self._on_status(status, self.state.active, self.state.swap_enabled)
        live.finish(time.perf_counter() - t_start, cap.dropped, pipeline.guarded_by_model())

    def on_frame(self, frame: Frame, pipeline: Any, live: LiveStats) -> None:
        """One frame: process, pace to ``[output] fps``, drop if over the latency budget, publish."""
        live.frame_in(frame.t_capture)
        data, stats = pipeline.process(frame, self.state.snapshot())
        live.processed(stats)
        if self.cfg.output.fps:
            wait = self._last_pub + 1.0 / self.cfg.output.fps - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        budget = 0.0 if self.delivery.lossless else float(self.cfg.pipeline.max_latency)  # lossless: every frame
        if budget > 0 and time.perf_counter() - frame.t_capture > budget:
            live.dropped_late()
            return
        self.output.send(data)
        if getattr(self.output, "user_closed", False):  # preview window closed by the user
            self.should_exit = True
        self._last_pub = time.perf_counter()
        live.published(frame.t_capture, self._last_pub)

    def shutdown(self, raise_errors: bool = False) -> None:
        """Stop and close every component, whatever one of them does; with ``raise_errors`` the first
        :class:`VcamError` a component raised (a file output that could not be finished) is raised
        once all are closed, otherwise it is logged as one line."""
        # Order: capture thread first (stops reading), then the source, the output, control.
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


__all__ = ["Daemon"]
