"""No paste off a face among real objects (issue 40): the precision benchmark on scenes composed of
real photographs, where :mod:`benchmarks.precision`'s are drawn shapes.

    python -m benchmarks.precision_real [--device cpu|cuda] [--frames 240] [--sizes 1080p,4K]
                                        [--modes after,worker (CPU; after on a GPU)] [--steady 150] [--json DIR] [--save DIR]
                                        [--jobs N (processes composing the frames)]

The scenes (made here, each ``--frames`` long, at 1080p and 4K): scikit-image's bundled photographs
(coins, a clock, a coffee cup, Chelsea the cat, the moon, a rocket, a horse, a motorcycle, a retina,
the Hubble deep field, brick and gravel for the wall and the table) as objects that slide, turn,
grow and shrink, brighten and dim, pass in front of each other and of the faces and leave the
frame; with them the real faces the project ships (Eileen Collins, Grace Hopper) and scikit-image's
(a mirrored copy, 48-240 px), one host always there, one walking through the frame (entering and
leaving at its edges), one small face that appears and disappears. Every frame comes with the true
face boxes and the objects' boxes, so a track off every face is named by the object it lies on.

Per frame, every track the tracker returns (what the pipeline swaps and what ``faces N`` counts):
- false: a track matched to no true face (IoU >= 0.3): a paste off a face; ``false_frames``: frames
  with at least one; ``on``: the objects they lay on (the one its box overlaps most);
- recall: true faces in view with a track / true faces in view (a face is in view with 80 % of its
  box inside the frame and at most 20 % of it behind a later-drawn object; the first 8 frames of a
  face's entry belong to the search, :data:`ENTRY`);
- faces_ok: frames where nothing is off a face and every face in view past its entry is counted
  (one entering, partly in view or partly hidden may be counted or not).
Modes as in :mod:`benchmarks.precision` (``before``: every detection swapped at once; ``after``:
the default tracker, search in the frame; ``worker``: the rolling search beside the frame).
Steadiness (``--steady`` frames of :func:`steady_scene` per size, the tracker as in ``after``):
per head (``still``, ``moving``) the paste's jump from one frame to the next relative to the head
(the five points the swap aligns with, in the head's own coordinates, in frame pixels; from frame
:data:`WARM` on): median, max, max where the head moved under 2 px; the moving head's lag in frames.
Prints the tables and writes ``precision_real.json`` to ``--json``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from benchmarks import write_report
from benchmarks.precision import SIZES, _run, _tri, match
from vcam.config import Config
from vcam.ops import make_ops
from vcam.runtime.roles import stage_params
from vcam.stages.demo import compose, face_box, placement, portrait, transform_box
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.detections import DetectParams, box_iou
from vcam.stages.track import Tracker, TrackParams

#: Frames a face entering the view is given before it counts for recall: the rolling search
#: finds a new face anywhere within ``[track] rolling`` (5) frames, beside the frame two frames
#: later (the worker's lag), and its track is confirmed at its next detection.
ENTRY = 8

#: Frames of the steadiness scene before its figures count: the tracks' first frames, where their
#: filter takes the head's position and speed from the detections themselves.
WARM = 10

#: The photographs used as objects (scikit-image's bundled ones, none with a human face).
OBJECTS = ("coins", "clock", "coffee", "chelsea", "moon", "rocket", "horse", "motorcycle", "retina", "hubble")


def _photo(name: str) -> np.ndarray:
    """One of scikit-image's bundled photographs as (H, W, 3) uint8 BGR."""
    from skimage import data

    img = {"motorcycle": lambda: data.stereo_motorcycle()[0], "hubble": data.hubble_deep_field}.get(
        name, getattr(data, name, None)
    )
    if img is None:
        raise ValueError(f"no photograph {name!r} in skimage.data")
    a = np.asarray(img())
    if a.dtype == bool:
        a = np.where(a, 235, 35).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    return np.ascontiguousarray(a[:, :, 2::-1])


def _wall(w: int, h: int) -> np.ndarray:
    """The background: a brick wall above a gravel table top, both real photos tiled and tinted."""
    from skimage import data

    brick = cv2.cvtColor(np.asarray(data.brick()), cv2.COLOR_GRAY2BGR).astype(np.float32)
    gravel = cv2.cvtColor(np.asarray(data.gravel()), cv2.COLOR_GRAY2BGR).astype(np.float32)
    s = max(1, w // 1920)
    brick = cv2.resize(brick, (brick.shape[1] * s, brick.shape[0] * s)) * np.float32([0.7, 0.85, 1.1])
    gravel = cv2.resize(gravel, (gravel.shape[1] * s, gravel.shape[0] * s)) * np.float32([0.6, 0.8, 0.95])
    out = np.tile(brick, (h // brick.shape[0] + 1, w // brick.shape[1] + 1, 1))[:h, :w]
    table = int(0.7 * h)
    out[table:] = np.tile(gravel, ((h - table) // gravel.shape[0] + 1, w // gravel.shape[1] + 1, 1))[: h - table, :w]
    return np.clip(out, 0, 255).astype(np.uint8)


def _lit(img: np.ndarray, gain: float) -> np.ndarray:
    return np.clip(img.astype(np.float32) * gain, 0, 255).astype(np.uint8)


def _objects(i: int, w: int, h: int, photos: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The objects of frame ``i``: (name, image lit, frame_from_image); each slides on its own path
    (some out of the frame and back), turns, scales and is lit by its own slow cycle."""
    s = w / 1920
    out = []
    for k, name in enumerate(OBJECTS):
        img = photos[name]
        ph = 0.37 * k
        side = s * (90 + 50 * (k % 5)) * (1 + 0.35 * math.sin(i / 23 + ph))  # 90-290 px at 1080p, +-35 %
        if name in ("coins", "clock", "retina", "coffee", "horse", "motorcycle", "chelsea"):
            side *= 1.6  # the larger pictures (their round things 20-150 px)
        row = 0.2 + 0.62 * ((k * 0.618) % 1)
        x = (-0.1 + 1.2 * _tri(i / (140 + 17 * k) + ph)) * w  # slides out of the frame and back
        y = (row + 0.05 * math.sin(i / 17 + k)) * h
        angle = 35 * math.sin(i / (29 + k) + ph)
        gain = 0.75 + 0.45 * (0.5 + 0.5 * math.sin(i / (11 + k) + 2 * ph))
        m = placement((img.shape[1] / 2, img.shape[0] / 2), (x, y), side / max(img.shape[:2]), angle)
        out.append((name, _lit(img, gain), m))
    return out


def _head(img: np.ndarray, det: RetinaFaceDetector) -> tuple[np.ndarray, np.ndarray]:
    """A portrait cut to the head and shoulders (so the objects stay in view): (crop, face box in it)."""
    b = face_box(img, det)
    fw, fh = b[2] - b[0], b[3] - b[1]
    x0, y0 = max(0, int(b[0] - 0.45 * fw)), max(0, int(b[1] - 0.55 * fh))
    x1, y1 = min(img.shape[1], int(b[2] + 0.45 * fw)), min(img.shape[0], int(b[3] + 0.7 * fh))
    return np.ascontiguousarray(img[y0:y1, x0:x1]), (b - np.array([x0, y0, x0, y0], np.float32)).astype(np.float32)


def _box_of(img: np.ndarray, m: np.ndarray) -> np.ndarray:
    return transform_box(np.array([0, 0, img.shape[1], img.shape[0]], np.float32), m)


def _cover(a: np.ndarray, b: np.ndarray) -> float:
    """The share of box ``a`` that box ``b`` covers."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return iw * ih / max((a[2] - a[0]) * (a[3] - a[1]), 1e-6)


class Scene:
    """The real-photo scene at one size, frame by frame: :meth:`frame` ``(i)`` is a pure function of
    ``i`` (fixed paths, the sensor noise drawn once), so frames can be made in any order, by any
    process, and come out the same."""

    def __init__(self, size: str) -> None:
        w, h = self.w, self.h = SIZES[size]
        self.wall = _wall(w, h)
        self.photos = {name: _photo(name) for name in OBJECTS}
        det = RetinaFaceDetector()
        grace, astro = _head(portrait("grace_hopper"), det), _head(portrait("astronaut"), det)
        mirrored = (np.ascontiguousarray(grace[0][:, ::-1]), grace[1].copy())
        mirrored[1][[0, 2]] = grace[0].shape[1] - grace[1][[2, 0]]
        astro_m = (np.ascontiguousarray(astro[0][:, ::-1]), astro[1].copy())
        astro_m[1][[0, 2]] = astro[0].shape[1] - astro[1][[2, 0]]
        self.heads = {"grace": grace, "astro": astro, "mirrored": mirrored, "astro_m": astro_m}  # (crop, face box)
        self.noise = np.random.default_rng(1).normal(0, 3.5, (h + 8, w + 8, 3)).astype(np.int16)  # the sensor's

    def frame(self, i: int) -> tuple[np.ndarray, list[np.ndarray], list[bool], list[tuple[str, np.ndarray]]]:
        """Frame ``i``: (frame, true face boxes, whether each is in view, objects' (name, box))."""
        w, h = self.w, self.h
        s = w / 1920
        objs = _objects(i, w, h, self.photos)
        # faces: the host (always there, lit and turning), a walker entering at the left edge and
        # leaving at the right every 200 frames, a small face there from frame 40 to 160 of each 240
        host = (0.5 * w + 60 * s * math.sin(i / 19), 0.4 * h)
        faces = [("astro", 180 * s, host, 12 * math.sin(i / 31), 0.8 + 0.3 * math.sin(i / 13))]
        walk = (i % 200) / 200
        faces.append(
            ("grace", 110 * s, ((-0.12 + 1.24 * walk) * w, 0.62 * h + 15 * s * math.sin(i / 7)), 8 * math.sin(i / 11), 1.0)
        )
        if 40 <= i % 240 < 160:
            faces.append(("mirrored", 52 * s, (0.78 * w, 0.25 * h + 20 * s * math.sin(i / 21)), 0.0, 0.9))
        # two more people standing still-ish: six in the scene, five here
        faces.append(("astro_m", 75 * s, (0.18 * w + 10 * s * math.sin(i / 9), 0.3 * h), -5.0, 0.7 + 0.2 * math.sin(i / 17)))
        faces.append(("grace", 130 * s, (0.86 * w, 0.58 * h + 8 * s * math.sin(i / 10)), 5 * math.sin(i / 25), 1.1))
        items, truth, tops = [], [], []
        for name, px, centre, angle, gain in faces:
            img, b = self.heads[name]
            m = placement(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2), centre, px / float(b[2] - b[0]), angle)
            items.append((_lit(img, gain), m))
            truth.append(transform_box(b, m))
            tops.append(_box_of(img, m))
        # the objects first, but the rocket and the coffee cup pass in front of everything
        front = [o for o in objs if o[0] in ("rocket", "coffee")]
        back = [o for o in objs if o[0] not in ("rocket", "coffee")]
        layers = [(img, m) for _, img, m in back] + items + [(img, m) for _, img, m in front]
        frame = compose((w, h), layers, background=self.wall)
        dy, dx = (i * 3) % 8, (i * 5) % 8
        frame = np.clip(frame + self.noise[dy : dy + h, dx : dx + w], 0, 255).astype(np.uint8)
        later_faces = [[tops[j] for j in range(k + 1, len(tops))] for k in range(len(tops))]
        fronts = [_box_of(img, m) for _, img, m in front]
        in_view = []
        for k, t in enumerate(truth):
            inside = _cover(t, np.array([0, 0, w, h], np.float32))
            hidden = max([_cover(t, b) for b in fronts + later_faces[k]], default=0.0)
            in_view.append(inside >= 0.8 and hidden <= 0.2)
        return frame, truth, in_view, [(name, _box_of(img, m)) for name, img, m in objs]


@functools.lru_cache(maxsize=2)
def _made(size: str) -> Scene:
    """A pool worker's scene at ``size``, made at its first frame."""
    return Scene(size)


def _frame_of(job: tuple[str, int]) -> tuple:
    size, i = job
    return _made(size).frame(i)


def scene(
    size: str, n: int, seed: int = 0, jobs: int = 1
) -> Iterator[tuple[np.ndarray, list[np.ndarray], list[bool], list[tuple[str, np.ndarray]]]]:
    """Frames of one scene (:meth:`Scene.frame` for ``0 .. n - 1``), made by ``jobs`` processes
    ahead of the reader, in order (the same frames as one process: a pure function of the index;
    a 4K frame takes ~0.2 s to compose, which a GPU's tracker does not hide)."""
    del seed  # the paths are fixed; the argument keeps precision.scene's signature
    if jobs <= 1:
        made = Scene(size)
        for i in range(n):
            yield made.frame(i)
        return
    import multiprocessing
    from collections import deque

    # At most two frames a process ahead of the reader: a 4K frame is 25 MB, and a reader slower than
    # the pool must not find the whole scene waiting in memory.
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        ahead: deque = deque()
        for i in range(n):
            ahead.append(pool.apply_async(_frame_of, ((size, i),)))
            if len(ahead) >= 2 * jobs:
                yield ahead.popleft().get()
        while ahead:
            yield ahead.popleft().get()


def steady_scene(size: str, n: int) -> Iterator[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]:
    """Frames for the steadiness figures: the same wall, objects sliding behind two heads, sensor
    noise; a still head (astronaut, 180 px at 1080p, never moves) and a moving one (Grace Hopper,
    130 px, swinging left and right up to 9 px a frame at 1080p, bobbing and turning). Yields
    (frame, true face boxes, ``frame_from_head`` (2, 3) of each head)."""
    w, h = SIZES[size]
    s = w / 1920
    wall = _wall(w, h)
    photos = {name: _photo(name) for name in OBJECTS}
    det = RetinaFaceDetector()
    heads = [_head(portrait("astronaut"), det), _head(portrait("grace_hopper"), det)]
    noise = np.random.default_rng(2).normal(0, 3.5, (h + 8, w + 8, 3)).astype(np.int16)
    for i in range(n):
        back = [(img, m) for name, img, m in _objects(i, w, h, photos) if name not in ("rocket", "coffee")]
        poses = [
            ((0.3 * w, 0.42 * h), 180 * s, 0.0),
            ((0.68 * w + 140 * s * math.sin(i / 15), 0.5 * h + 12 * s * math.sin(i / 9)), 130 * s, 6 * math.sin(i / 20)),
        ]
        items, truth, mats = [], [], []
        for (img, b), (centre, px, angle) in zip(heads, poses):
            m = placement(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2), centre, px / float(b[2] - b[0]), angle)
            items.append((img, m))
            truth.append(transform_box(b, m))
            mats.append(m)
        frame = compose((w, h), back + items, background=wall)
        dy, dx = (i * 3) % 8, (i * 5) % 8
        yield np.clip(frame + noise[dy : dy + h, dx : dx + w], 0, 255).astype(np.uint8), truth, mats


def _paste_points(landmarks: np.ndarray) -> np.ndarray:
    """Where the swap puts its face: the template's five points through the similarity the classic
    swap aligns ``landmarks`` with (frame pixels)."""
    from vcam.align import TEMPLATES, apply, estimate, invert

    return apply(invert(estimate(landmarks, "arcface_112_v2", 112)), TEMPLATES["arcface_112_v2"] * 112)


def _lag(paste: np.ndarray, true: np.ndarray) -> float:
    """Frames by which the paste's centres (T, 2) follow the true ones (T, 2): the shift (0.05
    steps, -2..4) that brings the true path closest to the paste's."""
    t = np.arange(len(true), dtype=np.float64)
    best = (math.inf, 0.0)
    for k in np.arange(-2.0, 4.0001, 0.05):
        ok = (t - k >= 0) & (t - k <= len(t) - 1)
        g = np.column_stack([np.interp(t[ok] - k, t, true[:, j]) for j in range(2)])
        best = min(best, (float(np.mean(np.linalg.norm(paste[ok] - g, axis=1))), float(k)))
    return best[1]


def steadiness(device: str = "cpu", size: str = "1080p", frames: int = 150) -> dict:
    """The steadiness figures on :func:`steady_scene` (the default tracker, search in the frame): per
    head, the paste's jump relative to the head from one frame to the next (mean over the five
    paste points of how far they moved in the head's own coordinates, in frame pixels), median and
    max, the max over frames where the head moved under 2 px, and the lag (frames) of the paste's
    centre behind the head's."""
    from vcam.align import apply, invert

    cfg = Config()
    ops = make_ops(device)
    det = RetinaFaceDetector(
        stage_params(DetectParams, cfg.detect), cfg.track.roi_size, ops=ops, device=ops.device, max_regions=16
    )
    tracker = Tracker(det, stage_params(TrackParams, cfg.track), cfg.pipeline.max_faces)
    rel: list[list] = [[], []]  # per head, per frame: paste points in head coordinates, or None
    mats: list[list] = [[], []]
    for i, (frame, truth, hm) in enumerate(steady_scene(size, frames)):
        tracks = tracker.update(ops.asarray(frame), i)
        for k, tb in enumerate(truth):
            iou = [float(box_iou(np.asarray(t.box, np.float64)[None], np.asarray(tb, np.float64)[None])[0, 0]) for t in tracks]
            best = int(np.argmax(iou)) if iou and max(iou) >= 0.3 else None
            pts = _paste_points(np.asarray(tracks[best].landmarks, np.float64)) if best is not None else None
            rel[k].append(None if pts is None else apply(invert(hm[k]), pts))
            mats[k].append(hm[k])
    return jitter(rel, mats)


def jitter(rel: list[list], mats: list[list]) -> dict:
    """The figures of :func:`steadiness` from each head's paste points in its own coordinates per
    frame (None: no track on it) and its ``frame_from_head`` per frame."""
    from vcam.align import apply

    out = {}
    for k, name in enumerate(("still", "moving")):
        jumps, moved, paste_c, true_c = [], [], [], []
        ref = np.median(np.array([r for r in rel[k] if r is not None]), axis=0)
        for i in range(WARM + 1, len(rel[k])):
            a, b, m0, m1 = rel[k][i - 1], rel[k][i], mats[k][i - 1], mats[k][i]
            if a is None or b is None:
                continue
            jumps.append(float(np.mean(np.linalg.norm((b - a) @ m1[:, :2].T, axis=1))))
            moved.append(float(np.max(np.linalg.norm(apply(m1, ref) - apply(m0, ref), axis=1))))
        for i, r in enumerate(rel[k]):
            if r is not None and i >= WARM:
                paste_c.append(apply(mats[k][i], r).mean(axis=0))
                true_c.append(apply(mats[k][i], ref).mean(axis=0))
        j, mv = np.array(jumps), np.array(moved)
        out[name] = {
            "frames": len(jumps),
            "median_px": float(np.median(j)),
            "max_px": float(j.max()),
            "max_px_head_under_2px": float(j[mv < 2].max()) if np.any(mv < 2) else 0.0,
            "head_median_px": float(np.median(mv)),
            "lag_frames": _lag(np.array(paste_c), np.array(true_c)) if name == "moving" else 0.0,
        }
    return out


def _blame(box: np.ndarray, objs: list[tuple[str, np.ndarray]], truth: list[np.ndarray]) -> str:
    """What a false track lies on: the object (or a face: "face part") covering most of its box."""
    best, name = 0.0, "wall"
    for label, b in [*objs, *(("face part", t) for t in truth)]:
        c = _cover(box, b)
        if c > best:
            best, name = c, label
    return name


def run(device: str, mode: str, size: str, frames: int, log: list | None = None, jobs: int = 1) -> dict:
    """One scene in one mode: the row of the table (see the module's docstring)."""
    seen: dict[int, int] = {}
    blamed: Counter[str] = Counter()
    state = {"false_frames": 0, "on_face": 0}

    def judge(i: int, boxes: list[np.ndarray], item: tuple) -> tuple[int, set[int], list[int], bool]:
        _, truth, in_view, objs = item
        _, people, unmatched = match(boxes, truth, with_unmatched=True)
        off = []  # tracks with less than half their box on any true face: pastes off every face
        for b in unmatched:
            if max((_cover(boxes[b], t) for t in truth), default=0.0) >= 0.5:
                state["on_face"] += 1  # a face's visible part (at the edge, behind someone): on a face
                continue
            off.append(b)
            blamed[_blame(boxes[b], objs, truth)] += 1
            if log is not None:
                log.append((i, _blame(boxes[b], objs, truth), boxes[b].round().tolist(), [t.round().tolist() for t in truth]))
        state["false_frames"] += bool(off)
        required = []
        for k, v in enumerate(in_view):
            if not v:
                seen.pop(k, None)
                continue
            if i - seen.setdefault(k, i) >= ENTRY:
                required.append(k)
        if log is not None:
            log.extend((i, "missed", k) for k in required if k not in people)
        # faces N right: nothing off a face, every face in view counted once its entry is over (a
        # face only partly in view, in its first ENTRY frames or behind someone, may be counted or not)
        ok = not off and all(k in people for k in required) and len(boxes) <= len(truth)
        return len(boxes) - len(off), people, required, ok

    t0 = time.perf_counter()
    row = _run(device, mode, size, frames, scenes=lambda size, n: scene(size, n, jobs=jobs), judge=judge)
    row["wall_s"] = time.perf_counter() - t0  # with the scene's making (track_ms_mean: the tracker's share)
    row["false_frames"] = state["false_frames"]
    row["partial_on_face"] = state["on_face"]
    row["on"] = dict(blamed.most_common())
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--frames", type=int, default=240, help="frames per scene")
    ap.add_argument("--sizes", default="1080p,4K")
    ap.add_argument("--modes", default=None, help="default: after,worker on the CPU, after on a GPU")
    ap.add_argument("--json", type=Path, default=None, help="folder for precision_real.json")
    ap.add_argument("--save", type=Path, default=None, help="folder: frames 0 and 100 of each scene as PNG")
    ap.add_argument("--steady", type=int, default=150, help="frames of the steadiness scene per size (0: none)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes composing the frames ahead (default: 1 on the CPU, whose tracker needs its cores; on a GPU "
        "half the host's cores, at most 8)",
    )
    a = ap.parse_args(argv)
    jobs = a.jobs if a.jobs is not None else (1 if a.device == "cpu" else max(1, min(8, (os.cpu_count() or 2) // 2)))
    modes = (a.modes or ("after,worker" if a.device == "cpu" else "after")).split(",")
    if a.device != "cpu" and "worker" in modes:  # assemble.search_worker: a GPU daemon searches in the frame
        ap.error("mode worker is the CPU's search beside the frame; on a GPU the daemon searches in the frame (mode after)")
    sizes = [s for s in a.sizes.split(",") if s]
    if a.save is not None:
        a.save.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            for i, (frame, *_) in enumerate(scene(size, 101)):
                if i in (0, 100):
                    cv2.imwrite(str(a.save / f"precision_real_{size}_{i}.png"), frame)
    rows = [run(a.device, mode, size, a.frames, jobs=jobs) for size in sizes for mode in modes]
    print(f"{'scene':6} {'mode':7} {'frames':>6} {'swapped':>8} {'false':>6} {'frames':>6} {'recall':>7} {'faces ok':>8}  on")
    for r in rows:
        on = ", ".join(f"{k} {v}" for k, v in r["on"].items())
        print(
            f"{r['size']:6} {r['mode']:7} {r['frames']:6d} {r['swapped']:8d} {r['false']:6d} {r['false_frames']:6d} "
            f"{r['recall']:7.3f} {r['faces_ok_pct']:7.1f}%  {on}"
        )
    steady = {size: steadiness(a.device, size, a.steady) for size in sizes} if a.steady > 0 else {}
    if steady:
        print(f"\n{'scene':6} {'head':7} {'frames':>6} {'head px':>7} {'median':>7} {'max':>6} {'max <2':>7} {'lag':>5}")
    for size, heads in steady.items():
        for name, f in heads.items():
            print(
                f"{size:6} {name:7} {f['frames']:6d} {f['head_median_px']:7.2f} {f['median_px']:7.2f} {f['max_px']:6.2f} "
                f"{f['max_px_head_under_2px']:7.2f} {f['lag_frames']:5.2f}"
            )
    payload = {"device": a.device, "machine": platform.node(), "rows": rows, "steadiness": steady}
    if a.json is not None:
        a.json.mkdir(parents=True, exist_ok=True)
        write_report(str(a.json / "precision_real.json"), payload)
    return payload


if __name__ == "__main__":
    main()
