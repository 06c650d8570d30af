"""Which CuPy kernels the frames build after the start's warm-up (issue 39's first seconds).

CuPy builds each of its kernels (an element-wise op, a reduction, an index gather) at its first call
in a process: NVRTC, or its disk cache. On the H100 each build took 70-90 ms of the frame loop's
thread, the GPU idle meanwhile: four streams of six faces stood still 0.55 s at the first track a
frame missed (seven builds in the GPU window of 2026-12-07: the look-alike's arithmetic), and a
fresh machine pays the first applied detection's builds (the looks' gather) inside its first
seconds. A start's warm-up (:meth:`vcam.runtime.assemble.Assembly.warmup`) builds them before the
first frame; this measures what is left.

In a fresh process (CuPy remembers the kernels it built): an assembly with the swapper asked (the
classic one, no weights; or the inswapper's tiny stand-in, ``vcam models stand-in``, with the
recogniser's), its warm-up as ``vcam run`` does it, then a clip of two real portraits (photographs) that
leave the frame and come back, through a patient pipeline (every frame waits for its detection: a
face that leaves is a lost track looked for again) and the daemon's (predicting, never waiting).
Every build is counted with its kernel's name and time, by phase. On the CPU nothing is built: the
run then shows the clip's scenario (faces lost and looked for again) and the tables' shape.

    python -m benchmarks.kernel_builds [--device cuda] [--swapper classic|inswapper_128] [--size 720p] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import write_report
from benchmarks.streams import _size
from vcam.config_file import build as build_config
from vcam.runtime.assemble import build as build_assembly
from vcam.runtime.assemble import load_faces
from vcam.stages.demo import gradient, group_frame
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat

ASSETS = Path(__file__).resolve().parents[1] / "vcam" / "assets"
#: The clip: faces in view for ``IN`` frames, gone for ``OUT``, back for ``IN`` (frames per phase).
IN, OUT = 24, 10


@contextlib.contextmanager
def counting_builds(builds: list[dict]) -> Iterator[bool]:
    """Record each CuPy kernel build inside (``{"kernels": names, "ms": time, "phase": ...}`` into
    ``builds``; the caller sets ``builds``' phase by appending a marker dict). Yields whether CuPy is
    there to count (False: nothing can be built, the CPU)."""
    try:
        from cupy.cuda import compiler
    except ImportError:
        yield False
        return
    inner = compiler._compile_module_with_cache

    def timed(source: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(source, *args, **kwargs)
        finally:
            names = re.findall(r"__global__\s+void\s+(\w+)", source) or ["?"]
            builds.append({"kernels": names, "ms": (time.perf_counter() - t0) * 1e3})

    compiler._compile_module_with_cache = timed
    try:
        yield True
    finally:
        compiler._compile_module_with_cache = inner


def clip(width: int, height: int) -> list[np.ndarray]:
    """The demo's two drifting portraits (:func:`~vcam.stages.demo.group_frame`), then the empty
    room for ``OUT`` frames, then the two again (BGR uint8 frames)."""
    room = gradient(width, height)
    return [
        room.copy() if IN <= i < IN + OUT else group_frame(width, height, 2, i, IN, background=room) for i in range(2 * IN + OUT)
    ]


def run_frames(pipe: Any, frames: list[np.ndarray], snap: Any, *, daemon: bool) -> dict:
    """The frames through ``pipe`` as the daemon's loop takes them (``daemon``: published, then the
    detection queued, settled while it waits) or one by one, each waiting for its detection."""
    swapped = looked = 0
    tracker = pipe.tracker
    inner = tracker._look_again

    def spy(frame: Any, seq: int, held: list) -> None:
        nonlocal looked
        looked += len(held)
        inner(frame, seq, held)

    tracker._look_again = spy
    try:
        for i, img in enumerate(frames):
            h, w = img.shape[:2]
            frame = Frame(img, w, h, PixelFormat.BGR, time.perf_counter(), i)
            if daemon:
                _, stats = pipe.collect(pipe.submit(frame, snap, detect_now=False))
                pipe.launch_detection()
                deadline = time.monotonic() + 10.0
                while not pipe.settle() and time.monotonic() < deadline:
                    time.sleep(0.0005)
            else:
                _, stats = pipe.process(frame, snap)
            swapped += stats.swapped
    finally:
        del tracker._look_again
    return {"frames": len(frames), "faces swapped": swapped, "tracks looked for again": looked}


def measure(device: str, size: str, swapper: str = "classic") -> dict:
    width, height = _size(size)
    builds: list[dict] = []
    phases: list[tuple[str, int]] = []
    with counting_builds(builds) as counts, tempfile.TemporaryDirectory() as models:
        settings: dict[str, Any] = {"pipeline": {"device": device}, "swap": {"swapper": swapper}}
        if swapper != "classic":
            from vcam.models import standin

            for name in (swapper, "arcface_w600k_r50"):
                standin.write(name, models, tiny=True)
            settings["models"] = {"dir": models}
        cfg = build_config(settings)
        asm = build_assembly(cfg)
        state = RuntimeState()
        load_faces(asm, state, demo_input=False, source=str(ASSETS / "astronaut.jpg"))  # as `vcam run --face` does
        snap = state.snapshot()
        frames = clip(width, height)
        phases.append(("start (assembly, source face)", len(builds)))
        patient = asm.make_pipeline(PixelFormat.BGR, width=width, height=height, in_fmt=PixelFormat.BGR, predict=False)
        daemon = asm.make_pipeline(
            PixelFormat.BGR, width=width, height=height, in_fmt=PixelFormat.BGR, predict=True, patient=False
        )
        phases.append(("warm-up (Assembly.warmup)", len(builds)))
        runs = {"patient": run_frames(patient, frames, snap, daemon=False)}
        phases.append(("frames, patient", len(builds)))
        runs["daemon"] = run_frames(daemon, frames, snap, daemon=True)
        phases.append(("frames, daemon", len(builds)))
    report: dict[str, Any] = {
        "device": device,
        "size": size,
        "swapper": swapper,
        "counts builds": counts,
        "runs": runs,
        "phases": {},
    }
    start = 0
    for name, end in phases:
        got = builds[start:end]
        report["phases"][name] = {
            "builds": len(got),
            "ms": round(sum(b["ms"] for b in got), 1),
            "kernels": [k for b in got for k in b["kernels"]],
        }
        start = end
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--size", default="720p", help="360p, 720p, 1080p, 4k or WxH")
    ap.add_argument("--swapper", default="classic", choices=("classic", "inswapper_128"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    report = measure(args.device, args.size, args.swapper)
    print(
        f"CuPy kernel builds by phase, {args.device}, {args.swapper}, {args.size}"
        + ("" if report["counts builds"] else " (no CuPy: none)")
    )
    print(f"  {'phase':32s} {'builds':>6s} {'ms':>8s}  kernels")
    for name, p in report["phases"].items():
        print(f"  {name:32s} {p['builds']:6d} {p['ms']:8.1f}  {', '.join(p['kernels'][:8])}")
    for name, r in report["runs"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    if args.json:
        write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
