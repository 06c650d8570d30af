"""Issue 10's acceptance checks through the assembled pipeline: nothing of the source photo outside
the target's face region, the background untouched, on a clip and on the demo clip."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from vcam.config import Config
from vcam.config_file import build
from vcam.runtime import assemble
from vcam.stages import demo, mask
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat

GREEN = np.array([0, 255, 0], np.uint8)


def _green_source() -> np.ndarray:
    """grace_hopper with everything outside her face (hat, hair, backdrop, clothes) pure green."""
    img = demo.portrait("grace_hopper").copy()
    det = max(RetinaFaceDetector().detect(img), key=lambda d: d.area)
    poly = mask.face_polygon(det.landmarks, 1.0).astype(np.int32)
    keep = np.zeros(img.shape[:2], np.uint8)
    cv2.fillConvexPoly(keep, poly, 1)
    img[keep == 0] = GREEN
    return img


def _is_green(img: np.ndarray) -> np.ndarray:
    b, g, r = (img[..., i].astype(int) for i in range(3))
    return (g > 180) & (r < 90) & (b < 90)


def _region(shape: tuple[int, int], landmarks: list[np.ndarray], dilate: int) -> np.ndarray:
    """The targets' face regions (their landmarks' face outline) dilated by ``dilate`` pixels."""
    out = np.zeros(shape, np.uint8)
    for lm in landmarks:
        cv2.fillConvexPoly(out, np.round(mask.face_polygon(lm)).astype(np.int32), 1)
    if dilate:
        out = cv2.dilate(out, np.ones((2 * dilate + 1, 2 * dilate + 1), np.uint8))
    return out.astype(bool)


def _run(cfg: Config, frames: list[np.ndarray], source: np.ndarray | None):
    asm = assemble.build(cfg)
    state = RuntimeState()
    if source is not None:
        face = face_from_image(source, "green", detector=asm.photo_detector, swappers=[asm.swapper])
        state.add_face(face, activate=True)
    else:
        assemble.load_faces(asm, state, demo_input=True)
    h, w = frames[0].shape[:2]
    pipe = asm.make_pipeline(PixelFormat.BGR, w, h, PixelFormat.BGR)
    for i, f in enumerate(frames):
        out, stats = pipe.process(Frame(f, w, h, PixelFormat.BGR, 0.0, i), state.snapshot())
        yield f, out.copy(), [t.landmarks for t in pipe.last_tracks], stats


@pytest.mark.slow
@pytest.mark.parametrize("masks", ["box,face", "face", "box,face,mouth"])
def test_source_colours_never_leave_the_target_face(masks):
    clip = demo.DemoClip(640, 360, seconds=1.0, face="astronaut", seed=3)
    frames = [clip.frame(i) for i in range(0, 30, 3)]
    cfg = Config().replace(pipeline=build({"pipeline": {"device": "cpu"}}).pipeline, mask=build({"mask": {"types": masks}}).mask)
    swapped = 0
    for src, out, lms, stats in _run(cfg, frames, _green_source()):
        swapped += stats.swapped
        assert not _is_green(out).any(), "a pixel of the source's green surroundings reached the frame"
        outside = ~_region(src.shape[:2], lms, dilate=2)
        assert np.array_equal(out[outside], src[outside]), "pixels outside the target's face region changed"
    assert swapped >= len(frames) - 1


def test_demo_clip_background_untouched():
    clip = demo.DemoClip(640, 360, seconds=1.0, seed=0)
    frames = [clip.frame(i) for i in range(0, 30, 5)]
    cfg = Config().replace(pipeline=build({"pipeline": {"device": "cpu"}}).pipeline)
    changed_inside = []
    for src, out, lms, stats in _run(cfg, frames, None):
        assert stats.swapped == 1
        region = _region(src.shape[:2], lms, dilate=2)
        assert np.array_equal(out[~region], src[~region])
        changed_inside.append((np.abs(out.astype(int) - src.astype(int)).max(axis=2) > 8)[region].mean())
    assert min(changed_inside) > 0.5  # the face itself is swapped


@pytest.mark.slow
def test_each_person_gets_their_own_source_by_recogniser_similarity(tmp_path):
    """Two people in a clip, two [[swap.map]] entries (each photo mapped to the other person's face):
    after the assembled pipeline, each output face is closer, for the recogniser, to the source it
    was mapped to than to the other source; and the two faces got different sources."""
    from pathlib import Path

    from vcam.models import registry, standin
    from vcam.models.download import crc32_text

    models = tmp_path / "models"
    models.mkdir()
    p = standin.write("arcface_w600k_r50", models, tiny=True)
    (models / registry.get("arcface_w600k_r50").hash_file).write_text(crc32_text(p.read_bytes()))
    assets = Path(demo.__file__).parents[1] / "assets"
    astro, hopper = str(assets / "astronaut.jpg"), str(assets / "grace_hopper.jpg")
    cfg = build(
        {
            "models": {"dir": str(models)},
            "pipeline": {"device": "cpu"},
            "swap": {"map": [{"target": astro, "source": hopper}, {"target": hopper, "source": astro}]},
            "faces": {"dir": str(tmp_path / "faces")},
        }
    )
    from conftest import two_people

    det = RetinaFaceDetector()
    scene = two_people()
    frames = [np.ascontiguousarray(np.roll(scene, i * 2, axis=1)) for i in range(4)]

    asm = assemble.build(cfg)
    assert asm.assigner is not None and asm.recogniser is not None
    state = RuntimeState()
    assemble.load_faces(asm, state, demo_input=False)
    rec = asm.recogniser
    src = {
        n: rec.embed(img, np.stack([max(det.detect(img), key=lambda d: d.area).landmarks]))[0]
        for n, img in (("astronaut", demo.portrait("astronaut")), ("hopper", demo.portrait("grace_hopper")))
    }
    h, w = scene.shape[:2]
    pipe = asm.make_pipeline(PixelFormat.BGR, w, h, PixelFormat.BGR)

    def cos(a, b):
        return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))

    # The stand-in recogniser has random weights: it tells the two photos apart (similarity about 0.3)
    # but weighs hair and backdrop as much as the face. So each face is judged by how the swap moved
    # it: towards the source it was mapped to, and not towards the other one.
    gains = []
    for i, f in enumerate(frames):
        out, stats = pipe.process(Frame(f, w, h, PixelFormat.BGR, 0.0, i), state.snapshot())
        assert stats.swapped == 2
        tracks = sorted(pipe.last_tracks, key=lambda t: float(t.box[0]))  # astronaut left, hopper right
        lms = np.stack([t.landmarks for t in tracks])
        before, after = rec.embed(f, lms), rec.embed(out, lms)
        for k, (mapped, other) in enumerate((("hopper", "astronaut"), ("astronaut", "hopper"))):
            to_mapped = cos(after[k], src[mapped]) - cos(before[k], src[mapped])
            to_other = cos(after[k], src[other]) - cos(before[k], src[other])
            gains.append((to_mapped, to_other))
    # (The classic swap keeps the target's face shape, its pose and outline, and moves only what lies
    # inside: a smaller move for a recogniser with random weights than pasting the source's shape.)
    assert all(m > 0.01 and m > o + 0.02 for m, o in gains), gains


@pytest.mark.slow
def test_vcam_run_with_every_mask_and_a_landmarker_on_the_cpu(tmp_path):
    """The real `vcam run` with occluder, parser and landmarker stand-ins: starts, says where each
    mask model runs, writes every frame."""
    from conftest import vcam_cli

    from vcam.models import standin

    models = tmp_path / "models"
    models.mkdir()
    for name in ("xseg_1", "bisenet_resnet_34", "2dfan4"):
        standin.write(name, models, tiny=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n[mask]\nlandmarker = '2dfan4'\n")
    out = tmp_path / "out.mp4"
    args = ["run", "-c", str(cfg), "--input", "demo", "--frames", "6", "--device", "cpu", "--quiet"]
    r = vcam_cli(*args, "--mask", "box,face,mouth,occlusion,region", "--output", f"file:{out}")
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout + r.stderr
    for role in ("occluder xseg_1: onnxruntime", "parser bisenet_resnet_34: onnxruntime", "landmarker 2dfan4: onnxruntime"):
        assert role in text, text
    assert "6 frames published of 6" in text
    bad = vcam_cli(*args, "--mask", "box,teeth", "--output", "null")
    assert bad.returncode != 0 and "--mask" in bad.stderr and "'teeth' is not one" in bad.stderr
    assert len([ln for ln in bad.stderr.strip().splitlines() if ln.strip()]) == 1, bad.stderr


def _tight_green_source(face_px: int) -> np.ndarray:
    """Issue 40: a tightly cropped source photo (its face ``face_px`` wide, the crop's edge a tenth
    of the face from it) whose backdrop, hair and clothes are one flat saturated colour, right up
    to the face's outline."""
    img = _green_source()
    det = max(RetinaFaceDetector().detect(img), key=lambda d: d.area)
    x1, y1, x2, y2 = det.box
    m = 0.1 * (x2 - x1)
    crop = img[int(max(0, y1 - m)) : int(y2 + m), int(max(0, x1 - m)) : int(x2 + m)]
    k = face_px / float(x2 - x1)
    return cv2.resize(crop, None, fx=k, fy=k, interpolation=cv2.INTER_AREA)


@pytest.mark.slow
@pytest.mark.parametrize("face_px", [112, 200])
def test_a_tight_crop_with_a_flat_backdrop_pastes_none_of_it(face_px):
    """Only the source's face reaches the paste: none of its flat green surroundings in any output
    frame, classic swap, default masks."""
    clip = demo.DemoClip(640, 360, seconds=1.0, face="astronaut", seed=5)
    frames = [clip.frame(i) for i in range(0, 30, 3)]
    cfg = Config().replace(pipeline=build({"pipeline": {"device": "cpu"}}).pipeline)
    swapped = 0
    for _, out, _, stats in _run(cfg, frames, _tight_green_source(face_px)):
        swapped += stats.swapped
        assert not _is_green(out).any(), f"{int(_is_green(out).sum())} pixels of the source's green backdrop reached the frame"
    assert swapped >= len(frames) - 1
