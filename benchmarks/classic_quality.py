"""How much of the face the classic swap replaces, and with how much detail (issue 29, item 2).

    python -m benchmarks.classic_quality [OUT_DIR] [--device cpu|cuda] [--frames 8] [--size 1920x1080]
        [--predict off|on] [--feed all|stride]

Runs the assembled pipeline (default config: the classic swap, box and face masks) on 1080p demo
clips with the old swap (the 128 px crop, ``dense=False``) and the new one (the source drawn at the
frame's resolution) in the same run, and prints per clip and swap:

- ``cover``: the share of the face ellipse (fitted to the jaw and brows of a 68-point layout placed
  by the face's 5 points, brows to chin) whose pixels change clearly (by more than 8 levels) in a run
  without the colour match (the same geometry; matched skin often lands within 8 levels of the
  target's own). The 5 points are the reference detector's in a square region of 1.6 times the
  face's box at 480 px (the face at about 300 px in the detector's input); ``full``: the same share
  for the 5 points of a full-frame detection (1920 px read at 640: the figure of before, whose mouth
  corners sit up to 10 px below the astronaut's mouth, so its ellipse reaches onto her neck);
- ``ring``: the share of pixels changed at all in the ring 2 to 40 px outside the face outline (of
  the pipeline's tracked landmarks: the face the swap was told about);
- ``sharp``: variance of the Laplacian of the swapped face over the frame's own (inside the ellipse
  shrunk to 85%, off the blend's edge).

Every 7th frame of a clip is measured (the face moves about 100 px between two); with ``--feed
all`` (the default) the frames between go through the pipeline too, as a camera's would (the
tracker's smoothing sees the face move 14 px a frame), with ``--feed stride`` only the measured
ones (the figures before issue 29's cover work: the smoothing then lags 100 px jumps made in a
thirtieth of a second). Each frame is swapped with its own detection (``[track] predict = off``,
the same route on both devices): with prediction (``--predict on``, the CUDA default) a frame is
swapped where the faces of the frames before it predict its face.

Writes ``classic_quality.json`` and side-by-side crops (input | old | new) ``classic_<clip>.png`` to
OUT_DIR (default ``bench_out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

CLIPS = {  # name: (moving face of the clip, source photo)
    "hopper_gets_astronaut": ("grace_hopper", "astronaut"),
    "astronaut_gets_hopper": ("astronaut", "grace_hopper"),
    "hopper_gets_hopper": ("grace_hopper", "grace_hopper"),
}


def _face68(lm5: np.ndarray) -> np.ndarray:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import face68

    return face68(lm5)


def _lap(img: np.ndarray, region: np.ndarray) -> float:
    g = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.float64)
    return float(cv2.Laplacian(g, cv2.CV_64F)[region].var())


def reference(detector: object, fine: object, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(5 points of the largest face in a full-frame detection, 5 points of the same face detected
    again in a square region of 1.6 times its box read at ``fine``'s region size)."""
    d = max(detector.detect(frame), key=lambda d: d.area)  # type: ignore[attr-defined]
    b = np.asarray(d.box, np.float64)
    side = 1.6 * float(max(b[2] - b[0], b[3] - b[1]))
    cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
    found = fine.detect_regions(frame, np.array([[cx - side / 2, cy - side / 2, side]]))[0]  # type: ignore[attr-defined]
    close = max(found, key=lambda d: d.area) if found else d
    return d.landmarks.astype(np.float64), close.landmarks.astype(np.float64)


def covered(src: np.ndarray, out: np.ndarray, lm5: np.ndarray) -> np.ndarray:
    """(H, W) uint8: 0 outside the face ellipse of ``lm5``, 1 where it is unchanged, 2 where it changed
    by more than 8 levels."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import face_ellipse

    ell = face_ellipse(src.shape[:2], _face68(lm5))
    diff = np.abs(out.astype(np.int16) - src).max(axis=2)
    return ell.astype(np.uint8) * (1 + (diff > 8))


def measure(frames_in: list[np.ndarray], frames_out: list[np.ndarray], dets: list) -> dict:
    from vcam.stages import mask as vmask

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import face_ellipse

    cover, full, ring, sharp = [], [], [], []
    for src, out, (coarse, lm5, track) in zip(frames_in, frames_out, dets):
        lm68 = _face68(lm5)
        inner = face_ellipse(src.shape[:2], lm68, 0.85)
        diff = np.abs(out.astype(np.int16) - src).max(axis=2)
        c = covered(src, out, lm5)
        cover.append(float((c == 2).sum() / max((c > 0).sum(), 1)))
        c = covered(src, out, coarse)
        full.append(float((c == 2).sum() / max((c > 0).sum(), 1)))
        poly = np.zeros(src.shape[:2], np.uint8)
        cv2.fillConvexPoly(poly, np.round(vmask.face_polygon(track)).astype(np.int32), 1)  # the pipeline's face
        near = cv2.dilate(poly, np.ones((5, 5), np.uint8)).astype(bool)
        far = cv2.dilate(poly, np.ones((81, 81), np.uint8)).astype(bool)
        band = far & ~near
        ring.append(float((diff > 0)[band].mean()))

        sharp.append(_lap(out, inner) / max(_lap(src, inner), 1e-9))
    return {
        "cover": float(np.mean(cover)),
        "cover_min": float(np.min(cover)),
        "cover_full": float(np.mean(full)),
        "ring": float(np.max(ring)),
        "sharp": float(np.mean(sharp)),
    }


def run_clip(
    face: str,
    source: str,
    dense: bool,
    device: str,
    frames: int,
    size: tuple[int, int],
    color_match: bool = True,
    predict: str = "off",
    feed: str = "all",
) -> tuple[list, list, list]:
    from vcam.config import Config
    from vcam.config_file import build
    from vcam.runtime import assemble
    from vcam.stages import demo
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.faces import face_from_image
    from vcam.stages.swap import ClassicSwapper
    from vcam.state import RuntimeState
    from vcam.types import Frame, PixelFormat

    given = build({"pipeline": {"device": device}, "track": {"predict": predict}})
    cfg = Config().replace(pipeline=given.pipeline, track=given.track)
    asm = assemble.build(cfg)
    old = asm.swapper
    asm.swapper = ClassicSwapper(old.crop_size, color_match, ops=old.ops, mask=old.mask, max_faces=old.max_faces, dense=dense)
    state = RuntimeState()
    state.add_face(
        face_from_image(demo.portrait(source), source, detector=asm.photo_detector, swappers=[asm.swapper]), activate=True
    )
    clip = demo.DemoClip(size[0], size[1], seconds=2.0, face=face, seed=1)
    w, h = size
    pipe = asm.make_pipeline(PixelFormat.BGR, w, h, PixelFormat.BGR)
    det, fine = RetinaFaceDetector(), RetinaFaceDetector(roi_size=480)
    ins, outs, lms = [], [], []
    for i in range(frames):
        for j in range(max(i * 7 - 6, 0), i * 7 + 1) if feed == "all" else [i * 7]:
            f = clip.frame(j)
            out, stats = pipe.process(Frame(f, w, h, PixelFormat.BGR, 0.0, j if feed == "all" else i), state.snapshot())
        ins.append(f)
        outs.append(np.array(out, copy=True))
        track = max(pipe.last_tracks, key=lambda t: float(t.box[2] - t.box[0])).landmarks
        lms.append((*reference(det, fine, f), np.asarray(track, np.float64)))
    return ins, outs, lms


def cover_map(path: Path, frames_in: list, frames_out: list, dets: list) -> None:
    """The face ellipses of the frames, side by side (at most 4): changed by more than 8 levels green,
    unchanged red, the pipeline's face outline white, the reference's yellow."""
    from vcam.stages import mask as vmask

    tiles = []
    for src, out, (_, lm5, track) in list(zip(frames_in, frames_out, dets))[:4]:
        c = covered(src, out, lm5)
        vis = (src * 0.5).astype(np.uint8)
        vis[c == 2] = (vis[c == 2] * 0.5 + (0, 127, 0)).astype(np.uint8)
        vis[c == 1] = (0, 0, 255)
        for pts, colour in ((track, (255, 255, 255)), (lm5, (0, 255, 255))):
            cv2.polylines(vis, [np.round(vmask.face_polygon(pts)).astype(np.int32)], True, colour, 1)
        ys, xs = np.nonzero(c)
        t = vis[max(ys.min() - 40, 0) : ys.max() + 40, max(xs.min() - 40, 0) : xs.max() + 40]
        t = cv2.resize(t, (360, int(round(360 * t.shape[0] / t.shape[1]))))
        share = float((c == 2).sum() / max((c > 0).sum(), 1))
        cv2.putText(t, f"{share:.3f}", (6, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (255, 255, 255), 2)
        tiles.append(t)
    h = max(t.shape[0] for t in tiles)
    tiles = [cv2.copyMakeBorder(t, 0, h - t.shape[0], 0, 4, cv2.BORDER_CONSTANT) for t in tiles]
    cv2.imwrite(str(path), np.concatenate(tiles, 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="bench_out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--predict", default="off", choices=["off", "on"], help="[track] predict (see above)")
    ap.add_argument("--feed", default="all", choices=["all", "stride"], help="frames through the pipeline (see above)")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    print(f"{'clip':<24} {'swap':<5} {'cover':>6} {'min':>6} {'full':>6} {'ring':>7} {'sharp':>6}")
    for name, (face, source) in CLIPS.items():
        shots = []
        for dense in (False, True):
            ins, outs, lms = run_clip(face, source, dense, args.device, args.frames, size, predict=args.predict, feed=args.feed)
            m = measure(ins, outs, lms)
            # the area replaced, without the colour match (which makes swapped skin close to the target's)
            plain = run_clip(face, source, dense, args.device, args.frames, size, False, args.predict, args.feed)
            raw = measure(*plain)
            m["cover"], m["cover_min"], m["cover_full"] = raw["cover"], raw["cover_min"], raw["cover_full"]
            report[f"{name}/{'new' if dense else 'old'}"] = m
            tag = "new" if dense else "old"
            cells = f"{m['cover']:6.3f} {m['cover_min']:6.3f} {m['cover_full']:6.3f} {m['ring']:7.4f} {m['sharp']:6.2f}"
            print(f"{name:<24} {tag:<5} {cells}")
            if dense:
                cover_map(out_dir / f"cover_{name}.png", *plain)
            lm0 = lms[0][1]
            x = np.concatenate([lm0[:, 0].min(keepdims=True), lm0[:, 0].max(keepdims=True)])
            y = np.concatenate([lm0[:, 1].min(keepdims=True), lm0[:, 1].max(keepdims=True)])
            e = float(x[1] - x[0])
            x0, x1 = int(max(0, x[0] - 1.3 * e)), int(x[1] + 1.3 * e)
            y0, y1 = int(max(0, y[0] - 1.5 * e)), int(y[1] + 1.4 * e)
            if not shots:
                shots.append(ins[0][y0:y1, x0:x1])
            shots.append(outs[0][y0:y1, x0:x1])
        cv2.imwrite(str(out_dir / f"classic_{name}.png"), np.concatenate(shots, axis=1))
    (out_dir / "classic_quality.json").write_text(
        json.dumps({"device": args.device, "size": args.size, "predict": args.predict, "feed": args.feed, **report}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
