"""The round hook's host CPU clock (issue 28): every mark carries the frame loop's CPU time so far
(``Mark.cpu``), so a tool measures the loop's CPU per frame without patching anything;
benchmarks.latency_breakdown reports it."""

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import WINDOWS

from vcam.config import Config, Duration
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput

ROOT = Path(__file__).resolve().parents[2]


def test_marks_carry_the_loops_cpu_time():
    """Each mark's ``cpu`` is the loop thread's CPU clock: it only grows, the hook sees it on the
    thread it runs on, and between two frames out it is at most the wall time between them (the
    loop's waits are not CPU time; its work is)."""
    cfg = Config()
    cfg = cfg.replace(
        capture=replace(cfg.capture, input="demo", width=320, height=180, pacing="fast"),
        pipeline=replace(cfg.pipeline, device="cpu", max_latency=Duration(0)),
        output=replace(cfg.output, target="null"),
    )
    marks = []

    def hook(m):
        marks.append((m, time.thread_time()))

    Daemon(cfg, output=NullOutput(320, 180, 30.0), control=False, hook=hook).run(max_frames=8)
    assert len([m for m, _ in marks if m.phase == "published"]) == 8
    cpus = [m.cpu for m, _ in marks]
    assert all(c > 0 for c in cpus) and cpus == sorted(cpus)
    assert all(m.cpu <= seen for m, seen in marks)  # the same clock, read just before the hook
    out = [m for m, _ in marks if m.phase == "published"]
    spent = [(b.cpu - a.cpu, b.t - a.t) for a, b in zip(out, out[1:])]
    if WINDOWS:  # thread CPU time advances in scheduler ticks (15.6 ms; 10 ms under Wine): a frame may show 0
        assert all(0 <= cpu <= wall + 0.016 for cpu, wall in spent) and sum(c for c, _ in spent) > 0, spent
    else:
        assert all(0 < cpu <= wall + 0.002 for cpu, wall in spent), spent


@pytest.mark.slow
def test_latency_breakdown_reports_host_cpu_per_frame(tmp_path):
    """`python -m benchmarks.latency_breakdown` on the CPU, small: the host CPU rows in the table
    and the JSON, for the daemon's path and the patient one (the A/B of issue 28)."""
    for extra in ([], ["--patient"]):
        out = tmp_path / f"lb{len(extra)}.json"
        cmd = [sys.executable, "-m", "benchmarks.latency_breakdown", "--device", "cpu", "--swapper", "classic",
               "--size", "480x270", "--seconds", "2", "--predict", "on", "--first", "0", "--json", str(out), *extra]  # fmt: skip
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "host CPU of the frame loop's thread" in res.stdout
        got = json.loads(out.read_text())
        for key in ("host CPU ms per frame p50", "host CPU ms per frame p99", "host CPU ms gathered->finished p50"):
            assert got[key] > 0, (key, got)
        assert got["host CPU ms per frame p50"] <= got["host CPU ms per frame p99"]
        # the slowest frames say when they were captured, within the timed run, slowest first
        slow = got["slowest frames"]
        assert slow and all(0.0 <= f["at_s"] <= 5.0 for f in slow), slow  # a 2-s run
        assert [f["ms"] for f in slow] == sorted((f["ms"] for f in slow), reverse=True)
        assert "at " in res.stdout.split("the slowest frames")[1]
