"""Swapping with predicted faces while the detection runs (``[track] predict``, issue 9 item 2):
what it saves in time and what it costs in accuracy.

    python -m benchmarks.predict [--device cuda] [--size 1080p] [--frames 150]
        [--swapper inswapper_128 --model-dir DIR] [--fp16] [--json bench_predict.json]

The demo clip (its face moves and turns) goes frame by frame through two pipelines built from
the same models, one waiting for each frame's detection (``predict = off``) and one swapping with
the tracks predicted from the frames before (``predict = on``). Each frame is submitted and
collected before the next, as a camera's frames come one at a time, so the time per frame is the
pipeline's latency.

Accuracy: for every face swapped, the box and the five landmarks it was swapped with against that
frame's own detection (raw, before smoothing): box IoU (mean, 5th percentile, min) and landmark
error in pixels (mean, max). With ``off`` the difference is the smoothing alone; with ``on`` it is
smoothing plus one frame of prediction. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import write_report
from benchmarks.streams import _Frames, _size
from vcam.config_file import build
from vcam.runtime.assemble import build as assemble
from vcam.runtime.assemble import load_faces
from vcam.stages.detections import box_iou
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat


def _run(asm: Any, pipe: Any, frames: _Frames, count: int, snap: Any, device: str) -> dict:
    swapped: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    detected: dict[int, dict[int, Any]] = {}
    times = []
    for i in range(count):
        img = frames.frame(i)
        frame = Frame(img, frames.width, frames.height, PixelFormat.BGR, time.perf_counter(), i)
        t0 = time.perf_counter()
        _, stats = pipe.process(frame, snap)
        times.append(time.perf_counter() - t0)
        swapped[i] = {t.id: (t.box.copy(), t.landmarks.copy()) for t in pipe.last_tracks if t.missed == 0}
        tracker = pipe.tracker
        if tracker.last_seq is not None:
            detected[tracker.last_seq] = dict(tracker.last_matched)
    seq = pipe.tracker.last_seq
    while not pipe.settle():  # the last frame's detection, still pending: applied once it has arrived
        time.sleep(0.0005)
    if pipe.tracker.last_seq != seq:
        detected[pipe.tracker.last_seq] = dict(pipe.tracker.last_matched)
    ious, errs = [], []
    for seq, faces in swapped.items():
        for tid, (box, lm) in faces.items():
            det = detected.get(seq, {}).get(tid)
            if det is None:
                continue
            ious.append(float(box_iou(box.reshape(1, 4), det.box.reshape(1, 4))[0, 0]))
            errs.append(float(np.linalg.norm(lm - det.landmarks, axis=1).mean()))
    ms = np.array(times[10:]) * 1e3  # the first frames pay for warm-ups
    iou = np.array(ious) if ious else np.zeros(1)
    err = np.array(errs) if errs else np.zeros(1)
    return {
        "frames": count,
        "predicted_frames": int(pipe.predicted),
        "faces_compared": len(ious),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "iou_mean": float(iou.mean()),
        "iou_p5": float(np.percentile(iou, 5)),
        "iou_min": float(iou.min()),
        "landmark_err_mean_px": float(err.mean()),
        "landmark_err_max_px": float(err.max()),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.predict", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--size", default="1080p", help="720p, 1080p, 4k or WxH")
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--swapper", default="classic")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--json", default="bench_predict.json")
    args = ap.parse_args(argv)
    w, h = _size(args.size)
    frames = _Frames(w, h, count=args.frames)
    rows = {}
    with tempfile.TemporaryDirectory() as faces_dir:
        data: dict[str, Any] = {
            "pipeline": {"device": args.device, "fp16": bool(args.fp16)},
            "swap": {"swapper": args.swapper},
            "faces": {"dir": faces_dir},
        }
        if args.model_dir:
            data["models"] = {"dir": args.model_dir}
        asm = assemble(build(data))
        state = RuntimeState()
        load_faces(asm, state, demo_input=True)
        snap = state.snapshot()
        for mode in ("off", "on"):
            pipe = asm.make_pipeline(PixelFormat.BGR, w, h, PixelFormat.BGR, predict=mode == "on")
            rows[mode] = _run(asm, pipe, frames, args.frames, snap, args.device)
    dev = args.device + (" fp16" if args.fp16 else "")
    print(f"{args.frames} frames of the {w}x{h} demo clip, {args.swapper} on {dev}, one frame at a time")
    head = ("predict", "p50 ms", "p99 ms", "predicted", "IoU mean", "IoU p5", "IoU min", "lm err px")
    print(" ".join(f"{h:>{w}s}" for h, w in zip(head, (8, 8, 8, 10, 9, 7, 8, 10))))
    for mode, r in rows.items():
        print(
            f"{mode:8s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['predicted_frames']:10d} {r['iou_mean']:9.3f} "
            f"{r['iou_p5']:7.3f} {r['iou_min']:8.3f} {r['landmark_err_mean_px']:5.2f}/{r['landmark_err_max_px']:4.1f}"
        )
    return write_report(args.json, {"device": dev, "size": [w, h], "swapper": args.swapper, "modes": rows})


if __name__ == "__main__":
    main()
