"""Recognise stage: ArcFace identity embeddings and identity lock by reference face.

The recogniser warps each face to its registry template (``arcface_112_v2`` at 112 for
arcface_w600k_r50), normalises it per the registry row and returns the raw (F, 512) float32
embedding; similarity is the cosine of two embeddings. It runs when a face is added to the bank
and when a track starts, never per frame.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vcam.align import estimate
from vcam.engines import Engine, create_engine
from vcam.engines.gate import ROUND_TURNS
from vcam.errors import EngineUnavailable, ModelError
from vcam.kernels.warp import warp_crops_normalized_ref, warp_crops_ref
from vcam.models import registry
from vcam.models.registry import ModelSpec

log = logging.getLogger(__name__)

DEFAULT_RECOGNISER = "arcface_w600k_r50"


def normalize(e: np.ndarray, axis: int = -1) -> np.ndarray:
    """L2-normalise along ``axis`` (float32); a zero vector stays zero."""
    e = np.asarray(e, dtype=np.float32)
    n = np.linalg.norm(e, axis=axis, keepdims=True)
    return (e / np.maximum(n, 1e-12)).astype(np.float32)


def similarity(face_embedding: np.ndarray, reference_embedding: np.ndarray) -> np.ndarray | float:
    """Cosine similarity in [-1, 1]. ``face_embedding``: (512,) or (F, 512); ``reference``: (512,).

    Returns a float for one face, a (F,) float32 array for several.
    """
    a = normalize(face_embedding)
    b = normalize(np.asarray(reference_embedding).reshape(-1))
    s = a @ b
    return float(s) if np.ndim(s) == 0 else s.astype(np.float32)


def pick_by_reference(embeddings: np.ndarray, reference: np.ndarray, threshold: float) -> np.ndarray:
    """Identity lock: indices (int64) of the faces to swap, given the reference person's embedding.

    Only the one face most similar to ``reference`` is chosen, and only if its similarity reaches
    ``threshold``; so the result has zero or one index. ``embeddings``: (F, 512).
    """
    emb = np.asarray(embeddings, dtype=np.float32).reshape(-1, np.asarray(reference).size)
    if emb.shape[0] == 0:
        return np.zeros((0,), dtype=np.int64)
    sims = np.atleast_1d(similarity(emb, reference))
    best = int(np.argmax(sims))
    return np.array([best], dtype=np.int64) if sims[best] >= threshold else np.zeros((0,), dtype=np.int64)


class ArcFaceRecogniser:
    """Embeddings from a registry recogniser. ``engine`` is any :class:`~vcam.engines.Engine`."""

    def __init__(self, engine: Engine, spec: ModelSpec | str = DEFAULT_RECOGNISER) -> None:
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "recogniser":
            raise ModelError(f"{self.spec.name} is a {self.spec.kind}, not a recogniser", hint="pick arcface_w600k_r50")
        self.engine = engine
        self.name = self.spec.name
        self.template = self.spec.template
        self.crop_size = self.spec.size
        self._input = engine.inputs[0]
        self._mean, self._std = self.spec.input_mean_std_255

    def describe(self) -> str:
        return f"{self.name}: {self.engine.describe()}"

    def embed(self, frame: np.ndarray, landmarks: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        """Embeddings (F, 512) of the faces with 5-point ``landmarks`` (F, 5, 2) in ``frame`` (BGR)."""
        lms = np.asarray(landmarks, dtype=np.float64).reshape(-1, 5, 2)
        if lms.shape[0] == 0:
            return np.zeros((0, 512), np.float32)
        mats = np.stack([estimate(lm, self.template, self.crop_size) for lm in lms])
        x = warp_crops_normalized_ref(frame, mats, self.crop_size, self._mean, self._std, rgb=self.spec.rgb)
        return self._run(x)

    def crops(self, frame: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        """The aligned uint8 crops the recogniser sees (F, S, S, 3) BGR."""
        lms = np.asarray(landmarks, dtype=np.float64).reshape(-1, 5, 2)
        mats = np.stack([estimate(lm, self.template, self.crop_size) for lm in lms])
        return warp_crops_ref(frame, mats, self.crop_size)

    def _run(self, x: np.ndarray) -> np.ndarray:
        out = np.asarray(self.engine.run({self._input.name: x})[0], np.float32)
        return out.reshape(x.shape[0], -1)


class DeferredRecogniser:
    """A recogniser built in a background thread (``build()``), off the start's critical path: its
    ``name`` is known at once (what the cached embeddings of the face bank and of photos are keyed
    by, :mod:`vcam.stages.face_cache`), so faces seen before load without it; the first use of
    anything else (:meth:`embed`, ``engine``, ...) waits for the build, and raises what the build
    raised. :meth:`start` starts the thread, which first calls ``wait`` (the daemon: until its first
    frame is out); a use before the thread began building builds it at once in the caller's thread."""

    def __init__(self, name: str, build: Callable[[], ArcFaceRecogniser]) -> None:
        self.name = name
        self._build = build
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._building = False
        self._value: ArcFaceRecogniser | None = None
        self._error: BaseException | None = None

    def start(self, wait: Callable[[], Any] | None = None) -> DeferredRecogniser:
        with self._lock:
            if self._thread is None and not self._building:
                self._thread = threading.Thread(target=self._run, args=(wait,), name="vcam-recogniser", daemon=True)
                self._thread.start()
        return self

    @property
    def started(self) -> bool:
        """Whether the build was asked for (:meth:`start` or a use)."""
        return self._thread is not None or self._building

    def _claim(self) -> bool:
        with self._lock:
            if self._building:
                return False
            self._building = True
            return True

    def _run(self, wait: Callable[[], Any] | None) -> None:
        if wait is not None:
            wait()
        if self._claim():
            with ROUND_TURNS.stepping_aside():  # seconds of Python beside the frames: it parks in their rounds
                self._build_now()

    def _build_now(self) -> None:
        try:
            self._value = self._build()
        except BaseException as exc:  # kept for the first use, which raises it
            self._error = exc
            log.warning("the recogniser %s could not be loaded: %s", self.name, getattr(exc, "message", exc))
        finally:
            self._done.set()

    @property
    def ready(self) -> bool:
        """Whether the build ended (loaded or failed)."""
        return self._done.is_set()

    def get(self) -> ArcFaceRecogniser:
        """The recogniser, built (now, in this thread, unless a build is under way: then waited for)."""
        if self._claim():
            self._build_now()
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def describe(self) -> str:
        return self.get().describe() if self.ready else f"{self.name}: loading in the background"

    def embed(self, frame: np.ndarray, landmarks: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        return self.get().embed(frame, landmarks)

    def __getattr__(self, attr: str) -> Any:  # everything else of ArcFaceRecogniser, once built
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.get(), attr)


def create_recogniser(
    *,
    store: Any,
    name: str = DEFAULT_RECOGNISER,
    device: str = "cpu",
    backend: str = "auto",
    fp16: bool = False,
    max_batch: int = 8,
    download: bool | None = None,
    threads: int = 0,
) -> ArcFaceRecogniser:
    """Build the recogniser ``name`` from ``store`` (verified; downloaded if allowed).

    It runs once per face switch and once per new track, never per frame, so it runs wherever it
    can: on ``device`` with ``backend`` when that works, else on onnxruntime on the CPU, with one
    log line saying why. A model file that cannot be read still raises ModelError. ``threads``: a
    call's CPU threads on onnxruntime (0: one per core).
    """
    path = store.ensure([name], download=download)[name]
    try:
        engine = create_engine(path, backend=backend, device=device, fp16=fp16, max_batch=max_batch, threads=threads)
    except EngineUnavailable as exc:
        if (backend, device) == ("onnxruntime", "cpu"):
            raise
        log.info("recogniser %s falls back to onnxruntime on the CPU: %s", name, exc.message)
        engine = create_engine(path, backend="onnxruntime", device="cpu", max_batch=max_batch, threads=threads)
        engine.skipped = [f"{backend} on {device}: {exc.message}"]
    return ArcFaceRecogniser(engine, name)


def reference_filter(recogniser: ArcFaceRecogniser, reference: np.ndarray, threshold: float) -> Callable:
    """A pipeline ``face_filter`` for identity lock (``swap.faces = "reference"``).

    Each track's similarity to ``reference`` is computed once, when the track first appears (kept on
    ``Track.similarity``), never per frame; then only the most similar track at or above
    ``threshold`` is swapped (see :func:`pick_by_reference`). ``host_frame()`` gives the frame on the
    host; it is called only when a new track needs its embedding (on the GPU: one extra download).
    """
    ref = np.asarray(reference, np.float32).reshape(-1)

    def choose(tracks: list, host_frame: Callable[[], np.ndarray]) -> list:
        new = [t for t in tracks if t.similarity is None]
        if new:
            emb = recogniser.embed(host_frame(), np.stack([t.landmarks for t in new]))
            for t, s in zip(new, np.atleast_1d(similarity(emb, ref))):
                t.similarity = float(s)
        if not tracks:
            return []
        sims = np.array([t.similarity for t in tracks], np.float32)
        best = int(np.argmax(sims))
        return [tracks[best]] if sims[best] >= threshold else []

    return choose
