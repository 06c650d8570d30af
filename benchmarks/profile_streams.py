"""Where the frame loop's time goes with one and several streams (host wall time per call of each
pipeline phase, timed through the round hook, and a cProfile of the loop). Usage on the GPU:

    python -m benchmarks.profile_streams OUT_DIR --model-dir DIR [--streams 1,4] [--seconds 5]
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
from vcam.runtime.rounds import Mark

#: Each phase's time: from the frame's previous phase boundary to this one (host wall time).
TIMED = {"begun": "begin", "swapped": "swap_batch", "finished": "finish", "collected": "collect"}


def phase_timer(acc: dict[str, float]):
    """A round hook adding each frame's time between phase boundaries to ``acc`` by phase."""
    last: dict[tuple, float] = {}

    def hook(m: Mark) -> None:
        key = (m.stream.name, m.seq)
        prev = last.get(key)
        if m.phase in TIMED and prev is not None:
            acc[TIMED[m.phase]] += m.t - prev
        last[key] = m.t
        if m.phase in ("published", "dropped"):
            last.pop(key, None)

    return hook


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
        daemon.rounds.hook = phase_timer(acc)
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        daemon.main_loop(None, args.seconds)
        wall = time.perf_counter() - t0
        prof.disable()
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
