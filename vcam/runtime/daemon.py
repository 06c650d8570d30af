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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vcam.config import Config
from vcam.engines.gate import ROUND_TURNS
from vcam.errors import VcamError
from vcam.platform import signals
from vcam.runtime import startup as _startup
from vcam.runtime.camera import Cameras, Lister
from vcam.runtime.pause import Pauses
from vcam.runtime.rounds import Round, RoundHook, Rounds, Stream
from vcam.stages.outputs import missing_members
from vcam.state import RuntimeState, Status
from vcam.status import RunSummary, swapped_locally_text

if TYPE_CHECKING:
    from vcam.runtime.assemble import Assembly
    from vcam.runtime.degrade import Degrader
    from vcam.runtime.early_swap import EarlySwap, Race
    from vcam.telemetry import Telemetry

log = logging.getLogger(__name__)


class Daemon:
    """Owns the threads of one run. ``run()`` blocks; ``start()``/``stop()`` run it in the background.

    ``output``/``source``/``state``: given instead of opened from the config (tests, benchmarks),
    for the first stream; ``outputs``/``sources``: the same by stream name. ``on_status(status,
    active_face, swap_on)``: called at each status interval for the first stream;
    ``on_stream_status(name, status, active_face, swap_on)`` for every stream. ``control``: start
    the local socket and OBS control (never for a run with neither a camera nor a virtual camera:
    :func:`vcam.runtime.startup.standalone`). ``panel``: serve the control panel as ``[panel]`` says
    (``announce(line)`` is told its URL). ``hook``: called at every phase boundary of every frame
    (:data:`vcam.runtime.rounds.RoundHook`: how measuring tools time the loop). ``timing``: the
    pipelines measure their device-side stage times. ``early_swap``: whether early frames are
    swapped on the CPU while the models load (the early swap, :mod:`vcam.runtime.early_swap`): None as ``[pipeline]
    early_frames`` says on a GPU run, True whatever the device (two CPU assemblies: tests), False
    never. ``load_delay``: seconds the model load (the full one of an early swap) is made slower.
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
        hook: RoundHook | None = None,
        timing: bool = False,
        panel: bool = False,
        announce: Callable[[str], None] | None = None,
        early_swap: bool | None = None,
        load_delay: float = 0.0,
        cameras: Lister | None = None,
    ) -> None:
        self.cfg = cfg
        self.state = state or RuntimeState()
        self._on_status = on_status
        self._on_stream_status = on_stream_status
        self.control_on = control
        self.panel_on = panel  # serve the panel ([panel]; `vcam run` turns it on)
        self.announce = announce  # told one-line news for the user (the panel's URL)
        self.timing = timing
        self.should_exit = False
        self.force_exit = False
        self.signalled = False  # a stop signal (Ctrl-C) came: a conversion not at its end is cut short
        self._held: list[int] | None = None  # stop signals held while an output is opened (held_signals)
        self._max_frames: int | None = None
        self._thread: threading.Thread | None = None
        self.streams: list[Stream] = [
            Stream(name, scfg, self.state if i == 0 else RuntimeState()) for i, (name, scfg) in enumerate(cfg.per_stream())
        ]
        self.summary = self.streams[0].summary
        first = self.streams[0].name
        self.given_outputs = dict(outputs or {})
        self.given_sources = dict(sources or {})
        if output is not None:
            self.given_outputs[first] = output
        for name, given in self.given_outputs.items():
            if lacking := missing_members(given):
                raise TypeError(
                    f"the output given for stream {name!r} ({type(given).__name__}) lacks {', '.join(lacking)}: "
                    "subclass vcam.stages.outputs.OutputBase, which has them all but send"
                )
        if source is not None:
            self.given_sources[first] = source
        self.ready = threading.Event()
        self.early_swap = early_swap
        self.load_delay = float(load_delay)
        #: What start-up opened and loaded (:class:`vcam.runtime.startup.Started`; empty until then).
        self.up = _startup.Started(control=control, streams=self.streams)
        self.wake: threading.Event = signals.Wake()  # set by the stop signals' handler too
        self.rounds = Rounds(
            self.streams,
            swapper=None,  # the assembly's, once loaded
            batch_deadline=float(cfg.pipeline.batch_deadline),
            wake=self.wake,
            should_exit=lambda: self.should_exit,
            exit_requested=self.request_stop,
            stages_on={},
            hook=hook,
        )
        #: Each stream's pause and resume (vcam ctl pause, OBS, the panel): see vcam.runtime.pause.
        self.pauses = Pauses(self.rounds)
        #: Each stream's camera switches (vcam ctl camera, OBS, the panel): see vcam.runtime.camera;
        #: ``cameras``: the machine's cameras (default: the platform's enumeration; tests give their own).
        self.cameras = Cameras(self.rounds, cameras)

    @property
    def load_in_flight(self) -> bool:
        """A stop came while the models loaded and the load still runs: a process that ends now
        must end with ``os._exit`` (native threads of the load must not be unwound under it)."""
        return self.loading is not None and self.loading.is_alive()

    @property
    def loading(self) -> threading.Thread | None:
        """A model load left running by a stop before the models were in use (see startup)."""
        return self.up.loading

    @property
    def assembly(self) -> Assembly | None:
        """The models in use (None before start-up loaded them)."""
        return self.up.assembly

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """After :meth:`startup`, before the frame loop (benchmarks timing the compiled swapper):
        let the engines' background work go now, not at the first frame (none comes while this
        waits: waiting with the gate held deadlocked ``benchmarks.streams`` on CUDA), and wait for
        it (:meth:`vcam.runtime.assemble.Assembly.wait_compiled`)."""
        self.up.release_background()
        return self.assembly.wait_compiled(timeout) if self.assembly is not None else True

    @property
    def instance_lock(self) -> Any:
        """The control socket's and OBS scenes' locks (:class:`vcam.runtime.startup.LockSet`) while held."""
        return self.up.locks

    @property
    def telemetry(self) -> Telemetry | None:
        return self.up.telemetry  # when NVML is there

    @property
    def degrader(self) -> Degrader | None:
        return self.up.degrader

    @property
    def detector(self) -> Any:
        return self.assembly.detector if self.assembly is not None else None

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
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def request_stop(self) -> None:
        self.should_exit = True
        self.wake.set()

    def install_signal_handlers(self) -> Callable[[], None]:
        """The stop signals (:mod:`vcam.platform.signals`: SIGINT/SIGTERM/SIGHUP; on Windows
        Ctrl-C, Ctrl-Break and closing the console) -> :meth:`handle_exit`: each stops the run
        cleanly, a second forces the exit. Main thread only; returns a function that restores the
        previous handlers. A signal the process was started ignoring (SIGHUP under nohup) stays
        ignored."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        return signals.install(self.handle_exit)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._held is not None:
            self._held.append(sig)
            return
        self.signalled = True
        if self.should_exit:
            self.force_exit = True
            log.warning("forced exit")
            # The files are left playable here, at the second signal, whatever the code it lands in
            # (an output being closed, a capture thread joined) does with the exit on its way out.
            self.salvage_outputs()
            raise SystemExit(130)
        self.should_exit = True
        self.wake.set()

    @contextmanager
    def held_signals(self) -> Iterator[None]:
        """Stop signals that come inside wait and are handled on the way out: an output being
        opened (its hidden temporary file made, not yet in :attr:`streams`) is never left behind by
        a forced exit that :meth:`salvage_outputs` could not see."""
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for sig in held:
                self.handle_exit(sig, None)

    def run(self, *, max_frames: int | None = None, duration: float | None = None) -> RunSummary:
        """Start up, run the loop until a limit, the end of the input or a stop request, shut down.
        Returns the first stream's summary (:attr:`summaries` has every stream's)."""
        restore = self.install_signal_handlers()
        self.summary.error = None
        self._max_frames = max_frames
        try:
            self.startup(max_frames)
            self.main_loop(max_frames, duration)
        except BaseException:
            self.mark_cut_short()
            self.shutdown(raise_errors=False)  # the error in flight is the one to report
            raise
        else:
            self.mark_cut_short()
            self.shutdown(raise_errors=True)  # e.g. the output file could not be finished
        finally:
            restore()
            if self.up.early is not None:  # ended on the CPU assembly: the full load is left running
                self.up.early.left_running()
            self.note_outcome()
            self.ready.set()
        return self.summary

    def mark_cut_short(self) -> None:
        """A stop signal before a conversion (every frame of a file) reached the end of its input
        (or its ``--frames``): that stream's summary says so and its file output keeps what was
        written as ``NAME.partial.mp4``, never under the name asked for."""
        if not self.signalled:
            return
        for st in self.streams:
            reached = self._max_frames is not None and st.summary.frames_in >= self._max_frames
            if st.delivery is None or not st.delivery.lossless or st.delivery.loop or st.done or reached:
                continue
            st.summary.interrupted = True
            if st.output is not None:
                st.output.cut_short = True

    def note_outcome(self) -> None:
        """Each summary names its active face and its file output (codec, pixel format, size, and
        where the file was kept)."""
        self.up.release_background()  # a run that ends before its first frame
        if self.assembly is not None:
            self.assembly.settle()
        for st in self.streams:
            if self.assembly is not None:
                st.summary.face = st.state.active or ""
                st.summary.models = self.assembly.describe()
            out = st.output
            text = out.describe() if out is not None else ""
            if out is None or not text:
                continue
            if out.kept is not None and out.kept != out.path:
                text = f"{text}; cut short, kept as {out.kept}"
            elif out.closed and out.kept is None:
                text = f"{text}; nothing written"
            st.summary.output = text

    def salvage_outputs(self) -> None:
        """A forced exit (a second signal), perhaps in the middle of closing the outputs: each file
        output leaves its frames playable under its name or as ``NAME.partial.mp4``, never as a
        hidden temporary file (:meth:`vcam.stages.recording.FileOutput.salvage`)."""
        for st in self.streams:
            if st.output is None or st.output.path is None:
                log.info("forced exit: stream %s has no file output to keep (%s)", st.name, type(st.output).__name__)
                continue
            kept = st.output.salvage()
            if kept is not None:
                log.warning("forced exit: the recording is in %s", kept)
            else:
                log.info("forced exit: nothing of %s was kept", st.output)

    def startup(self, max_frames: int | None = None) -> None:
        """Open the sources, load the models, open the outputs, start capture and control: one
        :class:`~vcam.runtime.startup.Started` (with early frames the camera is published while
        the models load), which the frame loop then runs on."""
        self.up = _startup.start(self, max_frames)
        if self.assembly is not None:
            self.ready.set()

    def plan_early_swap(self, up: _startup.Started) -> EarlySwap | None:
        """At the start, the outputs open: the early swap where the early frames can be swapped on
        the CPU while the models load (:func:`vcam.runtime.early_swap.cpu_config`), else None."""
        from vcam.runtime.early_swap import EarlySwap, cpu_config

        cpu_cfg = cpu_config(self)
        return EarlySwap(self, up, cpu_cfg) if cpu_cfg is not None else None

    def _switch(self) -> bool:
        """An early swap's full assembly, loaded: in use from the next round (see
        :meth:`vcam.runtime.early_swap.EarlySwap.switch`). True when the assembly changed."""
        assert self.up.early is not None
        return bool(self.up.early.switch())

    # -- the loop -------------------------------------------------------------------------------
    def main_loop(self, max_frames: int | None, duration: float | None) -> None:
        """Ticks until a limit, the end of every input or a stop request (see the module docstring)."""
        if self.assembly is None or any(st.live is None for st in self.streams):
            return  # stopped during start-up, before the models were loaded
        loop = Loop(max_frames, duration, overlap=overlaps(self.assembly), race=self._race())
        self.pauses.watch()
        try:
            while not self.should_exit and self.tick(loop):
                pass
        finally:
            if loop.race is not None:
                loop.race.close()
            ROUND_TURNS.fall_behind(False)  # the process's turns: a later loop starts within its budget
        self.rounds.collect(loop.inflight)  # the last round (a stop request keeps the frames in flight)
        elapsed = time.perf_counter() - loop.t_start
        for st in self.streams:
            assert st.live is not None and st.cap is not None and st.pipeline is not None
            st.live.finish(elapsed, st.cap.dropped, st.pipeline.guarded_by_model())
        if self.streams:  # one swapper for every stream: its count goes to the first summary
            self.streams[0].summary.swapped_locally = int(getattr(self.assembly.swapper, "swapped_locally", 0))

    def tick(self, loop: Loop) -> bool:
        """One round of the frame loop: an early swap's switch when due, the limits, the pause
        requests, then the round (raced on the CPU under a budget while the GPU loads, else
        gathered, submitted and collected, overlapped where the ops run beside the host), the
        status. False when the run is at its end."""
        self._switch_when_due(loop)
        if loop.ended(self.streams):
            return False
        self.pauses.tick()
        self.cameras.tick()
        rounds = self.rounds
        if loop.race is not None:
            ready = rounds.gather(loop.max_frames, timeout=self.pauses.timeout(0.5))
            with ROUND_TURNS.round():  # background Python steps aside (vcam.engines.gate.RoundTurns)
                loop.race.run(ready)
            submitted = Round()
        else:
            ready = rounds.gather(loop.max_frames, timeout=0.0 if loop.inflight else self.pauses.timeout(0.5), settle=True)
            with ROUND_TURNS.round():
                submitted = rounds.submit(ready) if ready else Round()
                rounds.collect(loop.inflight)
                if not loop.overlap:
                    rounds.collect(submitted)
        loop.inflight = submitted
        if not ready and not loop.inflight and all(st.done for st in self.streams):
            return False
        now = time.perf_counter()
        if now - loop.last_status >= float(self.cfg.status.interval):
            loop.last_status = now
            self._publish_status()
        return True

    def _race(self) -> Race | None:
        """The CPU frames of an early swap under a latency budget (:class:`vcam.runtime.early_swap.Race`)."""
        if self.up.early is None or not any(st.budget > 0 for st in self.streams):
            return None
        from vcam.runtime.early_swap import Race

        return Race(self.rounds)

    def _switch_when_due(self, loop: Loop) -> None:
        """An early swap's full assembly, loaded: in use from this round on, none in flight (the CPU
        collects each round at once; a raced swap is waited for); the work held back for the
        first frame begins once a frame went out through it."""
        if self.up.early is not None and self.up.early.ready() and not (loop.race is not None and loop.race.busy):
            self.rounds.collect(loop.inflight)
            loop.inflight = Round()
            if loop.race is not None:
                loop.race.close()
                loop.race = None
            if self._switch():
                loop.overlap = overlaps(self.assembly)
                loop.release_after = sum(st.summary.frames_out for st in self.streams)
        if loop.release_after is not None and sum(st.summary.frames_out for st in self.streams) > loop.release_after:
            loop.release_after = None
            self.up.release_background()  # the first frame through the full assembly is out

    def gather(self, max_frames: int | None = None, timeout: float = 0.5, *, settle: bool = False) -> list[tuple[Stream, Any]]:
        """:meth:`Rounds.gather <vcam.runtime.rounds.Rounds.gather>` over this daemon's streams."""
        return self.rounds.gather(max_frames, timeout, settle=settle)

    def _publish_status(self) -> None:
        first = self.streams[0].pipeline
        assert first is not None
        guarded = first.guarded_by_model()  # a device read (shared models), once per interval
        gpu = self.telemetry.latest() if self.telemetry is not None else None
        off = self.degrader.off if self.degrader is not None else ()
        engines = engine_notes(self.assembly.swapper if self.assembly is not None else None)
        if self.up.early is not None:  # the status line, `vcam ctl status` and the OBS text say why the device is the CPU
            engines += ("swapping on the CPU while the GPU loads",)
        for i, st in enumerate(self.streams):
            assert st.live is not None and st.cap is not None
            fps = float(getattr(st.source, "fps", 0.0) or 0.0)
            frame_s = 1.0 / fps if fps > 0 else 0.0
            status = st.live.status(st.cap.dropped, guarded, gpu=gpu, degraded=off, engines=engines, frame_s=frame_s)
            status.paused = st.paused
            st.state.publish_status(status)
            if i == 0 and self._on_status is not None:
                self._on_status(status, st.state.active, st.state.swap_enabled)
            if self._on_stream_status is not None:
                self._on_stream_status(st.name, status, st.state.active, st.state.swap_enabled)

    def shutdown(self, raise_errors: bool = False) -> None:
        """Stop and close every component, whatever one of them does; with ``raise_errors`` the first
        :class:`VcamError` a component raised (a file output that could not be finished) is raised
        once all are closed, otherwise it is logged as one line."""
        # Order: capture threads first (stop reading), then the rest in reverse order of opening,
        # the instance locks last (:meth:`vcam.runtime.startup.Started.close`).
        self.pauses.close()  # a camera being opened again for a resume is closed with the rest
        self.cameras.close()  # and one opened for a switch, not adopted yet
        first: VcamError | None = None
        for exc in self.up.close():
            if first is None and raise_errors:
                first = exc
            else:
                log.error("%s", exc)
        if first is not None:
            raise first


@dataclass
class Loop:
    """The frame loop's own state between ticks (:meth:`Daemon.tick`): its limits, the round in
    flight (submitted, not yet collected), whether rounds overlap, the frames out when the
    early swap switched (the background work waits for one more), the CPU race of an early swap."""

    max_frames: int | None
    duration: float | None
    overlap: bool = False
    race: Race | None = None
    inflight: Round = field(default_factory=Round)
    release_after: int | None = None
    t_start: float = field(default_factory=time.perf_counter)
    last_status: float = field(default_factory=time.perf_counter)

    def ended(self, streams: list[Stream]) -> bool:
        """``max_frames`` frames in on every stream (or its input ended), or ``duration`` over."""
        if self.max_frames is not None and all(st.summary.frames_in >= self.max_frames or st.done for st in streams):
            return True
        return self.duration is not None and time.perf_counter() - self.t_start >= self.duration


def overlaps(asm: Any) -> bool:
    """Whether the frame loop submits the next round before it collects this one: where the ops run
    work beside the host (CUDA), or the swapper answers later (remote)."""
    return bool(getattr(asm.ops, "concurrent", False) or getattr(asm.swapper, "deferred", False))


def engine_notes(swapper: Any) -> tuple[str, ...]:
    """What the status says about the swapper's engine beyond the numbers: a remote server that is
    down (``swapper: remote gpu-box:8001 down since 12:01:03``), compiled engines being built in
    the background (``swapper: compiling engines: 2/4, ~40 s left``)."""
    engine = getattr(swapper, "engine", None)
    notes: tuple[str, ...] = ()
    if engine is not None and getattr(engine, "in_episode", getattr(engine, "down", False)):
        notes = (f"swapper: {engine.health()}",)
    elif engine is not None and (progress := getattr(engine, "compile_progress", "")):
        notes = (f"swapper: {progress}",)
    if local := getattr(swapper, "swapped_locally", 0):
        notes += (f"swapper: {swapped_locally_text(local)}",)
    return notes
