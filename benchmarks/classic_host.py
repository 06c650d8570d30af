"""Host time of the classic swap's paste per 1080p face, as the GPU route spends it (issue 29, item 2:
the warp's host math set the pace of the H200 run), in this tree against an older one, alternated.

    python -m benchmarks.classic_host [OLD_TREE] [--rounds 3] [--frames 200] [--json classic_host.json]

What is timed: :meth:`vcam.stages.swap.ClassicSwapper.paste` on the NumPy ops with the work the GPU
route leaves to the device taken out (the render, and where a tree has it the warp grid's node
evaluation), so what remains is the host's: landmarks to the crop, control points, the spline's fit
(and, in a tree that evaluates the grid on the host, that evaluation), the launch parameters. Each
call gets landmarks moved by a fraction of a pixel (a live face's do; nothing may be cached
between frames). CPU seconds of the process (``time.process_time``, one BLAS thread), best and
median of 5 repeats per round; 5 points (the detector's) and 68 (a landmarker's).

OLD_TREE: an exported older checkout (``git archive <commit> | tar -x -C DIR``), run in a fresh
process with that tree first on the path, round by round before this one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, sys, time
import numpy as np
frames = int(sys.argv[1])
from vcam import align
from vcam.ops import make_ops
from vcam.stages import demo
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
import vcam.stages.swap as S
sys.path.insert(0, sys.argv[2])
from media import face68
det = RetinaFaceDetector()
frame = demo.DemoClip(1920, 1080, seed=1).frame(11)
lms = max(det.detect(frame), key=lambda d: d.area).landmarks.astype(np.float64)[None]
mats = align.estimate(lms[0], "arcface_128", 128)[None]
sw = S.ClassicSwapper(128, ops=make_ops("cpu"), dense=True)
face = face_from_image(demo.portrait("astronaut"), "astronaut", detector=det, swappers=[sw])
crops, mask = sw.swap(frame.copy(), mats, face)
S.classic.classic_paste = lambda ops, frame, *a: frame  # the render: the device's
if hasattr(S.classic, "tps_nodes"):
    S.classic.tps_nodes = lambda ops, splines, n, out: out  # the grid's nodes: the device's
rng = np.random.default_rng(0)
out = {}
for name, dense in (("5 points", None), ("68 points", face68(lms[0])[None])):
    moved = [lms + rng.normal(0, 0.3, lms.shape) for _ in range(50)]
    moved68 = None if dense is None else [dense + rng.normal(0, 0.3, dense.shape) for _ in range(50)]
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for i in range(frames):
            sw.paste(frame, crops, mats, mask, 1, sources=face, landmarks=moved[i % 50],
                     dense=None if moved68 is None else moved68[i % 50])
        runs.append((time.process_time() - t0) / frames * 1e3)
    out[name] = runs
print(json.dumps(out))
"""


def _measure(tree: Path, frames: int) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    tests = Path(__file__).resolve().parents[1] / "tests"  # the synthetic 68 points (tests/media.py)
    got = subprocess.run(
        [sys.executable, "-c", _CHILD, str(frames), str(tests)], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(got.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?", type=Path, default=None, help="an exported older tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--json", type=Path, default=Path("classic_host.json"))
    args = ap.parse_args(argv)
    new_tree = Path(__file__).resolve().parents[1]
    trees = ([("old", args.old.resolve())] if args.old else []) + [("new", new_tree)]
    rows: dict[str, dict[str, list[float]]] = {name: {} for name, _ in trees}
    for r in range(args.rounds):
        for name, tree in trees:
            for layout, runs in _measure(tree, args.frames).items():
                rows[name].setdefault(layout, []).extend(runs)
                print(f"round {r + 1} {name:<4} {layout:<10} best {min(runs):.3f} ms, median {statistics.median(runs):.3f} ms")
    print(f"\n{'tree':<5} {'layout':<10} {'best ms':>8} {'median ms':>10}")
    report: dict = {"frames": args.frames, "rounds": args.rounds, "old": str(args.old) if args.old else None, "rows": {}}
    for name, per in rows.items():
        for layout, runs in per.items():
            best, med = min(runs), statistics.median(runs)
            report["rows"][f"{name}/{layout}"] = {"best_ms": best, "median_ms": med}
            print(f"{name:<5} {layout:<10} {best:8.3f} {med:10.3f}")
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
