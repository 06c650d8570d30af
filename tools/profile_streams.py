"""Where the frame loop's time goes with one and several streams (host wall time per call of each
pipeline phase, and a cProfile of the loop). Usage on the GPU:

    python tools/profile_streams.py OUT_DIR --model-dir DIR [--streams 1,4] [--seconds 5]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import streams as bench
from vcam.pipeline.pipeline import Pipeline


def timed(cls, name, acc):
    fn = getattr(cls, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0

    setattr(cls, name, wrapper)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--swapper", default="inswapper_128")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", default="1080p")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in [int(x) for x in args.streams.split(",")]:
        acc: dict[str, float] = defaultdict(float)
        daemon = bench.make_daemon(streams=n, size=args.size, swapper=args.swapper, model_dir=args.model_dir)
        daemon.startup()
        originals = {m: timed(Pipeline, m, acc) for m in ("begin", "finish", "collect")}
        sw = type(daemon.assembly.swapper)
        originals_sw = timed(sw, "swap_batch", acc)
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        daemon.main_loop(None, args.seconds)
        wall = time.perf_counter() - t0
        prof.disable()
        for m, fn in originals.items():
            setattr(Pipeline, m, fn)
        sw.swap_batch = originals_sw
        daemon.shutdown()
        frames = sum(s.frames_out for s in daemon.summaries.values())
        lines = [f"{n} streams: {frames} frames in {wall:.2f}s = {frames / wall:.1f} fps"]
        for k, v in acc.items():
            lines.append(f"  {k:12s} {v * 1000 / max(frames, 1):7.3f} ms per frame  ({v / wall * 100:5.1f}% of the loop)")
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        s2 = io.StringIO()
        pstats.Stats(prof, stream=s2).sort_stats("cumulative").print_stats(45)
        text = "\n".join(lines)
        print(text, flush=True)
        (out / f"profile_{n}.txt").write_text(text + "\n\n" + s.getvalue() + "\n\n" + s2.getvalue())


if __name__ == "__main__":
    main()
