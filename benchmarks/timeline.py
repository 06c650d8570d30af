"""Where one frame's time goes on the GPU and on the host: the bench's CUDA pipeline (as `vcam
bench` builds it) run frame by frame under torch.profiler (CUPTI: every kernel and copy, CuPy's
included, on its stream), each frame's host phases marked. Prints, medians over the frames:
the host phases and each stream's busy span relative to the frame's start, and the longest GPU
operations with where they start; writes the Chrome trace and the summary as JSON.

    python -m benchmarks.timeline OUT_DIR [--faces 1] [--frames 40] [--compile auto] [--no-predict]
        [--pace FPS] [--model FILE]

``--pace 30`` waits between frames as a 30 fps camera would (the GPU idles between them), applying
the pending detection and planning the next frame meanwhile as the daemon does (``settle``), and
also times that many frames unprofiled, against flat out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vcam.runtime.bench import SIZES, _inswapper_file, gpu_rig

PHASES = ("begin", "track.complete", "track.launch", "swap_batch", "finish", "collect")


def mark(obj, name: str, label: str, rf) -> None:
    fn = getattr(obj, name)

    def wrapped(*a, **k):
        with rf(label):
            return fn(*a, **k)

    setattr(obj, name, wrapped)


def idle(pipe, until: float) -> None:
    """Wait for the next paced frame as the daemon does: apply the pending detection (and plan the
    next frame) as soon as it arrives, looking every 0.5 ms, then sleep."""
    settled = False
    while (left := until - time.perf_counter()) > 0:
        settled = settled or pipe.settle()
        time.sleep(left if settled else min(left, 0.0005))


def latencies(rig, frames: int, pace: float) -> list[float]:
    out = []
    for i in range(frames):
        f = rig.frame(i)
        t0 = time.perf_counter()
        rig.pipe.process(f, rig.snap)
        out.append((time.perf_counter() - t0) * 1e3)
        if pace:
            idle(rig.pipe, t0 + 1.0 / pace)
    return out


def summarize(trace: dict, skip: int) -> dict:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    frames = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"] == "frame"), key=lambda e: e["ts"])
    frames = frames[skip:]
    marks = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in PHASES]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    streams: dict[str, list[tuple[float, float, float, int]]] = defaultdict(list)
    ops: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    totals = []
    for fr in frames:
        t0, t1 = fr["ts"], fr["ts"] + fr["dur"]
        totals.append(fr["dur"] / 1e3)
        for m in marks:
            if t0 <= m["ts"] < t1:
                rows[m["name"]].append(((m["ts"] - t0) / 1e3, (m["ts"] + m["dur"] - t0) / 1e3))
        per: dict[str, list[dict]] = defaultdict(list)
        for g in gpu:
            if t0 <= g["ts"] < t1:
                per[str(g.get("args", {}).get("stream", g.get("tid")))].append(g)
                key = (g["name"][:70], str(g.get("args", {}).get("stream", g.get("tid"))))
                ops[key].append(((g["ts"] - t0) / 1e3, g["dur"] / 1e3))
        for sid, evs in per.items():
            first = min(e["ts"] for e in evs) - t0
            last = max(e["ts"] + e["dur"] for e in evs) - t0
            busy = sum(e["dur"] for e in evs)
            streams[sid].append((first / 1e3, last / 1e3, busy / 1e3, len(evs)))
    n = len(frames)
    summary = {
        "frames": n,
        "frame_ms": float(np.median(totals)) if totals else float("nan"),
        "host": {
            k: [float(np.median([v[0] for v in vs])), float(np.median([v[1] for v in vs])), len(vs) / max(n, 1)]
            for k, vs in rows.items()
        },
        "streams": {
            k: {
                "first_ms": float(np.median([v[0] for v in vs])),
                "last_ms": float(np.median([v[1] for v in vs])),
                "busy_ms": float(np.median([v[2] for v in vs])),
                "ops": float(np.median([v[3] for v in vs])),
                "frames": len(vs),
            }
            for k, vs in streams.items()
        },
        "ops": sorted(
            (
                {
                    "name": k[0],
                    "stream": k[1],
                    "per_frame": len(vs) / max(n, 1),
                    "start_ms": float(np.median([v[0] for v in vs])),
                    "dur_ms": float(np.median([v[1] for v in vs])),
                    "total_ms": float(sum(v[1] for v in vs) / max(n, 1)),
                }
                for k, vs in ops.items()
            ),
            key=lambda r: -r["total_ms"],
        ),
    }
    return summary


def report(s: dict, title: str) -> str:
    lines = [f"== {title}: {s['frames']} frames, frame (host, profiled) median {s['frame_ms']:.3f} ms"]
    lines.append("host phases (ms from the frame's start): start .. end  [calls a frame]")
    for k in PHASES:
        if k in s["host"]:
            a, b, c = s["host"][k]
            lines.append(f"  {k:<16s} {a:7.3f} .. {b:7.3f}  [{c:.1f}]")
    lines.append("GPU streams (ms from the frame's start): first op .. last op end, busy, ops")
    for k, v in sorted(s["streams"].items(), key=lambda kv: kv[1]["first_ms"]):
        span = f"{v['first_ms']:7.3f} .. {v['last_ms']:7.3f}"
        lines.append(f"  stream {k:<6s} {span}  busy {v['busy_ms']:6.3f}  ops {v['ops']:.0f}")
    lines.append("GPU operations by time a frame (start ms, duration ms, stream, count a frame):")
    for r in s["ops"][:30]:
        at = f"@{r['start_ms']:6.3f} {r['dur_ms']:6.3f}"
        lines.append(f"  {r['total_ms']:6.3f}  {at}  s{r['stream']:<4s} x{r['per_frame']:.1f}  {r['name']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--faces", type=int, default=1)
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--compile", default="auto")
    ap.add_argument("--no-predict", dest="predict", action="store_false")
    ap.add_argument("--pace", type=float, default=0.0)
    ap.add_argument("--model", default="")
    ap.add_argument("--masks", default="box,face")
    ap.add_argument("--cprofile", type=int, default=0, help="also run this many frames under cProfile (host time)")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w, h = SIZES[args.size]
    rig = gpu_rig(
        w, h, args.faces, model=_inswapper_file(args.model or None), compile=args.compile, predict=args.predict,
        masks=tuple(args.masks.split(",")),
    )  # fmt: skip
    result: dict = {"args": vars(args), "compiled": rig.engine.compiled_for(args.faces)}
    flat = latencies(rig, 200, 0.0)
    result["flat_ms"] = {"p50": float(np.median(flat)), "p99": float(np.percentile(flat, 99))}
    print(f"unprofiled, flat out: p50 {np.median(flat):.3f} p99 {np.percentile(flat, 99):.3f} ms")
    if args.pace:
        paced = latencies(rig, int(args.pace * 4), args.pace)
        result["paced_ms"] = {"p50": float(np.median(paced)), "p99": float(np.percentile(paced, 99))}
        print(f"unprofiled, paced at {args.pace:g} fps: p50 {np.median(paced):.3f} p99 {np.percentile(paced, 99):.3f} ms")
    if args.cprofile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        latencies(rig, args.cprofile, 0.0)
        prof.disable()
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
            (out / f"cprofile_{key}.txt").write_text(buf.getvalue())
        print(f"cProfile of {args.cprofile} frames: {out}/cprofile_*.txt")
    pipe, tracker, sw = rig.pipe, rig.pipe.tracker, rig.pipe.swapper
    mark(pipe, "begin", "begin", record_function)
    mark(pipe, "finish", "finish", record_function)
    mark(pipe, "collect", "collect", record_function)
    mark(sw, "swap_batch", "swap_batch", record_function)
    for name in ("complete", "launch"):
        if hasattr(tracker, name):
            mark(tracker, name, f"track.{name}", record_function)
    runs = [("flat", 0.0)] + ([("paced", args.pace)] if args.pace else [])
    text = []
    for label, pace in runs:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(args.frames):
                f = rig.frame(i)
                t0 = time.perf_counter()
                with record_function("frame"):
                    pipe.process(f, rig.snap)
                if pace:
                    idle(pipe, t0 + 1.0 / pace)
            torch.cuda.synchronize()
        path = out / f"trace_{label}.json"
        prof.export_chrome_trace(str(path))
        s = summarize(json.loads(path.read_text()), skip=5)
        result[label] = s
        text.append(report(s, f"{label} ({args.faces} face(s), compile {args.compile}, predict {args.predict})"))
        print(text[-1])
    rig.close()
    (out / "timeline.json").write_text(json.dumps(result, indent=1))
    (out / "timeline.txt").write_text("\n\n".join(text) + "\n")


if __name__ == "__main__":
    main()
