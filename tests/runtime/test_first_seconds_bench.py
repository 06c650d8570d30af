"""`benchmarks/first_seconds.py`, issue 39's instrument, on the CPU: the real `vcam run` in a child,
its frames, and with ``--stalls`` the GIL waits and the garbage collector's passes reported."""

from __future__ import annotations

import json

from benchmarks import first_seconds


def test_a_short_cpu_start_is_measured_with_its_stalls_and_collections(tmp_path, capsys):
    out = tmp_path / "fs.json"
    args = ["--device", "cpu", "--model", "classic", "--duration", "4", "--window", "3", "--runs", "1", "--stalls"]
    first_seconds.main([*args, "--json", str(out)])
    (run,) = json.loads(out.read_text())["runs"]["this"]
    assert run["rc"] == 0, run["tail"]
    (row,) = run["rows"]
    # what the benchmark reads, not how fast this machine is (under Wine on a busy machine 29 % went out;
    # a window edge can count one frame over the camera's rate)
    assert row["frames"] > 30 and row["published"] > 0 and row["first_s"] is not None
    assert isinstance(run["stalls"], list) and isinstance(run["gc"], list)
    for c in run["gc"]:
        assert c["generation"] in (0, 1, 2) and c["ms"] >= 0 and c["thread"]
    assert "first seconds" in capsys.readouterr().out


def test_also_env_takes_one_pair_or_several_set_together():
    assert first_seconds.env_pairs("VCAM_WARM_SWAP=0") == {"VCAM_WARM_SWAP": "0"}
    got = first_seconds.env_pairs("VCAM_TUNE_BACKGROUND=1  VCAM_BACKGROUND_PACE=2,1 EMPTY=")
    assert got == {"VCAM_TUNE_BACKGROUND": "1", "VCAM_BACKGROUND_PACE": "2,1", "EMPTY": ""}
    try:
        first_seconds.env_pairs("VCAM_TUNE_BACKGROUND")
    except SystemExit as exc:
        assert "KEY=VALUE" in str(exc)
    else:
        raise AssertionError("a pair without '=' was taken")


def test_trees_alternate_abba_after_an_unmeasured_start_of_each(tmp_path, capsys):
    out = tmp_path / "fs.json"
    args = ["--device", "cpu", "--model", "classic", "--duration", "2", "--window", "1", "--runs", "2"]
    args += ["--prime", "--prime-seconds", "3"]
    first_seconds.main([*args, "--also-env", "VCAM_WARM_SWAP=0", "--json", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [r["seq"] for r in runs["this"]] == [0, 3] and [r["seq"] for r in runs["this VCAM_WARM_SWAP=0"]] == [1, 2]
    assert all(r["rc"] == 0 for rs in runs.values() for r in rs)
    printed = capsys.readouterr().out
    assert "primed this: rc 0" in printed and "primed this VCAM_WARM_SWAP=0: rc 0" in printed


def test_the_faces_input_is_a_looping_1080p_clip_of_that_many_detectable_portraits(tmp_path):
    import av

    from vcam.stages.detect import RetinaFaceDetector

    clip = first_seconds._faces_clip(tmp_path, 6, frames=30)
    assert first_seconds._faces_clip(tmp_path, 6, frames=30) == clip  # made once
    with av.open(str(clip)) as c:
        frames = [f.to_ndarray(format="bgr24") for f in c.decode(video=0)]
    assert len(frames) == 30 and frames[0].shape == (1080, 1920, 3)
    det = RetinaFaceDetector()
    assert len(det.detect(frames[0])) == 6 and len(det.detect(frames[15])) == 6
    assert float(abs(frames[15].astype(int) - frames[0]).mean()) > 1.0  # the portraits move
    assert not list(tmp_path.glob("*.part.mp4"))


def test_each_run_says_when_its_load_ended_from_the_phase_lines():
    """A slow host shows in the load's phases before any tree's code runs (issue 39, H200: one
    tree's imports ended 2.5-2.7 s after the start in two runs, 1.9 s in the others)."""
    log = "\n".join(
        [
            "INFO vcam.runtime.assemble: load phase on cuda: import torch (before CuPy) 1.21 s (2.58 s after the start)",
            "INFO vcam.runtime.rounds: start-up: first round on the loaded models began 6 ms (4.65 s after the start)",
            "INFO vcam.runtime.assemble: load phase on cuda: pipeline warm-up 0.37 s (4.12 s after the start)",
            "INFO vcam.runtime.assemble: load phase on cpu: model files checked 0.00 s (0.40 s after the start)",
        ]
    )
    assert first_seconds.load_done_s(log) == 4.12
    assert first_seconds.load_done_s("stopped: 600 frames published") is None


def test_the_phase_lines_keep_when_a_compiled_engine_came_into_use_and_what_the_degrader_did():
    """A compiled four-stream run of six faces published 60 % (H200, 2026-12-07) and its JSON could
    not say whether the artifact was ever in use or a stage was shed: both kinds of line are kept,
    in the words the daemon logs them with."""
    from vcam.runtime.degrade import Change

    shed = Change("swap", False, "frames over the 33 ms budget for 6.0 s").line()
    log = "\n".join(
        [
            "INFO vcam.runtime.assemble: load phase on cuda: import torch (before CuPy) 1.04 s (2.24 s after the start)",
            "INFO vcam.engines.compiled: inswapper_128.onnx: compiled engine for batch 8 ready in 0.4 s",
            "INFO vcam.engines.compiled: inswapper_128.onnx: compiled engine for batch 8 in use 7.10 s after its load started; "
            "210 earlier calls ran uncompiled",
            f"WARNING vcam.runtime.rounds: {shed}",
            "INFO vcam.runtime.status: 30.0 fps",
        ]
    )
    kept = first_seconds.phase_lines(log)
    assert len(kept) == 4 and not any("fps" in ln for ln in kept)
    assert any("in use" in ln for ln in kept) and any(shed in ln for ln in kept)
