"""End-to-end benchmark of the daemon on the demo clip (issue 2's CPU benchmark).

    python -m vcam.bench.demo [--frames 300] [--size 1280x720] [--json bench_demo.json]

Runs the real daemon (capture thread, tracking, classic swap, paste-back, publish to `null`) on the
720p demo clip in two modes and prints a table:
- ``paced``: the clip at its 30 fps, as a camera would deliver it: fps out and capture-to-publish
  latency p50/p99 under real-time load;
- ``flat out``: frames as fast as the pipeline takes them: the capacity in fps;
and, as the naive baseline in the same run, the same frames with a full-frame detection on every
frame (no ROI tracking). Also reports the mean per-stage times and how often a full scan ran.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace

from ..config import Config, TrackConfig
from ..daemon import Daemon
from . import write_report


def _run(cfg: Config, frames: int) -> dict:
    d = Daemon(cfg, control=False)
    t0 = time.perf_counter()
    s = d.run(max_frames=frames)
    wall = time.perf_counter() - t0
    return {
        "frames_in": s.frames_in,
        "frames_out": s.frames_out,
        "fps_out": s.fps,
        "latency_p50_ms": s.percentile(50),
        "latency_p99_ms": s.percentile(99),
        "dropped_capture": s.dropped_capture,
        "dropped_latency": s.dropped_latency,
        "full_scan_pct": 100.0 * s.full_scans / max(s.frames_in, 1),
        "stage_ms": s.stage_ms,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--json", default="bench_demo.json")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    base = Config()
    base = base.replace(
        capture=replace(base.capture, input="demo", width=w, height=h, fps=30.0, loop=True),
        output=replace(base.output, target="null"),
        pipeline=replace(base.pipeline, device="cpu", max_latency=0.0),
    )
    modes = {
        "paced (30 fps source)": base.replace(capture=replace(base.capture, pacing="realtime")),
        "flat out": base.replace(capture=replace(base.capture, pacing="fast")),
        "naive: full scan every frame": base.replace(
            capture=replace(base.capture, pacing="fast"), track=TrackConfig(rescan_every=1)
        ),
    }
    results = {name: _run(cfg, args.frames) for name, cfg in modes.items()}

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"vcam demo benchmark, {w}x{h}, {args.frames} frames, CPU ({platform.processor() or platform.machine()})")
    for col in ("mode", "fps out", "p50 ms", "p99 ms", "full scans %", "dropped (capture)"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['fps_out']:.1f}",
            f"{r['latency_p50_ms']:.1f}",
            f"{r['latency_p99_ms']:.1f}",
            f"{r['full_scan_pct']:.1f}",
            str(r["dropped_capture"]),
        )
    con = Console()
    con.print(table)
    stages = results["flat out"]["stage_ms"]
    con.print("per-stage mean ms (flat out): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    payload = write_report(args.json, {"size": [w, h], "frames": args.frames, "results": results})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
