"""The CPU pipeline end to end with real detector and tracker: geometry, pass-through, formats."""

import numpy as np
import pytest

from vcam import align, blend
from vcam.config import Config, TrackConfig
from vcam.daemon import face_from_image
from vcam.demo import DemoClip, compose, portrait
from vcam.detect import RetinaFaceDetector
from vcam.errors import FaceError
from vcam.pipeline import Pipeline
from vcam.state import RuntimeState
from vcam.swap import ClassicSwapper, IdentitySwapper, SolidSwapper
from vcam.track import Tracker
from vcam.types import Frame, PixelFormat


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector(Config().detect, roi_size=Config().track.roi_size)


def make_pipeline(detector, swapper, cfg=None, out_fmt=PixelFormat.BGR):
    cfg = cfg or Config()
    tracker = Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces)
    return Pipeline(cfg, tracker=tracker, swapper=swapper, out_fmt=out_fmt)


def frames_of(clip, n, step=1):
    for i in range(0, n * step, step):
        img = clip.frame(i)
        yield Frame(img, img.shape[1], img.shape[0], PixelFormat.BGR, 0.0, i)


def state_with(face):
    st = RuntimeState()
    if face is not None:
        st.add_face(face, activate=True)
    return st


@pytest.fixture(scope="module")
def source_face(detector):
    return face_from_image(portrait("astronaut"), "astronaut", swapper=ClassicSwapper(), detector=detector)


def boxes_for(pipe, height, width):
    """Paste boxes of the faces the pipeline tracked in its last frame."""
    sw = pipe.swapper
    mats = [align.estimate(t.landmarks, sw.template, sw.crop_size) for t in pipe.last_tracks]
    return blend.paste_boxes(np.array(mats), sw.crop_size, height, width) if mats else np.zeros((0, 4), int)


def test_identity_swapper_round_trips_within_interpolation_error(detector, source_face):
    # Two bilinear resamplings (warp, then paste) blur a sharp face by themselves: at a 1:1 crop
    # the round trip costs ~3 grey levels. A crop that oversamples the ~140 px paste box over 5x
    # (768 px) brings pure interpolation error under 1, so any geometric error (a shifted or
    # mis-scaled paste) would show far above the bound.
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=2.0)
    pipe = make_pipeline(detector, IdentitySwapper(crop_size=768))
    st = state_with(source_face)
    checked = 0
    for fr in frames_of(clip, 30, step=2):
        src = fr.data.copy()
        out, stats = pipe.process(fr, st.snapshot())
        if not stats.swapped:
            continue
        for x0, y0, x1, y1 in boxes_for(pipe, 360, 640):
            diff = np.abs(out[y0:y1, x0:x1].astype(np.int16) - src[y0:y1, x0:x1]).mean()
            assert diff <= 1.0, diff
            checked += 1
    assert checked >= 25


def test_solid_swapper_changes_only_the_paste_box(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=2.0)
    pipe = make_pipeline(detector, SolidSwapper(crop_size=128))
    st = state_with(source_face)
    swapped = 0
    for fr in frames_of(clip, 10, step=5):
        src = fr.data.copy()
        out, stats = pipe.process(fr, st.snapshot())
        changed = np.any(out != src, axis=2)
        inside = np.zeros_like(changed)
        for x0, y0, x1, y1 in boxes_for(pipe, 360, 640):
            inside[y0:y1, x0:x1] = True
        assert not np.any(changed & ~inside)
        if stats.swapped:
            swapped += 1
            assert changed.sum() > 0.3 * inside.sum()
    assert swapped >= 9


def test_pass_through_without_source_face_or_with_swap_off(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    pipe = make_pipeline(detector, ClassicSwapper())
    no_face = RuntimeState()
    off = state_with(source_face)
    off.set_swap("off")
    for st in (no_face, off):
        for fr in frames_of(clip, 3):
            src = fr.data.copy()
            out, stats = pipe.process(fr, st.snapshot())
            assert stats.faces == 1 and stats.swapped == 0
            np.testing.assert_array_equal(out, src)


def test_classic_swap_changes_the_face(detector, source_face):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=1.0)
    pipe = make_pipeline(detector, ClassicSwapper())
    st = state_with(source_face)
    fr = next(frames_of(clip, 1))
    src = fr.data.copy()
    out, stats = pipe.process(fr, st.snapshot())
    assert stats.swapped == 1
    (x0, y0, x1, y1), = boxes_for(pipe, 360, 640)
    assert np.abs(out[y0:y1, x0:x1].astype(np.int16) - src[y0:y1, x0:x1]).mean() > 5.0


def test_frame_with_ten_faces_swaps_at_most_max_faces(detector, source_face):
    cfg = Config()
    cfg = cfg.replace(pipeline=type(cfg.pipeline)(max_faces=8), track=TrackConfig(rescan_every=1))
    a, g = portrait("astronaut"), portrait("grace_hopper")
    items = []
    for k in range(10):  # a 5 x 2 grid of portraits, faces about 90 px wide
        img = a if k % 2 else g
        s = 300.0 / img.shape[0]
        col, row = k % 5, k // 5
        m = np.array([[s, 0, col * 256 + (256 - s * img.shape[1]) / 2], [0, s, row * 360 + 30]], dtype=np.float64)
        items.append((img, m))
    frame = compose((1280, 720), items, background=None)
    pipe = make_pipeline(detector, SolidSwapper(), cfg)
    out, stats = pipe.process(Frame(frame, 1280, 720, PixelFormat.BGR, 0.0, 0), state_with(source_face).snapshot())
    assert stats.faces == 8
    assert stats.swapped == 8


def test_grayscale_and_odd_size_frames(detector, source_face):
    clip = DemoClip(width=641, height=361, fps=30.0, seconds=1.0)
    import cv2

    pipe = make_pipeline(detector, ClassicSwapper(), out_fmt=PixelFormat.I420)
    st = state_with(source_face)
    img = clip.frame(0)
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    out, stats = pipe.process(Frame(gray, 641, 361, PixelFormat.GRAY, 0.0, 0), st.snapshot())
    assert out.shape == (360 * 3 // 2, 640)
    assert stats.swapped == 1
    out, stats = pipe.process(Frame(img, 641, 361, PixelFormat.BGR, 0.0, 1), st.snapshot())
    assert out.shape == (540, 640)


def test_source_photo_without_face_is_refused(detector):
    blank = np.full((300, 300, 3), 127, np.uint8)
    with pytest.raises(FaceError, match="no face found in source photo 'blank'"):
        face_from_image(blank, "blank", swapper=ClassicSwapper(), detector=detector)
