"""Where one frame's capture-to-publish latency goes in the running daemon (one stream, or
``--streams N``, of the 1080p one-face clip, paced like a camera (out of phase) or flat out): host
timestamps at each phase of the frame loop, how many frames each round took, the frame loop's
host CPU time per frame, and the device-side stage times (CUDA events). Usage on the GPU:

    python -m benchmarks.latency_breakdown --model-dir DIR [--paced] [--streams 1] [--seconds 4]
        [--faces 6] [--compile auto|off] [--deadline 2ms] [--patient] [--json OUT.json]
        [--gpu-window 2 [--gpu-window-at 8] [--gpu-window-trace FILE]]

Host CPU comes from the round hook (``Mark.cpu``: the loop thread's ``time.thread_time()``; on a
tree whose marks lack it, the hook reads the same clock, as it runs on that thread): "per frame" is
the loop's CPU between one published (or dropped) frame and the next, everything the loop did for
a frame (waits excluded); "gathered -> finished" is the part spent between a frame's arrival and
its GPU work being queued. ``--patient``: every pipeline waits for the previous frame's detection
as before issue 28 (the A/B of taking the detection off the frame's path). On the CPU
(``--device cpu --swapper classic --predict on``) the host logic is the same, the detector runs
on the loop's thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import streams as bench
from vcam.runtime.rounds import Mark

PHASES = ("gathered", "begun", "swapped", "finished", "collected", "published")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--swapper", default="inswapper_128")
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--paced", action="store_true")
    ap.add_argument("--faces", type=int, default=1, help="faces in each frame")
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--compile", default="auto", choices=("auto", "off"))
    ap.add_argument("--deadline", default=None, help="[pipeline] batch_deadline, e.g. 2ms")
    ap.add_argument("--first", type=int, default=12, help="print the phases of the run's first N frames")
    ap.add_argument("--switch-interval", type=float, default=0.0, help="sys.setswitchinterval (s) for the run; 0: Python's")
    ap.add_argument("--predict", default=None, choices=("auto", "on", "off"), help="[track] predict (default: the config's)")
    ap.add_argument("--profile", default="", help="also write the frame loop's cProfile (top functions by own time) to this file")
    ap.add_argument("--patient", action="store_true", help="pipelines wait for the previous frame's detection (the old path)")
    ap.add_argument(
        "--gpu-window", type=float, default=0.0, metavar="SECONDS",
        help="also record every GPU operation (torch.profiler) for this long, from --gpu-window-at into the run: "
        "the GPU's busy share, by stream and operation (benchmarks/gpu_window.py)",
    )  # fmt: skip
    ap.add_argument(
        "--gpu-window-at",
        type=float,
        default=None,
        help="seconds into the run (default: ending 1 s before the run's end, past the start-up)",
    )
    ap.add_argument("--gpu-window-trace", default="", help="where the window's Chrome trace goes (default: the temp folder)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    marks: dict[tuple, dict[str, float]] = {}
    rounds: list[int] = []
    stages: list[dict[str, float]] = []
    gathered: list[tuple] = []
    last_out: list[float] = []  # the loop's CPU clock at the last frame out (published or dropped)

    window = None  # the GPU window (--gpu-window), ticked by the hook: on the loop's thread

    def hook(m: Mark) -> None:
        if window is not None:
            window.tick()
        key = (m.stream.name, m.seq)
        cpu = getattr(m, "cpu", 0.0) or time.thread_time()  # the hook runs on the loop's thread
        if key in marks or m.phase == "gathered":
            marks.setdefault(key, {})[f"cpu {m.phase}"] = cpu
        if m.phase in ("published", "dropped"):
            if last_out and key in marks:
                marks[key]["cpu frame"] = cpu - last_out[0]
            last_out[:] = [cpu]
        if m.phase == "gathered":
            marks[key].update(capture=m.t_capture)
            gathered.append(key)
        elif m.phase == "begun" and gathered:  # the first frame begun closes the gathered round
            rounds.append(len(gathered))
            gathered.clear()
        if key in marks:
            marks[key][m.phase] = m.t
        if m.phase == "collected" and m.stats is not None and key in marks:
            marks[key]["full_scan"] = float(m.stats.full_scan)
            stages.append(dict(m.stats.stages))

    daemon = bench.make_daemon(
        streams=args.streams,
        compile=args.compile,
        deadline=args.deadline,
        paced=args.paced,
        size=args.size,
        device=args.device,
        swapper=args.swapper,
        model_dir=args.model_dir,
        fp16=args.device == "cuda",
        faces=args.faces,
        timing=True,  # the pipelines' device-side stage times (CUDA events)
        predict=args.predict,
    )
    daemon.startup()
    for st in daemon.streams:
        st.pipeline.patient = bool(args.patient)
    daemon.wait_compiled(300)  # time the compiled swapper where it is built
    import threading

    print("threads:", ", ".join(sorted(t.name for t in threading.enumerate())))
    for st in daemon.streams:
        st.cap.get(timeout=0)  # a frame captured while the compiled engine was awaited is not timed
    daemon.rounds.hook = hook  # the run's frames only, not the warm-up's
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()  # this thread's calls only: the frame loop's
        prof.enable()
    result_gpu = None
    if args.gpu_window > 0:
        from benchmarks.gpu_window import Window

        at = args.gpu_window_at if args.gpu_window_at is not None else max(0.0, args.seconds - args.gpu_window - 1.0)
        import tempfile

        trace = Path(args.gpu_window_trace or Path(tempfile.gettempdir()) / "vcam_gpu_window_trace.json")
        window = Window(at, args.gpu_window, trace, rounds=lambda: len(rounds))
    try:
        daemon.main_loop(None, args.seconds)
    finally:
        if prof is not None:
            prof.disable()
        daemon.shutdown()
    if window is not None:
        from benchmarks.gpu_window import report

        try:
            gpu = window.result()
            print(report(gpu))
            result_gpu = gpu
        except (TimeoutError, RuntimeError) as e:
            print(f"GPU window: {e}")
    if prof is not None:
        import io
        import pstats

        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("tottime").print_stats(60)
        st.sort_stats("cumulative").print_stats(60)
        Path(args.profile).write_text(buf.getvalue())
        print(f"profile: {args.profile}")
    done = [m for m in marks.values() if all(k in m for k in PHASES)]
    print(f"the first {args.first} frames, ms per phase (" + ", ".join(PHASES) + "), full scan:")
    for m in done[: args.first]:
        prev_t, parts = m["capture"], []
        for ph in PHASES:
            parts.append(f"{(m[ph] - prev_t) * 1e3:6.2f}")
            prev_t = m[ph]
        total_ms = (m["published"] - m["capture"]) * 1e3
        print(f"  {total_ms:7.2f}: " + " ".join(parts) + f"  {'yes' if m.get('full_scan') else 'no'}")
    rows = done[10:]  # the summary below skips the first frames
    if not rows:
        sys.exit(f"no frame published past the first 10 in {args.seconds:g} s (the load took longer?): try a longer --seconds")
    result: dict[str, Any] = {}
    prev = "capture"
    print(
        f"{len(rows)} frames of {args.streams} stream(s), {'paced at 30 fps' if args.paced else 'flat out'}, switch interval "
        f"{sys.getswitchinterval() * 1e3:g} ms; host phases, median (p99) ms, and the loop's CPU in each, median ms:"
    )
    for ph in PHASES:
        d = np.array([(m[ph] - m[prev]) * 1e3 for m in rows])
        result[f"{prev}->{ph}"] = float(np.median(d))
        cpu = ""
        if prev != "capture":
            c = float(np.median([(m[f"cpu {ph}"] - m[f"cpu {prev}"]) * 1e3 for m in rows]))
            result[f"host CPU ms {prev}->{ph}"] = c
            cpu = f"  CPU {c:6.3f}"
        print(f"  {prev:>10s} -> {ph:<10s} {np.median(d):7.3f} ({np.percentile(d, 99):7.3f}){cpu}")
        prev = ph
    # The loop's CPU outside any frame's phases: after a publish up to the next frame's arrival (the
    # detection queued after the publish, the pending one applied while waiting, the gather).
    between = [(m["cpu frame"] - (m["cpu published"] - m["cpu gathered"])) * 1e3 for m in rows if "cpu frame" in m]
    if between and args.streams == 1:
        result["host CPU ms between frames"] = float(np.median(between))
        print(f"  (published -> next gathered: the loop's CPU {np.median(between):6.3f}: detection queued and applied, gather)")
    total = np.array([(m["published"] - m["capture"]) * 1e3 for m in rows])
    print(f"  capture -> published   {np.median(total):7.3f} ({np.percentile(total, 99):7.3f})")
    result["capture->published p50"] = float(np.median(total))
    result["capture->published p99"] = float(np.percentile(total, 99))
    per_frame = np.array([m["cpu frame"] * 1e3 for m in rows if "cpu frame" in m])
    front = np.array([(m["cpu finished"] - m["cpu gathered"]) * 1e3 for m in rows])
    print("host CPU of the frame loop's thread, median (p99) ms:")
    for label, vals in (("per frame", per_frame), ("gathered->finished", front)):
        if vals.size:
            result[f"host CPU ms {label} p50"] = float(np.median(vals))
            result[f"host CPU ms {label} p99"] = float(np.percentile(vals, 99))
            print(f"  {label:<24s} {np.median(vals):7.3f} ({np.percentile(vals, 99):7.3f})")
    sizes = np.bincount(rounds[10:] or [0])
    print("frames per round: " + ", ".join(f"{k}: {int(c)} rounds" for k, c in enumerate(sizes) if c and k))
    scans = [m for m in rows if m.get("full_scan")]
    print(f"frames whose tracker step was a full scan: {len(scans)} of {len(rows)}")
    # when each was captured, from the first timed frame's capture (where to put --gpu-window-at: on
    # 2026-12-07 a 6.8-s stall of four streams of six was outside the window at 12 s)
    t_first = min(m["capture"] for m in rows)
    print("the slowest frames, ms per phase (" + ", ".join(PHASES) + "), full scan, captured at (s into the run):")
    slowest = []
    for i in np.argsort(total)[::-1][:6]:
        m, prev_t, parts = rows[i], rows[i]["capture"], []
        for ph in PHASES:
            parts.append(f"{(m[ph] - prev_t) * 1e3:6.2f}")
            prev_t = m[ph]
        at = m["capture"] - t_first
        slowest.append({"ms": float(total[i]), "at_s": float(at)})
        print(f"  {total[i]:7.2f}: " + " ".join(parts) + f"  {'yes' if m.get('full_scan') else 'no':3s}  at {at:6.2f} s")
    result["slowest frames"] = slowest
    print("device stage times (CUDA events), median ms:")
    for name in stages[-1] if stages else ():
        vals = [x[name] * 1e3 for x in stages[10:] if name in x]
        result[f"device {name}"] = float(np.median(vals))
        print(f"  {name:<14s} {np.median(vals):7.3f}")
    if result_gpu is not None:
        result["gpu window"] = result_gpu
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
