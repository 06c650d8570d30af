"""How much of the face the classic swap replaces, and with how much detail (issue 29, item 2).

    python -m benchmarks.classic_quality [OUT_DIR] [--device cpu|cuda] [--frames 8] [--size 1920x1080]
        [--predict off|on]

Runs the assembled pipeline (default config: the classic swap, box and face masks) on 1080p demo
clips with the old swap (the 128 px crop, ``dense=False``) and the new one (the source drawn at the
frame's resolution) in the same run, and prints per clip and swap:

- ``cover``: the share of the face ellipse (fitted to the jaw and brows of a 68-point layout placed
  by the face's detected 5 points, brows to chin) whose pixels change clearly (by more than 8 levels)
  in a run without the colour match (the same geometry; matched skin often lands within 8 levels of
  the target's own);
- ``ring``: the share of pixels changed at all in the ring 2 to 40 px outside the face outline (of
  the pipeline's tracked landmarks: the face the swap was told about);
- ``sharp``: variance of the Laplacian of the swapped face over the frame's own (inside the ellipse
  shrunk to 85%, off the blend's edge).

The clips are read every 7th frame (the face moves about 100 px between two), so each frame is
swapped with its own detection (``[track] predict = off``, the same route on both devices): with
prediction (``--predict on``, the CUDA default) a frame is swapped where the faces of the frames
before it predict its face, which on such jumps lags the face (less of the ellipse covered) and
measures the prediction, not the swap.

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


def measure(frames_in: list[np.ndarray], frames_out: list[np.ndarray], dets: list[np.ndarray]) -> dict:
    from vcam.stages import mask as vmask

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import face_ellipse

    cover, ring, sharp = [], [], []
    for src, out, (lm5, track) in zip(frames_in, frames_out, dets):
        lm68 = _face68(lm5)
        ell = face_ellipse(src.shape[:2], lm68)
        inner = face_ellipse(src.shape[:2], lm68, 0.85)
        diff = np.abs(out.astype(np.int16) - src).max(axis=2)
        cover.append(float((diff > 8)[ell].mean()))
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
    det = RetinaFaceDetector()
    ins, outs, lms = [], [], []
    for i in range(frames):
        f = clip.frame(i * 7)
        out, stats = pipe.process(Frame(f, w, h, PixelFormat.BGR, 0.0, i), state.snapshot())
        d = max(det.detect(f), key=lambda d: d.area)
        ins.append(f)
        outs.append(np.array(out, copy=True))
        track = max(pipe.last_tracks, key=lambda t: float(t.box[2] - t.box[0])).landmarks
        lms.append((d.landmarks.astype(np.float64), np.asarray(track, np.float64)))
    return ins, outs, lms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="bench_out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--predict", default="off", choices=["off", "on"], help="[track] predict (see above)")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    print(f"{'clip':<24} {'swap':<5} {'cover':>6} {'min':>6} {'ring':>7} {'sharp':>6}")
    for name, (face, source) in CLIPS.items():
        shots = []
        for dense in (False, True):
            ins, outs, lms = run_clip(face, source, dense, args.device, args.frames, size, predict=args.predict)
            m = measure(ins, outs, lms)
            # the area replaced, without the colour match (which makes swapped skin close to the target's)
            raw = measure(*run_clip(face, source, dense, args.device, args.frames, size, False, args.predict))
            m["cover"], m["cover_min"] = raw["cover"], raw["cover_min"]
            report[f"{name}/{'new' if dense else 'old'}"] = m
            tag = "new" if dense else "old"
            print(f"{name:<24} {tag:<5} {m['cover']:6.3f} {m['cover_min']:6.3f} {m['ring']:7.4f} {m['sharp']:6.2f}")
            lm0 = lms[0][0]
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
        json.dumps({"device": args.device, "size": args.size, "predict": args.predict, **report}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
