"""No face pasted on a non-face (issue 29): the 5-landmark check of the small-face tiles, faces on a
larger face, and new tracks swapped (and counted) only once confirmed."""

from __future__ import annotations

import numpy as np
import pytest

from vcam.stages.detections import DetectParams, inside_larger, plausible_face
from vcam.stages.track import Tracker, TrackParams
from vcam.types import Detection

# A real 48 px face as RetinaFace sees it in a 1080p tile: box and left eye, right eye, nose, mouth corners.
BOX = np.array([776.0, 473.0, 824.5, 529.6], np.float32)
LMS = np.array([[788.6, 492.5], [811.7, 491.9], [800.4, 505.1], [790.9, 514.5], [809.8, 514.0]], np.float32)


def det(box=BOX, lms=LMS, score=0.99) -> Detection:
    return Detection(np.asarray(box, np.float32), np.asarray(lms, np.float32), float(score))


def rotated(lms: np.ndarray, deg: float) -> np.ndarray:
    c = lms.mean(axis=0)
    a = np.deg2rad(deg)
    r = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return (lms - c) @ r.T + c


def test_a_real_face_passes_the_landmark_check_upright_and_tilted():
    assert plausible_face(det())
    assert plausible_face(det(lms=rotated(LMS, 30)))
    assert plausible_face(det(lms=rotated(LMS, -30)))


@pytest.mark.parametrize(
    "why,lms",
    [
        ("upside down: the mouth above the eyes", rotated(LMS, 180)),
        ("on its side", rotated(LMS, 90)),
        ("eyes too close for the box", np.array([[798, 492], [802, 492], [800, 505], [791, 514], [810, 514]])),
        ("eyes wider than the box", np.array([[770, 492], [830, 492], [800, 505], [791, 514], [810, 514]])),
        ("mouth on the eye line", np.array([[788, 492], [812, 492], [800, 494], [791, 495], [810, 495]])),
        ("nose below the mouth", np.array([[788, 492], [812, 492], [800, 525], [791, 514], [810, 514]])),
        ("a point far outside the box", np.array([[788, 492], [812, 492], [800, 505], [791, 514], [810, 600]])),
        ("mouth corners swapped", np.array([[788, 492], [812, 492], [800, 505], [810, 514], [791, 514]])),
    ],
)
def test_landmarks_that_make_no_face_fail(why, lms):
    assert not plausible_face(det(lms=np.asarray(lms, np.float32))), why


def test_a_small_face_on_a_larger_one_is_found():
    host = np.array([[700.0, 400.0, 900.0, 650.0]])
    on_cheek = det(box=[690, 480, 740, 540])  # 40 of its 50 px inside the host's box
    by_ear = det(box=[650, 480, 700, 540])  # touching it, where the ear is: on the head
    beside = det(box=[610, 480, 660, 540])  # a head's width away
    alone = det(box=[100, 100, 150, 160])
    big_twin = det(box=[720, 420, 880, 640])  # as large as the host: another person, not a thumbnail
    assert inside_larger([on_cheek, by_ear, beside, alone, big_twin], host) == [True, False, False, False, False]
    assert inside_larger([on_cheek, by_ear, beside], host, margin=0.15) == [True, True, False]  # ears count
    assert inside_larger([on_cheek], np.zeros((0, 4))) == [False]


def test_a_tracker_s_few_faces_on_larger_ones_in_floats_are_the_array_pass(monkeypatch):
    """Up to _INSIDE_SMALL pairs the check runs in Python floats: the same answers as the array pass
    over 5,000 random sets (touching, nested and scaled twins, every frac, margin and size ratio
    the tracker asks for) and with a box that is not finite (NaN, an infinity: the array pass's)."""
    from vcam.stages import detections

    rng = np.random.default_rng(0)
    limit, hits = detections._INSIDE_SMALL, 0
    for i in range(5000):
        ns, no = int(rng.integers(1, 8)), int(rng.integers(1, 9))
        corner = rng.uniform(0, 300, (ns + no, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(-5, 200, (ns + no, 2))], axis=1)
        if i % 4 == 0:
            boxes = boxes.round()
        if i % 11 == 0:
            boxes[rng.integers(0, ns + no), rng.integers(0, 4)] = (np.nan, np.inf, -np.inf)[i % 3]
        small = [det(box=b) for b in boxes[:ns]]
        others = boxes[ns:]
        if i % 3 == 0:
            others[: min(ns, no)] = boxes[: min(ns, no)] * (1.0, 1.6)[i % 2]
        args = ((0.3, 0.7, 0.0)[i % 3], (1.5, 1.0)[i % 2], (0.0, 0.15)[i % 5 == 0])
        with np.errstate(invalid="ignore"):
            floats = inside_larger(small, others, *args)
            monkeypatch.setattr(detections, "_INSIDE_SMALL", -1)
            array = inside_larger(small, others, *args)
            monkeypatch.setattr(detections, "_INSIDE_SMALL", limit)
        assert floats == array, i
        hits += sum(floats)
    assert hits > 1000  # the sets hold many faces on larger ones, not only misses


class Scripted:
    """A detector whose faces are scripted per frame (``faces[seq]``); regions report the scripted
    faces whose centre lies inside them. No tiles, so the rolling search is the coarse scan."""

    def __init__(self, faces: dict[int, list[Detection]]) -> None:
        self.faces = faces
        self.seq = 0

    def detect(self, frame):
        return list(self.faces.get(self.seq, []))

    def detect_coarse(self, frame):
        return self.detect(frame)

    def detect_regions(self, frame, rects):
        out = []
        for x0, y0, side in np.asarray(rects).reshape(-1, 3):
            out.append(
                [
                    d
                    for d in self.faces.get(self.seq, [])
                    if x0 <= (d.box[0] + d.box[2]) / 2 <= x0 + side and y0 <= (d.box[1] + d.box[3]) / 2 <= y0 + side
                ]
            )
        return out


def run(faces: dict[int, list[Detection]], frames: int, **params) -> list[list[int]]:
    """The ids of the tracks returned (swapped, counted) per frame."""
    sd = Scripted(faces)
    tr = Tracker(sd, TrackParams(**params))
    img = np.zeros((1080, 1920, 3), np.uint8)
    out = []
    for i in range(frames):
        sd.seq = i
        out.append([t.id for t in tr.update(img, i)])
    return out


def test_a_new_face_with_a_modest_score_is_swapped_from_its_third_hit():
    """A face the detector keeps scoring 0.8 (dim light): swapped, a hit later than one that scored
    ``confirm_score`` once (two hits alone confirmed a coffee cup on the real-photo set)."""
    weak = det(score=0.8)
    got = run({i: [weak] for i in range(6)}, 6)
    assert got[:2] == [[], []] and all(len(ids) == 1 for ids in got[2:]), got


def test_two_modest_hits_with_a_miss_between_do_not_confirm():
    """Issue 40, the real-photo set at 4K: a coffee cup found at 0.82, 0.65, 0.80 was confirmed by
    its two hits and pasted for 3 frames; a face had scored 0.9 by its second hit."""
    got = run({0: [det(score=0.82)], 1: [det(score=0.65)], 2: [det(score=0.80)]}, 6)
    assert all(ids == [] for ids in got), got
    got = run({0: [det(score=0.82)], 1: [det(score=0.65)], 2: [det(score=0.93)], 3: [det(score=0.95)]}, 4)
    assert got[:2] == [[], []] and got[2] == [1] and got[3] == [1], got


def test_a_confident_face_is_swapped_at_once():
    assert run({i: [det(score=0.97)] for i in range(3)}, 3)[0] == [1]


def test_a_first_score_that_objects_also_reach_waits_for_a_second_hit():
    """Issue 40, the real-photo set at 1080p with the search beside the frame: a cat first found at
    0.924 (landmarks of a face) was swapped at once under the 0.9 rule and pasted for a frame.
    Objects reached 0.92 there, so at once needs ``confirm_at_once`` (0.95); a face found at 0.924
    is swapped from its second hit, a blip at 0.924 never."""
    assert run({0: [det(score=0.924)]}, 4) == [[], [], [], []]
    got = run({i: [det(score=0.924)] for i in range(3)}, 3)
    assert got[0] == [] and got[1] == [1] and got[2] == [1], got


def test_a_one_frame_blip_is_never_swapped_or_counted():
    """A weak detection in one frame only (a texture, a reflection): followed, never confirmed,
    gone once its confirmation window and misses are over."""
    got = run({0: [det(score=0.8)]}, 8)
    assert all(ids == [] for ids in got), got


def test_hits_below_the_hit_score_do_not_confirm():
    """A face-like texture the detector keeps scoring 0.7 (above its 0.6 threshold): never swapped."""
    got = run({i: [det(score=0.7)] for i in range(10)}, 10)
    assert all(ids == [] for ids in got), got


def test_a_face_smaller_than_small_face_needs_a_hit_more_and_no_score_confirms_it_at_once():
    class WithCfg(Scripted):
        cfg = type("P", (), {"small_face": 60, "score": 0.6})()

    sd = WithCfg({i: [det(score=0.97)] for i in range(4)})  # a 48 px face, below small_face 60
    tr = Tracker(sd, TrackParams())
    img = np.zeros((1080, 1920, 3), np.uint8)
    got = []
    for i in range(4):
        sd.seq = i
        got.append([t.id for t in tr.update(img, i)])
    assert got == [[], [], [1], [1]], got


def test_a_face_far_smaller_than_the_search_looks_for_starts_no_track():
    """A confident 28 px "face" (a head in a crowd far away) in a 4K frame, where a full scan looks
    for faces down to 60 px: never swapped; the same face scaled to 48 px is (45 px is the least
    a new track needs there: 3/4 of 60); in a 1080p frame (40 px searched) a 30 px one is too."""

    def ids(face: Detection, shape: tuple[int, int]) -> list[list[int]]:
        sd = Scripted({i: [face] for i in range(6)})
        sd.cfg = DetectParams()  # type: ignore[attr-defined]  # small_face 40, as configured by default
        tr = Tracker(sd, TrackParams())
        img = np.zeros((*shape, 3), np.uint8)
        out = []
        for i in range(6):
            sd.seq = i
            out.append([t.id for t in tr.update(img, i)])
        return out

    def scaled(k: float) -> Detection:
        c = (BOX[:2] + BOX[2:]) / 2
        return det(box=np.concatenate([c + (BOX[:2] - c) * k, c + (BOX[2:] - c) * k]), lms=c + (LMS - c) * k, score=0.99)

    tiny, small = scaled(0.5), scaled(0.86)  # sides 28 and 48.7 px
    assert all(got == [] for got in ids(tiny, (2160, 3840)))
    assert ids(small, (2160, 3840))[-1] == [1]
    assert ids(scaled(0.54), (1080, 1920))[-1] == [1]  # 30.6 px at 1080p: at least 30
    assert all(got == [] for got in ids(tiny, (1080, 1920)))


def test_hits_whose_landmarks_make_no_face_do_not_confirm():
    bad = det(lms=rotated(LMS, 180), score=0.7)
    got = run({i: [bad] for i in range(10)}, 10)
    assert all(ids == [] for ids in got), got


def test_a_confident_first_detection_whose_landmarks_make_no_face_is_not_swapped_at_once():
    """Issue 40: the instant confirmation (first score >= confirm_score) also asks the landmark
    check: a shiny object scoring 0.95 once with landmarks upside down is never swapped."""
    got = run({i: [det(lms=rotated(LMS, 180), score=0.95)] for i in range(6)}, 6)
    assert all(ids == [] for ids in got), got


def test_a_confirmed_track_whose_scores_sag_to_an_objects_is_no_longer_swapped():
    """Issue 40, the face on a brass ashtray: an object confirmed by three good hits, then found in
    its own region at the scores real objects get there (0.6-0.77 on the real-photo set), goes
    back to a candidate within 3 frames and is dropped when it does not confirm again; before,
    it was swapped as long as it was found."""
    faces = {i: [det(score=0.85)] for i in range(3)} | {i: [det(score=0.7)] for i in range(3, 15)}
    got = run(faces, 15)
    assert got[:2] == [[], []] and all(ids == [1] for ids in got[2:5]), got
    assert all(ids == [] for ids in got[5:]), got


def test_a_face_whose_score_dips_now_and_then_stays_swapped():
    """A real face's detections score near 1 with a dip now and then (a blink, a hand, a turn):
    never hidden (its median stays above the hit score)."""
    scores = [0.99, 0.99, 0.7, 0.99, 0.65, 0.99, 0.99, 0.72, 0.99, 0.99, 0.99, 0.7]
    got = run({i: [det(score=sc)] for i, sc in enumerate(scores)}, len(scores))
    assert all(ids == [1] for ids in got), got


def test_a_missed_face_is_swapped_only_where_it_still_looks_the_same():
    """Issue 40: a track held through a miss (``max_missed``) was swapped where its face had been,
    on the wall after the face vanished (5 of the 7 off-face frames of the real-photo set). Now a
    missed track is returned only while the grey look of its box matches its last detection's: a
    detector's miss on a face still there keeps the swap, a face gone hides it at once (the track
    kept, so a face found again keeps its id)."""
    rng = np.random.default_rng(3)
    there = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    gone = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)  # what lies there once the face left
    sd = Scripted({i: [det(score=0.99)] for i in (*range(6), 8)})
    tr = Tracker(sd, TrackParams())
    got = []
    for i, frame in enumerate([there] * 7 + [gone, there]):
        sd.seq = i
        got.append([(t.id, t.missed) for t in tr.update(frame, i)])
    assert got[5] == [(1, 0)] and got[6] == [(1, 1)], got  # missed, the face still there: swapped
    assert got[7] == [], got  # missed, the face gone: not swapped, not counted
    assert got[8] == [(1, 0)], got  # found again: the same track


def test_a_weak_first_detection_is_not_a_hit():
    """Issue 40 (the real-photo set, 4K, search beside the frame: a motorcycle's lamp found at 0.72,
    then once at 0.91, was swapped for 3 frames): a new track's first detection counts toward its
    confirmation only when it scores as a hit; a real face's next detections confirm it."""
    got = run({0: [det(score=0.72)], 2: [det(score=0.91)]}, 6)
    assert all(ids == [] for ids in got), got
    got = run({0: [det(score=0.72)], 1: [det(score=0.91)], 2: [det(score=0.95)], 3: [det(score=0.99)]}, 4)
    assert got == [[], [], [1], [1]], got


def test_confirmation_off_swaps_every_detection_at_once():
    assert run({0: [det(score=0.7)]}, 1, confirm_hits=1)[0] == [1]


def test_a_new_face_on_a_tracked_face_starts_no_track():
    host = det(box=[700, 400, 900, 650], lms=LMS * 0 + [[760, 490], [840, 490], [800, 530], [770, 580], [830, 580]])
    thumb = det(box=[690, 480, 740, 540], lms=LMS - [88, 0], score=0.99)
    got = run({i: [host] + ([thumb] if i >= 2 else []) for i in range(6)}, 6)
    assert all(ids == [1] for ids in got), got


@pytest.mark.slow
def test_precision_benchmark_today_vs_confirmed(tmp_path, capsys):
    """The distractor scenes: today's tracker swaps the thumbnail by the host's ear; confirmed
    tracks swap only the people, and find them all."""
    from benchmarks import precision

    payload = precision.main(["--device", "cpu", "--frames", "30", "--sizes", "1080p", "--json", str(tmp_path)])
    rows = {r["mode"]: r for r in payload["rows"]}
    assert "precision" in capsys.readouterr().out and (tmp_path / "precision.json").is_file()
    assert rows["before"]["false"] > 0
    assert rows["after"]["false"] == 0 and rows["after"]["precision"] == 1.0 and rows["after"]["recall"] >= 0.95
    # The CPU's default, the rolling search beside the frame: as precise, the same recall.
    assert rows["worker"]["false"] == 0 and rows["worker"]["precision"] == 1.0 and rows["worker"]["recall"] >= 0.95


@pytest.mark.slow
def test_predicting_through_a_miss_keeps_precision(tmp_path):
    """The tracker as the daemon's pipelines drive it (issue 28: predicted frames, also through a
    miss, each detection applied at the next frame) swaps only the people on the distractor
    scene, and finds them as the waiting flow does."""
    from benchmarks import precision

    payload = precision.main(["--device", "cpu", "--frames", "40", "--sizes", "1080p", "--modes", "after,daemon"])
    rows = {r["mode"]: r for r in payload["rows"]}
    assert rows["daemon"]["false"] == 0 and rows["daemon"]["precision"] == 1.0
    assert rows["daemon"]["recall"] >= rows["after"]["recall"] - 0.02


@pytest.mark.slow
def test_no_paste_off_a_face_among_real_photographs(tmp_path, capsys):
    """Issue 40: scikit-image's real photographs (coins, a clock, a coffee cup, a cat, the moon, a
    motorcycle...) sliding, turning and lit around five real faces entering and leaving: nothing
    is swapped off a face, in the frame and with the search beside it, and every face in view is
    found."""
    from conftest import require

    try:
        import skimage.data  # noqa: F401
    except ImportError:
        require("scikit-image", "the real-photo scenes are made of skimage.data's photographs: pip install scikit-image")
    from benchmarks import precision_real

    args = ["--frames", "60", "--sizes", "1080p", "--modes", "after,worker", "--steady", "0", "--json", str(tmp_path)]
    payload = precision_real.main(args)
    assert "recall" in capsys.readouterr().out and (tmp_path / "precision_real.json").is_file()
    for r in payload["rows"]:
        assert r["false"] == 0 and r["false_frames"] == 0, r
        assert r["recall"] >= 0.99 and r["faces_ok_pct"] >= 90, r


def test_a_frames_look_is_the_same_from_a_tensor():
    """The look a missed track is checked by is taken where the frame lives (a device tensor on a
    GPU pipeline, no copy to the host): the same samples as from the NumPy frame."""
    from conftest import require

    try:
        import torch
    except ImportError:
        require("torch", "PyTorch is not installed")
    from vcam.stages.track import _alike, _patch

    frame = np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)
    box = np.array([50.0, 40.0, 150.0, 160.0])
    look = _patch(frame, box)
    np.testing.assert_array_equal(_patch(torch.from_numpy(frame), box).numpy(), look)
    assert _alike(look, look) > 0.999 and _alike(look, _patch(frame, box + 30)) < 0.5


@pytest.mark.slow
def test_the_real_photo_scene_made_by_several_processes_is_the_scene_made_by_one():
    """The real-photo scene's frames composed ahead by a pool (``--jobs``, the GPU host's way to keep
    up with its tracker) come in order and equal to the pixel, with the same ground truth."""
    from conftest import require

    try:
        import skimage.data  # noqa: F401
    except ImportError:
        require("scikit-image", "the real-photo scenes are made of skimage.data's photographs: pip install scikit-image")
    from benchmarks.precision_real import scene

    one = list(scene("1080p", 5, jobs=1))
    pooled = list(scene("1080p", 5, jobs=2))
    assert len(one) == len(pooled) == 5
    for a, b in zip(one, pooled):
        assert np.array_equal(a[0], b[0])
        assert all(np.array_equal(p, q) for p, q in zip(a[1], b[1])) and a[2] == b[2]
        assert [(n, p.tolist()) for n, p in a[3]] == [(n, p.tolist()) for n, p in b[3]]
    assert not np.array_equal(one[0][0], one[4][0])  # the scene moves
