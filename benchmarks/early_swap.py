"""What the CPU's early frames cost the GPU load: the GPU libraries imported beside them (the GIL).

    python -m benchmarks.early_swap [--runs 3] [--size 720p] [--modules cupy,torch] [--switch S] [--json OUT]

An early swap (:mod:`vcam.runtime.early_swap`) swaps frames on the CPU in the frame loop while the
load thread imports CuPy and PyTorch and builds the GPU assembly; both need the GIL. Each run is a
fresh process that starts a live demo daemon (30 fps, ``--size``) on the CPU and, once its frames
flow, times ``import`` of ``--modules`` in another thread, as the load thread does:

    alone     no daemon (the import on its own)
    pixelate  the early frames of today's start (pixelated, no pipeline)
    swap      the frames swapped on the CPU (the early swap's CPU assembly; its full load held back)

The table gives each mode's import time (best and median of the runs) and the frames the daemon
published meanwhile; the JSON has every run. Modes alternate run by run (the same machine load).
``--switch``: the interpreter's switch interval in the child (how long the import keeps the GIL
before a waiting frame loop gets it): shorter makes the CPU's frames quicker, the import slower.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys, threading, time
mode, size, modules = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if len(sys.argv) > 4:
    sys.setswitchinterval(float(sys.argv[4]))
w, h = {"360p": (640, 360), "720p": (1280, 720), "1080p": (1920, 1080)}[size]
from dataclasses import replace
from vcam.config import Config, Duration
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput
cfg = Config()
cfg = cfg.replace(
    capture=replace(cfg.capture, input="demo", width=w, height=h, pacing="realtime"),
    pipeline=replace(
        cfg.pipeline, device="cpu", max_latency=Duration(0), early_frames="pixelate" if mode == "pixelate" else "swap"
    ),
    output=replace(cfg.output, target="null"),
)
d = None
if mode != "alone":
    d = Daemon(cfg, output=NullOutput(w, h, 30.0), control=False, early_swap=mode == "swap", load_delay=600)
    d.start()
    deadline = time.monotonic() + 60
    while d.summary.frames_out + d.summary.early_frames < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
def count():
    return d.summary.frames_out + d.summary.early_frames if d else 0
n0, took = count(), {}
def load():
    import importlib
    for m in modules:
        t = time.perf_counter()
        try:
            importlib.import_module(m)
        except ImportError:
            continue
        took[m] = time.perf_counter() - t
t0 = time.perf_counter()
th = threading.Thread(target=load, name="vcam-load")
th.start(); th.join()
total = time.perf_counter() - t0
print("RESULT", total, count() - n0, *(f"{m}={v:.3f}" for m, v in took.items()), flush=True)
import os; os._exit(0)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="720p", choices=["360p", "720p", "1080p"])
    ap.add_argument("--modules", default="cupy,torch")
    ap.add_argument("--modes", default="alone,pixelate,swap")
    ap.add_argument("--switch", type=float, default=0.0, help="sys.setswitchinterval in the child (0: Python's 5 ms)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    modes = args.modes.split(",")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(args.runs):
        for mode in modes:
            r = subprocess.run(
                [sys.executable, "-c", CHILD, mode, args.size, args.modules, *([str(args.switch)] if args.switch else [])],
                capture_output=True,
                text=True,
                cwd=here,
                timeout=300,
            )
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
            if line is None:
                print(f"{mode}: failed: {(r.stdout + r.stderr)[-400:]}", flush=True)
                continue
            _, total, frames, *mods = line.split()
            run = {"import_s": float(total), "frames": int(frames), "modules": dict(m.split("=") for m in mods)}
            rows[mode].append(run)
            print(f"run {i + 1} {mode:9s} import {float(total):.2f} s, {frames} frames meanwhile {run['modules']}", flush=True)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"import {args.modules} in the load thread beside the early frames ({args.size}, {args.runs} runs)")
    for col in ("mode", "import s (best)", "import s (median)", "fps meanwhile", "vs alone (median)"):
        t.add_column(col, justify="right")
    alone = statistics.median([r["import_s"] for r in rows.get("alone", [])] or [0.0])
    for mode, runs in rows.items():
        if not runs:
            t.add_row(mode, "failed", "", "", "")
            continue
        secs = [r["import_s"] for r in runs]
        fps = statistics.median([r["frames"] / r["import_s"] for r in runs])
        med = statistics.median(secs)
        t.add_row(mode, f"{min(secs):.2f}", f"{med:.2f}", f"{fps:.1f}", f"{med - alone:+.2f} s" if alone else "-")
    Console(width=120).print(t)
    if args.json:
        out = {"size": args.size, "modules": args.modules, "date": time.strftime("%Y-%m-%d"), "rows": rows}
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
