"""The classic swap of one 1080p face on the GPU: the old swap (128 px crop, pasted) against the new
(the source drawn at the frame's resolution), in the same run (issue 29, item 2: < 1 ms on the H200).

    python -m benchmarks.classic_gpu [OUT_DIR] [--frames 300] [--size 1920x1080] [--faces 1]

Per swap: the swap, the default masks (box, face) and the paste/render of ``--faces`` faces on a
device-resident frame, timed with CUDA events on the ops' stream (device ms: p50, p99) and on the
host (the wall time to queue it all, including the warp grid's host math). Also checks the CUDA
frame against the NumPy reference (max difference in levels, share of values off by more than 1).
Prints a table and writes ``classic_gpu.json`` to OUT_DIR (default ``bench_out``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def _setup(size: tuple[int, int], faces: int):
    from vcam import align
    from vcam.stages import demo
    from vcam.stages.detect import RetinaFaceDetector

    det = RetinaFaceDetector()
    w, h = size
    if faces == 1:
        frame = demo.DemoClip(w, h, seed=1).frame(11)
    else:
        frame = demo.group_frame(w, h, faces, 3, 60)
    dets = sorted(det.detect(frame), key=lambda d: float(d.box[0]))[:faces]
    lms = np.stack([d.landmarks for d in dets]).astype(np.float64)
    mats = np.stack([align.estimate(lm, "arcface_128", 128) for lm in lms])
    boxes = np.stack([d.box for d in dets])
    source = demo.portrait("astronaut")
    return det, frame, lms, mats, boxes, source


def _run(ops, dense: bool, frame, lms, mats, boxes, source, det, frames: int):
    from vcam.stages.faces import face_from_image
    from vcam.stages.mask import create_masker
    from vcam.stages.swap import ClassicSwapper, paste_faces

    n = mats.shape[0]
    sw = ClassicSwapper(128, ops=ops, dense=dense, max_faces=max(8, n))
    masker = create_masker(["box", "face"], 128, ops=ops, max_faces=max(8, n), feather=0.06)
    face = face_from_image(source, "astronaut", detector=det, swappers=[sw])
    # Copies: on the CPU ``asarray`` returns the array itself, and the paste writes in place (the
    # reference frame must be the input frame swapped once, and the caller's frame stay as it is).
    dev = ops.asarray(frame.copy())
    work = ops.asarray(frame.copy())

    def once():
        ops.xp.copyto(work, dev)
        crops, mask = sw.swap(work, mats, face)
        mask = masker.masks(work, mats, lms, boxes, n, mask)
        paste_faces(ops, sw, work, crops, mats, mask, n, face, lms)

    dev_ms, host_ms = [], []
    if ops.device == "cuda":
        import cupy

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with ops.activate():
            for i in range(frames + 20):
                t0 = time.perf_counter()
                start.record(ops.stream)
                once()
                end.record(ops.stream)
                t1 = time.perf_counter()
                end.synchronize()
                if i >= 20:
                    dev_ms.append(cupy.cuda.get_elapsed_time(start, end))
                    host_ms.append((t1 - t0) * 1e3)
    else:
        for i in range(frames + 2):
            t0 = time.perf_counter()
            once()
            if i >= 2:
                host_ms.append((time.perf_counter() - t0) * 1e3)
        dev_ms = host_ms
    return ops.to_host(work), dev_ms, host_ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="bench_out")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--faces", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    from vcam.ops import make_ops

    size = tuple(int(v) for v in args.size.lower().split("x"))
    det, frame, lms, mats, boxes, source = _setup(size, args.faces)
    ops = make_ops(args.device)
    cpu = make_ops("cpu")
    report: dict = {"device": args.device, "size": args.size, "faces": args.faces, "frames": args.frames}
    print(f"classic swap, {args.size}, {args.faces} face(s), {args.frames} frames on {args.device}")
    print(f"{'swap':<5} {'dev p50 ms':>10} {'dev p99 ms':>10} {'host p50 ms':>11} {'vs NumPy max':>12} {'>1 level':>9}")
    for dense in (False, True):
        got, dev_ms, host_ms = _run(ops, dense, frame, lms, mats, boxes, source, det, args.frames)
        ref, _, _ = _run(cpu, dense, frame, lms, mats, boxes, source, det, 1)
        d = np.abs(np.asarray(got).astype(np.int16) - ref)
        row = {
            "device_p50_ms": float(np.percentile(dev_ms, 50)),
            "device_p99_ms": float(np.percentile(dev_ms, 99)),
            "host_p50_ms": float(np.percentile(host_ms, 50)),
            "max_diff_vs_numpy": int(d.max()),
            "share_over_1": float((d > 1).mean()),
        }
        name = "new" if dense else "old"
        report[name] = row
        print(
            f"{name:<5} {row['device_p50_ms']:10.3f} {row['device_p99_ms']:10.3f} {row['host_p50_ms']:11.3f}"
            f" {row['max_diff_vs_numpy']:12d} {row['share_over_1']:9.5f}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "classic_gpu.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'classic_gpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
