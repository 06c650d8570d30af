"""Several streams in one daemon against one process per stream (issue 12 part 1).

    python -m benchmarks.streams [--device cuda] [--streams 4] [--size 1080p] [--seconds 8]
        [--swapper inswapper_128 --model-dir DIR] [--fp16] [--json bench_streams.json]

Every stream plays the same one-face clip (the demo clip's first frames, rendered once and kept in
memory, so the source costs nothing) to the null output. Four rows, all in the same run:

- ``one daemon, flat out``: one ``vcam`` daemon with N streams read on demand: total frames
  published per second, and each stream's capture-to-publish p50/p99;
- ``N processes, flat out``: N separate daemon processes of one stream each (the naive baseline:
  models, CUDA context and batches per process), started together and measured over the same time;
- ``one daemon, paced`` / ``N processes, paced``: the same with every stream at the clip's 30 fps,
  as cameras deliver: the latency under real-time load. The streams' frames come out of step, evenly
  over one frame time, on fixed slots of the shared clock (``--phases in``: all at once, the
  worst case).

On CUDA with NVML (``fastswap-cam[nvml]``) each row also has the GPU's mean utilisation and power
over the measured seconds (the whole GPU, every process on it).

The processes are started first and wait at a barrier until every one has loaded its models, so
start-up is not measured; each then runs for ``--seconds``. The column ``after 1 s`` is the worst
stream's p99 over the frames published after the run's first second (the first rounds of a run meet
whatever was not warmed up). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from benchmarks import write_report
from vcam.config import Config
from vcam.config_file import build
from vcam.runtime.daemon import Daemon
from vcam.runtime.rounds import Mark, RoundHook
from vcam.stages.outputs import NullOutput
from vcam.stages.sources import DemoSource

SIZES = {"360p": (640, 360), "720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160)}


def _size(name: str) -> tuple[int, int]:
    """``360p``/``720p``/``1080p``/``4k`` or ``WxH``."""
    if name in SIZES:
        return SIZES[name]
    w, _, h = name.lower().partition("x")
    return int(w), int(h)


class _Frames:
    """A clip for :class:`DemoSource`, rendered once: ``count`` frames of the demo clip (one face),
    or of ``faces`` portraits on a grid (:func:`vcam.stages.demo.group_frame`). Either loops without a
    jump (the demo clip's ``count`` frames are one whole pan cycle), as a camera's face never
    jumps: a jump loses the track and costs a full scan, which would measure the loop, not the
    daemon."""

    def __init__(self, width: int, height: int, count: int = 150, fps: float = 30.0, seed: int = 0, faces: int = 1) -> None:
        from vcam.stages.demo import DemoClip, gradient, group_frame

        self.width, self.height, self.fps, self.n_frames = width, height, fps, count
        if faces == 1:
            clip = DemoClip(width=width, height=height, fps=fps, seconds=count / fps, seed=seed)
            self._frames = [clip.frame(i) for i in range(count)]
        else:
            bg = gradient(width, height)
            self._frames = [group_frame(width, height, faces, i, count, background=bg) for i in range(count)]

    def frame(self, i: int) -> np.ndarray:
        return self._frames[i % self.n_frames]


class _Camera(DemoSource):
    """The demo clip delivered like a camera: frame slots at ``phase + k / fps`` on the shared
    monotonic clock (``time.perf_counter``, the same in every process), a read waits for the next
    slot, and a late read takes the next free slot: like a camera, it drops frames but never drifts
    out of its phase (a pacer that restarts its clock after a stall, as during start-up, would let
    the streams fall into step)."""

    def __init__(self, clip: _Frames, phase: float, **kw: Any) -> None:
        super().__init__(clip, realtime=False, **kw)
        self._phase, self._period = phase, 1.0 / clip.fps
        self._slot: int | None = None

    def read(self) -> Any:
        now = time.perf_counter()
        k = math.ceil((now - self._phase) / self._period)
        if self._slot is not None:
            k = max(k, self._slot + 1)
        self._slot = k
        due = self._phase + k * self._period
        if due > now:
            time.sleep(due - now)
        return super().read()


def _phase(args: argparse.Namespace, index: int, streams: int, fps: float) -> float:
    """Stream ``index``'s first frame slot: out of phase, evenly over one frame time (cameras are
    not synchronised), or with ``--phases in`` all at once (the worst case for one GPU)."""
    offset = 0.0 if getattr(args, "phases", "out") == "in" else index / fps / streams
    return float(args.epoch) + offset


def _config(args: argparse.Namespace, streams: int, paced: bool) -> Config:
    w, h = _size(args.size)
    data: dict[str, Any] = {
        "capture": {"width": w, "height": h, "pacing": "realtime" if paced else "fast", "loop": True},
        "pipeline": {
            "device": args.device,
            "fp16": bool(args.fp16),
            "max_latency": 0,
            "max_faces": args.max_faces,
            "compile": getattr(args, "compile", "auto"),
        },
        "swap": {"swapper": args.swapper},
        "streams": [{"name": f"s{i + 1}", "input": "demo", "output": "null"} for i in range(streams)],
        "status": {"interval": "1s"},
    }
    if args.model_dir:
        data["models"] = {"dir": args.model_dir}
    if args.deadline is not None:
        data["pipeline"]["batch_deadline"] = args.deadline
    if getattr(args, "predict", None):
        data["track"] = {"predict": args.predict}
    return build(data)


def _daemon(
    args: argparse.Namespace, streams: int, paced: bool, *, hook: RoundHook | None = None, timing: bool = False
) -> Daemon:
    cfg = _config(args, streams, paced)
    w, h = _size(args.size)
    frames = _Frames(w, h, faces=args.faces)
    sources: dict[str, DemoSource] = {}
    for i, (name, _) in enumerate(cfg.per_stream()):
        if paced:
            index, of = (i, streams) if getattr(args, "index", None) is None else (args.index, args.of)
            sources[name] = _Camera(frames, _phase(args, index, of, frames.fps), loop=True)
        else:
            sources[name] = DemoSource(frames, loop=True, realtime=False)
    outputs = {name: NullOutput(w, h) for name, _ in cfg.per_stream()}
    return Daemon(cfg, sources=sources, outputs=outputs, control=False, hook=hook, timing=timing)


def make_daemon(
    *,
    streams: int,
    paced: bool = False,
    size: str = "1080p",
    device: str = "cuda",
    swapper: str = "inswapper_128",
    model_dir: str = "",
    fp16: bool = True,
    max_faces: int = 8,
    faces: int = 1,
    compile: str = "auto",
    deadline: str | None = None,
    hook: RoundHook | None = None,
    timing: bool = False,
    predict: str | None = None,
) -> Daemon:
    """The benchmark's daemon (``streams`` demo-clip streams to the null output) from keywords, for
    tools that time its phases (tools/profile_streams.py, tools/latency_breakdown.py) through
    ``hook`` (:data:`vcam.runtime.rounds.RoundHook`); ``timing``: device-side stage times;
    ``predict``: ``[track] predict`` (None: the default)."""
    args = argparse.Namespace(
        size=size,
        device=device,
        epoch=time.perf_counter(),
        fp16=fp16,
        max_faces=max_faces,
        swapper=swapper,
        model_dir=model_dir,
        deadline=deadline,
        faces=faces,
        compile=compile,
        predict=predict,
    )
    return _daemon(args, streams, paced, hook=hook, timing=timing)


#: Seconds at the start of a measured run whose frames the steady-state figures leave out.
SETTLE_S = 1.0


def _measure(daemon: Daemon, seconds: float, settle: float = SETTLE_S) -> dict:
    """Run the frame loop for ``seconds``; per stream the frames, fps and capture-to-publish p50/p99,
    over all frames and (``steady_``: p50, p99 and fps) over the frames published after the first
    ``settle`` seconds, and the first five frames' latencies. Frames captured before the run are not timed."""
    marks: dict[str, int] = {}
    t_start: list[float] = []
    t_mark: list[float] = []

    def hook(m: Mark) -> None:  # the frames published before ``settle`` into the run are left out of steady_
        if m.phase == "published" and not marks and m.t - t_start[0] >= settle:
            marks.update({name: len(s.latencies_ms) for name, s in daemon.summaries.items()})
            t_mark.append(time.perf_counter())

    for st in daemon.streams:  # a frame captured before the run (while start-up was awaited) is not timed
        if st.cap is not None:
            st.cap.get(timeout=0)
    daemon.rounds.hook = hook
    t_start.append(time.perf_counter())
    try:
        daemon.main_loop(None, seconds)
    finally:
        daemon.rounds.hook = None
    steady_s = time.perf_counter() - t_mark[0] if t_mark else 0.0
    rows = {}
    for name, s in daemon.summaries.items():
        steady = np.fromiter(s.latencies_ms, float)[marks.get(name, 0) :]
        rows[name] = {
            "frames": s.frames_out,
            "seconds": s.seconds,
            "fps": s.fps,
            "p50_ms": s.percentile(50),
            "p99_ms": s.percentile(99),
            "steady_p50_ms": float(np.percentile(steady, 50)) if steady.size else 0.0,
            "steady_p99_ms": float(np.percentile(steady, 99)) if steady.size else 0.0,
            "steady_fps": steady.size / steady_s if marks and steady_s > 0 else 0.0,
            "first_ms": [round(float(x), 2) for x in list(s.latencies_ms)[:5]],
        }
    return rows


def _one_daemon(args: argparse.Namespace, paced: bool) -> dict:
    daemon = _daemon(args, args.streams, paced)
    daemon.startup()
    daemon.wait_compiled(300)  # time the compiled swapper where it is built
    try:
        with _GpuLoad(args.device) as load:
            rows = _measure(daemon, args.seconds)
    finally:
        daemon.shutdown()
    return {**_total(rows), **load.result()}


def _total(rows: dict) -> dict:
    def worst(key: str) -> float:
        return max((r.get(key, 0.0) for r in rows.values()), default=0.0)

    return {
        "streams": rows,
        "total_fps": sum(r["fps"] for r in rows.values()),
        "total_steady_fps": sum(r.get("steady_fps", 0.0) for r in rows.values()),
        "worst_p50_ms": worst("p50_ms"),
        "worst_p99_ms": worst("p99_ms"),
        "worst_steady_p50_ms": worst("steady_p50_ms"),
        "worst_steady_p99_ms": worst("steady_p99_ms"),
    }


def _processes(args: argparse.Namespace, paced: bool) -> dict:
    """N worker processes of one stream each, released together once all have started up."""
    cmd = [sys.executable, "-m", "benchmarks.streams", "--worker", "--size", args.size, "--device", args.device]
    cmd += ["--swapper", args.swapper, "--seconds", str(args.seconds), "--max-faces", str(args.max_faces)]
    cmd += ["--compile", args.compile, "--faces", str(args.faces)]
    cmd += ["--fp16"] if args.fp16 else []
    cmd += ["--model-dir", args.model_dir] if args.model_dir else []
    cmd += ["--paced", "--phases", args.phases, "--epoch", repr(args.epoch), "--of", str(args.streams)] if paced else []
    env = dict(os.environ)
    procs = [
        subprocess.Popen(cmd + ["--index", str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for i in range(args.streams)
    ]
    try:
        for p in procs:  # each says "ready" once its models are loaded
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")
        with _GpuLoad(args.device) as load:
            for p in procs:  # each stream's frames come in its own phase (_Camera)
                p.stdin.write("go\n")
                p.stdin.flush()
            rows = {}
            for i, p in enumerate(procs):
                out, _ = p.communicate(timeout=args.seconds + 120)
                rows[f"p{i + 1}"] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {**_total(rows), **load.result()}


def _worker(args: argparse.Namespace) -> None:
    daemon = _daemon(args, 1, args.paced)
    daemon.startup()
    daemon.wait_compiled(300)  # time the compiled swapper where it is built
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        rows = _measure(daemon, args.seconds)
    finally:
        daemon.shutdown()
    print(json.dumps(next(iter(rows.values()))), flush=True)


class _GpuLoad:
    """Mean GPU utilisation and power over a mode, read through NVML (:mod:`vcam.telemetry`) every
    0.25 s; nothing when NVML is not there. The whole GPU: every process on it counts."""

    def __init__(self, device: str) -> None:
        self.util: list[float] = []
        self.power: list[float] = []
        self._stop = threading.Event()
        self._tel = None
        if device == "cuda":
            from vcam.config import TelemetryConfig
            from vcam.telemetry import open_telemetry

            self._tel = open_telemetry(TelemetryConfig(enabled="auto", interval=0.2), "cuda", warn=None)
        self._thread = threading.Thread(target=self._run, daemon=True) if self._tel is not None else None

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            s = self._tel.latest()
            if s is not None and s.util_gpu_pct is not None:
                self.util.append(float(s.util_gpu_pct))
            if s is not None and s.power_w is not None:
                self.power.append(float(s.power_w))

    def __enter__(self) -> _GpuLoad:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._tel is not None:
            self._tel.stop()

    def result(self) -> dict:
        if not self.util:
            return {}
        return {"gpu_util_pct": float(np.mean(self.util)), "gpu_power_w": float(np.mean(self.power)) if self.power else None}


def _gpu_memory() -> dict:
    try:
        import torch

        if torch.cuda.is_available():
            return {"torch_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20}
    except ImportError:
        pass
    return {}


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--size", default="1080p", help="720p, 1080p, 4k or WxH")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--swapper", default="classic")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--max-faces", type=int, default=8)
    ap.add_argument("--faces", type=int, default=1, help="faces in each frame (1: the demo clip; more: portraits on a grid)")
    ap.add_argument("--deadline", default=None, help="[pipeline] batch_deadline, e.g. 2ms")
    ap.add_argument("--compile", default="auto", choices=("auto", "off"), help="[pipeline] compile")
    ap.add_argument("--modes", default="daemon,processes,daemon-paced,processes-paced")
    ap.add_argument("--json", default="bench_streams.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--phases", default="out", choices=("out", "in"), help="paced streams' frames out of step, or all at once")
    ap.add_argument("--paced", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--epoch", type=float, default=None, help=argparse.SUPPRESS)  # the paced frame slots' origin
    ap.add_argument("--index", type=int, default=None, help=argparse.SUPPRESS)  # a worker's stream, of --of
    ap.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.epoch is None:
        args.epoch = time.perf_counter()
    if args.worker:
        _worker(args)
        return None
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, dict] = {}
    for mode in modes:
        paced = mode.endswith("-paced")
        t0 = time.perf_counter()
        if mode.startswith("daemon"):
            results[mode] = _one_daemon(args, paced)
        else:
            results[mode] = _processes(args, paced)
        results[mode]["wall_s"] = time.perf_counter() - t0
    n = args.streams
    fp = " fp16" if args.fp16 else ""
    faces = f"{args.faces} face{'s' if args.faces > 1 else ''}"
    print(f"{n} streams of {args.size} {faces}, {args.swapper}{fp} on {args.device}, {args.seconds:g} s each")
    print(
        f"{'mode':<28} {'total fps':>10} {'per stream fps':>16} {'worst p50 ms':>13} {'worst p99 ms':>13} "
        f"{'after 1 s':>10} {'GPU util %':>10}"
    )
    labels = {
        "daemon": f"one daemon, {n} streams",
        "processes": f"{n} processes",
        "daemon-paced": f"one daemon, {n} x 30 fps{' in step' if args.phases == 'in' else ''}",
        "processes-paced": f"{n} processes, 30 fps{' in step' if args.phases == 'in' else ''}",
    }
    for mode, r in results.items():
        per = ", ".join(f"{s['fps']:.0f}" for s in r["streams"].values())
        lat = f"{r['worst_p50_ms']:>13.2f} {r['worst_p99_ms']:>13.2f} {r.get('worst_steady_p99_ms', 0.0):>10.2f}"
        util = f"{r['gpu_util_pct']:>10.0f}" if "gpu_util_pct" in r else f"{'-':>10}"
        print(f"{labels.get(mode, mode):<28} {r['total_fps']:>10.1f} {per:>16} {lat} {util}")
    if "daemon" in results and "processes" in results and results["processes"]["total_fps"] > 0:
        ratio = results["daemon"]["total_fps"] / results["processes"]["total_fps"]
        print(f"throughput, one daemon / {n} processes: {ratio:.2f}x")
        results["throughput_ratio"] = ratio  # type: ignore[assignment]
    payload = write_report(
        args.json,
        {
            "streams": n,
            "size": args.size,
            "device": args.device,
            "swapper": args.swapper,
            "fp16": bool(args.fp16),
            "seconds": args.seconds,
            "phases": args.phases,
            "results": results,
            "gpu_memory": _gpu_memory(),
            "threads": threading.active_count(),
        },
    )
    return payload


if __name__ == "__main__":
    main()
