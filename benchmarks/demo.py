"""End-to-end benchmark of the daemon on the demo clip (issue 2's CPU benchmark, issue 9's CPU path).

    python -m benchmarks.demo [--frames 300] [--runs 3] [--size 1280x720] [--json bench_demo.json]

Runs the real daemon (capture thread, tracking, classic swap, paste-back, publish to `null`) on the
720p demo clip in these modes and prints a table:
- ``paced``: the clip at its 30 fps, as a camera would deliver it: fps out and capture-to-publish
  latency p50/p99 under real-time load;
- ``flat out``: frames as fast as the pipeline takes them: the capacity in fps;
- ``flat out, NV12 in / I420 out``: the same with the frames in a camera's format and published in a
  virtual camera's (the colour conversions of the CPU path at work);
- ``flat out, search in the frame``: flat out with the rolling search for new faces in the frame's
  own detector call (``[track] search = "frame"``) instead of a worker beside it (the CPU's default);
and, as the naive baseline in the same run, the same frames with a full-frame detection on every
frame (no ROI tracking). Also reports the mean per-stage times, how often a full scan ran, and how
many frames the source produced against how many the daemon published: on demand (``--fast``) the
two differ only by the one or two frames in flight when the run stops; paced, frames the pipeline
was too slow for are dropped at capture (newest wins) and counted.

``--runs N`` repeats every mode N times (modes interleaved, so a slow spell of the machine touches
all of them) and reports the median with the spread of fps and latency.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from dataclasses import replace
from typing import Any

from benchmarks import write_report
from vcam.config import Config, TrackConfig
from vcam.runtime.daemon import Daemon
from vcam.types import PixelFormat


class _Counted:
    """A source that counts the frames it produced (read by the capture thread)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.produced = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def read(self) -> Any:
        frame = self._source.read()
        if frame is not None:
            self.produced += 1
        return frame

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsNV12:
    """The demo source delivering NV12, as a webcam without MJPEG does (converted on the capture thread)."""

    def __init__(self, source: Any) -> None:
        from vcam.kernels.convert import from_bgr_cv

        self._source = source
        self._convert = from_bgr_cv
        self.fmt = PixelFormat.NV12

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def read(self) -> Any:
        frame = self._source.read()
        if frame is None:
            return None
        return dataclasses.replace(frame, data=self._convert(frame.data, PixelFormat.NV12), fmt=PixelFormat.NV12)

    def close(self) -> None:
        self._source.close()


def _run(cfg: Config, frames: int, camera_formats: bool = False) -> dict:
    from vcam.stages import capture, outputs

    target = "" if camera_formats else cfg.output.target
    delivery = capture.plan_delivery(cfg.capture, target, frames)
    raw = capture.open_source(cfg.capture, delivery=delivery)
    source = _Counted(_AsNV12(raw) if camera_formats else raw)
    output = outputs.NullOutput(raw.width, raw.height, raw.fps, fmt=PixelFormat.I420) if camera_formats else None
    d = Daemon(cfg, control=False, source=source, output=output)
    t0 = time.perf_counter()
    s = d.run(max_frames=frames)
    wall = time.perf_counter() - t0
    return {
        "frames_in": s.frames_in,
        "frames_out": s.frames_out,
        "produced": source.produced,
        "fps_out": s.fps,
        "latency_p50_ms": s.percentile(50),
        "latency_p99_ms": s.percentile(99),
        "dropped_capture": s.dropped_capture,
        "dropped_latency": s.dropped_latency,
        "full_scan_pct": 100.0 * s.full_scans / max(s.frames_in, 1),
        "stage_ms": s.stage_ms,
        "wall_s": wall,
    }


def _median(runs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _spread(runs: list[dict], key: str, fmt: str = "{:.1f}") -> str:
    """``median`` for one run, ``median (min-max)`` for several."""
    med = fmt.format(_median(runs, key))
    if len(runs) < 2:
        return med
    values = [r[key] for r in runs]
    return f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _stages(runs: list[dict]) -> dict[str, float]:
    names = runs[0]["stage_ms"].keys()
    return {k: float(statistics.median(r["stage_ms"].get(k, 0.0) for r in runs)) for k in names}


def _summary(runs: list[dict]) -> dict:
    """One run as it is; several as the median of every number, with the runs themselves."""
    if len(runs) == 1:
        return runs[0]
    med: dict[str, Any] = {k: _median(runs, k) for k, v in runs[0].items() if isinstance(v, (int, float))}
    return {**med, "stage_ms": _stages(runs), "runs": runs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--runs", type=int, default=1, help="repeat every mode this many times (interleaved)")
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
    fast = base.replace(capture=replace(base.capture, pacing="fast"))
    modes: dict[str, tuple[Config, bool]] = {
        "paced (30 fps source)": (base.replace(capture=replace(base.capture, pacing="realtime")), False),
        "flat out": (fast, False),
    }
    if w % 2 == 0 and h % 2 == 0:  # 4:2:0 formats need an even size
        modes["flat out, NV12 in / I420 out"] = (fast, True)
    # The rolling search in the frame's own detector call instead of the worker beside it ([track] search).
    modes["flat out, search in the frame"] = (fast.replace(track=replace(fast.track, search="frame")), False)
    modes["naive: full scan every frame"] = (fast.replace(track=TrackConfig(rescan_every=1, search="frame")), False)
    runs: dict[str, list[dict]] = {name: [] for name in modes}
    for _ in range(max(1, args.runs)):
        for name, (cfg, camera_formats) in modes.items():
            runs[name].append(_run(cfg, args.frames, camera_formats))

    from rich.console import Console
    from rich.table import Table

    n = max(1, args.runs)
    title = f"vcam demo benchmark, {w}x{h}, {args.frames} frames, CPU ({platform.processor() or platform.machine()})"
    if n > 1:
        title += f", median (min-max) of {n} runs"
    table = Table(title=title)
    cols = ("mode", "fps out", "p50 ms", "p99 ms", "full scans %", "produced", "published", "dropped (capture)")
    for col in cols:
        table.add_column(col, justify="right" if col != "mode" else "left")
    for name, rs in runs.items():
        table.add_row(
            name,
            _spread(rs, "fps_out"),
            _spread(rs, "latency_p50_ms"),
            _spread(rs, "latency_p99_ms"),
            f"{_median(rs, 'full_scan_pct'):.1f}",
            _spread(rs, "produced", "{:.0f}"),
            _spread(rs, "frames_out", "{:.0f}"),
            _spread(rs, "dropped_capture", "{:.0f}"),
        )
    con = Console()
    if not con.is_terminal:  # a log or a pipe: wide enough for the table on one line per mode
        con = Console(width=160)
    con.print(table)
    for name in ("paced (30 fps source)", "flat out", "flat out, NV12 in / I420 out"):
        if name in runs:
            stages = _stages(runs[name])
            con.print(f"per-stage mean ms ({name}): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    results = {name: _summary(rs) for name, rs in runs.items()}
    payload = write_report(args.json, {"size": [w, h], "frames": args.frames, "runs": n, "results": results})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
