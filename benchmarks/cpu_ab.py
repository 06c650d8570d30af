"""The CPU demo's flat-out rate of two trees, alternated in one run (a busy machine slows both alike).

    python -m benchmarks.cpu_ab OLD_TREE [--rounds 3] [--frames 300] [--size 1280x720] [--json cpu_ab.json]
                                [--search auto|worker|frame]

OLD_TREE: an exported older checkout (``git archive <commit> | tar -x -C DIR``); the new tree is this
one. Each round runs ``benchmarks.demo``'s flat-out mode (the daemon on the 720p demo clip, classic
swap, publishing to null) once per tree, in a fresh process, old first in even rounds and new
first in odd ones (ABBA). Prints fps per round and the
median new/old ratio; writes the numbers as JSON. The share of frames with a full scan tells where the
rolling search ran (``[track] search``: a worker beside the frame leaves only the first frame's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, sys
from dataclasses import replace
from vcam.config import Config
from benchmarks.demo import _run
w, h, frames = (int(v) for v in sys.argv[1:4])
search = sys.argv[4] if len(sys.argv) > 4 else ""
base = Config()
cfg = base.replace(
    capture=replace(base.capture, input="demo", width=w, height=h, fps=30.0, loop=True, pacing="fast"),
    output=replace(base.output, target="null"),
    pipeline=replace(base.pipeline, device="cpu", max_latency=0.0),
)
if search:  # [track] search, both trees
    cfg = cfg.replace(track=replace(cfg.track, search=search))
r = _run(cfg, frames, False)
print("RESULT " + json.dumps({"fps": r["fps_out"], "stage_ms": r["stage_ms"], "full_scan_pct": r["full_scan_pct"]}))
"""


def _one(tree: Path, w: int, h: int, frames: int, search: str = "") -> dict:
    extra = os.environ.get("PYTHONPATH", "")  # the tree first, then what the caller's path holds (wheels)
    env = {**os.environ, "PYTHONPATH": str(tree) + (os.pathsep + extra if extra else "")}
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(w), str(h), str(frames), *([search] if search else [])],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{tree}: no result\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--json", default="cpu_ab.json")
    ap.add_argument(
        "--search",
        default="",
        help="[track] search of both trees (auto, worker, frame; the old tree must have it: eefa218 or later); default: "
        "each config's ('auto' picks by the machine's load at start, which these runs raise)",
    )
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    trees = {"old": Path(args.old).resolve(), "new": Path(__file__).resolve().parents[1]}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        # Odd rounds new first (old, new, new, old, ...): a machine whose speed drifts over the run
        # favours neither tree.
        for name, tree in sorted(trees.items(), reverse=r % 2 == 0):  # "old" > "new"
            res = _one(tree, w, h, args.frames, args.search)
            runs[name].append(res)
            stages = ", ".join(f"{k} {v:.2f}" for k, v in res["stage_ms"].items())
            scans = f", full scans {res['full_scan_pct']:.1f} %" if "full_scan_pct" in res else ""
            print(f"round {r + 1} {name}: {res['fps']:.1f} fps ({stages}{scans})", flush=True)
    ratios = [n["fps"] / o["fps"] for o, n in zip(runs["old"], runs["new"])]
    med = {k: statistics.median(x["fps"] for x in v) for k, v in runs.items()}
    print(f"median fps: old {med['old']:.1f}, new {med['new']:.1f}; new/old per round {[round(x, 3) for x in ratios]}")
    Path(args.json).write_text(
        json.dumps({"size": [w, h], "frames": args.frames, "runs": runs, "median_fps": med, "ratios": ratios}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
