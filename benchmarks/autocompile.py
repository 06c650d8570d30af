"""Compiled engines without a manual step: how long the build of every batch size a 1-8 face run
uses takes (the job a daemon starts in the background, `vcam engines build`'s path), into a fresh
engine cache, and what the progress line said on the way; the one artifact with a dynamic batch
against one artifact per batch size (static), each mode in the same run with a fresh Inductor
cache of its own, and optionally the call time per batch size of each against the uncompiled module.

    python -m benchmarks.autocompile OUT --model DIR/inswapper_128.onnx [--batches 1,2,4,8]
        [--modes dynamic,static] [--jobs 0] [--calls 0] [--cache DIR] [--hint N]
    python -m benchmarks.autocompile OUT --tiny --device cpu --modes dynamic,static --calls 30

``--tiny``: the tiny inswapper stand-in (the full one takes many minutes per build on a small CPU).
Prints a table (mode, entry, state, seconds; then ms per call by batch size with ``--calls``) and
each mode's total against the 120 s target; writes OUT/autocompile.json. The cache is
OUT/engines (OUT/engines-<mode> with several modes) unless --cache is given (one mode: then `vcam
bench` can use it, VCAM_ENGINE_CACHE=DIR). Needs a GPU for --device cuda (the default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any


def build(args: argparse.Namespace, model: Path, cache: Path, mode: str, sizes: list[int]) -> dict[str, Any]:
    """One mode's build into ``cache`` (emptied first), timed, with the progress lines."""
    from vcam.engines.autobuild import default_jobs
    from vcam.engines.build_job import prebuild

    if cache.exists():
        shutil.rmtree(cache)
    os.environ["VCAM_ENGINE_CACHE"] = str(cache)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")  # nothing reused from another mode's build
    lines: list[tuple[float, str]] = []
    t0 = time.perf_counter()

    def progress(state: Any) -> None:
        text = state.text()
        if text and (not lines or lines[-1][1] != text):
            lines.append((round(time.perf_counter() - t0, 1), text))
            print(f"  {mode:>7} {lines[-1][0]:6.1f} s  {text}", flush=True)  # as it goes: a call cut off still shows how far

    how, done = prebuild(
        model, device=args.device, fp16=args.device == "cuda", max_batch=max(sizes), batches=sizes,
        cache_dir=cache, jobs=args.jobs or None, progress=progress, dynamic=mode == "dynamic",
    )  # fmt: skip
    total = time.perf_counter() - t0
    jobs = 1 if mode == "dynamic" else args.jobs or default_jobs(args.device, len(sizes))
    return {
        "mode": mode,
        "cache": str(cache),
        "jobs": jobs,
        "total_s": round(total, 1),
        "entries": [{"batch": label, "state": s, "seconds": round(sec, 1)} for label, s, sec in done],
        "progress": lines,
        "engine": how,
    }


def call_times(args: argparse.Namespace, model: Path, cache: Path | None, sizes: list[int]) -> dict[str, float]:
    """Median ms of one ``run`` per batch size: compiled from ``cache`` (None: uncompiled)."""
    import numpy as np

    from vcam.engines.compiled import torch_engine

    if cache is not None:
        os.environ["VCAM_ENGINE_CACHE"] = str(cache)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    engine = torch_engine(
        model, device=args.device, fp16=args.device == "cuda", max_batch=max(sizes),
        compile="load" if cache is not None else "off", cache_dir=cache,
    )  # fmt: skip
    engine.wait_compiled(timeout=300)
    rng = np.random.default_rng(0)
    out = {}
    for b in sizes:
        f = {"target": rng.random((b, 3, 128, 128), dtype=np.float32), "source": rng.standard_normal((b, 512)).astype(np.float32)}
        if cache is not None and not engine.compiled_for(b):
            engine.run(f)  # the call that adopts what the load finished
        for _ in range(3):
            engine.run(f)
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            engine.run(f)
            times.append((time.perf_counter() - t) * 1e3)
        out[str(b)] = round(statistics.median(times), 3)
        if cache is not None:
            assert engine.compiled_for(b), f"batch {b} did not run compiled"
    engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="the tiny inswapper stand-in (written to OUT)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--modes", default="dynamic", help="comma list of dynamic (one artifact), static (one per size)")
    ap.add_argument("--jobs", type=int, default=0, help="static: build jobs side by side (0: the default)")
    ap.add_argument("--calls", type=int, default=0, help="time this many calls per batch size and mode (0: none)")
    ap.add_argument("--cache", type=Path, default=None, help="engine cache of a single mode (default OUT/engines, emptied first)")
    ap.add_argument("--target", type=float, default=120.0)
    ap.add_argument("--hint", type=int, default=0, help="dynamic: the batch it is tuned at (VCAM_COMPILE_HINT; 0: the largest)")
    args = ap.parse_args()
    if args.hint:
        os.environ["VCAM_COMPILE_HINT"] = str(args.hint)  # the build jobs and the timed engines read it
    args.out.mkdir(parents=True, exist_ok=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"dynamic", "static"}:
        ap.error("--modes: dynamic and/or static")
    if args.cache is not None and len(modes) > 1:
        ap.error("--cache takes one mode")
    if args.model is None:
        if not args.tiny:
            ap.error("--model or --tiny")
        from vcam.models import standin

        args.model = standin.write("inswapper_128", args.out / "inswapper_128.onnx", tiny=True, seed=3)
    sizes = [int(b) for b in args.batches.split(",")]
    runs = []
    for mode in modes:
        cache = args.cache or (args.out / ("engines" if len(modes) == 1 else f"engines-{mode}"))
        runs.append(build(args, args.model, cache, mode, sizes))
    if args.calls:
        base = call_times(args, args.model, None, sizes)
        for run in runs:
            run["ms_per_call"] = call_times(args, args.model, Path(run["cache"]), sizes)
    print(f"{'mode':>8} {'entry':>6} {'state':>7} {'seconds':>8}")
    for run in runs:
        for e in run["entries"]:
            print(f"{run['mode']:>8} {e['batch']:>6} {e['state']:>7} {e['seconds']:>8.1f}")
    for run in runs:
        print(
            f"{run['mode']:>8}: total {run['total_s']:.1f} s for batch {args.batches}, {len(run['entries'])} artifact(s), "
            f"{run['jobs']} job(s) (target <= {args.target:.0f} s)"
        )
    by = {r["mode"]: r for r in runs}
    if len(by) == 2:
        print(f"static / dynamic build time: {by['static']['total_s'] / max(by['dynamic']['total_s'], 1e-9):.2f}x")
    if args.calls:
        print(f"ms per call (median of {args.calls}), {args.device}:")
        print(f"{'batch':>6} {'uncompiled':>11} " + " ".join(f"{r['mode']:>9}" for r in runs))
        for b in map(str, sizes):
            print(f"{b:>6} {base[b]:>11.3f} " + " ".join(f"{r['ms_per_call'][b]:>9.3f}" for r in runs))
    (args.out / "autocompile.json").write_text(
        json.dumps(
            {
                "model": str(args.model),
                "device": args.device,
                "batches": sizes,
                "cpu_count": os.cpu_count(),
                "target_s": args.target,
                "runs": runs,
                # the first mode's figures where they were before (gpu_check.sh and older readers)
                "total_s": runs[0]["total_s"],
                "jobs": runs[0]["jobs"],
                "sizes": runs[0]["entries"],
                "uncompiled_ms_per_call": base if args.calls else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
