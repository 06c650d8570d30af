"""Compiled engines without a manual step: how long the build of every batch size a 1-8 face run
uses takes (the jobs a daemon starts in the background, `vcam engines build`'s path), into a fresh
engine cache, and what the progress line said on the way.

    python -m benchmarks.autocompile OUT --model DIR/inswapper_128.onnx [--batches 1,2,4,8] [--jobs 0]

Prints a table (batch, state, seconds) and the total against the 120 s target; writes
OUT/autocompile.json. The cache is OUT/engines unless --cache is given (then `vcam bench` can use
it: VCAM_ENGINE_CACHE=OUT/engines). Needs a GPU for --device cuda (the default).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--jobs", type=int, default=0, help="build jobs side by side (0: the daemon's default)")
    ap.add_argument("--cache", type=Path, default=None, help="engine cache (default OUT/engines, emptied first)")
    ap.add_argument("--target", type=float, default=120.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or args.out / "engines"
    if args.cache is None and cache.exists():
        import shutil

        shutil.rmtree(cache)
    os.environ["VCAM_ENGINE_CACHE"] = str(cache)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))

    from vcam.engines.autobuild import default_jobs
    from vcam.engines.build_job import prebuild

    sizes = [int(b) for b in args.batches.split(",")]
    lines: list[tuple[float, str]] = []
    t0 = time.perf_counter()

    def progress(state) -> None:
        text = state.text()
        if text and (not lines or lines[-1][1] != text):
            lines.append((round(time.perf_counter() - t0, 1), text))
            print(f"  {lines[-1][0]:6.1f} s  {text}", flush=True)  # as it goes: a call cut off still shows how far

    how, done = prebuild(
        args.model, device=args.device, fp16=args.device == "cuda", max_batch=max(sizes), batches=sizes,
        cache_dir=cache, jobs=args.jobs or None, progress=progress,
    )  # fmt: skip
    total = time.perf_counter() - t0
    jobs = args.jobs or default_jobs(args.device, len(sizes))
    print(f"{'batch':>6} {'state':>7} {'seconds':>8}")
    for b, state, seconds in done:
        print(f"{b:>6} {state:>7} {seconds:>8.1f}")
    print(f"total {total:.1f} s for batch {args.batches} with {jobs} jobs (target <= {args.target:.0f} s): {how}")
    (args.out / "autocompile.json").write_text(
        json.dumps(
            {
                "model": str(args.model),
                "device": args.device,
                "batches": sizes,
                "jobs": jobs,
                "cpu_count": os.cpu_count(),
                "total_s": round(total, 1),
                "target_s": args.target,
                "sizes": [{"batch": b, "state": s, "seconds": round(sec, 1)} for b, s, sec in done],
                "progress": lines,
                "engine": how,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
