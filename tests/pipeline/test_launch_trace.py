"""The GPU frame's host side, traced on the CPU (`benchmarks/launch_trace.py`, issue 43): the CUDA
path's launches, copies and events per frame, what a per-frame CUDA graph would capture, and the
pipeline's own host time, with the real detector's answers."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from benchmarks import launch_trace as lt

SIZE = (640, 360)
KERNELS = Path(__file__).resolve().parents[2] / "kernels"


@pytest.fixture(scope="module")
def real():
    rig = lt.build_rig(1, SIZE, "real")
    return rig, lt.run(rig, 24)


@pytest.fixture(scope="module")
def fixed():
    rig = lt.build_rig(1, SIZE, "fixed")
    return rig, lt.run(rig, 16)


def test_every_frame_of_the_trace_swaps_the_face_the_real_detector_finds(real):
    rig, trace = real
    assert trace.faces == [1] * 24
    # frames after the first go out swapped with predicted tracks while their detection runs (as
    # `vcam run` on CUDA does), moved in bands
    assert rig.pipe.predicted >= 22 and rig.pipe.banded >= 22
    for frame in trace.frames[2:]:
        names = [e.name for e in frame]
        assert names.count("swapper") == 1  # all faces in one call
        # one upload and one download, each in two row bands (the band first, the rest beside the swap)
        assert [e.name for e in frame if e.kind == "h2d"] == ["upload", "upload_rest"]
        assert [e.name for e in frame if e.kind == "d2h" and e.stream == "copy"] == ["download", "download"]
        assert "detector" in names  # the predicted frame's own detection, on the back stream
        assert {e.stream for e in frame if e.name == "detector"} == {"back"}
        assert not [e for e in frame if e.kind == "alloc"], "a steady frame allocates nothing"
        assert [e.name for e in frame if e.kind == "host_wait"] == ["download"]  # the host waits for nothing else
    assert (rig.ops.transfers.h2d, rig.ops.transfers.d2h) == (24, 24)


def test_recorded_launches_name_kernels_of_the_cuda_sources(real):
    _, trace = real
    names = {e.name for f in trace.frames for e in f if e.kind == "kernel"}
    assert len(names) >= 6
    for name in names:
        module, kernel = name.split(".")
        source = (KERNELS / f"{module}.cu").read_text()
        assert re.search(rf"__global__\s+void\s+{kernel}\s*\(", source) or re.search(rf"\b{kernel}\b", source), name


def test_fixed_faces_make_a_frame_a_graph_could_replay(fixed):
    """With the same faces, each frame repeats the launches of the frame through its ring slot
    before it, argument for argument: what a captured graph needs. The real tracker's moving faces
    change the per-face parameters passed by value (the blockers issue 43 item 1 moves into device
    buffers)."""
    rig, trace = fixed
    s = lt.summary(trace, skip=4, ring=rig.pipe.ring)
    assert s["graph blockers (share of frame pairs)"] == {}
    assert s["per frame"]["engine"] == 2  # the swapper and the one region of the face


def test_moving_faces_change_the_face_kernels_parameters(real):
    rig, trace = real
    s = lt.summary(trace, skip=4, ring=rig.pipe.ring)
    blockers = s["graph blockers (share of frame pairs)"]
    assert {"paste.paste_back", "warp.warp_crops_norm_f16"} <= set(blockers)


def test_with_parameter_records_the_moving_faces_change_no_launch_of_the_swap_s_part():
    """The real tracker's moving faces with the warp's, masks' and paste-back's structs in parameter
    records (vcam/kernels/records.py): from the warp to the paste-back a frame repeats the launches
    of the frame through its ring slot before it (their structs are copies from fixed places, the
    paste-back's grid fixed); what still changes is outside a per-frame graph by design: the
    detection (its regions follow the faces) and the band's copies and conversions (its rows)."""
    rig = lt.build_rig(1, SIZE, "real", records=True)
    trace = lt.run(rig, 24)
    assert trace.faces == [1] * 24 and rig.pipe.predicted >= 22
    s = lt.summary(trace, skip=4, ring=rig.pipe.ring)
    blockers = set(s["graph blockers (share of frame pairs)"])
    swap_part = {"warp.warp_crops_norm_f16_rec", "swapper", "warp.crops_from_planar_f16_f16", "mask.landmark_masks_rec"}
    assert swap_part | {"paste.paste_back_rec"} <= set(s["by name per frame"])
    assert not blockers & (swap_part | {"paste.paste_back_rec", "params"}), blockers
    assert blockers <= {"convert.detector_input_f32", "detector", "upload", "upload_rest", "download", "convert.bgr_from_420",
                        "convert.bgr_to_420", "the launch sequence itself"}  # fmt: skip
    for frame in trace.frames[2:]:
        params = [e for e in frame if e.name == "params"]
        assert len(params) == 3 and {e.stream for e in params} == {"compute"}  # warp, masks, paste: one copy each
        assert not [e for e in frame if e.kind == "alloc"]


def test_host_time_is_counted_per_step_and_leaves_the_device_s_work_out(monkeypatch):
    """Every engine call made 30 ms slower, as device work: the host's steps do not see it, and host
    and device time make up the run."""
    rig = lt.build_rig(1, SIZE, "real")
    lt.run(rig, 3)
    inner = lt.TraceEngine.run_device

    def slow(self, feeds, stream=None):
        with self.log.device_work():
            time.sleep(0.03)
        return inner(self, feeds, stream)

    monkeypatch.setattr(lt.TraceEngine, "run_device", slow)
    d0, t0 = rig.log.device_s, time.perf_counter()
    trace = lt.run(rig, 8)
    wall, device = time.perf_counter() - t0, rig.log.device_s - d0
    assert set(trace.steps_s) == set(lt.STEPS) and all(len(v) == 8 for v in trace.steps_s.values())
    for frame, host in zip(trace.frames[-8:], trace.host_s):
        calls = sum(1 for e in frame if e.kind == "engine")
        assert calls >= 2 and 0 < host < 0.03 * calls  # the sleeps are not in the host's time
    assert device >= 0.03 * sum(1 for f in trace.frames[-8:] for e in f if e.kind == "engine")
    assert 0.8 * wall <= sum(trace.host_s) + device <= wall


def test_device_time_inside_device_time_is_counted_once():
    """A block of device work (or a record) inside another is the outer block's time: counted
    twice, a frame's host time came out negative on a busy machine."""
    log = lt.TraceLog()
    t0 = time.perf_counter()
    with log.device_work():
        time.sleep(0.02)
        with log.device_work():
            time.sleep(0.02)
        log.add("kernel", "k.k", "s")
    wall = time.perf_counter() - t0
    assert 0.04 <= log.device_s <= wall
    log.add("kernel", "k.k", "s")  # alone, a record is counted
    assert log.device_s > 0.04 and len(log.frames[-1]) == 2


def test_the_command_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert lt.main(["--size", "640x360", "--frames", "14", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "launches by name" in text and "host time" in text
    s = json.loads(out.read_text())["summary"]
    assert s["launches per frame"] >= 10 and s["host ms p50"] > 0
    assert set(s["host ms p50 by step"]) == set(lt.STEPS)


def test_four_streams_of_one_daemon_share_one_swapper_call_a_round():
    """Four streams run round by round as the daemon does: each begun, their faces swapped in one
    call, each finished and collected; each stream's own detection still runs (four)."""
    rig = lt.build_rig(1, SIZE, "real", streams=4)
    trace = lt.run(rig, 8)
    assert trace.faces[2:] == [4] * 6
    for frame in trace.frames[2:]:
        names = [e.name for e in frame]
        assert names.count("swapper") == 1
        assert [e.name for e in frame if e.kind == "host_wait"] == ["download"] * 4
        assert sum(1 for e in frame if e.name == "detector") >= 4
    assert len({id(p.tracker) for p in rig.pipes}) == 4 and len({id(p.swapper) for p in rig.pipes}) == 1


def test_four_streams_of_six_faces_swap_their_24_faces_in_one_call_a_round():
    """The daemon's swapper takes every stream's faces in one call (``runtime.roles``: the pipeline's
    faces times the streams, up to 32): four streams of the six-face still trace as rounds of all
    their faces, more than the eight a swapper of one pipeline took (it refused the round: the
    four-stream six-face round of issue 39). At this small size the detector finds three a stream."""
    rig = lt.build_rig(6, SIZE, "real", streams=4)
    assert rig.pipe.swapper.max_faces == 32
    trace = lt.run(rig, 6)
    assert trace.faces[-1] == 12
    assert [e.name for e in trace.frames[-1]].count("swapper") == 1


def test_a_detection_copy_buffer_is_made_on_the_stream_that_copies_into_it(real):
    """The buffer a predicted frame's detection reads is made (zero-filled) on the back stream, whose
    copy fills it, so the fill is ordered before the first copy (on the GPU a refactor once moved the
    fill to the compute stream, unordered with the back stream's copy)."""
    _, trace = real
    first = next(f for f in trace.frames if any(e.name == "xp.copyto" for e in f))
    at = next(i for i, e in enumerate(first) if e.name == "xp.copyto")
    made = [e.stream for e in first[:at] if e.kind == "alloc"]
    assert made and made[-1] == first[at].stream == "back", (made, first[at].stream)


def test_predicted_frames_copy_for_their_detection_into_two_buffers_in_turn(real):
    """A detection not yet applied when the next predicted frame is copied keeps its own frame: the
    copies alternate between two buffers, so the tracks' looks it reads are of its frame, not the
    next one's (a single buffer was overwritten first)."""
    _, trace = real
    dest = [e.key[0][1] for f in trace.frames for e in f if e.name == "xp.copyto" and e.stream == "back"]
    assert len(dest) >= 20 and len(set(dest)) == 2
    assert all(a != b for a, b in zip(dest, dest[1:]))


def test_the_planner_applies_a_detection_on_the_front_stream(real):
    """The looks a detection's tracks take (a gather from its frame) and the look-alike checks of
    later frames that read them queue on one stream, the front one; none on the GPU's legacy null
    stream, which is not ordered with the others."""
    rig = lt.build_rig(1, SIZE, "real")
    seen: list[str] = []
    complete = rig.pipe.tracker.complete

    def spy(step):
        seen.append(rig.ops.stream)
        return complete(step)

    rig.pipe.tracker.complete = spy
    lt.run(rig, 12)
    assert rig.pipe.predicted >= 10 and len(seen) >= 10
    assert set(seen) == {"front"}
