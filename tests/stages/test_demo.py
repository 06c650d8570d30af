"""Demo material: bundled portraits, the generated clip and its ground truth, frame composition."""

from __future__ import annotations

import numpy as np
import pytest

from vcam.errors import FaceError, InputError
from vcam.stages.demo import DemoClip, compose, face_box, gradient, placement, portrait, transform_box
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.detections import DetectParams, box_iou


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector(DetectParams(), roi_size=160)


@pytest.mark.parametrize("name, shape", [("astronaut", (384, 384, 3)), ("grace_hopper", (600, 512, 3))])
def test_portraits_load_from_the_package(name, shape):
    img = portrait(name)
    assert img.shape == shape and img.dtype == np.uint8
    assert img.std() > 20  # a photo, not a blank
    img[...] = 0  # a fresh copy each time: the next call is unaffected
    assert portrait(name).std() > 20


def test_unknown_portrait_names_the_choices():
    with pytest.raises(InputError, match=r"unknown demo portrait 'mona_lisa' \(use one of: astronaut, grace_hopper\)"):
        portrait("mona_lisa")


def test_clip_frames_are_deterministic_moving_and_loop(detector):
    clip = DemoClip(640, 360, fps=30.0, seconds=2.0, seed=3, detector=detector)
    assert clip.n_frames == len(clip) == 60
    f0 = clip.frame(0)
    assert f0.shape == (360, 640, 3) and f0.dtype == np.uint8 and f0.flags.c_contiguous
    np.testing.assert_array_equal(f0, DemoClip(640, 360, 30.0, 2.0, seed=3, detector=detector).frame(0))
    assert np.abs(f0.astype(int) - DemoClip(640, 360, 30.0, 2.0, seed=4, detector=detector).frame(0)).mean() > 1
    assert np.abs(f0.astype(int) - clip.frame(15)).mean() > 5  # it moves
    np.testing.assert_array_equal(clip.frame(60), f0)  # loops
    # Consecutive frames move smoothly: the face centre shifts by a few pixels, never jumps.
    centres = np.array([(lambda b: (b[:2] + b[2:]) / 2)(clip.truth(i)[0]) for i in range(60)])
    steps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
    assert steps.max() < 12 and steps.mean() > 0.5


def test_clip_truth_is_the_portrait_face_through_the_frame_affine(detector):
    clip = DemoClip(1280, 720, fps=30.0, seconds=4.0, detector=detector)
    fb = face_box(portrait("grace_hopper"), detector)
    np.testing.assert_allclose(clip.face_box(), fb)
    for i in range(0, clip.n_frames, 20):
        (gt,) = clip.truth(i)
        np.testing.assert_allclose(gt, transform_box(fb, clip.affine(i)), atol=1e-4)
        assert gt[0] >= 0 and gt[1] >= 0 and gt[2] < 1280 and gt[3] < 720  # the face stays in view
        dets = detector.detect(clip.frame(i))
        assert len(dets) == 1
        assert box_iou(dets[0].box, gt)[0, 0] > 0.7  # what the detector sees agrees with the truth


def test_clip_truth_without_a_detector_builds_its_own(detector):
    """A clip made without a detector (as the daemon makes it) finds the portrait's face itself."""
    clip = DemoClip(320, 240, fps=30.0, seconds=1.0)
    np.testing.assert_allclose(clip.face_box(), face_box(portrait("grace_hopper"), detector))


def test_clip_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"demo clip size 8x8 is too small"):
        DemoClip(8, 8)
    with pytest.raises(ValueError, match=r"demo clip needs fps > 0 and seconds > 0, got 0 and 1"):
        DemoClip(fps=0, seconds=1)


def test_placement_and_transform_box():
    m = placement((10.0, 20.0), (100.0, 50.0), 2.0, 90.0)
    np.testing.assert_allclose(m @ [10.0, 20.0, 1.0], [100.0, 50.0], atol=1e-9)
    # 90 degrees counter-clockwise on screen (y down): +x goes up, +y goes right.
    np.testing.assert_allclose(m @ [11.0, 20.0, 1.0], [100.0, 48.0], atol=1e-9)
    np.testing.assert_allclose(m @ [10.0, 21.0, 1.0], [102.0, 50.0], atol=1e-9)
    box = transform_box(np.array([10.0, 20.0, 14.0, 22.0]), m)
    np.testing.assert_allclose(box, [100.0, 42.0, 104.0, 50.0], atol=1e-5)


def test_compose_places_portraits_exactly_and_clips_at_the_frame():
    patch = np.full((10, 20, 3), 255, np.uint8)
    shift = np.array([[1.0, 0, 30], [0, 1.0, 5]])
    frame = compose((64, 48), [(patch, shift)], background=(10, 20, 30))
    assert frame.shape == (48, 64, 3)
    np.testing.assert_array_equal(frame[5:15, 30:50], 255)
    mask = np.zeros((48, 64), bool)
    mask[5:15, 30:50] = True
    np.testing.assert_array_equal(frame[~mask], np.broadcast_to([10, 20, 30], (int((~mask).sum()), 3)))
    # Half outside the frame: the visible part is drawn, nothing wraps around.
    off = compose((64, 48), [(patch, np.array([[1.0, 0, 54], [0, 1.0, -5]]))], background=(0, 0, 0))
    assert (off > 0).all(axis=2).sum() == 10 * 5
    np.testing.assert_array_equal(off[0:5, 54:64], 255)
    # Entirely outside: the background is untouched.
    np.testing.assert_array_equal(
        compose((64, 48), [(patch, np.array([[1.0, 0, 500], [0, 1.0, 0]]))], (1, 2, 3)), np.broadcast_to([1, 2, 3], (48, 64, 3))
    )
    # Later items are drawn over earlier ones; a background image is not modified.
    bg = gradient(64, 48)
    before = bg.copy()
    two = compose((64, 48), [(patch, shift), (np.zeros_like(patch), shift)], background=bg)
    np.testing.assert_array_equal(two[5:15, 30:50], 0)
    np.testing.assert_array_equal(bg, before)


def test_compose_rejects_a_background_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"unexpected background \(10, 10, 3\) uint8 != \(48, 64, 3\) uint8"):
        compose((64, 48), [], background=np.zeros((10, 10, 3), np.uint8))


def test_face_box_of_a_photo_without_a_face(detector):
    with pytest.raises(FaceError, match=r"no face found in the portrait"):
        face_box(np.full((200, 200, 3), 128, np.uint8), detector)
