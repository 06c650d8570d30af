"""No kernel is built on the frame path after the start's warm-up (issue 39's first seconds): on CUDA
each CuPy kernel is built at its first call in a process, 70-90 ms of the loop's thread apiece on the
H100 (a four-stream run stood still 0.55 s at the first track a frame missed). benchmarks/
kernel_builds.py runs a real clip (two photographs that leave and come back) through the patient
and the daemon's pipelines after ``Assembly.warmup``; on CUDA in a fresh process, so no kernel an
earlier test built hides one. Both swappers: the network's path and the classic one (its colour
fit, warp grid and local colour match: 13 builds, 2.75 s of a fresh H100's first face before
``ClassicSwapper.warm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.kernel_builds import IN, OUT, clip, counting_builds, measure
from vcam.stages.detect import RetinaFaceDetector

ROOT = Path(__file__).resolve().parents[2]


def test_the_clip_has_two_faces_that_leave_and_come_back():
    frames = clip(640, 360)
    detector = RetinaFaceDetector()
    assert len(frames) == 2 * IN + OUT
    assert [len(detector.detect(frames[i])) for i in (0, IN - 1, IN, IN + OUT - 1, IN + OUT, 2 * IN + OUT - 1)] == [
        2,
        2,
        0,
        0,
        2,
        2,
    ]


@pytest.mark.parametrize("swapper", ["inswapper_128", "classic"])
def test_on_the_cpu_the_clip_loses_tracks_and_builds_nothing(swapper):
    """The scenario the CUDA run counts in: faces swapped, then lost and looked for again (the path
    whose arithmetic built seven kernels at its first call), in both pipelines; no CuPy, no build."""
    report = measure("cpu", "360p", swapper)
    assert report["counts builds"] is False
    for name, run in report["runs"].items():
        assert run["faces swapped"] >= 2 * 2 * (IN - 4), (name, run)  # two faces, all but the first frames
        assert run["tracks looked for again"] >= 1, (name, run)
    assert all(p["builds"] == 0 for p in report["phases"].values())


def test_the_counter_sees_a_build_and_restores_cupy():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (the GPU path's array library)")
    from cupy.cuda import compiler

    before = compiler._compile_module_with_cache
    builds: list[dict] = []
    with counting_builds(builds) as counts:
        kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 3.25f + 0.125f", f"vcam_probe_{os.getpid()}")
        try:
            kernel(cupy.ones(4, np.float32))
        except Exception as exc:  # CuPy without a device
            pytest.skip(f"CuPy cannot run a kernel here ({exc})")
    assert counts and compiler._compile_module_with_cache is before
    assert any(f"vcam_probe_{os.getpid()}" in b["kernels"] for b in builds), builds


@pytest.mark.gpu
@pytest.mark.parametrize("swapper", ["inswapper_128", "classic"])
def test_after_the_warm_up_the_gpu_frames_build_no_kernel(tmp_path, swapper):
    from vcam.ops import cuda_status

    ok, why = cuda_status()
    if not ok:
        from conftest import require

        require("gpu", why)
    out = tmp_path / "builds.json"
    cmd = [sys.executable, "-m", "benchmarks.kernel_builds", "--device", "cuda", "--size", "720p", "--swapper", swapper]
    cmd += ["--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    phases = report["phases"]
    assert report["counts builds"] is True
    assert phases["warm-up (Assembly.warmup)"]["builds"] + phases["start (assembly, source face)"]["builds"] > 0, phases
    for name in ("frames, patient", "frames, daemon"):
        assert phases[name]["builds"] == 0, (name, phases[name], proc.stdout)
    for name, run in report["runs"].items():
        assert run["tracks looked for again"] >= 1, (name, run)
