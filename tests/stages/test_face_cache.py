"""Faces from photos remembered between starts (vcam.stages.face_cache) and the recogniser built in
the background (DeferredRecogniser): a photo seen before needs neither the detector nor the
recogniser; a damaged entry is computed again; another photo is another key."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from vcam import config_file as vconfig
from vcam.errors import ModelError
from vcam.models import registry, standin
from vcam.models.download import crc32_text
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo, face_cache
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.stages.recognize import DeferredRecogniser


@pytest.fixture(scope="module")
def recogniser(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    p = standin.write("arcface_w600k_r50", d, tiny=True)
    (d / registry.get("arcface_w600k_r50").hash_file).write_text(crc32_text(p.read_bytes()))
    cfg = vconfig.build({"models": {"dir": str(d)}, "pipeline": {"backend": "onnxruntime", "device": "cpu"}})
    return build_role("recogniser", cfg, store=model_store(cfg, progress=False))


class Counting:
    """A real detector or recogniser, its calls counted."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.name = getattr(inner, "name", None)
        self.cfg = getattr(inner, "cfg", None)

    def detect(self, frame):
        self.calls += 1
        return self.inner.detect(frame)

    def embed(self, frame, landmarks):
        self.calls += 1
        return self.inner.embed(frame, landmarks)


def test_a_photo_seen_before_needs_neither_detector_nor_recogniser(recogniser):
    photo = demo.portrait("grace_hopper")
    det, rec = Counting(RetinaFaceDetector()), Counting(recogniser)
    first = face_from_image(photo, "grace", detector=det, recogniser=rec)
    assert (det.calls, rec.calls) == (1, 1)
    again = face_from_image(photo.copy(), "grace", detector=det, recogniser=rec)
    assert (det.calls, rec.calls) == (1, 1)  # both from the cache
    assert np.array_equal(again.image, first.image) and np.array_equal(again.landmarks, first.landmarks)
    assert np.array_equal(again.embeddings[recogniser.name], first.embeddings[recogniser.name])
    other = demo.portrait("astronaut")  # another photo: another key
    face_from_image(other, "astro", detector=det, recogniser=rec)
    assert (det.calls, rec.calls) == (2, 2)


def test_damaged_entries_are_computed_again(recogniser):
    photo = demo.portrait("grace_hopper")
    det, rec = Counting(RetinaFaceDetector()), Counting(recogniser)
    want = face_from_image(photo, "grace", detector=det, recogniser=rec)
    files = sorted(face_cache.root().glob("*.npy"))
    assert len(files) == 2  # the landmarks and the embedding
    for f in files:
        f.write_bytes(b"garbage")
    got = face_from_image(photo, "grace", detector=det, recogniser=rec)
    assert (det.calls, rec.calls) == (2, 2)
    assert np.array_equal(got.embeddings[recogniser.name], want.embeddings[recogniser.name])
    assert (
        face_cache.landmarks(face_cache.image_digest(photo), f"{face_cache.detector_id(det)}-pick0") is not None
    )  # written again (key: detector and face picked)


def test_unwritable_cache_still_loads_the_face(recogniser, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setattr(face_cache, "root", lambda: blocker / "photo-faces")
    photo = demo.portrait("grace_hopper")
    face = face_from_image(photo, "grace", detector=RetinaFaceDetector(), recogniser=recogniser)
    assert face.embeddings[recogniser.name].shape == (512,)


def test_deferred_recogniser_builds_in_the_background(recogniser):
    gate, built = threading.Event(), []

    def build():
        gate.wait(30)
        built.append(1)
        return recogniser

    d = DeferredRecogniser(recogniser.name, build)
    assert d.name == recogniser.name and not d.ready
    assert "loading in the background" in d.describe()
    d.start().start()  # one build, however often started
    photo = demo.portrait("grace_hopper")
    lms = RetinaFaceDetector().detect(photo)[0].landmarks[None]
    gate.set()
    emb = d.embed(photo, lms)
    assert built == [1] and d.ready
    assert np.array_equal(emb, recogniser.embed(photo, lms))
    assert d.crop_size == recogniser.crop_size and d.engine is recogniser.engine


def test_deferred_recogniser_raises_its_build_error_at_use():
    def build():
        raise ModelError("arcface is broken", hint="pull it again")

    d = DeferredRecogniser("arcface_w600k_r50", build).start()
    with pytest.raises(ModelError, match="broken"):
        d.embed(np.zeros((8, 8, 3), np.uint8), np.zeros((1, 5, 2), np.float32))
    assert d.ready and d.name == "arcface_w600k_r50"


def test_deferred_recogniser_waits_for_its_gate_unless_used_first(recogniser):
    built: list[str] = []

    profiled: list[bool] = []

    def build():
        built.append(threading.current_thread().name)
        profiled.append(sys.getprofile() is not None)
        return recogniser

    gate = threading.Event()
    d = DeferredRecogniser(recogniser.name, build).start(gate.wait)
    assert d.started and not d.ready and built == []  # held back by its gate
    gate.set()
    d._thread.join(10)  # the thread builds it once the gate opens
    assert d.ready and d.get() is recogniser and built == ["vcam-recogniser"]
    assert profiled == [True]  # its Python steps aside for the frame loop's rounds (engines.gate.ROUND_TURNS)

    held = threading.Event()
    e = DeferredRecogniser(recogniser.name, build).start(held.wait)
    assert e.get() is recogniser and built[-1] == threading.current_thread().name  # a use builds it now
    held.set()
    e._thread.join(5)
    assert len(built) == 2  # the thread found it built: never twice
    assert profiled == [True, False]  # built in the caller's thread: nothing installed there
