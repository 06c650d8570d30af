"""What the control panel costs the frame loop (issue 31; before/after: issue 42).

    python -m benchmarks.panel [--device cpu|cuda] [--pacing fast|realtime] [--size 640x480]
        [--seconds 10] [--rounds 2] [--swapper classic | inswapper_128 --model-dir DIR] [--json bench_panel.json]

The real daemon on the demo clip (one face) to the null output, run ``--rounds`` times in each mode,
the modes' order turned each round (off, on, b/a; on, b/a, off; ...) in one process so drift falls
on all:

- ``panel off``: no panel (control socket on, as in every mode);
- ``panel on, open, preview on``: the panel served, and a separate reader process holding what an
  open page holds: the pushed state (``/api/events``) and the preview (``/api/preview``, 320 px JPEG
  at 5 fps), read as fast as they come;
- ``... + before/after``: the same with the ``before_after`` setting on (each input frame kept
  small before the pipeline, the preview twice as wide).

Per mode: frames published per second (``--pacing fast``: flat out, the CPU criterion: within 5 %),
capture-to-publish p50/p99 and the frame loop's own time per frame (gathered -> published, through
the daemon's hook) p50/p99 (the GPU criterion: p99 within 0.1 ms, with ``--pacing realtime``), the
preview tap's own time on the frame thread (mean and max per published frame; with before/after the
input frame's keeping is added), and how many preview frames and pushed states the reader got.
Prints a table and the ratios to ``panel off`` and writes JSON.

On the GPU host: ``python -m benchmarks.panel --device cuda --pacing realtime --size 1920x1080
--seconds 20 --rounds 3 --json /tmp/bench_panel_gpu.json`` (add ``--swapper inswapper_128
--model-dir DIR`` for the neural swapper).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_report
from vcam.config_file import build
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import Mark
from vcam.stages.publish import open_output

READER = r"""
import json, sys, threading, time, urllib.request
base, code = sys.argv[1], sys.argv[2]
# the printed link's one-time code traded for the token, as the page does
ask = urllib.request.Request(base + "/api/once", data=json.dumps({"code": code}).encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(ask, timeout=30) as res:
    token = json.load(res)["token"]
counts = {"events": 0, "preview": 0}
def read(path, key, marker):
    req = urllib.request.Request(base + path, headers={"X-Vcam-Token": token})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            while True:
                chunk = res.readline()
                if not chunk:
                    return
                if chunk.startswith(marker):
                    counts[key] += 1
    except Exception:
        return
for args in (("/api/events", "events", b"event: state"), ("/api/preview", "preview", b"--frame")):
    threading.Thread(target=read, args=args, daemon=True).start()
try:
    sys.stdin.read()
finally:
    print(counts["events"], counts["preview"], flush=True)
"""


def config(args: argparse.Namespace, sock: Path) -> Any:
    w, _, h = args.size.lower().partition("x")
    swap: dict[str, Any] = {"swapper": args.swapper}
    models = {"dir": args.model_dir} if args.model_dir else {}
    return build(
        {
            "capture": {"input": "demo", "width": int(w), "height": int(h), "pacing": args.pacing},
            "pipeline": {"device": args.device, "max_latency": 0},
            "swap": swap,
            "models": models,
            "output": {"target": "null"},
            "control": {"socket": str(sock)},
            "panel": {"port": 0},
        }
    )


MODES = ("off", "on", "before_after")
LABELS = {"off": "panel off", "on": "panel on, open, preview on", "before_after": "... + before/after"}


def segment(args: argparse.Namespace, mode: str, folder: Path) -> dict:
    """One run of the daemon in ``mode`` (:data:`MODES`); its numbers."""
    panel = mode != "off"
    sock = folder / f"vcam-{time.monotonic_ns()}.sock"
    loop_ms: list[float] = []
    tap_us: list[float] = []
    gathered: dict[int, float] = {}

    cpu: list[float] = []  # process CPU seconds at the first frame and at the last one published

    def hook(m: Mark) -> None:
        if m.phase == "gathered":
            gathered[m.seq] = m.t
            if not cpu:
                cpu.append(time.process_time())
        elif m.phase == "published" and m.seq in gathered:
            loop_ms.append((m.t - gathered.pop(m.seq)) * 1000.0)
            if len(cpu) == 2:
                cpu[1] = time.process_time()
            else:
                cpu.append(time.process_time())

    reader: list[subprocess.Popen] = []
    d: Daemon

    def announce(line: str) -> None:
        url = line.split("panel: ", 1)[-1]
        if not line.startswith("panel: ") or "/#once=" not in url:  # the link's second line, the OBS source
            return
        base, code = url.split("/#once=")
        tap = d.rounds.tap
        assert tap is not None

        def timed(st: Any, data: Any) -> None:
            t0 = time.perf_counter()
            tap(st, data)
            tap_us.append((time.perf_counter() - t0) * 1e6)

        d.rounds.tap = timed
        before = d.rounds.before
        if mode == "before_after" and before is not None:
            d.state.set_setting("before_after", True)

            def kept(st: Any, frame: Any) -> None:  # its time counted with the tap's: the frame thread's cost
                t0 = time.perf_counter()
                before(st, frame)
                tap_us.append((time.perf_counter() - t0) * 1e6)

            d.rounds.before = kept
        reader.append(
            subprocess.Popen([sys.executable, "-c", READER, base, code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )

    cfg = config(args, sock)
    # The null output opened here and given: a run whose output is given counts as live, so it
    # serves its control socket as in the product (a demo to the null output opened by the daemon
    # itself would be a standalone run, without one).
    w, _, h = args.size.lower().partition("x")
    out = open_output(cfg.output, int(w), int(h), 30.0)
    d = Daemon(cfg, output=out, panel=panel, announce=announce, hook=hook)
    summary = d.run(duration=args.seconds)
    events = previews = 0
    if reader:
        out, _ = reader[0].communicate("", timeout=30)
        events, previews = (int(v) for v in out.split())
    skip = len(loop_ms) // 10  # the first tenth meets warm-ups
    lm = np.asarray(loop_ms[skip:] or [0.0])
    tu = np.asarray(tap_us or [0.0])
    return {
        "mode": mode,
        "fps": summary.fps,
        "frames": summary.frames_out,
        "latency_p50_ms": summary.percentile(50),
        "latency_p99_ms": summary.percentile(99),
        "loop_p50_ms": float(np.percentile(lm, 50)),
        "loop_p99_ms": float(np.percentile(lm, 99)),
        # CPU time of the whole daemon process (every thread: the panel's server and encoder too) per
        # published frame: steadier than fps on a machine others share
        "cpu_ms_per_frame": (cpu[1] - cpu[0]) * 1000.0 / max(1, len(loop_ms) - 1) if len(cpu) == 2 else 0.0,
        "tap_mean_us": float(tu.mean()),
        "tap_max_us": float(tu.max()),
        "preview_frames": previews,
        "pushed_states": events,
        "error": summary.error,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--pacing", default="fast", choices=("fast", "realtime"))
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--swapper", default="classic")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--json", default="bench_panel.json")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vcam-bench-panel-") as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir(mode=0o700)
        for r in range(args.rounds):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                row = segment(args, mode, folder)
                rows.append(row)
                print(f"  round {r + 1} {mode:12}: {row['fps']:.1f} fps, loop p99 {row['loop_p99_ms']:.2f} ms")
    summary: dict[str, dict] = {}
    for mode in MODES:
        mine = [x for x in rows if x["mode"] == mode]
        summary[mode] = {
            k: float(np.median([x[k] for x in mine]))
            for k in (
                "fps",
                "latency_p50_ms",
                "latency_p99_ms",
                "loop_p50_ms",
                "loop_p99_ms",
                "cpu_ms_per_frame",
                "tap_mean_us",
                "tap_max_us",
            )
        } | {"preview_frames": sum(x["preview_frames"] for x in mine), "pushed_states": sum(x["pushed_states"] for x in mine)}
    per = f"{args.rounds} x {args.seconds:g} s per mode (medians)"
    print(f"\n{args.device}, {args.size}, {args.swapper}, pacing {args.pacing}, {per}")
    cols = ("fps", 7), ("lat p50", 8), ("lat p99", 8), ("loop p50", 9), ("loop p99", 9), ("cpu/frame", 9), ("tap mean", 9)
    cols += (("tap max", 8),)
    head = f"{'mode':32} " + " ".join(f"{c:>{w}}" for c, w in cols) + f" {'previews':>8} {'states':>6}"
    print(head)
    for mode in MODES:
        s = summary[mode]
        print(
            f"{LABELS[mode]:32} {s['fps']:7.1f} {s['latency_p50_ms']:7.2f}ms {s['latency_p99_ms']:7.2f}ms"
            f" {s['loop_p50_ms']:8.3f}ms {s['loop_p99_ms']:8.3f}ms {s['cpu_ms_per_frame']:7.2f}ms"
            f" {s['tap_mean_us']:7.1f}us {s['tap_max_us']:6.0f}us"
            f" {s['preview_frames']:8d} {s['pushed_states']:6d}"
        )
    off = summary["off"]
    ratios = {}
    for mode in MODES[1:]:
        on = summary[mode]
        ratio = on["fps"] / off["fps"] if off["fps"] else 0.0
        cpu = on["cpu_ms_per_frame"] / off["cpu_ms_per_frame"] if off["cpu_ms_per_frame"] else 0.0
        gap = on["loop_p99_ms"] - off["loop_p99_ms"]
        ratios[mode] = {"fps_ratio": ratio, "cpu_ratio": cpu, "loop_p99_gap_ms": gap}
        print(
            f"{LABELS[mode]} / off: fps {ratio:.3f} ({(ratio - 1) * 100:+.1f} %), CPU per frame {cpu:.3f}"
            f" ({(cpu - 1) * 100:+.1f} %), loop p99 {gap:+.3f} ms"
        )
    ratio, cpu = ratios["on"]["fps_ratio"], ratios["on"]["cpu_ratio"]
    return write_report(
        args.json,
        {
            "benchmark": "panel",
            "args": vars(args),
            "rows": rows,
            "summary": summary,
            "fps_ratio": ratio,
            "cpu_ratio": cpu,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
