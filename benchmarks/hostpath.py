"""The frame thread's host CPU time in front of the swap, the daemon's path against the patient one
(issue 28 item (b)), on the CPU: the real detector and tracker on NumPy ops (the host logic of
tracking is the one the GPU path runs), a clip of N faces, each detection arriving one frame late
as it does on the GPU when the next frame comes before it (the detector on the device's back
stream), and, with ``--miss-every K``, one face hidden for one frame every K frames (a face the
detector misses once: the patient path makes the next frame wait for a region call and a full
scan). Alternates the two paths ``--rounds`` times; prints a table and writes JSON.

    python -m benchmarks.hostpath [--faces 6] [--size 1080p] [--frames 60] [--miss-every 10]
        [--rounds 2] [--no-band] [--json OUT.json]

Per frame: ``begin CPU`` (thread CPU of :meth:`Pipeline.begin`: everything before the swap, where
the patient path decodes and matches the detection before it, or waits a scan), ``frame CPU`` (the
whole frame: begin, swap, finish, collect, ``launch_detection`` after the publish; on the CPU the
detector's inference runs in it too), and the frames that waited for their own detection.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import write_report
from benchmarks.streams import _size
from vcam.config import Config
from vcam.pipeline.pipeline import Pipeline
from vcam.stages.demo import gradient, group_frame, portrait
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.stages.swap import ClassicSwapper
from vcam.stages.track import Tracker
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat


class _Late:
    """A tracker step that has not arrived until the harness says so."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.arrived = inner, False

    def ready(self) -> bool:
        return self.arrived and self.inner.ready()


class LateTracker:
    """The real tracker whose deferred detections arrive only once the next frame has begun."""

    def __init__(self, inner: Tracker) -> None:
        self.inner, self.steps = inner, []  # type: ignore[var-annotated]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, frame: Any, seq: int, t: float | None = None, *, deferred: bool = False) -> _Late:
        step = _Late(self.inner.launch(frame, seq, t, deferred=deferred))
        self.steps.append(step)
        return step

    def complete(self, step: _Late) -> Any:
        return self.inner.complete(step.inner)

    def arrive(self) -> None:
        for s in self.steps:
            s.arrived = True
        self.steps.clear()


def clip(width: int, height: int, faces: int, frames: int, miss_every: int) -> list[Frame]:
    """``frames`` frames of ``faces`` portraits; every ``miss_every``-th one with the first face
    hidden under the background."""
    bg = gradient(width, height)
    cols = int(math.ceil(math.sqrt(faces)))
    rows = int(math.ceil(faces / cols))
    out = []
    for i in range(frames):
        img = group_frame(width, height, faces, i, frames, background=bg)
        if miss_every and i % miss_every == miss_every - 1:
            img = img.copy()
            h, w = height // rows, width // cols
            img[:h, :w] = bg[:h, :w]
        out.append(Frame(img, width, height, PixelFormat.BGR, 0.0, i))
    return out


def run(frames: list[Frame], detector: Any, snap: Any, patient: bool, band: bool = True) -> dict[str, Any]:
    cfg = Config()
    tracker = LateTracker(Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces))
    swapper = ClassicSwapper(ops=detector.ops)
    pipe = Pipeline(ops=detector.ops, tracker=tracker, swapper=swapper, max_faces=8, predict=True, patient=patient, band=band)  # type: ignore[arg-type]
    begin, whole, swapped = [], [], 0
    for f in frames:
        c0 = time.thread_time()
        work = pipe.begin(f, snap)
        c1 = time.thread_time()
        tracker.arrive()  # the detection before this frame lands while it is swapped
        crops, mask = pipe.swapper.swap_batch([(work.img, work.mats)], work.sources) if work.n else (None, None)
        _, stats = pipe.collect(pipe.finish(work, crops, mask, detect_now=False))
        pipe.launch_detection()
        whole.append(time.thread_time() - c0)
        begin.append(c1 - c0)
        swapped += stats.swapped
    b, w = np.array(begin[5:]) * 1e3, np.array(whole[5:]) * 1e3
    return {
        "begin_cpu_p50_ms": float(np.median(b)),
        "begin_cpu_p99_ms": float(np.percentile(b, 99)),
        "begin_cpu_mean_ms": float(b.mean()),
        "frame_cpu_p50_ms": float(np.median(w)),
        "frame_cpu_p99_ms": float(np.percentile(w, 99)),
        "frames_waited": len(frames) - pipe.predicted,
        "full_scans": tracker.inner.full_scans,
        "faces_swapped": swapped,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--faces", type=int, default=6)
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--miss-every", type=int, default=10, help="hide one face on every K-th frame (0: never)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-band", action="store_true", help="predicted frames move whole (on the CPU, two bands cost more)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    w, h = _size(args.size)
    detector = RetinaFaceDetector(Config().detect, roi_size=Config().track.roi_size)
    face = face_from_image(portrait("astronaut"), "astronaut", swappers=[ClassicSwapper()], detector=detector)
    st = RuntimeState()
    st.add_face(face, activate=True)
    snap = st.snapshot()
    frames = clip(w, h, args.faces, args.frames, args.miss_every)
    rows: dict[str, list[dict[str, Any]]] = {"patient": [], "daemon": []}
    for _ in range(args.rounds):
        for mode in rows:
            rows[mode].append(run(frames, detector, snap, patient=mode == "patient", band=not args.no_band))
    print(f"{args.faces} faces, {w}x{h}, {args.frames} frames, a face hidden every {args.miss_every} frames, bands", end=" ")
    print(f"{'off' if args.no_band else 'on'}; CPU ms (median of rounds):")
    heads = ("begin p50", "begin p99", "begin mean", "frame p50", "frame p99", "waited", "scans", "swapped")
    print(f"{'path':<9}" + "".join(f"{h:>11}" for h in heads))
    summary: dict[str, dict[str, float]] = {}
    for mode, runs in rows.items():
        med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        summary[mode] = med
        print(
            f"{mode:<9}{med['begin_cpu_p50_ms']:>11.3f}{med['begin_cpu_p99_ms']:>11.3f}{med['begin_cpu_mean_ms']:>11.3f}"
            f"{med['frame_cpu_p50_ms']:>11.2f}{med['frame_cpu_p99_ms']:>11.2f}{med['frames_waited']:>11.0f}{med['full_scans']:>11.0f}"
            f"{med['faces_swapped']:>11.0f}"
        )
    ratios = {
        k: summary["daemon"][k] / summary["patient"][k] if summary["patient"][k] else float("nan")
        for k in ("begin_cpu_p50_ms", "begin_cpu_p99_ms", "begin_cpu_mean_ms", "frame_cpu_p50_ms", "frame_cpu_p99_ms")
    }
    print("daemon / patient: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    if args.json:
        write_report(args.json, {"args": vars(args), "runs": rows, "median": summary, "ratios": ratios})


if __name__ == "__main__":
    main()
