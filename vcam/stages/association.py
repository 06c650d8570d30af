"""Which detection is which tracked face: greedy one-to-one matching of detected boxes to the boxes
the tracks predict (:class:`vcam.stages.track.Tracker`'s association passes)."""

from __future__ import annotations

import math

import numpy as np

from vcam.stages.detections import box_iou

_MATCH_IOU = 0.3  # IoU at which a detection is the same face as a track's predicted box
_MATCH_DIST = 0.5  # or: centre distance below this fraction of the track's box side
_MATCH_SIZE = 1.5  # the second pass (see associate): box sides within this factor


def associate(
    track_boxes: np.ndarray, det_boxes: np.ndarray, reach: float = 0.0
) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Greedy one-to-one matching of detections to tracks.

    A pair qualifies when IoU >= 0.3 or the centre distance is below half the track box's longer
    side; pairs are taken by IoU, then by distance. ``reach`` > 0.5: a second pass then pairs the
    tracks and detections left over when the centre distance is below ``reach`` track sides and
    the two boxes' sides are within a factor 1.5 (a face that moved further than half its size
    since the track's last position, still inside the region its track searches: the same face,
    not a new one beside a stale track). Returns (matches (track, det), unmatched tracks,
    unmatched detections).
    """
    nt, nd = len(track_boxes), len(det_boxes)
    if nt == 0 or nd == 0:
        return [], list(range(nt)), list(range(nd))
    tb = np.asarray(track_boxes, dtype=np.float64).reshape(-1, 4)
    db = np.asarray(det_boxes, dtype=np.float64).reshape(-1, 4)
    if nt == 1 and nd == 1:  # one face, found again: every frame of the common case, in floats
        return ([(0, 0)], [], []) if _pair(tb[0].tolist(), db[0].tolist(), reach) else ([], [0], [0])
    iou = box_iou(tb, db)
    tc = (tb[:, :2] + tb[:, 2:]) / 2
    dc = (db[:, :2] + db[:, 2:]) / 2
    side = np.maximum(tb[:, 2] - tb[:, 0], tb[:, 3] - tb[:, 1]).clip(1.0)
    dist = np.linalg.norm(tc[:, None] - dc[None], axis=-1) / side[:, None]
    ok = (iou >= _MATCH_IOU) | (dist < _MATCH_DIST)
    ti, di = np.nonzero(ok)
    used_t, used_d, matches = set[int](), set[int](), list[tuple[int, int]]()
    _take_pairs(ti, di, np.lexsort((dist[ti, di], -iou[ti, di])), used_t, used_d, matches)
    if reach > _MATCH_DIST and len(used_t) < nt and len(used_d) < nd:
        dside = np.maximum(db[:, 2] - db[:, 0], db[:, 3] - db[:, 1]).clip(1.0)
        ratio = dside[None, :] / side[:, None]
        near = (dist < reach) & (ratio <= _MATCH_SIZE) & (ratio >= 1.0 / _MATCH_SIZE)
        near[list(used_t), :] = False
        near[:, list(used_d)] = False
        ti, di = np.nonzero(near)
        _take_pairs(ti, di, np.argsort(dist[ti, di], kind="stable"), used_t, used_d, matches)
    return matches, [t for t in range(nt) if t not in used_t], [d for d in range(nd) if d not in used_d]


def _pair(t: list[float], d: list[float], reach: float) -> bool:
    """:func:`associate` of one track box ``t`` and one detected box ``d`` (x1, y1, x2, y2): the
    same tests and thresholds, in Python floats."""
    w = max(min(t[2], d[2]) - max(t[0], d[0]), 0.0)
    h = max(min(t[3], d[3]) - max(t[1], d[1]), 0.0)
    inter = w * h
    union = max(t[2] - t[0], 0.0) * max(t[3] - t[1], 0.0) + max(d[2] - d[0], 0.0) * max(d[3] - d[1], 0.0) - inter
    iou = inter / max(union, 1e-12) if union > 0 else 0.0
    side = max(t[2] - t[0], t[3] - t[1], 1.0)
    dx, dy = (t[0] + t[2]) / 2 - (d[0] + d[2]) / 2, (t[1] + t[3]) / 2 - (d[1] + d[3]) / 2
    dist = math.sqrt(dx * dx + dy * dy) / side
    if iou >= _MATCH_IOU or dist < _MATCH_DIST:
        return True
    if reach <= _MATCH_DIST:
        return False
    ratio = max(d[2] - d[0], d[3] - d[1], 1.0) / side
    return dist < reach and 1.0 / _MATCH_SIZE <= ratio <= _MATCH_SIZE


def _take_pairs(
    ti: np.ndarray, di: np.ndarray, order: np.ndarray, used_t: set[int], used_d: set[int], matches: list[tuple[int, int]]
) -> None:
    """Greedy: candidate pairs (``ti[k]``, ``di[k]``) in ``order``, each side taken at most once."""
    for k in order:
        t, d = int(ti[k]), int(di[k])
        if t in used_t or d in used_d:
            continue
        used_t.add(t)
        used_d.add(d)
        matches.append((t, d))


__all__ = ["associate"]
