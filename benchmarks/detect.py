"""Finding small and new faces, and what it costs (issue 11).

    python -m benchmarks.detect [--device cpu|cuda] [--frames 90] [--json bench_detect.json]

A 1080p scene made from the bundled portrait: a 120 px face that stays, and a 45 px face that drifts
in from frame 15. The whole pipeline runs (detect/track, align, a solid-colour swap, paste-back), so
"swapped" is read off the output. Per mode the table shows how many frames had the small face
swapped after it appeared, how many frames the new face waited, and the time per frame (mean and
p99 of the whole pipeline, and of the track stage). Modes:

- ``before``: the coarse full scan only (``small_face`` off) and no rolling search, as before;
- ``tiles``: full scans add the small-face tiles, no rolling search;
- ``tiles + rolling`` (the default config);
- ``naive``: the baseline a user would try, ``[detect] size = 1920`` with a full scan every frame.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace

import numpy as np

from benchmarks import write_report
from vcam.config import Config, DetectConfig, TrackConfig
from vcam.ops import make_ops
from vcam.pipeline.pipeline import Pipeline
from vcam.runtime.roles import stage_params
from vcam.stages.demo import face_box, faces_scene, gradient, portrait
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.detections import DetectParams
from vcam.stages.swap import SolidSwapper
from vcam.stages.track import Tracker, TrackParams
from vcam.state import Snapshot
from vcam.types import Frame, PixelFormat, SourceFace

W, H = 1920, 1080
APPEARS = 15
MAGENTA = np.array([255, 0, 255])


def _scenes(frames: int):
    img = portrait("grace_hopper")
    fb = face_box(img, RetinaFaceDetector())
    bg = gradient(W, H)
    for i in range(frames):
        faces = [(120.0, (500 + 2 * i, 540))]
        if i >= APPEARS:
            faces.append((45.0, (1300 + 4 * (i - APPEARS), 300 + 40 * np.sin(i / 5))))
        frame, boxes = faces_scene((W, H), img, fb, faces, bg)
        yield frame, [(int((b[0] + b[2]) / 2), int((b[1] + b[3]) / 2)) for b in boxes]


def _run(device: str, detect: DetectConfig, track: TrackConfig, frames: int) -> dict:
    ops = make_ops(device)
    params = stage_params(DetectParams, detect)
    det = RetinaFaceDetector(params, track.roi_size, ops=ops, device=ops.device, max_regions=16)
    det.warmup(H, W)
    pipe = Pipeline(
        ops=ops,
        tracker=Tracker(det, stage_params(TrackParams, track), 8),
        swapper=SolidSwapper(ops=ops),
        out_fmt=PixelFormat.BGR,
        timing=True,
    )
    snap = Snapshot(face=SourceFace(name="x", image=np.zeros((128, 128, 3), np.uint8)), swap_enabled=True, version=0)
    small_hits, wall, track_ms, scans = [], [], [], 0
    for i, (frame, centres) in enumerate(_scenes(frames)):
        t0 = time.perf_counter()
        out, stats = pipe.process(Frame(frame, W, H, PixelFormat.BGR, t0, i), snap)
        wall.append((time.perf_counter() - t0) * 1e3)
        track_ms.append(stats.stages.get("detect_track", 0.0) * 1e3)
        scans += bool(stats.full_scan)
        if i >= APPEARS:
            cx, cy = centres[1]
            small_hits.append(bool((out[cy, cx] == MAGENTA).all()))
    first = next((k for k, hit in enumerate(small_hits) if hit), None)
    steady = wall[5:]  # the first frames build kernels and caches
    return {
        "small_face_swapped_pct": 100.0 * float(np.mean(small_hits)),
        "new_face_wait_frames": first,
        "frame_ms_mean": float(np.mean(steady)),
        "frame_ms_p99": float(np.percentile(steady, 99)),
        "track_ms_mean": float(np.mean(track_ms[5:])),
        "track_ms_p99": float(np.percentile(track_ms[5:], 99)),
        "full_scan_pct": 100.0 * scans / frames,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--json", default="bench_detect.json")
    args = ap.parse_args(argv)
    cfg = Config()
    off = replace(cfg.detect, small_face=100_000)  # no tiles: the coarse scan alone
    modes = {
        "before: coarse scan, no rolling": (off, replace(cfg.track, rolling=0)),
        "tiles, no rolling": (cfg.detect, replace(cfg.track, rolling=0)),
        "tiles + rolling (default)": (cfg.detect, cfg.track),
        "naive: size 1920, full scan every frame": (
            replace(off, size=1920),
            replace(cfg.track, rescan_every=1, rolling=0),
        ),
    }
    results = {name: _run(args.device, d, t, args.frames) for name, (d, t) in modes.items()}

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"vcam detection benchmark, {W}x{H}, {args.frames} frames, a 45 px face enters at frame {APPEARS}, "
        f"{args.device} ({platform.processor() or platform.machine()})"
    )
    cols = (
        "mode",
        "small face swapped %",
        "new face wait (frames)",
        "frame ms mean",
        "frame ms p99",
        "detect+track ms mean",
        "detect+track ms p99",
        "full scans %",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name, r in results.items():
        wait = "never" if r["new_face_wait_frames"] is None else str(r["new_face_wait_frames"])
        table.add_row(
            name,
            f"{r['small_face_swapped_pct']:.0f}",
            wait,
            f"{r['frame_ms_mean']:.1f}",
            f"{r['frame_ms_p99']:.1f}",
            f"{r['track_ms_mean']:.1f}",
            f"{r['track_ms_p99']:.1f}",
            f"{r['full_scan_pct']:.0f}",
        )
    con = Console(width=200)
    con.print(table)
    payload = write_report(args.json, {"size": [W, H], "frames": args.frames, "device": args.device, "results": results})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
