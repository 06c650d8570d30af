"""The daemon's start-up: one :class:`Started` (built and returned by :func:`start`), holding the
locks, sources, outputs, capture threads, models (:mod:`vcam.runtime.assemble`) and faces,
telemetry and control, opened in that order and closed in reverse by one exit stack.

With early frames (``[pipeline] early_frames``, live runs without a frame enhancer) the outputs
open first and each stream's newest camera frame is published (pixelated by default, each within
the latency budget) while the models load in a thread; the capture threads then get their
stream's own stage (:func:`capture_stage`: the MJPG decode and the pinned staging of the GPU path).
A GPU run (``early_frames = "swap"``) swaps them on a CPU assembly instead as soon as that is
built, and the frame loop switches to the GPU's between two frames (the early swap,
:mod:`vcam.runtime.early_swap`): hence the load's two halves, :func:`prepare` (build, touching no
stream) and :func:`adopt` (put in use).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from vcam.config import Config
from vcam.engines.held import restore_switches, shorten_switches
from vcam.errors import VcamError
from vcam.platform import process
from vcam.runtime.opened import Opened
from vcam.runtime.rounds import SHED_SWAP, start_pixel_threads
from vcam.status import LiveStats
from vcam.types import Frame, PixelFormat

if TYPE_CHECKING:
    from vcam.pipeline.pipeline import Pipeline
    from vcam.runtime.assemble import Assembly
    from vcam.runtime.camera import Cameras
    from vcam.runtime.degrade import Degrader
    from vcam.runtime.rounds import Rounds, Stream
    from vcam.state import RuntimeState
    from vcam.status import RunSummary
    from vcam.telemetry import Telemetry

log = logging.getLogger(__name__)


class Daemon(Protocol):
    """What start-up reads (never writes): :class:`vcam.runtime.daemon.Daemon` as this module sees it."""

    cfg: Config
    streams: list[Stream]
    state: RuntimeState
    summary: RunSummary
    rounds: Rounds
    timing: bool
    should_exit: bool
    control_on: bool
    panel_on: bool
    announce: Callable[[str], None] | None
    early_swap: bool | None
    load_delay: float
    given_outputs: dict[str, Any]
    given_sources: dict[str, Any]
    wake: threading.Event
    cameras: Cameras

    def held_signals(self) -> AbstractContextManager[None]: ...

    def plan_early_swap(self, up: Started) -> Any: ...


@dataclass
class Started:
    """What a start-up opened and loaded, one object (:func:`start` builds and returns it; the
    daemon's frame loop runs on it; :meth:`close` closes it). In the order :func:`start` opens them:

    1. ``locks``: the control socket's and OBS scenes' (:func:`take_instance_lock`), released last;
    2. each stream's source, then (early frames) its output and capture thread;
    3. ``loaded``: the models in use (:class:`Loaded`: assembly, pipelines, capture stages, faces
       watcher; a file output opened once the frame size is known), replaced by another between
       two frames by an early swap (``early``: :class:`vcam.runtime.early_swap.EarlySwap`);
    4. ``telemetry`` and ``degrader``; the control socket and OBS controllers (``obs``); the
       panel (``panel``).

    ``switches``: the interpreter's thread switch interval, short while the models load beside the
    early frames (:class:`ShortSwitches`), back to what it was once they are the run's own;
    ``collector``: Python's garbage collector off meanwhile (:class:`HeldCollector`).

    ``opened`` closes them in reverse (:class:`vcam.runtime.opened.Opened`); the capture threads
    are stopped first (:meth:`stop_capture`: no frame is read while the rest closes). ``loading``:
    a load left running by a stop before the models were in use (the process ends with
    ``os._exit``); ``control``: whether this run offers `vcam ctl` and OBS control."""

    opened: Opened = field(default_factory=Opened)
    locks: LockSet | None = None
    loaded: Loaded | None = None
    early: Any = None  # a vcam.runtime.early_swap.EarlySwap (the layer above) under way, else None
    telemetry: Telemetry | None = None
    degrader: Degrader | None = None
    loading: threading.Thread | None = None
    control: bool = True
    streams: list[Stream] = field(default_factory=list)
    panel: Any = None  # the daemon's side of the panel (vcam.runtime.panel), when it serves one
    obs: list[Any] = field(default_factory=list)  # the OBS controllers, one per stream
    switches: ShortSwitches | None = None  # while the models load beside the early frames
    collector: HeldCollector | None = None  # likewise

    def models_final(self) -> None:
        """The models in use are the run's own (the load ended, or an early swap switched): the
        interpreter's thread switch interval back to what it was (:class:`ShortSwitches`), the
        load's objects frozen and the collector back (:class:`HeldCollector`)."""
        if self.switches is not None:
            self.switches.close()
        if self.collector is not None:
            self.collector.close()

    @property
    def assembly(self) -> Assembly | None:
        return self.loaded.assembly if self.loaded is not None else None

    def release_background(self) -> None:
        """Let the work held back for the first frame begin (the engines' other graphs, the recogniser)."""
        if self.loaded is not None and self.loaded.release is not None:
            self.loaded.release()

    def stop_capture(self) -> None:
        for st in self.streams:
            if st.cap is not None:
                st.cap.stop()

    def close(self) -> list[VcamError]:
        """Everything closed, the capture threads first, the rest in reverse order of opening, the
        locks last; the :class:`VcamError` components raised (a file that could not be finished)."""
        self.stop_capture()
        errors = self.opened.close()
        if self.assembly is not None:
            try:
                self.assembly.stop_builds()
            except Exception:
                log.exception("error while stopping the background compile")
        if self.locks is not None:  # the last thing: another daemon may start from here on
            self.locks.close()
            self.locks = None
        return errors


def start(d: Daemon, max_frames: int | None = None) -> Started:
    """Open the sources, load the models, open the outputs, start capture, telemetry and control;
    the :class:`Started` that holds them. A failure closes what was opened and is raised."""
    up = Started(control=d.control_on, streams=d.streams)
    try:
        _start(d, up, max_frames)
    except BaseException:
        for exc in up.close():
            log.error("%s", exc)
        raise
    return up


def _start(d: Daemon, up: Started, max_frames: int | None) -> None:
    from vcam.stages import capture, recording

    if up.control and standalone(d):
        up.control = False
        log.info("no camera and no virtual camera: this run leaves the control socket and OBS to any live vcam")
    if up.control:  # one daemon per control socket: a second one stops here, naming the first
        up.locks = take_instance_lock(d)
    check_streams([(st.name, st.cfg) for st in d.streams if st.name not in d.given_sources], d.given_outputs)
    for st in d.streams:
        given_output = st.name in d.given_outputs
        if not given_output:
            recording.refuse_overwriting_input(st.cfg.output.target, st.cfg.capture.input)
        st.delivery = capture.plan_delivery(st.cfg.capture, "" if given_output else st.cfg.output.target, max_frames)
    if early_frames(d):  # a live run: its models build from here, beside the sources and outputs opening
        up.early = d.plan_early_swap(up)
    open_sources(d, up)
    for st in d.streams:
        st.summary.frames_total = frames_to_convert(st.source, st.delivery, max_frames)
    if early_frames(d):
        for st in d.streams:
            assert st.source is not None
            open_output(d, up.opened, st, st.source.width, st.source.height)
        start_capture(d, up, early=True)
        if not load_while_passing_through(d, up):
            return  # stopped (Ctrl-C) before the models were loaded: nothing more to start
        for st in d.streams:
            assert st.cap is not None
            st.cap.stage, st.cap.target = st.stage, st.target
    else:
        load(d, up)
        if up.loaded is None:
            return  # stopped while loading
        start_capture(d, up, early=False)
    start_telemetry(d, up)
    offer_settings(d, up)
    start_control(d, up)
    if d.panel_on and (d.cfg.panel.enabled or d.cfg.obs_source):  # off: not even its imports (issue 39)
        from vcam.runtime.panel import start_panel

        up.panel = start_panel(d, up)
        if up.panel is not None:
            up.opened.add(up.panel)


def standalone(d: Daemon) -> bool:
    """A run with neither a camera nor a virtual camera or OBS source (a file converted, the demo in a window):
    it shares nothing with a live daemon, so it runs beside one. It takes neither the control
    socket's lock nor an OBS scene's, and offers no `vcam ctl` socket and no OBS control (those stay
    the live daemon's: `vcam ctl` and OBS keep driving the camera, never a conversion); its panel,
    when on, is its own (a free port if the default is taken, no panel file). A given source or
    output counts as a device: what it is cannot be told here."""
    from vcam.errors import InputError
    from vcam.stages.capture import parse_webcam_index

    if d.given_sources or d.given_outputs:
        return False
    for st in d.streams:
        try:
            if parse_webcam_index(st.cfg.capture.input or "") is not None:
                return False
        except InputError:  # webcam:x, a camera all the same (opening it says what is wrong)
            return False
        target = (st.cfg.output.target or "").strip().lower()
        if target in ("vcam", "obs-source") or target.startswith("vcam:"):  # what OBS or a call shows
            return False
    return True


def open_sources(d: Daemon, up: Started) -> None:
    """Each stream's source, given or opened from its capture settings, set on the stream and added
    to ``up.opened`` in stream order (a resume may reopen it: :mod:`vcam.runtime.pause`). Several
    are opened at once, one thread each: a video's or a camera's opening waits in its library with
    the GIL let go (PyAV's probe of a 1080p clip: 60-110 ms on the H200's host), and four opened one
    after another held the start 0.4 s before the models began to load (issue 39, 2026-12-07; on the
    2-core CPU machine four 1080p clips open in 120 ms at once against 208 one by one:
    ``benchmarks.open_sources``). Where one fails, the others are added all the same (closed with
    the rest) and the first failure, in stream order, is raised."""
    from vcam.stages import capture

    def opened(st: Stream) -> Any:
        """The stream's new source, or what its opening raised."""
        assert st.delivery is not None
        try:
            return capture.open_source(st.cfg.capture, delivery=st.delivery, compressed=True)
        except BaseException as exc:
            return exc

    todo = [st for st in d.streams if st.name not in d.given_sources]
    if len(todo) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(todo), thread_name_prefix="vcam-open") as pool:
            got = dict(zip((st.name for st in todo), pool.map(opened, todo)))
    else:
        got = {st.name: opened(st) for st in todo}
    got.update(d.given_sources)
    failure: BaseException | None = None
    for st in d.streams:
        if isinstance(got[st.name], BaseException):
            failure = failure or got[st.name]
            continue
        st.source = got[st.name]
        up.opened.add_current(partial(getattr, st, "source"))
    if failure is not None:
        raise failure


def frames_to_convert(source: Any, delivery: Any, max_frames: int | None) -> int | None:
    """The input frames a conversion (every frame, played once) is to process: the source's frame
    count, capped by ``max_frames``; None for live inputs and loops (no end) or an unknown count."""
    if delivery is None or not delivery.lossless or delivery.loop:
        return None
    count = getattr(source, "frame_count", None)
    if not isinstance(count, int) or count <= 0:
        return max_frames
    return min(count, max_frames) if max_frames is not None else count


def take_instance_lock(d: Daemon) -> LockSet:
    """The control socket's lock (:class:`~vcam.control.instance.InstanceLock`) and, with OBS control,
    each stream's OBS scene lock, released at shutdown. Another daemon holding one stops this one
    (one line naming its PID): two daemons on one scene would switch each other's faces. A lock that
    cannot be used at all (another user's file, a folder others can write) turns that control off
    with one line (the socket; OBS control keeps going without its lock), and the video goes on."""
    from vcam.config import ControlConfig
    from vcam.control.instance import AlreadyRunning, InstanceLock

    locks = LockSet()
    try:
        lock = InstanceLock(d.cfg.socket_path)
        try:
            lock.acquire()
            locks.socket = lock
        except AlreadyRunning:
            raise
        except VcamError as exc:  # no local socket without its lock (OBS control stays on)
            log.warning("local control disabled: %s", exc)
        if d.cfg.obs.enabled:
            folder = d.cfg.replace(control=ControlConfig()).socket_path.parent  # the same whatever the socket
            for st in d.streams:
                obs = d.cfg.obs.for_stream(st.name, len(d.streams))
                scene = InstanceLock.for_obs_scene(folder, obs.host, obs.port, obs.scene)
                try:
                    scene.acquire()
                    locks.scenes.append(scene)
                except AlreadyRunning:
                    raise
                except VcamError as exc:
                    log.warning("OBS scene lock not taken: %s", exc)
    except BaseException:
        locks.close()
        raise
    return locks  # released last, once every output is finished


#: The interpreter's thread switch interval while the models load in a thread beside the early frames
#: (Python's default: 5 ms). A thread that wants the GIL waits up to the interval for a running one
#: to drop it, and an early frame takes the GIL several times (capture, gather, publish), so a load
#: running Python (imports, model building) held four 720p streams to 22-30 % of their frames in a
#: CPU model of the GPU start (a thread running Python for 6 s beside four early streams) against
#: 79-87 % at 0.5 ms; that thread did 9 % less meanwhile, and a real `import torch` beside them took
#: 1.02-1.06 s against 1.10-1.27 s (the frames 80-88 % against 75-85 %). At 0.02 ms (2026-12-06, the
#: same model, `benchmarks.gil_early --settings 0.5,0.02`, 2 runs): four streams 95-97 % against
#: 88-97 % at 0.5 ms, one stream 99-100 % both, the thread's work the same or more (144-176 against
#: 110-175 thousand laps). The GPU's rounds gain most: see :data:`vcam.engines.held.QUICK_SWITCHES`.
LOADING_SWITCH_S = 0.00002


class ShortSwitches:
    """The interpreter's thread switch interval shortened to :data:`LOADING_SWITCH_S` (never
    lengthened) from now until :meth:`close`, which puts the old one back (once; closing again does
    nothing). Held by :class:`Started` from the start of a load beside the early frames until the
    models in use are the run's own (:meth:`Started.models_final`), and in its exit stack, so a stop
    puts it back too. The interval is the interpreter's, one per process: vcam's daemon owns its
    process while it starts."""

    def __init__(self) -> None:
        self.saved: float | None
        self.saved, self.set_to = shorten_switches(LOADING_SWITCH_S)

    def close(self) -> None:
        """The old interval back, unless it was changed since (another daemon of this process that
        started loading meanwhile and ended first: its old value is this one's short one)."""
        if self.saved is not None:
            restore_switches(self.saved, self.set_to)
        self.saved = None


class HeldCollector:
    """Python's cyclic garbage collector off from the start of a load beside the early frames until
    :meth:`close`, which freezes what the load left alive and lets the collector run again
    (:func:`vcam.engines.held.collector_off`, counted with the CUDA graph captures' holds; closing
    again does nothing). Held by :class:`Started` as :class:`ShortSwitches` is. Issue 39 (H100, four
    1080p streams, 2026-12-06, ``benchmarks.first_seconds --stalls``): three full collections in the
    loading thread while ``import torch`` ran held the GIL 28, 68 and 99 ms, on the way to the first
    GPU frame, and every stream stood still meanwhile (pauses of 155-232 ms then)."""

    def __init__(self) -> None:
        from vcam.engines.held import collector_off

        self._held = ExitStack()
        self._held.enter_context(collector_off())

    def close(self) -> None:
        self._held.close()  # once: an ExitStack closed again has nothing left to close


@dataclass
class LockSet:
    """The daemon's instance locks (:func:`take_instance_lock`): the control socket's (None when it
    could not be used: no local socket then) and the OBS scenes', released together."""

    socket: Any = None
    scenes: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for lk in [self.socket, *self.scenes]:
            if lk is not None:
                lk.close()


def early_frames(d: Daemon) -> bool:
    """Publish the camera (pixelated, or as it is) while the models load: on for live runs (a
    camera, paced input), off when any stream keeps every frame (a file conversion must be swapped
    throughout) or has a frame enhancer (its output size is known only once it is loaded)."""
    if d.cfg.pipeline.early_frames == "off":
        return False
    return all(st.delivery is not None and not st.delivery.lossless and not st.cfg.upscale.model for st in d.streams)


def open_output(d: Daemon, opened: Opened, st: Stream, width: int, height: int) -> None:
    from vcam.stages import publish

    output = d.given_outputs.get(st.name)
    with d.held_signals():  # a forced exit finds the output in st.output, its temporary file salvaged
        if output is None:
            assert st.delivery is not None and st.source is not None
            # Live input: stamp file frames by wall clock (plays at real speed even with drops);
            # lossless input: by frame count, so the file keeps the input's rate and every frame.
            timing = "frames" if st.delivery.lossless else "wall"
            fps = st.cfg.output.fps or st.source.fps or d.cfg.capture.fps
            output = publish.open_output(st.cfg.output, width, height, fps, file_timing=timing)
        opened.add(output)
        st.output = output


@dataclass
class Loaded:
    """What a load built for the streams (:func:`prepare`), not yet in use (:func:`adopt`): the
    assembly, each stream's pipeline and capture stage (stage, target, decoder), the release of
    the engines' background work (None: nothing held), and what it opened (the faces watcher, the
    search threads, pinned staging, a file output opened once its size was known), closed with it."""

    assembly: Assembly
    pipelines: dict[str, Pipeline] = field(default_factory=dict)
    stages: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)
    release: Callable[[], None] | None = None
    opened: Opened = field(default_factory=Opened)
    watcher: Any = None  # the faces' BankWatcher this load started (None: the states had faces)


def load(d: Daemon, up: Started) -> None:
    """The models, the faces, each stream's output (opened here unless early frames opened it) and
    pipeline (built with its output format, budget and degradability), the buffers and the CUDA
    graphs of the first frame warmed up, put in use (:func:`prepare` then :func:`adopt`). The
    engines' other graphs and the recogniser are built in the background once the first frame went
    out through the pipeline (the daemon holds :data:`vcam.engines.gate.BACKGROUND` until then, at
    most its patience; :meth:`Started.release_background` lets it go earlier); a face that needs
    the recogniser meanwhile builds it at once."""
    if d.load_delay:
        time.sleep(d.load_delay)
    loaded = prepare(d, d.cfg)
    if loaded is not None:
        rehearse(d, loaded)
        adopt(d, up, loaded)


def prepare(
    d: Daemon,
    cfg: Config,
    *,
    faces: bool = True,
    hold: bool = True,
    threads: int = 0,
    short_lived: bool = False,
) -> Loaded | None:
    """Build what :func:`load` puts in use, for ``cfg`` (the daemon's, or the CPU one of
    :mod:`vcam.runtime.early_swap`), touching no stream: it may run while the frame loop runs other
    pipelines. ``faces``: load the faces into the daemon's states unless they have some; ``hold``:
    hold the engines' background work until the first frame; ``threads``: the CPU threads of a
    model call on onnxruntime (0: one per core); ``short_lived``: the assembly swaps for seconds
    (:func:`vcam.runtime.assemble.build`). None when stopped meanwhile."""
    from vcam.engines.gate import BACKGROUND

    release = BACKGROUND.hold() if hold else None
    try:
        loaded = _prepare(d, cfg, faces=faces, threads=threads, short_lived=short_lived)
    except BaseException:
        if release is not None:
            release()
        raise
    if loaded is None:
        if release is not None:
            release()
        return None
    loaded.release = release
    start_recogniser = getattr(loaded.assembly.recogniser, "start", None)
    if start_recogniser is not None:
        start_recogniser(BACKGROUND.wait)
    return loaded


def adopt(d: Daemon, up: Started, loaded: Loaded) -> None:
    """Put ``loaded`` in use (``up.loaded``, closed with ``up``): each stream's pipeline and
    capture stage (set on its capture thread by the caller), the rounds on its swapper. Between
    two frames of the frame loop, or before it."""
    up.opened.add(loaded.opened)  # what it opened, not its models: those go when it is replaced
    up.loaded = loaded
    asm = loaded.assembly
    d.rounds.adopt(asm.swapper, asm.stages_on)
    for st in d.streams:
        st.summary.device = asm.device
        st.summary.models = asm.describe()
        before = st.pipeline
        st.pipeline = loaded.pipelines[st.name]
        search = getattr(getattr(before, "tracker", None), "search", None)
        if search is not None:  # the early swap's CPU pipeline: its search thread is done
            search.close()
        st.stage, st.target, st.decoder = loaded.stages[st.name]
        if st.live is None:
            st.live = LiveStats(st.summary)
        if loaded.release is not None:  # the background work begins when its first frame is out (an early swap's switch too)
            st.live.on_first = loaded.release
    log.info("models: %s", d.summary.models)


#: The devices whose loads rehearse the first frame (:func:`rehearse`): on the CPU a first frame costs
#: what any frame does, and the rehearsal would only delay the takeover by one.
REHEARSED_ON = frozenset({"cuda"})


def rehearse(d: Daemon, loaded: Loaded) -> None:
    """On a GPU, each stream's pipeline runs once on a copy of the newest camera frame the early
    frames gathered (its output dropped), in the load's thread before :func:`adopt`: the first
    round's own first uses (the frame's buffers, the kernels of the convert, align, paste and mask
    stages, the detection's readback) are paid here while the early frames still go out, not by the
    frame loop at the takeover. Issue 39 (H100, 1080p, warm, 2026-12-06): that first round took
    129-208 ms, the camera's longest pause of the start. A stream without a frame yet, a stop, or a
    failure (one line) leaves it to the first round."""
    if loaded.assembly.device not in REHEARSED_ON:
        return
    import numpy as np

    t0 = time.perf_counter()
    done = 0
    for st in d.streams:
        frame, pipe = st.newest, loaded.pipelines.get(st.name)
        if frame is None or pipe is None or d.should_exit or PixelFormat(frame.fmt) is PixelFormat.MJPEG:
            continue
        try:
            copy = replace(frame, data=np.array(frame.data, copy=True)) if isinstance(frame.data, np.ndarray) else frame
            pipe.process(copy, st.state.snapshot())
            done += 1
        except Exception as exc:  # the first round meets it again and reports it where it counts
            log.warning("rehearsing the first frame of stream %s failed (%s: %s)", st.name, type(exc).__name__, exc)
            return
    if done:
        log.info("start-up: first frame rehearsed on %d stream(s) in %.2f s", done, time.perf_counter() - t0)


def _prepare(d: Daemon, cfg: Config, *, faces: bool, threads: int = 0, short_lived: bool = False) -> Loaded | None:
    from vcam.runtime import assemble

    first = d.streams[0]
    assert first.source is not None
    loaded_opened = Opened()
    t0 = time.perf_counter()
    fps = first.source.fps or cfg.capture.fps
    asm = assemble.build(cfg, fps=fps, threads=threads, short_lived=short_lived)
    if d.should_exit:  # stopped while loading in the background (early frames): go no further
        return None
    t1 = time.perf_counter()
    watcher = load_faces(d, asm) if faces else None
    if watcher is not None:
        loaded_opened.add(watcher)
    t2 = time.perf_counter()
    loaded = Loaded(asm, opened=loaded_opened, watcher=watcher)
    for st in d.streams:
        src = st.source
        assert src is not None and st.delivery is not None
        if st.output is None:
            open_output(d, loaded.opened, st, *asm.frame_size(src.width, src.height))
        assert st.output is not None
        live = not st.delivery.lossless
        loaded.pipelines[st.name] = asm.make_pipeline(
            st.output.fmt,
            src.width,
            src.height,
            # MJPG is decoded in the capture thread (vcam.stages.decode): the pipeline gets BGR frames.
            PixelFormat.BGR if src.fmt == PixelFormat.MJPEG else src.fmt,
            timing=d.timing,
            degradable=live,
            patient=not live,  # a camera's frame never waits for the detection once faces are tracked
            upscale_budget=st.frame_budget() if live and cfg.upscale.drop_first else 0.0,
        )
        search = getattr(loaded.pipelines[st.name].tracker, "search", None)
        if search is not None:
            loaded.opened.add(search)  # the search thread stops with the daemon
        loaded.stages[st.name] = capture_stage(loaded.opened, st, asm)  # the decoder is built here too, off the frame loop
    age = process.age()
    log.info(
        "start-up: models %.2f s, faces %.2f s, pipelines %.2f s on %s (loading began %s after the start)",
        t1 - t0, t2 - t1, time.perf_counter() - t2, asm.device,
        f"{age - (time.perf_counter() - t0):.2f} s",
    )  # fmt: skip
    return loaded


def load_faces(d: Daemon, asm: Assembly) -> Any:
    """The faces into the streams' states (from the config's sources, the demo's own face for the
    demo) with their watcher started, or, where the daemon's state has faces already (tests,
    embedding), those shared with every stream (None then)."""
    from vcam.runtime import assemble

    first = d.streams[0]
    if d.state.names:
        assemble.share_faces(d.state, [st.state for st in d.streams[1:]])
        return None
    watcher = assemble.load_faces(
        asm,
        d.state,
        demo_input=first.cfg.capture.input == "demo",
        source=first.cfg.swap.source,
        others=[(st.state, st.cfg.swap.source, st.cfg.capture.input == "demo") for st in d.streams[1:]],
    )
    watcher.start()
    return watcher


def start_capture(d: Daemon, up: Started, early: bool) -> None:
    """One capture thread per stream. Early (models still loading): an MJPG frame is decoded on the
    CPU there; the stream's own stage (:func:`capture_stage`) is set once the models are loaded."""
    from vcam.stages import capture
    from vcam.stages.decode import CpuJpegDecoder

    for st in d.streams:
        assert st.source is not None and st.delivery is not None
        name = "vcam-capture" if len(d.streams) == 1 else f"vcam-capture-{st.name}"
        stage: Callable[[Frame], Frame | None] | None
        if early:
            stage = CpuJpegDecoder().decode if st.source.fmt == PixelFormat.MJPEG else None
        else:
            stage = st.stage
        target = None if early else st.target
        st.cap = capture.CaptureThread(
            st.source, lossless=st.delivery.lossless, name=name, wake=d.wake, stage=stage, target=target
        )
        st.cap.start()
        up.opened.add_current(partial(getattr, st, "cap"))  # a resume may reopen it (vcam.runtime.pause)


def load_while_passing_through(d: Daemon, up: Started) -> bool:
    """:func:`load` in a thread while this one publishes each stream's newest frame, pixelated
    (``early_frames = "pixelate"``, or ``"swap"``) or as it is (``"camera"``), converted on the CPU, so a video
    call sees the camera within a second of the start. Those frames are counted in
    ``early_frames``, not in ``frames_in``/``frames_out``. With an early swap (``"swap"``,
    ``up.early``: :mod:`vcam.runtime.early_swap`) only until its CPU assembly is in use; the frame
    loop switches to the full one later. False when a stop was requested before the models were
    loaded (the loading thread is left to finish on its own: ``up.loading``)."""
    failure: list[BaseException] = []
    ho = up.early

    def loading() -> None:
        try:
            load(d, up)
        except BaseException as exc:
            failure.append(exc)
        finally:
            d.wake.set()

    loader = ho.thread if ho is not None else threading.Thread(target=loading, name="vcam-load", daemon=True)

    def loaded() -> bool:
        return ho.first_ready() if ho is not None else not loader.is_alive()

    t0 = time.perf_counter()
    up.switches = up.opened.add(ShortSwitches())  # the early frames get the GIL soon after asking
    up.collector = up.opened.add(HeldCollector())  # and no full collection holds it meanwhile
    start_pixel_threads()  # OpenCV's workers, before the load maps the GPU libraries
    loader.start()
    if d.panel_on and d.cfg.panel.enabled:  # the panel starts after the load: its imports meanwhile
        threading.Thread(target=preimport, args=(PANEL_MODULES,), name="vcam-imports", daemon=True).start()
    while not loaded() and not d.should_exit:
        # Under the stream's budget, as every frame. A frame gathered as the load ends (the loader
        # wakes the rounds just before its thread ends) goes out early too: the pipeline's first round
        # takes the camera's next frame anyway, and this one was dropped uncounted before.
        for st, frame in d.rounds.gather(None, timeout=0.05):
            d.rounds.publish_early(st, frame)
    if not loaded():
        # A stop while loading does not wait for the models: the load goes on in the background. It
        # may be inside a native library (onnxruntime, torch) whose threads must not be torn down
        # under it, so the daemon says so (Daemon.loading) and the command ends the process with
        # os._exit once the outputs are finished instead of unwinding the interpreter.
        up.loading = loader
        log.info("stopped before the models were loaded")
        return False
    passed = sum(st.summary.early_frames for st in d.streams)
    if ho is not None:
        return ho.adopt_first()  # the interval stays short until the switch to the full models
    up.models_final()
    loader.join()
    if failure:
        raise failure[0]
    if up.loaded is None:  # the stop came while loading, and the load gave up on it meanwhile
        log.info("stopped before the models were loaded")
        return False
    log.info("models loaded in %.1f s; %d early frames published meanwhile", time.perf_counter() - t0, passed)
    return True


#: The libraries a live run's load imports first (the CPU path: leaves of the import graph, so a
#: thread importing them beside the command's own imports can never deadlock with it).
LOAD_MODULES = ("numpy", "cv2", "onnxruntime")


def import_ahead(modules: tuple[str, ...] = LOAD_MODULES) -> None:
    """``modules`` (:data:`LOAD_MODULES`) imported in a thread from the command's start, beside the
    config, the sources and the outputs: the load that follows finds them imported. Not a daemon
    thread: a command that ends at once (a bad flag) waits for the imports, as an interpreter
    killing a thread inside onnxruntime's import aborts ("terminate called without an active exception")."""
    if not modules:
        return
    threading.Thread(target=preimport, args=(modules,), name="vcam-imports").start()


#: What the panel's start imports (about a quarter of a second of Python before the first swapped frame).
PANEL_MODULES = ("vcam.runtime.panel", "vcam.panel.access", "vcam.panel.server", "uvicorn", "starlette.applications")


def preimport(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (in a thread, while the models load); a failure is left to the real use."""
    import importlib

    for name in modules:
        t0 = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:
            log.debug("importing %s ahead failed: %s", name, exc)
            continue
        if time.perf_counter() - t0 > 0.2:  # the ones that count: a -v line each (torch, onnxruntime)
            log.info("imported %s ahead in %.2f s (%.2f s after the start)", name, time.perf_counter() - t0, process.age())


def capture_stage(opened: Opened, st: Stream, asm: Assembly) -> tuple[Callable[[Frame], Frame] | None, Any, Any]:
    """What the capture thread does to each frame before handing it over, as (stage, target,
    decoder): an MJPG frame is decoded (:mod:`vcam.stages.decode`: on the GPU into device memory,
    or on the CPU; the decoder); a frame on the host is put in pinned staging on the GPU path: read
    into it by the source where it can (the target), else copied."""
    from vcam.kernels.convert import frame_shape
    from vcam.stages.decode import open_decoder

    assert st.source is not None
    ops, src = asm.ops, st.source
    fmt = src.fmt
    decoder = None
    if fmt == PixelFormat.MJPEG:
        decoder = open_decoder(st.cfg.capture.decode, ops)
        log.info("%s: MJPG decoded on the %s", st.name, "GPU (nvJPEG)" if decoder.device == "cuda" else "CPU")
        if decoder.device == "cuda":
            return decoder.decode, None, decoder
        fmt = PixelFormat.BGR
    staging = ops.staging(frame_shape(fmt, src.width, src.height))
    if staging is not None:
        opened.add(staging)  # its copy threads stop with the daemon
    if decoder is None:
        return (staging.stage, staging.claim, None) if staging is not None else (None, None, None)
    if staging is None:
        return decoder.decode, None, decoder
    decode, stage = decoder.decode, staging.stage
    return (lambda frame: stage(decode(frame))), None, decoder


def start_telemetry(d: Daemon, up: Started) -> None:
    """The GPU sampler (NVML, off the frame loop) and the degrader (one for the shared GPU: its
    changes apply to every stream), handed to the rounds. A run where every stream converts a file
    (every frame kept) never degrades."""
    from vcam.runtime.degrade import Degrader, available_stages
    from vcam.telemetry import open_telemetry

    assert up.assembly is not None
    cfg = d.cfg
    up.telemetry = open_telemetry(cfg.telemetry, up.assembly.device, gpu_index=0)
    if up.telemetry is not None:
        up.opened.add(up.telemetry)
    if up.early is not None:  # the CPU assembly's frames: no GPU to watch, no load to shed yet (at the switch)
        return
    lossless = all(st.delivery is not None and st.delivery.lossless for st in d.streams)
    available = available_stages(cfg)
    # The last rung (the swap shed, frames out as the early frames go) where those can be made:
    # host frames (not decoded on the GPU) whose output size is the input's.
    if early_frames(d) and not any(st.decoder is not None and st.decoder.device == "cuda" for st in d.streams):
        available.add(SHED_SWAP)
    up.degrader = Degrader.from_config(cfg.degrade, available, enabled=bool(available) and not lossless)
    d.rounds.degrader, d.rounds.telemetry = up.degrader, up.telemetry


def offer_settings(d: Daemon, up: Started) -> None:
    """The desk's settings this run can honour, offered on every stream's state at the config's
    values (:mod:`vcam.control.commands`): the enhancer and its amount with a face enhancer, the
    mouth mask with a mask stage (any mask type beyond 'box'), the occlusion mask with the occluder
    loaded, mirror always, recording (:mod:`vcam.runtime.record`) and the camera
    (:mod:`vcam.runtime.camera`) on a live stream. Audio sync is offered with the OBS controller
    (:func:`start_control`), the before/after view with the panel (:func:`vcam.runtime.panel.start_panel`)."""
    cfg = d.cfg
    offers: dict[str, object] = {}
    if cfg.swap.enhancer:
        offers |= {"enhancer": True, "enhancer_amount": float(cfg.swap.enhancer_amount)}
    if set(cfg.mask.types) - {"box"}:
        offers["mouth_mask"] = "mouth" in cfg.mask.types
    if "occlusion" in cfg.mask.types:
        offers["occlusion_mask"] = True
    offers["mirror"] = False
    for st in d.streams:
        for key, value in offers.items():
            st.state.offer(key, value)
    live = [st for st in d.streams if not (st.delivery is not None and st.delivery.lossless)]
    if live:  # a file converted is a recording already
        from vcam.runtime.record import Recorder, default_folder

        fps = (live[0].source.fps if live[0].source is not None else 0.0) or cfg.capture.fps
        recorder = Recorder(default_folder(cfg.output.record_dir), fps)
        d.rounds.record = recorder.offer
        up.opened.add(recorder)
        for st in live:
            st.state.offer("record", False)
    from vcam.runtime.camera import offer_cameras

    offer_cameras(d.cameras, d.streams)


def start_control(d: Daemon, up: Started) -> None:
    """The local control socket and, when on, one OBS controller per stream."""
    if not up.control:
        return
    from vcam.control.local import ControlServer

    states = {st.name: st.state for st in d.streams}
    if up.locks is not None and up.locks.socket is not None:  # without its lock (said why), no socket
        try:
            srv = ControlServer(d.cfg.socket_path, d.state, streams=states if len(states) > 1 else None)
            srv.start()
            up.opened.add(srv)
        except VcamError as exc:
            log.warning("local control disabled: %s", exc)
    if d.cfg.obs.enabled:
        from vcam.control.obs import ObsController
        from vcam.control.obs_audio import ObsAudio

        for i, st in enumerate(d.streams):
            several = len(d.streams) > 1
            # Audio sync follows the first stream's delay (one offset per OBS input); its panel switch is there.
            audio = ObsAudio(d.cfg.obs.audio_sync if i == 0 else ())
            if audio.inputs:
                st.state.offer("audio_sync", True)
            obs = ObsController(
                d.cfg.obs.for_stream(st.name, len(d.streams)), st.state, stream=st.name if several else None, audio=audio
            )
            obs.start()
            up.opened.add(obs)
            up.obs.append(obs)


def check_streams(streams: list[tuple[str, Config]], given_outputs: dict[str, object] | None = None) -> None:
    """ConfigError when two streams would open the same camera, write the same file or publish to
    the same virtual camera (``given_outputs``: streams whose output is given, not opened)."""
    from vcam.errors import ConfigError
    from vcam.stages.capture import parse_webcam_index
    from vcam.stages.recording import file_target

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
