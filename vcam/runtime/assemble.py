"""The one place that builds the pipeline from the config: device, ops, models, faces.

:data:`ROLES` (:mod:`vcam.runtime.roles`) is the table of what each model role needs on each device: roles on the hot path
(detector, swapper, enhancer) run on the pipeline's device through a backend of that device, or the
start fails with one line naming the fix; roles off the hot path (the recogniser, run once per face
switch and per new track) run where they can and fall back to onnxruntime on the CPU with one log
line. :func:`plan` answers from that table without loading anything (``vcam check``);
:func:`build` loads everything and reports where each model really runs (:attr:`Assembly.placements`,
shown by ``vcam run``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcam.config import Config
from vcam.errors import ConfigError, DeviceError, VcamError
from vcam.platform import cpu, process
from vcam.platform.cpu import usable_cores
from vcam.runtime import gpu_ahead
from vcam.runtime import roles as _roles
from vcam.runtime.device import PIXELS, accelerator, resolve_device
from vcam.runtime.roles import stage_params
from vcam.state import RuntimeState
from vcam.types import PixelFormat

if TYPE_CHECKING:
    from vcam.models.download import ModelStore
    from vcam.ops import Ops
    from vcam.pipeline.parts import FaceFilter
    from vcam.pipeline.pipeline import Pipeline
    from vcam.stages.detect import FaceDetector
    from vcam.stages.enhance import Enhancer
    from vcam.stages.mapping import Assigner
    from vcam.stages.mask import Masker
    from vcam.stages.recognize import ArcFaceRecogniser, DeferredRecogniser
    from vcam.stages.swap import Swapper
    from vcam.stages.track import Tracker
    from vcam.stages.upscale import FrameEnhancer

log = logging.getLogger(__name__)

# The role table (what each model role is and needs) lives in vcam.runtime.roles.
ROLES = _roles.ROLES
MAX_BATCH = _roles.MAX_BATCH
model_names = _roles.model_names


@dataclass(frozen=True)
class Placement:
    """Where one model runs: ``role`` (a key of :data:`ROLES`), ``model`` name, ``where`` (its
    engine's own description, or what ``auto`` would pick), ``ok`` (False: it cannot run)."""

    role: str
    model: str
    where: str
    ok: bool = True


def plan(cfg: Config) -> tuple[str, str, list[Placement]]:
    """(device, why, placements) as ``vcam run`` would choose them, without loading a model."""
    from vcam.engines import explain_backends
    from vcam.stages.swap import BUILT_IN

    device, why = resolve_device(cfg)
    acc = accelerator(cfg, device)
    backend = acc.backend if acc is not None else cfg.pipeline.backend
    rows = {d: explain_backends(device=d, backend=backend if d == device else cfg.pipeline.backend) for d in {device, "cpu"}}
    out = []
    for role, name in model_names(cfg).items():
        if role == "swapper" and name in BUILT_IN:
            out.append(Placement(role, name, f"built in, {PIXELS[device]} on {device}"))
            continue
        picked = next((b for b, ok, _ in rows[device] if ok), None)
        if picked is None and not ROLES[role].hot:
            picked, place = next((b for b, ok, _ in rows["cpu"] if ok), None), "cpu"
        else:
            place = device
        if picked is None:
            reasons = "; ".join(f"{b}: {r}" for b, _, r in rows[device])
            out.append(Placement(role, name, f"no backend on {device} ({reasons})", ok=False))
        else:
            note = "" if place == device else " (fallback: off the hot path)"
            runs = f"onnxruntime on {acc.label} ({acc.provider})" if acc is not None and picked == acc.backend else picked
            out.append(Placement(role, name, f"{runs} on {place}{note}"))
    return device, why, out


#: On a GPU the pipeline's warm-up also calls the swap network once (:meth:`NeuralSwapper.warm
#: <vcam.stages.swap_neural.NeuralSwapper.warm>`), so the first frame through the pipeline does not
#: pay its kernels' first use; ``"0"`` leaves it to that frame, ``"1"`` makes the call on the CPU too
#: (where a first call costs about what any call does, so the call would only delay the takeover by
#: one inference). Issue 39: that first frame was the camera's one long pause left at the takeover
#: (300-440 ms on the H200, 445-491 ms on the H100). On the H100 (warm, one stream, 2 runs
#: alternated) the warm-up grew by 0.3 s and the takeover's pause went: longest pause 167-177 ms
#: against 445-491 ms, 91-97 % of the frames published in the first 10 s against 82-95 %. The call
#: in a thread beside the detector's first capture was measured and taken out (H100, 1080p clip,
#: 2026-12-06): first GPU frame 2.87 / 2.82 s one stream, 3.28 / 3.26 s four: no gain.
WARM_SWAP_ENV = "VCAM_WARM_SWAP"


@dataclass
class Assembly:
    """Everything one run needs, built from one config (see :func:`build`)."""

    cfg: Config
    device: str
    ops: Ops
    detector: FaceDetector
    photo_detector: FaceDetector
    swapper: Swapper
    tracker: Tracker
    face_filter: FaceFilter
    recogniser: ArcFaceRecogniser | DeferredRecogniser | None = None
    enhancer: Enhancer | None = None
    masker: Masker | None = None
    assigner: Assigner | None = None
    store: ModelStore | None = None
    upscaler: FrameEnhancer | None = None
    fps: float = 30.0
    placements: list[Placement] = field(default_factory=list)
    #: Optional stages on/off by name (:data:`vcam.types.OPTIONAL_STAGES`), shared by every
    #: pipeline built here; the daemon's degradation under load changes it between frames.
    stages_on: dict[str, bool] = field(default_factory=dict)
    _pipelines: int = 0
    _warm: set[tuple[int, int]] = field(default_factory=set)

    def current_placements(self) -> list[Placement]:
        """:attr:`placements`, a model that was loading in the background looked at again."""
        models = {"recogniser": self.recogniser}
        for i, p in enumerate(self.placements):
            if p.where == "loading in the background" and models.get(p.role) is not None:
                self.placements[i] = Placement(p.role, p.model, _where(models[p.role], self.device), p.ok)
        return self.placements

    def describe(self) -> str:
        """One line: where each model runs (:meth:`current_placements`)."""
        return "; ".join(f"{p.role} {p.model}: {p.where}" for p in self.current_placements())

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for what loads in the background (the recogniser, the engines' graph captures), so a
        short run's summary says where each model ran and no load is torn down at exit."""
        rec = self.recogniser
        if rec is not None and getattr(rec, "started", False):  # never asked for: never built
            try:
                getattr(rec, "get")()  # noqa: B009 - a DeferredRecogniser's
            except Exception:  # said when it failed; the summary says it too
                pass
        for model in (self.swapper, self.detector, self.recogniser if getattr(self.recogniser, "ready", True) else None):
            try:
                wait = getattr(getattr(model, "engine", None), "wait_graphs", None)
            except Exception:
                wait = None
            if wait is not None:
                wait(timeout)

    def stop_builds(self) -> None:
        """Stop the swapper's background compile (``[pipeline] compile = "auto"``) at the end of a
        run: its job would otherwise outlive a run that ends inside a longer process. What it
        finished stays in the cache; the next run builds the rest."""
        loader = getattr(getattr(self.swapper, "engine", None), "loader", None)
        close = getattr(loader, "close", None)
        if close is not None:
            close()

    def frame_size(self, width: int, height: int) -> tuple[int, int]:
        """The size of the frames a pipeline built here publishes for ``width`` x ``height`` input
        (the frame enhancer's output size when there is one; before 4:2:0 rounding)."""
        if self.upscaler is None:
            return int(width), int(height)
        w, h = self.upscaler.output_size(width, height)
        return int(w), int(h)

    def make_pipeline(
        self,
        out_fmt: PixelFormat,
        width: int | None = None,
        height: int | None = None,
        in_fmt: PixelFormat | None = None,
        *,
        timing: bool = False,
        predict: bool | None = None,
        degradable: bool = True,
        upscale_budget: float = 0.0,
        tracker: Any = None,
        patient: bool = True,
    ) -> Pipeline:
        """A pipeline over these stages, publishing ``out_fmt``. The first one uses :attr:`tracker`
        and :attr:`assigner`; each further one (another stream) gets its own (tracks and their
        identities are per stream; the models are shared). With the frame geometry given, its
        buffers are allocated and the detector's engine warmed up now, so the first frame pays for
        neither. ``predict``: None follows ``[track] predict`` (:attr:`predicts`); ``patient``,
        ``degradable`` and ``upscale_budget``: see :class:`~vcam.pipeline.pipeline.Pipeline`. ``tracker``: instead of
        the assembly's (the bench's fixed faces)."""
        from vcam.pipeline.pipeline import Pipeline

        given = tracker
        tracker, assigner = self.tracker, self.assigner
        if self._pipelines:
            from vcam.stages.track import Tracker, TrackParams

            tracker = Tracker(
                self.detector,
                stage_params(TrackParams, self.cfg.track),
                max_faces=self.cfg.pipeline.max_faces,
                fps=self.fps,
                search=search_worker(self.cfg, self.device, self.store),
            )
            if assigner is not None:
                from vcam.stages.mapping import Assigner

                assigner = Assigner(self.recogniser, self.cfg.swap.map_threshold, self.cfg.swap.unmatched)
        self._pipelines += 1
        tracker = given if given is not None else tracker
        pipeline = Pipeline(
            ops=self.ops,
            tracker=tracker,
            swapper=self.swapper,
            out_fmt=out_fmt,
            enhancer=self.enhancer,
            masker=self.masker,
            assigner=assigner,
            face_filter=self.face_filter,
            upscaler=self.upscaler,
            stages_on=self.stages_on,
            max_faces=self.cfg.pipeline.max_faces,
            timing=timing,
            predict=self.predicts if predict is None else predict,
            patient=patient,
            band=self.cfg.pipeline.band,
            degradable=degradable,
            upscale_budget=upscale_budget,
        )
        if width and height and in_fmt is not None:
            pipeline.configure(width, height, in_fmt)
            self.warmup(width, height)
        return pipeline

    def at_rate(self, fps: float) -> None:
        """The source's frame rate, known once it is open (an assembly built before: the tracker's
        clock where a frame has no timestamp, and the trackers of the pipelines built from here)."""
        self.fps = self.tracker.fps = float(fps)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until the swapper's compiled engines (``[pipeline] compile = "auto"``) are loaded and in
        use, and the engines' background graph captures are done; call it from the thread that runs
        the frames (benchmarks: time the compiled swapper, with nothing captured beside the frames)."""
        wait_graphs = getattr(getattr(self.detector, "engine", None), "wait_graphs", None)
        if wait_graphs is not None:
            wait_graphs(timeout)
        wait = getattr(getattr(self.swapper, "engine", None), "wait_compiled", None)
        return wait(timeout) if wait is not None else True

    @property
    def predicts(self) -> bool:
        """Whether pipelines swap with predicted tracks while the detection runs (``[track]
        predict``: ``auto`` where the ops run work beside the host, i.e. CUDA)."""
        mode = self.cfg.track.predict
        return mode == "on" or (mode == "auto" and bool(getattr(self.ops, "concurrent", False)))

    def warmup(self, width: int, height: int) -> None:
        """Warm the kernels and the detector's engine up for ``width`` x ``height`` frames (once per size)."""
        if (width, height) in self._warm:
            return
        self._warm.add((width, height))
        phase = Phases(self.device)
        self.ops.warmup()
        self.tracker.warmup(self.ops.empty((height, width, 3)))  # the kernels of a track's look
        phase("kernels built")
        self.detector.warmup(height, width)
        if self.upscaler is not None:
            self.upscaler.warmup(width, height)
        self.ops.synchronize()
        phase(f"pipeline warm-up for {width}x{height}: the detector's first graphs")
        asked = os.environ.get(WARM_SWAP_ENV, "")
        wanted = asked == "1" or (asked != "0" and self.device == "cuda")
        warm = getattr(self.swapper, "warm", None) if wanted else None
        if callable(warm):
            warm(len(self.cfg.streams) or 1)  # the first rounds: one face a stream
            self.ops.synchronize()
            phase("pipeline warm-up: the swapper's first call")


def _module_source(swapper: Any) -> str:
    """Where a torch engine's native module came from, for the load's phase line (issue 39: a start
    that parses the graph again pays about a second for it); '' for other engines."""
    saved = getattr(getattr(swapper, "engine", None), "from_saved", None)
    return "" if saved is None else " (its saved build)" if saved else " (from the ONNX graph)"


def build(cfg: Config, *, fps: float = 30.0, threads: int = 0, short_lived: bool = False) -> Assembly:
    """Build ops, models and tracker for ``cfg`` (device resolved; every model file verified and,
    when allowed, downloaded in one go). :meth:`Assembly.make_pipeline` then builds the pipeline.
    ``threads``: the CPU threads of one call of the detector, swapper and recogniser on
    onnxruntime (0: one per core). ``short_lived``: the assembly swaps for seconds (an early swap's
    CPU one): its swap network opens as quickly as it can (:func:`vcam.engines.create_engine`)."""
    from vcam.kernels import paste as blend
    from vcam.models import registry
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.detections import EMBEDDED_DETECTOR, DetectParams
    from vcam.stages.swap import BUILT_IN
    from vcam.stages.track import Tracker, TrackParams

    phase = Phases(cfg.pipeline.device)
    device = _device(cfg, phase)
    names = model_names(cfg)
    store = _ensure_files(cfg, names)
    phase("model files checked")
    ops = _ops(device, phase)
    if device == "cuda" and cfg.pipeline.backend in ("auto", "torch"):
        torch_ready(phase)
    if device == "cuda":  # the kernel modules build (NVRTC on a fresh machine: seconds) while the models load
        threading.Thread(target=_build_kernels, args=(ops,), name="vcam-kernels", daemon=True).start()
    crop_size = cfg.swap.crop_size if cfg.swap.swapper in BUILT_IN else registry.get(cfg.swap.swapper).size
    # Without 'box' the paste mask still fades out on the crop's outermost pixels (blur 0: one pixel).
    box = "box" in cfg.mask.types
    top, right, bottom, left = cfg.mask.box_padding if box else (0.0, 0.0, 0.0, 0.0)
    mask = ops.asarray(blend.box_mask(crop_size, cfg.swap.blur if box else 0.0, (top, right, bottom, left)))
    detector = _roles.build("detector", cfg, store=store, ops=ops, device=device, threads=threads)
    phase(f"detector {names['detector']} built")
    photo_detector: Any = detector
    if not (device == "cpu" and cfg.detect.model == EMBEDDED_DETECTOR):  # built when a photo is first read
        params = stage_params(DetectParams, cfg.detect)
        photo_detector = OnFirstUse(params, lambda: RetinaFaceDetector(params, cfg.track.roi_size, backend="onnxruntime"))
    recogniser = _recogniser(cfg, names.get("recogniser"), store, device, threads)
    swapper = _roles.build(
        "swapper", cfg, mask=mask, store=store, ops=ops, device=device, threads=threads, short_lived=short_lived
    )
    phase(f"swapper {cfg.swap.swapper} built{_module_source(swapper)}")
    enhancer = _roles.build("enhancer", cfg, store=store, ops=ops, device=device) if "enhancer" in names else None
    upscaler = _roles.build("upscaler", cfg, store=store, ops=ops, device=device) if "upscaler" in names else None
    masker = None
    if set(cfg.mask.types) - {"box"}:
        masker = _roles.build_masker(cfg, swapper.crop_size, store=store, ops=ops, device=device)
    if hasattr(swapper, "landmarker"):  # the classic swap warps with 68 points where the masks have them
        swapper.landmarker = getattr(masker, "landmarker", None)
    mask_models = {
        "occluder": getattr(masker, "occluder", None),
        "parser": getattr(masker, "parser", None),
        "landmarker": getattr(masker, "landmarker", None),
        "upscaler": upscaler,
    }
    roles = (("detector", detector), ("swapper", swapper), ("enhancer", enhancer), *mask_models.items())
    _check_devices(roles, names, device)
    tracker = Tracker(
        detector,
        stage_params(TrackParams, cfg.track),
        max_faces=cfg.pipeline.max_faces,
        fps=fps,
        search=search_worker(cfg, device, store),
    )
    face_filter, assigner = _selection(cfg, photo_detector, recogniser)
    placements = [
        Placement(role, names[role], _where(m, device)) for role, m in (*roles, ("recogniser", recogniser)) if m is not None
    ]
    return Assembly(
        cfg=cfg,
        device=device,
        ops=ops,
        detector=detector,
        photo_detector=photo_detector,
        swapper=swapper,
        tracker=tracker,
        face_filter=face_filter,
        recogniser=recogniser,
        enhancer=enhancer,
        masker=masker,
        assigner=assigner,
        store=store,
        upscaler=upscaler,
        fps=fps,
        placements=placements,
    )


def _recogniser(cfg: Config, name: str | None, store: Any, device: str, threads: int) -> Any:
    """The recogniser ``name`` (None: none is needed), built at its first use or ``start()``: faces
    seen before need only its name. A run that maps faces or swaps a reference face calls it for
    each new track, so it starts loading now."""
    if name is None:
        return None
    from vcam.stages.recognize import DeferredRecogniser

    recogniser = DeferredRecogniser(name, lambda: _roles.build("recogniser", cfg, store=store, device=device, threads=threads))
    if cfg.swap.map or cfg.swap.faces == "reference":
        recogniser.start()
    return recogniser


def _selection(cfg: Config, photo_detector: Any, recogniser: Any) -> tuple[Any, Any]:
    """Which faces of a frame are swapped (``[swap] faces``), and the assigner of ``[[swap.map]]``
    (None without a map)."""
    from vcam.pipeline.parts import select_all, select_largest

    if cfg.swap.faces == "reference":
        face_filter = _reference_filter(cfg, photo_detector, recogniser)
    else:
        face_filter = select_largest if cfg.swap.faces == "largest" else select_all
    if not cfg.swap.map:
        return face_filter, None
    from vcam.stages.mapping import Assigner

    return face_filter, Assigner(recogniser, cfg.swap.map_threshold, cfg.swap.unmatched)


def _check_devices(roles: Any, names: dict[str, str], device: str) -> None:
    """DeviceError for a model (``(role, model)`` pairs) whose engine runs on another device than
    the pipeline's."""
    for role, model in roles:
        engine = getattr(model, "engine", None)
        if engine is not None and engine.device != device:
            raise DeviceError(
                f"the {role} {names[role]} runs on {engine.device}, the pipeline on {device}",
                hint="install onnxruntime-gpu or PyTorch with CUDA, or use --device cpu",
            )


def search_worker(cfg: Config, device: str, store: Any = None) -> Any:
    """The tracker's :class:`~vcam.stages.search.SearchWorker` (``[track] search``) with a detector
    of its own on one CPU thread, or None (the search runs in the frame: on a GPU, as configured, or for
    ``auto`` on one core or a machine whose other programs leave no core idle)."""
    mode = cfg.track.search
    if mode == "frame" or device != "cpu" or cfg.track.rolling <= 0:
        return None
    if mode == "auto" and (usable_cores() < 2 or _busy()):
        return None
    from vcam.stages.search import SearchWorker

    return SearchWorker(_roles.build("detector", cfg, store=store, device="cpu", threads=1))


def _ops(device: str, phase: Phases) -> Any:
    """The ops of ``device`` (on a GPU: CuPy and its CUDA context, while PyTorch may still be
    importing ahead). A CPU pipeline on two cores or fewer calls OpenCV on its own thread: waking
    OpenCV's pool for the frame's operations costs more than the second core gives back, which the
    search worker or onnxruntime wants anyway (the 720p demo on 2 cores: 7 % more frames beside the
    search worker, 2.5 % with the search in the frame). OpenCV's thread count is the process's."""
    from vcam.ops import make_ops

    ops = make_ops(device)
    phase("ops (CuPy, its CUDA context)" if device == "cuda" else "ops")
    if device == "cpu" and usable_cores() <= 2:
        import cv2

        cv2.setNumThreads(1)
    return ops


#: Beyond this age (a library's daemon made long after its import) the start's CPU times are stale.
BUSY_WINDOW_MAX_S = 60.0
_WHERE = {True: "in the frame", False: "beside the frame"}


def _busy() -> bool:
    """No core to spare at start: other programs kept all the cores this process may use but half
    of one busy since vcam started (the system's CPU times against this process's own, over the
    start-up's first second or so: :func:`vcam.platform.cpu.others_busy`), or, where that window
    cannot say (no such times; a library whose start was over a minute ago), the 1-minute load
    average above all cores but one. The load average lags: right after a heavy program ends it
    still says busy for a minute, when every core is idle."""
    now = cpu.sample()
    others = cpu.others_busy(process.cpu_at_start(), now) if process.age() <= BUSY_WINDOW_MAX_S else None
    if others is not None and now is not None:
        busy = others > now.cores - 0.5
        what = "other programs kept %.1f of the %d cores busy since the start"
        log.info("the face search runs %s: " + what, _WHERE[busy], others, now.cores)
        return busy
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not Unix
        return False
    busy = load > (os.cpu_count() or 1) - 1
    log.info("the face search runs %s: the load average is %.1f", _WHERE[busy], load)
    return busy


def _device(cfg: Config, phase: Phases) -> str:
    """The pipeline's device (:func:`resolve_device`), said where ``auto`` falls back to the CPU or
    FP16 cannot be had; a load phase (on a GPU it imports CuPy and PyTorch, or waits for the import
    begun ahead)."""
    device, why = device_for_load(cfg, phase)
    phase.device = device
    phase("device resolved (on a GPU: CuPy and PyTorch imported, or waited for)")
    if device == "cpu" and cfg.pipeline.device == "auto" and "no usable GPU" in why:
        log.info("running on the CPU: %s", why)
    if cfg.pipeline.fp16 and device == "cpu":
        log.warning("--fp16 needs a CUDA GPU; running FP32 on the CPU")
    return device


def device_for_load(cfg: Config, phase: Callable[[str], None] | None = None) -> tuple[str, str]:
    """:func:`resolve_device` for a start that loads the models: on a GPU, PyTorch's native side
    first (:func:`gpu_ahead.load`, without the GIL), then PyTorch imported before CuPy where the
    models may run on it (:func:`_torch_before_cupy`) while a thread makes the GPU's context, which
    CuPy's import (:func:`resolve_device`) waits for; each a ``phase``."""
    # PyTorch's CUDA libraries, without the GIL; the GPU's context made beside the import
    ahead = gpu_ahead.load(cfg.pipeline.device, beside=True)
    say = phase or (lambda what: None)
    if ahead.loaded:
        say(f"{len(ahead.loaded)} GPU libraries loaded")
    if ahead.loaded and cfg.pipeline.backend in ("auto", "torch"):
        _torch_before_cupy()
        say("import torch (before CuPy)")
    ahead = ahead.made()
    if ahead.loaded or ahead.context:
        say(f"{ahead.describe()} (the context beside the import, waited for)")
    return resolve_device(cfg)


def _torch_before_cupy() -> None:
    """Import PyTorch before :func:`resolve_device` imports CuPy (a GPU start whose models run on
    PyTorch, which it imports anyway). With CuPy imported first, PyTorch 2.11's own import
    (``torch.utils._debug_mode``) also pulled in CuPy's lazily loaded parts: ``cupyx.linalg`` with
    SciPy's sparse matrices, ``cupyx.profiler``, ``cupy.testing`` with pytest, 92 modules. Measured on
    the H100 (fresh processes, 3 alternations): both imports took 1.69-1.86 s CuPy first against
    1.38-1.64 s PyTorch first. A failed import is left to the backends, which say why."""
    try:
        import torch  # noqa: F401
    except Exception as exc:
        log.debug("importing PyTorch first failed (%s: %s)", type(exc).__name__, exc)


def _ensure_files(cfg: Config, names: dict[str, str]) -> ModelStore | None:
    """Every model file the run needs, checked (and, if allowed, downloaded) at once; the store, or
    None where the run needs no file."""
    from vcam.models import registry
    from vcam.stages.detect import detector_requirements
    from vcam.stages.detections import EMBEDDED_DETECTOR
    from vcam.stages.swap import BUILT_IN

    needed: list[str] = [names["recogniser"]] if "recogniser" in names else []
    if cfg.swap.swapper not in BUILT_IN:
        needed += registry.requirements(cfg.swap.swapper)
    for role in ("enhancer", "occluder", "parser", "landmarker", "upscaler"):
        if role in names:
            needed += registry.requirements(names[role])
    if cfg.detect.model != EMBEDDED_DETECTOR:
        needed += detector_requirements(cfg.detect.model)
    if not needed:
        return None
    store = _roles.model_store(cfg)
    store.ensure(list(dict.fromkeys(needed)))
    return store


class Phases:
    """The ``-v`` lines that say where a load's seconds go on ``device``: ``phase(what)`` logs
    ``load phase on cuda: swapper inswapper_128 built 1.21 s (2.84 s after the start)``, the time
    since the last phase (the H200's device calls read them: imports, CUDA, each model, captures)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.t = time.perf_counter()

    def __call__(self, what: str) -> None:
        now = time.perf_counter()
        log.info("load phase on %s: %s %.2f s (%.2f s after the start)", self.device, what, now - self.t, process.age())
        self.t = now


def torch_ready(phase: Phases) -> None:
    """PyTorch imported and its CUDA context made, each a phase (an import begun ahead,
    :func:`vcam.runtime.startup.import_ahead`, is waited for here); nothing without PyTorch."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return
    import torch

    phase("import torch")
    if torch.cuda.is_available():
        torch.cuda.init()
        phase("PyTorch's CUDA init")


def _build_kernels(ops: Ops) -> None:
    """``ops.warmup()`` in a background thread; a failure is left to the warm-up that needs the
    kernels (:meth:`Assembly.warmup`), which raises it where the start can report it."""
    try:
        ops.warmup()
    except Exception as exc:
        log.debug("building the kernels in the background failed (%s); the warm-up tries again", exc)


class OnFirstUse:
    """A detector built at its first :meth:`detect` (the photo detector: a start whose faces are all
    known from the caches never builds it); ``cfg``, what the face caches are keyed by, at once."""

    def __init__(self, cfg: Any, build: Any) -> None:
        self.cfg = cfg
        self._build = build
        self._value: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._value is None:
                self._value = self._build()
            return self._value

    def detect(self, frame_bgr: Any) -> Any:
        return self.get().detect(frame_bgr)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.get(), attr)


def _where(model: Any, device: str) -> str:
    """Where ``model`` runs (its engine's description), or that it is still loading."""
    if not getattr(model, "ready", True):
        return "loading in the background"
    try:
        engine = getattr(model, "engine", None)
    except Exception as exc:  # a background load that failed
        return f"failed: {getattr(exc, 'message', None) or exc}"
    where = engine.describe() if engine is not None else f"built in, {PIXELS[device]} on {device}"
    if engine is not None and getattr(engine, "skipped", None):
        where += " [after " + "; ".join(engine.skipped) + "]"
    return where


def _reference_filter(cfg: Config, detector: Any, recogniser: Any) -> Any:
    from vcam.stages.faces import load_face_arg
    from vcam.stages.recognize import reference_filter

    if not cfg.swap.reference:
        raise ConfigError("[swap] faces = 'reference' needs [swap] reference", hint="set it to a face-bank name or a photo path")
    ref = load_face_arg(cfg.swap.reference, faces_dir=cfg.faces_dir, detector=detector, recogniser=recogniser)
    return reference_filter(recogniser, ref.embeddings[recogniser.name], cfg.swap.reference_threshold)


class _States:
    """Several streams' states as one for the bank watcher: a face reloaded goes to all of them."""

    def __init__(self, states: list[RuntimeState]) -> None:
        self.states = states

    def add_face(self, face: Any, *, activate: bool | None = None) -> None:
        for st in self.states:
            st.add_face(face, activate=activate)


def load_faces(
    asm: Assembly,
    state: RuntimeState,
    *,
    demo_input: bool,
    source: str | None = None,
    others: list[tuple[RuntimeState, str, bool]] = (),  # type: ignore[assignment]
) -> Any:
    """The active face (``source``, default ``--face`` / ``[swap] source``, else the demo face for
    the demo input; with none of them no face is active and frames pass through until one is
    chosen) and every usable face of the bank, prepared for the swapper; later additions
    load on first use. ``others``: further streams as ``(state, source, demo_input)``, each with
    its own active face and every bank face (each face is loaded once and shared). Returns the
    :class:`~vcam.stages.faces.BankWatcher` that reloads bank faces replaced on disk into every state (not
    started). A damaged face of the bank is skipped with a warning naming the fix."""
    from vcam.stages.faces import BankWatcher, FaceBank, face_from_image, load_face_arg

    cfg = asm.cfg
    kw: dict[str, Any] = {"detector": asm.photo_detector, "swappers": [asm.swapper], "recogniser": asm.recogniser}
    bank = FaceBank(cfg.faces_dir)
    streams = [(state, cfg.swap.source if source is None else source, demo_input), *others]
    states = [st for st, _, _ in streams]
    watcher = BankWatcher(bank, state if len(states) == 1 else _States(states), bank_loader(bank, asm))
    loaded: dict[str, Any] = {}  # what each active-face argument gave, loaded once
    for st, src, demo in streams:
        if src and src in bank and not Path(src).expanduser().is_file():
            if src not in loaded:
                loaded[src] = watcher.load(src)
            st.add_face(loaded[src], activate=True)
        elif src:
            if src not in loaded:
                pick = cfg.swap.pick if src == cfg.swap.source else 0  # --pick is --face's
                loaded[src] = load_face_arg(src, faces_dir=cfg.faces_dir, pick=pick or None, **kw)
            st.add_face(loaded[src], activate=True)
        elif demo:
            from vcam.stages import demo as demo_mod

            if "<demo clip>" not in loaded:
                loaded["<demo clip>"] = face_from_image(demo_mod.portrait("astronaut"), "astronaut", **kw)
            st.add_face(loaded["<demo clip>"], activate=True)
        st.set_loader(watcher.load)
    for name in bank.names():
        face = loaded.get(name)
        for st in states:
            if name in st.names:
                continue
            if face is None:
                try:
                    face = loaded[name] = watcher.load(name)
                except VcamError as exc:
                    log.warning("face '%s' skipped: %s", name, exc)
                    break
            st.add_face(face, activate=False)  # loaded, never chosen for the user: no --face, no swap
    if cfg.swap.map:
        from vcam.stages.mapping import load_mappings

        for st in states:
            load_mappings(
                cfg.swap.map, cfg.faces_dir, st, detector=asm.photo_detector, recogniser=asm.recogniser, swapper=asm.swapper
            )
    return watcher


def bank_loader(bank: Any, asm: Assembly) -> Callable[[str], Any]:
    """How a face of ``bank`` loads for ``asm``: with its recogniser's embedding, prepared for its swapper."""
    return lambda name: bank.load(name, recogniser=asm.recogniser, swappers=[asm.swapper])


def rebind_faces(asm: Assembly, watcher: Any, states: list[RuntimeState]) -> None:
    """The faces' loaders moved to ``asm``'s models (an early swap's switch to its full assembly):
    the bank ``watcher``'s (the states' loader of faces added later) and, with ``[swap] map``, the
    states' target loader. Nothing then keeps the replaced assembly alive: the CPU one of an early
    swap stayed for the whole run, its sessions (a swap network's weights) included. The faces
    loaded stay as they are."""
    from vcam.stages.mapping import targets_loader

    if watcher is not None:
        watcher.rebind(bank_loader(watcher.bank, asm))
    if asm.cfg.swap.map and asm.recogniser is not None:
        load = targets_loader(asm.cfg.faces_dir, detector=asm.photo_detector, recogniser=asm.recogniser)
        for st in states:
            st.set_target_loader(load)


def share_faces(state: RuntimeState, others: list[RuntimeState]) -> None:
    """Give ``others`` every face of ``state`` (same objects), the same active face and loader."""
    if not others:
        return
    faces = {n: f for n in state.names if (f := state.face(n)) is not None}
    for other in others:
        for face in faces.values():
            other.add_face(face, activate=face.name == state.active)


__all__ = [
    "Assembly",
    "MAX_BATCH",
    "Placement",
    "ROLES",
    "bank_loader",
    "build",
    "device_for_load",
    "load_faces",
    "model_names",
    "plan",
    "rebind_faces",
    "share_faces",
]
