"""Pause -> resume: how soon the first swapped frame goes out after a resume, and the input closed
while paused (:mod:`vcam.runtime.pause`).

    python -m benchmarks.pause [--cycles 20] [--input demo] [--size 360p] [--fps 30] [--device cpu]
                               [--swapper classic | inswapper_128 --model-dir DIR --fp16] [--paused 0.5] [--json OUT]

A live daemon (the input paced as a camera, a null output) is paused and resumed ``--cycles`` times
through its runtime state, as `vcam ctl pause`/`resume` do. Each cycle checks that the input was
closed while paused (its source closed, its capture thread ended), counts the still cards published
meanwhile, and times, from the resume asked for: the capture opened again and adopted by the frame
loop, the first frame published through the pipeline, and the first one with a face swapped (none
with ``--input pattern``: no face). The cycles begin once the daemon runs its final models (past an
early swap's switch, its graph captures and compiled engines): a pause during start-up resumes into
models still loading. The table gives p50, p99 and the worst of each; ``--json`` has every cycle.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

SIZES = {"360p": (640, 360), "720p": (1280, 720), "1080p": (1920, 1080)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--input", default="demo", help="demo (a face to swap) or pattern (none), or a video file")
    ap.add_argument("--size", default="360p", choices=list(SIZES))
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--swapper", default="classic")
    ap.add_argument("--model-dir", default="", help="the models' folder (a swap network's stand-in)")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--paused", type=float, default=0.5, help="seconds each pause lasts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from vcam.config import Config
    from vcam.runtime.daemon import Daemon
    from vcam.stages.outputs import NullOutput

    w, h = SIZES[args.size]
    cfg = Config()
    cfg = cfg.replace(
        capture=replace(cfg.capture, input=args.input, width=w, height=h, fps=args.fps, pacing="realtime"),
        pipeline=replace(cfg.pipeline, device=args.device, fp16=args.fp16),
        swap=replace(cfg.swap, swapper=args.swapper),
        output=replace(cfg.output, target="null"),
    )
    if args.model_dir:
        cfg = cfg.replace(models=replace(cfg.models, dir=args.model_dir))
    published: list[tuple[float, int]] = []  # (time, faces swapped)

    def hook(mark) -> None:
        if mark.phase == "published" and mark.stats is not None:
            published.append((mark.t, mark.stats.swapped))

    out = NullOutput(w, h, args.fps)
    d = Daemon(cfg, output=out, control=False, hook=hook)
    d.start()
    if not d.ready.wait(300) or d.summary.error:
        print(f"the daemon did not start: {d.summary.error}", file=sys.stderr)
        return 1
    st = d.streams[0]
    wait_until(lambda: len(published) >= 10, 60)
    # The cycles time a running daemon's pause: past an early swap's switch to the GPU and the work
    # that begins after it (graph captures, compiled engines), which the first cycle on the H200 met
    # (0.6 s, its p99). A pause during start-up resumes into the models still loading.
    wait_until(lambda: d.up.early is None, 300)
    settled = len(published)
    wait_until(lambda: len(published) >= settled + 10, 60)
    if d.assembly is not None:
        settle(d.assembly, 120)
    wait_until(lambda: len(published) >= settled + 20, 60)
    cycles = []
    try:
        for _ in range(args.cycles):
            t_pause = time.perf_counter()
            d.state.set_paused(True)
            wait_until(lambda: st.paused and st.cap is not None and st.cap.join(0), 10)
            closed_after = time.perf_counter() - t_pause
            source = st.source
            sent = out.frames
            time.sleep(args.paused)
            closed = bool(source is not None and source.closed and st.cap is not None and st.cap.join(0))
            cards = out.frames - sent
            t = time.perf_counter()
            d.state.set_paused(False)
            first = first_after(published, t, swapped=False) - t
            swapped = first_after(published, t, swapped=True) - t if args.input != "pattern" else None
            adopted = d.pauses.resumes[-1][1] if d.pauses.resumes else None
            cycles.append(
                {
                    "closed_while_paused": closed,
                    "pause_to_closed_s": closed_after,
                    "cards_per_s": cards / args.paused,
                    "resume_to_capture_s": adopted,
                    "resume_to_first_frame_s": first,
                    "resume_to_first_swapped_s": swapped,
                }
            )
            time.sleep(0.3)
    finally:
        d.stop()
    rows = [
        ("pause -> input closed", "pause_to_closed_s"),
        ("resume -> capture adopted", "resume_to_capture_s"),
        ("resume -> first frame out", "resume_to_first_frame_s"),
        ("resume -> first swapped frame", "resume_to_first_swapped_s"),
    ]
    print(f"{args.cycles} pause/resume cycles, {args.input} {args.size} @ {args.fps:g} fps on {args.device} ({args.swapper})")
    print(f"{'':32} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    summary = {}
    for label, key in rows:
        values = [c[key] for c in cycles if c[key] is not None]
        if not values:
            continue
        p50, p99, worst = (float(np.percentile(values, 50)), float(np.percentile(values, 99)), max(values))
        summary[key] = {"p50": p50, "p99": p99, "max": worst}
        print(f"{label:32} {p50 * 1e3:8.1f} {p99 * 1e3:8.1f} {worst * 1e3:8.1f}")
    closed = sum(c["closed_while_paused"] for c in cycles)
    cards = float(np.median([c["cards_per_s"] for c in cycles]))
    print(f"input closed while paused: {closed} of {len(cycles)} cycles; still cards {cards:.1f} a second (median)")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "cycles": cycles}, indent=2)
        )
    return 0 if closed == len(cycles) and d.summary.error is None else 1


def first_after(published: list[tuple[float, int]], t: float, *, swapped: bool, timeout: float = 10.0) -> float:
    """When the first frame (with a face swapped) went out after ``t``."""
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        for p, n in list(published):
            if p >= t and (n or not swapped):
                return p
        time.sleep(0.001)
    raise TimeoutError("no frame after the resume")


def settle(assembly, timeout: float) -> None:
    """Wait for the models' background work (graph captures, compiled engines loading) without
    taking part: the frame thread adopts what they made between two frames."""
    for model in (assembly.detector, assembly.swapper):
        engine = getattr(model, "engine", None)
        wait_graphs = getattr(engine, "wait_graphs", None)
        if wait_graphs is not None:
            wait_graphs(timeout)
        loader = getattr(engine, "loader", None)
        if loader is not None:
            loader.wait(timeout)


def wait_until(pred, timeout: float) -> None:
    end = time.perf_counter() + timeout
    while not pred():
        if time.perf_counter() > end:
            raise TimeoutError("timed out")
        time.sleep(0.001)


if __name__ == "__main__":
    sys.exit(main())
