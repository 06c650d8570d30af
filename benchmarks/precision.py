"""No face pasted on a non-face (issue 29): detection precision and recall on scenes with face-like
distractors, today's behaviour ("before": every detection swapped at once, tile faces unchecked)
beside the confirmed tracks and checked tile faces ("after", the default), in the same run; on the
CPU also "worker": "after" with the rolling search beside the frame (`[track] search`, its default there).

    python -m benchmarks.precision [--device cpu|cuda] [--frames 250] [--json DIR]

Scenes (made here from the bundled portraits, each ``--frames`` long, at 1080p and 4K): real faces
of 45-200 px that move, among distractors the small-face tiles (native-scale regions, upsampled)
can take for a face: round shiny objects (a brass lamp, plates, balls), patterned textures
(checks, dots, foliage noise), a cartoon face printed on a shirt, a pencil-sketch portrait on a
wall, a crowd far away (head-sized blobs with dark dots for eyes and mouth), and a thumbnail face
on the host's cheek by the ear (the issue's "face on the ear": a face, but not a person). The tracker runs
as in the pipeline (full scans, regions, the rolling tile search); per frame every track it
returns is what the pipeline swaps and what the status line counts as ``faces N``.

- precision: returned tracks that lie on a true face / all returned tracks (1.0: nothing else swapped);
- recall: true faces with a returned track / all true faces in view (the first 5 frames of a scene
  and of a face's entry are given to the search; a face another one crosses is not in view);
- faces_ok: frames where the count equals the true faces in view.
Prints a table and writes ``precision.json`` to the ``--json`` folder. Modes: ``before``, ``after``,
and (``--modes ...,predicted,daemon``) the tracker as a predicting pipeline drives it (issue 28):
``predicted`` swaps a frame with the predicted tracks while every tracked face was found and waits
for its detection otherwise (a patient pipeline), ``daemon`` predicts through a miss too (the
daemon's pipelines, :meth:`~vcam.stages.track.Tracker.predictable`); each frame's detection applied
at the next frame.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np

from benchmarks import write_report
from vcam.config import Config
from vcam.ops import make_ops
from vcam.runtime.roles import stage_params
from vcam.stages.demo import compose, face_box, gradient, placement, portrait, transform_box
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.detections import DetectParams, box_iou
from vcam.stages.search import SearchWorker
from vcam.stages.track import Tracker, TrackParams

SIZES = {"1080p": (1920, 1080), "4K": (3840, 2160)}


def _texture(w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """A wall: plaster noise, a check pattern band, a dotted wallpaper band and foliage noise."""
    base = gradient(w, h, (90, 95, 105), (150, 150, 140)).astype(np.float32)
    base += rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    s = max(1, w // 1920)
    checks = (((xx // (24 * s)) + (yy // (24 * s))) % 2).astype(np.float32)
    band = (yy > 0.62 * h) & (yy < 0.72 * h)
    base[band] = (60 + 120 * checks[band])[:, None]
    dots = (((xx % (36 * s)) - 18 * s) ** 2 + ((yy % (36 * s)) - 18 * s) ** 2 < (6 * s) ** 2).astype(np.float32)
    band = (yy > 0.05 * h) & (yy < 0.18 * h)
    base[band] = np.stack([140 - 90 * dots[band], 120 - 70 * dots[band], 170 - 100 * dots[band]], -1)
    leaves = cv2.GaussianBlur(rng.normal(0, 1, (h // 8, w // 8)).astype(np.float32), (0, 0), 1.5)
    leaves = cv2.resize(leaves, (w, h))
    band = xx > 0.82 * w
    base[band] = np.stack([40 + 40 * leaves[band], 90 + 60 * leaves[band], 40 + 30 * leaves[band]], -1)
    return np.clip(base, 0, 255).astype(np.uint8)


def _distractors(frame: np.ndarray, i: int, rng_seed: int, sketch: np.ndarray, shirt_at: tuple[int, int] | None) -> None:
    h, w = frame.shape[:2]
    s = w / 1920
    rng = np.random.default_rng(rng_seed)
    # round shiny objects: a brass lamp and plates (radial gradients with a highlight), balls
    for k in range(9):
        cx, cy = int(rng.uniform(0.05, 0.95) * w), int(rng.uniform(0.72, 0.97) * h)
        r = int(rng.uniform(12, 40) * s)
        col = np.array([40, 140, 200]) if k % 3 == 0 else np.array([200, 200, 210]) if k % 3 == 1 else rng.integers(40, 220, 3)
        for rr in range(r, 0, -1):
            shade = 0.45 + 0.55 * (1 - rr / r)
            cv2.circle(frame, (cx + (r - rr) // 3, cy - (r - rr) // 3), rr, tuple(int(c * shade) for c in col), -1)
        cv2.circle(frame, (cx - r // 3, cy - r // 3), max(1, r // 6), (245, 245, 245), -1)  # a highlight
        cv2.circle(frame, (cx + r // 4, cy - r // 3), max(1, r // 7), (30, 30, 30), -1)  # a dark rivet
    # a crowd far away: head-sized blobs with dark dots for eyes and a mouth
    for k in range(40):
        cx = int((0.03 + 0.94 * ((k * 0.6180339) % 1)) * w)
        cy = int((0.22 + 0.08 * ((k * 0.414) % 1)) * h) + int(2 * s * math.sin(i / 6 + k))
        r = int((5 + 3 * ((k * 0.27) % 1)) * s)  # far away: 10-16 px wide, below [detect] min_face
        skin = (int(90 + 60 * ((k * 0.33) % 1)), int(120 + 60 * ((k * 0.71) % 1)), int(160 + 60 * ((k * 0.13) % 1)))
        cv2.ellipse(frame, (cx, cy), (r, int(1.25 * r)), 0, 0, 360, skin, -1)
        for dx in (-r // 3, r // 3):
            cv2.circle(frame, (cx + dx, cy - r // 4), max(1, r // 5), (30, 30, 30), -1)
        cv2.line(frame, (cx - r // 3, cy + r // 2), (cx + r // 3, cy + r // 2), (40, 40, 60), max(1, r // 6))
    # a pencil-sketch portrait on the wall (edges of a portrait, no photographic face)
    sh, sw = sketch.shape[:2]
    x0, y0 = int(0.08 * w), int(0.3 * h)
    frame[y0 : y0 + sh, x0 : x0 + sw] = sketch
    # a cartoon face printed on a shirt below a real face
    if shirt_at is not None:
        cx, cy = shirt_at
        r = int(22 * s)
        cv2.circle(frame, (cx, cy), r, (40, 200, 240), -1)
        cv2.circle(frame, (cx, cy), r, (20, 20, 20), max(1, r // 10))
        for dx in (-r // 3, r // 3):
            cv2.ellipse(frame, (cx + dx, cy - r // 4), (max(1, r // 8), max(1, r // 5)), 0, 0, 360, (20, 20, 20), -1)
        cv2.ellipse(frame, (cx, cy + r // 5), (r // 2, r // 3), 0, 10, 170, (20, 20, 20), max(1, r // 10))


def _tri(x: float) -> float:
    """A triangle wave 0 -> 1 -> 0 over each unit of ``x``: paths that turn back, never jump."""
    f = x % 1.0
    return 2 * f if f < 0.5 else 2 - 2 * f


def _sketch(img: np.ndarray, side: int) -> np.ndarray:
    g = cv2.cvtColor(cv2.resize(img, (side, side)), cv2.COLOR_BGR2GRAY)
    edges = cv2.Canny(cv2.GaussianBlur(g, (5, 5), 0), 40, 100)
    paper = np.full((side, side, 3), 225, np.uint8)
    paper[edges > 0] = (60, 60, 60)
    return paper


def scene(size: str, n: int, seed: int = 0):
    """Frames of one scene: (frame, true boxes, in drawing order: far to near). Faces: a 45 px one
    far away drifting in at frame 20, a 200 px host whose shirt carries the cartoon, a 90 px one
    walking in front."""
    w, h = SIZES[size]
    s = w / 1920
    rng = np.random.default_rng(seed)
    bg = _texture(w, h, rng)
    grace, astro = portrait("grace_hopper"), portrait("astronaut")
    det = RetinaFaceDetector()
    boxes = {id(grace): face_box(grace, det), id(astro): face_box(astro, det)}
    sketch = _sketch(grace, int(160 * s))
    gb = boxes[id(grace)].astype(int)  # the thumbnail: the face and a little around it, a sticker
    m = (gb[2] - gb[0]) // 4
    thumb = grace[max(0, gb[1] - m) : gb[3] + m, max(0, gb[0] - m) : gb[2] + m]
    tb = gb - np.array([max(0, gb[0] - m), max(0, gb[1] - m)] * 2)
    for i in range(n):
        faces = [
            (astro, 200 * s, (0.5 * w + 30 * s * math.sin(i / 15), 0.42 * h)),
            (grace, 90 * s, ((0.25 + 0.4 * _tri(i / 200)) * w, 0.8 * h + 10 * s * math.sin(i / 7))),  # in front
        ]
        if i >= 20:
            # far away (drawn first), over the foliage beside the host
            faces.insert(0, (grace, 45 * s, ((0.83 + 0.12 * _tri((i - 20) / 150)) * w, 0.33 * h)))
        items, truth = [], []
        for img, px, centre in faces:
            b = boxes[id(img)]
            m = placement(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2), centre, px / float(b[2] - b[0]), 0.0)
            items.append((img, m))
            truth.append(transform_box(b, m))
        host = truth[-2]
        # a thumbnail face on the host's cheek, by the ear (a sticker, a reflection): not a person
        side = 50 * s
        anchor = ((tb[0] + tb[2]) / 2, (tb[1] + tb[3]) / 2)
        at = (host[0] + 0.06 * (host[2] - host[0]), (host[1] + host[3]) / 2)
        items.append((thumb, placement(anchor, at, side / float(tb[2] - tb[0]), 0.0)))
        frame = compose((w, h), items, background=bg)
        _distractors(frame, i, seed, sketch, (int((host[0] + host[2]) / 2), int(host[3] + 170 * s)))
        yield frame, truth


def _occluded(k: int, truth: list[np.ndarray]) -> bool:
    """True face ``k`` overlaps a face drawn after it (the walker crossing the host): not
    required to be found while it does."""
    a = truth[k]
    for b in truth[k + 1 :]:
        if min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1]):
            return True
    return False


def match(boxes: list[np.ndarray], truth: list[np.ndarray], with_unmatched: bool = False) -> Any:
    """One track per person: tracks matched one-to-one to true faces (IoU >= 0.3, best first).
    Returns (tracks matched, indices of the true faces matched); every other track is a false
    swap (a distractor, or a second, smaller face pasted on a person: the "face on the ear").
    ``with_unmatched``: also the indices of those tracks, a third item."""
    if not boxes or not truth:
        return (0, set(), list(range(len(boxes)))) if with_unmatched else (0, set())
    iou = box_iou(np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(truth, np.float64).reshape(-1, 4))
    pairs = sorted(((iou[i, j], i, j) for i in range(len(boxes)) for j in range(len(truth)) if iou[i, j] >= 0.3), reverse=True)
    used_b, used_t = set(), set()
    for _, i, j in pairs:
        if i not in used_b and j not in used_t:
            used_b.add(i)
            used_t.add(j)
    if with_unmatched:
        return len(used_b), used_t, [i for i in range(len(boxes)) if i not in used_b]
    return len(used_b), used_t


def _step(tracker: Tracker, img, i: int, mode: str, pending: list) -> list:
    """The tracks frame ``i`` is swapped with: its own detection's, or (``predicted``, ``daemon``)
    the predicted ones while its detection is deferred to the next frame."""
    if mode not in ("predicted", "daemon"):
        return tracker.update(img, i)
    if pending:
        tracker.complete(pending.pop())
    ok = tracker.predictable(img, i) if mode == "daemon" else tracker.confident(img, i)
    if not ok:
        return tracker.update(img, i)
    tracks = tracker.predict(i)
    pending.append(tracker.launch(img, i, deferred=True))
    return tracks


def _judge(i: int, boxes: list[np.ndarray], item: tuple) -> tuple[int, set[int], list[int]]:
    """This module's scene: (tracks on a face, true faces found, true faces required this frame)."""
    truth = item[1]
    matched, people = match(boxes, truth)
    visible = [k for k in range(len(truth)) if not _occluded(k, truth)]
    if i < 5:
        return matched, people, []
    # the small face's first 5 frames: the search's to find it
    return matched, people, [k for k in visible if not (len(truth) == 3 and k == 0 and i < 25)]


def _run(device: str, mode: str, size: str, frames: int, scenes: Callable = scene, judge: Callable = _judge) -> dict:
    """One scene (``scenes(size, frames)``: items whose first is the frame, the second the true
    boxes) in one mode; ``judge(i, boxes, item)`` -> (tracks on a face, faces found, faces required)."""
    cfg = Config()
    ops = make_ops(device)
    det = RetinaFaceDetector(
        stage_params(DetectParams, cfg.detect), cfg.track.roi_size, ops=ops, device=ops.device, max_regions=16
    )
    params = stage_params(TrackParams, cfg.track)
    if mode == "before":  # today's: every new track swapped at once, tile faces unchecked
        params = replace(params, confirm_hits=1)
        det.tile_check = False
    search = None
    if mode == "worker":  # "after" with the rolling search beside the frame ([track] search, the CPU's default)
        search = SearchWorker(
            RetinaFaceDetector(stage_params(DetectParams, cfg.detect), cfg.track.roi_size, max_regions=16, threads=1),
            wait=True,  # its faces always two frames late, as on a machine with a core to spare
        )
    tracker = Tracker(det, params, cfg.pipeline.max_faces, search=search)
    tracker.admit_check = mode != "before"
    tp = fp = found = truths = count_ok = 0
    ms: list[float] = []
    pending: list = []  # the deferred detection of a predicted frame, applied at the next one
    for i, item in enumerate(scenes(size, frames)):
        img = ops.asarray(item[0])  # the frame where the pipeline's tracker sees it (device memory on cuda)
        t0 = time.perf_counter()
        tracks = _step(tracker, img, i, mode, pending)
        ms.append((time.perf_counter() - t0) * 1000)
        boxes = [np.asarray(t.box) for t in tracks]
        matched, people, required, *ok = judge(i, boxes, item)
        tp += matched
        fp += len(boxes) - matched
        count_ok += ok[0] if ok else len(tracks) == sum(not _occluded(k, item[1]) for k in range(len(item[1])))
        truths += len(required)
        found += sum(k in people for k in required)
    if search is not None:
        search.close()
    return {
        "mode": mode,
        "size": size,
        "frames": frames,
        "swapped": tp + fp,
        "false": fp,
        "precision": tp / max(tp + fp, 1),
        "recall": found / max(truths, 1),
        "faces_ok_pct": 100.0 * count_ok / frames,
        "track_ms_mean": float(np.mean(ms)),
        "track_ms_p99": float(np.percentile(ms, 99)),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--frames", type=int, default=250, help="frames per scene (2 sizes: 1080p, 4K)")
    ap.add_argument("--sizes", default="1080p,4K")
    ap.add_argument("--modes", default=None, help="default: before,after (and worker on the CPU)")
    ap.add_argument("--json", type=Path, default=None, help="folder for precision.json")
    ap.add_argument("--save", type=Path, default=None, help="folder: the first frame of each scene as PNG")
    a = ap.parse_args(argv)
    sizes = [s for s in a.sizes.split(",") if s]
    if a.save is not None:
        a.save.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            frame, _ = next(iter(scene(size, 30)))
            cv2.imwrite(str(a.save / f"precision_scene_{size}.png"), frame)
    modes = (a.modes or ("before,after,worker" if a.device == "cpu" else "before,after")).split(",")
    rows = [_run(a.device, mode, size, a.frames) for size in sizes for mode in modes]
    head = f"{'scene':6} {'mode':7} {'frames':>6} {'swapped':>8} {'false':>6} {'precision':>9} {'recall':>7}"
    print(head + f" {'faces ok':>8} {'track ms':>9} {'p99':>7}")
    for r in rows:
        print(
            f"{r['size']:6} {r['mode']:7} {r['frames']:6d} {r['swapped']:8d} {r['false']:6d} {r['precision']:9.4f} "
            f"{r['recall']:7.3f} {r['faces_ok_pct']:7.1f}% {r['track_ms_mean']:9.1f} {r['track_ms_p99']:7.1f}"
        )
    payload = {"device": a.device, "machine": platform.node(), "rows": rows}
    if a.json is not None:
        a.json.mkdir(parents=True, exist_ok=True)
        write_report(str(a.json / "precision.json"), payload)
    return payload


if __name__ == "__main__":
    main()
