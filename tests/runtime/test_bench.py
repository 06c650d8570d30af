"""`vcam bench` as a user types it, on the CPU (the GPU rig shares its snapshot and tracker)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vcam.cli import app
from vcam.runtime.bench_rig import bench_snapshot
from vcam.state import Snapshot


def test_vcam_bench_on_the_cpu_times_the_pipeline_and_the_naive_loop(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--device", "cpu", "--size", "720p", "--faces", "1", "--frames", "4", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    (row,) = res["gpu"]
    assert (row["size"], row["faces"]) == ("1280x720", 1)
    assert row["p50_ms"] > 0 and row["fps_pipelined"] > 0
    # every stage of a swapped frame ran: the face was found, swapped and pasted
    assert all(row["stages_ms"][k] > 0 for k in ("convert_in", "detect_track", "swap", "blend", "convert_out"))
    (naive,) = res["naive"]
    assert naive["p50_ms"] > row["p50_ms"]


def test_the_bench_snapshot_is_the_state_s_own_with_no_desk_setting():
    snap = bench_snapshot("face")
    assert isinstance(snap, Snapshot)
    assert (snap.face, snap.swap_enabled, dict(snap.settings), snap.mapping) == ("face", True, {}, ())
