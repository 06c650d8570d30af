"""The daemon: capture thread -> frame loop (pipeline) -> publish, with live status and control.

Layers (uvicorn style): the CLI builds one :class:`~vcam.config.Config` and calls :func:`run` or
creates a :class:`Daemon`; the daemon owns startup (open source, models, output), the main loop and
shutdown (output closed, file finalised, threads joined). Control channels (OBS, local socket) only
post changes to :class:`~vcam.state.RuntimeState` and never touch the loop.

Latency: each frame carries its capture time; a frame older than ``pipeline.max_latency`` when it
would be published is dropped and counted, and the status shows the budget being exceeded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Config
from .errors import ConfigError, DeviceError, FaceError, VcamError
from .state import RuntimeState, Status
from .types import SourceFace

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    frames_in: int = 0
    frames_out: int = 0
    dropped_capture: int = 0
    dropped_latency: int = 0
    full_scans: int = 0
    # Capture-to-publish latency of the most recent published frames (bounded: the daemon runs for
    # hours; 100k frames is about an hour at 30 fps).
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=100_000))
    stage_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = "cpu"
    error: str | None = None

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.fromiter(self.latencies_ms, float), q)) if self.latencies_ms else 0.0

    @property
    def fps(self) -> float:
        return self.frames_out / self.seconds if self.seconds > 0 else 0.0


def resolve_device(cfg: Config) -> str:
    """'cpu' or 'cuda' from cfg.pipeline.device; raises DeviceError if cuda is asked but unusable."""
    want = cfg.pipeline.device
    if want == "cpu":
        return "cpu"
    try:
        from .gpu import available as gpu_available  # type: ignore[attr-defined]

        ok, reason = gpu_available()
    except ImportError as exc:
        ok, reason = False, f"GPU support not importable: {exc}"
    if ok:
        return "cuda"
    if want == "cuda":
        raise DeviceError(f"--device cuda asked, but {reason}", hint="install a CuPy build for your CUDA (pip install 'fastswap-cam[cuda]') or use --device cpu")
    return "cpu"


def face_from_image(image: np.ndarray, name: str, *, swapper, detector=None, recogniser=None) -> SourceFace:
    """Detect the largest face in a BGR photo and build a prepared SourceFace (aligned at arcface_128/128).

    With a ``recogniser`` the face's embedding is computed too (neural swappers need it).
    """
    from . import align
    from .config import DetectConfig

    if detector is None:
        from .detect import RetinaFaceDetector

        detector = RetinaFaceDetector(DetectConfig(score=0.5))
    dets = detector.detect(image)
    if not dets:
        raise FaceError(f"no face found in source photo '{name}'", hint="use a photo where one face is clearly visible and frontal")
    best = max(dets, key=lambda d: d.area)
    m = align.estimate(best.landmarks, "arcface_128", 128)
    crop = align.warp_crops(image, m[None], 128)[0]
    lm = align.apply(m, best.landmarks).astype(np.float32)
    embeddings = {}
    if recogniser is not None:
        embeddings[recogniser.name] = np.asarray(recogniser.embed(image, best.landmarks[None]), np.float32)[0]
    face = SourceFace(name=name, image=crop, landmarks=lm, embeddings=embeddings)
    return swapper.prepare(face)


def load_face_arg(arg: str, *, swapper, cfg: Config, detector=None, recogniser=None) -> SourceFace:
    """--face NAME|PATH: a face-bank name or a photo path."""
    p = Path(arg).expanduser()
    if p.suffix and (p.exists() or "/" in arg or "\\" in arg):
        import cv2

        if not p.is_file():
            raise FaceError(f"face photo not found: {p}", hint="check the path, or use a name from `vcam faces list`")
        img = cv2.imread(str(p), cv2.IMREAD_COLOR)
        if img is None:
            raise FaceError(f"cannot read face photo {p}", hint="use a JPEG or PNG image")
        return face_from_image(img, p.stem, swapper=swapper, detector=detector, recogniser=recogniser)
    from .faces import FaceBank

    bank = FaceBank(cfg.faces_dir)
    return bank.load(arg, recogniser=recogniser, swappers=[swapper])


class _NoPrepare:
    """Stands in for a swapper where only the embedding of a face is needed (the reference face)."""

    def prepare(self, face: SourceFace) -> SourceFace:
        return face


class Daemon:
    """Owns the threads of one run. ``run()`` blocks; ``start()``/``stop()`` run it in the background."""

    def __init__(
        self,
        cfg: Config,
        *,
        state: RuntimeState | None = None,
        output=None,
        source=None,
        on_status=None,
        control: bool = True,
    ) -> None:
        self.cfg = cfg
        self.state = state or RuntimeState()
        self._output = output
        self._source = source
        self._on_status = on_status
        self._control = control
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.summary = RunSummary()
        self.ready = threading.Event()
        self.device = "cpu"
        self.swapper = None
        self.recogniser = None
        self.detector = None
        self._components: list = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, **run_kwargs) -> None:
        def target():
            try:
                self.run(**run_kwargs)
            except VcamError as exc:
                self.summary.error = str(exc)
                log.error("%s", exc)
                self.ready.set()

        self._thread = threading.Thread(target=target, name="vcam-frame-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    # -- setup -------------------------------------------------------------------------------
    def _build(self):
        from . import capture, publish
        from .detect import EMBEDDED_DETECTOR, detector_requirements, make_detector
        from .swap import BUILT_IN, make_swapper
        from .track import Tracker

        cfg = self.cfg
        self.device = resolve_device(cfg)
        if cfg.pipeline.fp16 and self.device == "cpu":
            log.warning("--fp16 needs a CUDA GPU; running FP32 on the CPU")

        source = self._source or capture.open_source(cfg.capture)
        self._components.append(source)
        gpu = self.device == "cuda"
        store = recogniser = enhancer = None
        neural = cfg.swap.swapper not in BUILT_IN
        own_detector = cfg.detect.model != EMBEDDED_DETECTOR
        if neural or cfg.swap.faces == "reference" or cfg.swap.enhancer or own_detector:
            from .models import registry
            from .models.download import ModelStore
            from .recognize import DEFAULT_RECOGNISER, create_recogniser

            store = ModelStore.from_config(cfg)
            # Every file this run needs, checked (and, if allowed, downloaded) at once, so a missing
            # set is reported in one message.
            needed = [DEFAULT_RECOGNISER] if (neural or cfg.swap.faces == "reference") else []
            needed += registry.requirements(cfg.swap.swapper) if neural else []
            needed += registry.requirements(cfg.swap.enhancer) if cfg.swap.enhancer else []
            needed += detector_requirements(cfg.detect.model) if own_detector else []
            store.ensure(needed)
            if neural or cfg.swap.faces == "reference":
                recogniser = create_recogniser(cfg, store=store, device=self.device)
        # The CPU detector also finds faces in source photos (once per photo) on the GPU path.
        detector = make_detector(cfg, store=store, device="cpu")
        self.detector = detector
        if gpu:
            from .gpu import stages

            transfers, stream = stages.make_context()
            swapper = stages.make_swapper(cfg, store=store, recogniser=recogniser)
            tracker = Tracker(stages.make_detector(cfg, transfers=transfers, stream=stream), cfg.track,
                              max_faces=cfg.pipeline.max_faces, fps=source.fps or cfg.capture.fps)
        else:
            if neural:
                from .swap_neural import create_swapper

                swapper = create_swapper(cfg.swap.swapper, cfg, store=store, device=self.device)
            else:
                swapper = make_swapper(cfg.swap.swapper, crop_size=cfg.swap.crop_size, color_match=cfg.swap.color_match)
            tracker = Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces, fps=source.fps or cfg.capture.fps)
        if cfg.swap.enhancer:
            if gpu:
                log.warning("the enhancer runs on the CPU path only; [swap] enhancer is ignored with --device cuda")
            else:
                from .swap_neural import create_enhancer

                enhancer = create_enhancer(cfg.swap.enhancer, cfg, amount=cfg.swap.enhancer_amount, store=store, device=self.device)
        self.swapper = swapper
        self.recogniser = recogniser

        # Source faces: --face / [swap] source, else the demo face for the demo input, plus the bank.
        if not self.state.names:
            self._load_faces(swapper, detector, recogniser)

        fps = cfg.output.fps or source.fps or cfg.capture.fps
        output = self._output
        if output is None:
            # Live input: stamp file frames by wall clock (plays at real speed even with drops);
            # as-fast-as-possible input: by frame count, so the file keeps the input's rate.
            timing = "wall" if cfg.capture.realtime else "frames"
            output = publish.open_output(cfg.output, source.width, source.height, fps, file_timing=timing)
        self._components.append(output)
        face_filter = self._reference_filter(detector, recogniser) if cfg.swap.faces == "reference" else None
        if gpu:
            pipeline = stages.make_pipeline(cfg, tracker=tracker, swapper=swapper, width=source.width,
                                            height=source.height, in_fmt=source.fmt, out_fmt=output.fmt,
                                            face_filter=face_filter, transfers=transfers, stream=stream)
        else:
            from .pipeline import Pipeline

            pipeline = Pipeline(cfg, tracker=tracker, swapper=swapper, out_fmt=output.fmt,
                                face_filter=face_filter, enhancer=enhancer)
        return source, output, pipeline, fps

    def _load_faces(self, swapper, detector, recogniser) -> None:
        """Active face: --face / [swap] source, else the demo face for the demo input; plus the bank."""
        from .faces import FaceBank

        cfg = self.cfg
        if cfg.swap.source:
            face = load_face_arg(cfg.swap.source, swapper=swapper, cfg=cfg, detector=detector, recogniser=recogniser)
            self.state.add_face(face, activate=True)
        elif cfg.capture.input == "demo":
            from . import demo

            face = face_from_image(demo.portrait("astronaut"), "astronaut", swapper=swapper, detector=detector, recogniser=recogniser)
            self.state.add_face(face, activate=True)
        bank = FaceBank(cfg.faces_dir)
        # Faces added to the bank later are loaded on first use (`vcam ctl face NAME`, OBS).
        self.state.set_loader(lambda name: bank.load(name, recogniser=recogniser, swappers=[swapper]))
        for name in bank.names():
            if name in self.state.names:
                continue
            try:
                self.state.add_face(bank.load(name, recogniser=recogniser, swappers=[swapper]))
            except VcamError as exc:
                log.warning("face '%s' skipped: %s", name, exc)

    def _reference_filter(self, detector, recogniser):
        from .recognize import reference_filter

        cfg = self.cfg
        if not cfg.swap.reference:
            raise ConfigError("[swap] faces = 'reference' needs [swap] reference", hint="set it to a face-bank name or a photo path")
        ref = load_face_arg(cfg.swap.reference, swapper=_NoPrepare(), cfg=cfg, detector=detector, recogniser=recogniser)
        return reference_filter(recogniser, ref.embeddings[recogniser.name], cfg.swap.reference_threshold)

    def _start_control(self) -> None:
        if not self._control:
            return
        try:
            from .control.local import ControlServer  # type: ignore[import-not-found]
        except ImportError:
            ControlServer = None  # noqa: N806
        if ControlServer is not None:
            try:
                srv = ControlServer(self.cfg.socket_path, self.state)
                srv.start()
                self._components.append(srv)
            except VcamError as exc:
                log.warning("local control disabled: %s", exc)
        if self.cfg.obs.enabled:
            try:
                from .control.obs import ObsController  # type: ignore[import-not-found]

                obs = ObsController(self.cfg.obs, self.state)
                obs.start()
                self._components.append(obs)
            except ImportError as exc:
                log.warning("OBS control unavailable: %s", exc)

    # -- main loop ---------------------------------------------------------------------------
    def run(self, *, max_frames: int | None = None, duration: float | None = None) -> RunSummary:
        from .capture import CaptureThread

        cfg = self.cfg
        summary = self.summary
        summary.error = None
        try:
            source, output, pipeline, fps = self._build()
            summary.device = self.device
            self._start_control()
            cap = CaptureThread(source)
            cap.start()
            self._components.insert(0, cap)
            self.ready.set()
            budget = float(cfg.pipeline.max_latency)
            min_interval = 1.0 / cfg.output.fps if cfg.output.fps else 0.0
            lat: deque[float] = deque(maxlen=300)
            stage_sum: dict[str, float] = {}
            t_start = time.perf_counter()
            last_status = t_start
            last_pub = 0.0
            in_window = deque(maxlen=120)
            out_window = deque(maxlen=120)
            status = Status()
            over_budget_recent = 0
            while not self._stop.is_set():
                if max_frames is not None and summary.frames_in >= max_frames:
                    break
                now = time.perf_counter()
                if duration is not None and now - t_start >= duration:
                    break
                frame = cap.get(timeout=0.5)
                if frame is None:
                    if cap.finished:
                        break
                    continue
                summary.frames_in += 1
                in_window.append(frame.t_capture)
                snap = self.state.snapshot()
                data, stats = pipeline.process(frame, snap)
                for k, v in stats.stages.items():
                    stage_sum[k] = stage_sum.get(k, 0.0) + v
                summary.full_scans += int(stats.full_scan)
                if min_interval:
                    wait = last_pub + min_interval - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                t_pub = time.perf_counter()
                age = t_pub - frame.t_capture
                if budget > 0 and age > budget:
                    summary.dropped_latency += 1
                    over_budget_recent = 30
                else:
                    output.send(data)
                    if getattr(output, "user_closed", False):  # preview window closed by the user
                        self._stop.set()
                    last_pub = time.perf_counter()
                    summary.frames_out += 1
                    out_window.append(last_pub)
                    lat.append((last_pub - frame.t_capture) * 1000.0)
                    summary.latencies_ms.append(lat[-1])
                    over_budget_recent = max(0, over_budget_recent - 1)
                status.faces = stats.faces
                status.guarded = stats.guarded
                if t_pub - last_status >= float(cfg.status.interval):
                    last_status = t_pub
                    status.frames_in = summary.frames_in
                    status.frames_out = summary.frames_out
                    status.dropped_capture = cap.dropped
                    status.dropped_latency = summary.dropped_latency
                    status.full_scans = summary.full_scans
                    status.fps_in = _rate(in_window)
                    status.fps_out = _rate(out_window)
                    if lat:
                        arr = np.fromiter(lat, dtype=np.float64)
                        status.latency_p50_ms = float(np.percentile(arr, 50))
                        status.latency_p99_ms = float(np.percentile(arr, 99))
                    status.over_budget = over_budget_recent > 0
                    self.state.publish_status(status)
                    if self._on_status is not None:
                        self._on_status(status, self.state.active, self.state.swap_enabled)
            summary.seconds = time.perf_counter() - t_start
            summary.dropped_capture = cap.dropped
            n = max(summary.frames_in, 1)
            summary.stage_ms = {k: v * 1000.0 / n for k, v in stage_sum.items()}
            return summary
        finally:
            self._shutdown()
            self.ready.set()

    def _shutdown(self) -> None:
        # Order: capture thread first (stops reading), then the source, the output, control.
        for comp in self._components:
            for meth in ("stop", "close"):
                fn = getattr(comp, meth, None)
                if fn is not None:
                    try:
                        fn()
                    except Exception:  # shutdown must finish whatever one part does
                        log.exception("error while closing %s", type(comp).__name__)
                    break
        self._components.clear()


def _rate(times: deque) -> float:
    if len(times) < 2:
        return 0.0
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else 0.0
