"""Issue 40 item 5, seams at occluders: with the face parser (``region`` mask) or the occluder
(``occlusion`` mask) configured, the paste stops at a hat's brim and at glasses frames. The
models' stand-ins have random weights, so the masks here come from controlled engines that label
the crop they are given by colour (the brim and the frames are painted in colours no face has);
what is tested is the wiring (the model's output through the mask stage into the classic paste)
and the mask's effect on the output frame."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from media import MaskModel, occluded_portrait

from vcam.models import registry


@pytest.fixture(scope="module")
def case():
    pytest.importorskip("skimage")
    from benchmarks.swap_cases import source
    from vcam.stages.detect import RetinaFaceDetector

    det = RetinaFaceDetector()
    return det, occluded_portrait(det), source(det, "grace_hopper")


@pytest.mark.parametrize("model", ["bisenet_resnet_34", "xseg_1"])
def test_the_paste_stops_at_a_brim_and_glasses_frames_when_a_mask_model_is_configured(case, model):
    from benchmarks.swap_cases import swap
    from vcam.config import Config

    det, (frame, brim, frames), face = case
    spec = registry.get(model)
    engine = MaskModel(spec)
    kind = "region" if spec.kind == "parser" else "occlusion"
    assert "glasses" not in Config().mask.regions  # the parser's default regions leave the frames (and a hat) out
    plain, lm = swap(det, frame, face, ("box", "face"))
    masked, _ = swap(det, frame, face, ("box", "face", kind), **{"parser" if kind == "region" else "occluder": (spec, engine)})
    assert engine.calls == 1
    moved = lambda out: np.abs(out.astype(np.int16) - frame).max(-1)  # noqa: E731
    # inside the painted brim and frames (2 px in from their edges, where the model's crop resampled
    # at its own size is all brim or frame), within the face the paste covers
    face_zone = moved(plain) > 8
    for part in (brim, frames):
        core = cv2.erode(part.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool) & face_zone
        assert core.sum() > 40, core.sum()  # the painted parts do lie where the plain paste goes
        assert np.percentile(moved(masked)[core], 95) <= 6, np.percentile(moved(masked)[core], 95)
    # the face between them is still swapped
    skin = face_zone & ~cv2.dilate((brim | frames).astype(np.uint8), np.ones((15, 15), np.uint8)).astype(bool)
    assert np.median(moved(masked)[skin]) > 0.6 * np.median(moved(plain)[skin])
