"""Face bank on disk, its CLI, and face switching that never stalls the frame loop."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from vcam import config_file as vconfig
from vcam.align import TEMPLATES, estimate
from vcam.cli.faces import faces_app
from vcam.errors import FaceError
from vcam.kernels.warp import warp_crops_ref
from vcam.models import registry, standin
from vcam.models.download import crc32_text
from vcam.pipeline.pipeline import Pipeline
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import FaceBank
from vcam.stages.track import Tracker
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat

ASSETS = Path(demo.__file__).parents[1] / "assets"


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector()


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    for name in ("arcface_w600k_r50", "inswapper_128"):
        p = standin.write(name, d, tiny=True)
        (d / registry.get(name).hash_file).write_text(crc32_text(p.read_bytes()))
    return vconfig.build({"models": {"dir": str(d)}, "pipeline": {"backend": "onnxruntime", "device": "cpu"}})


@pytest.fixture(scope="module")
def recogniser(cfg):
    return build_role("recogniser", cfg, store=model_store(cfg, progress=False))


class CountingRecogniser:
    """The real recogniser, counting calls and optionally held on an event (a slow model)."""

    def __init__(self, inner, gate: threading.Event | None = None):
        self.inner, self.gate, self.calls = inner, gate, 0
        self.name, self.template, self.crop_size = inner.name, inner.template, inner.crop_size
        self.entered = threading.Event()

    def embed(self, frame, landmarks):
        self.calls += 1
        self.entered.set()
        if self.gate is not None and not self.gate.wait(30):
            raise TimeoutError("test gate never opened")
        return self.inner.embed(frame, landmarks)


def _two_faces(tmp_path: Path) -> Path:
    a, h = demo.portrait("astronaut"), demo.portrait("grace_hopper")
    frame = demo.compose(
        (960, 480), [(h, demo.placement((256, 250), (250, 250), 0.7, 0)), (a, demo.placement((192, 160), (700, 230), 1.0, 0))]
    )
    p = tmp_path / "two people.png"
    cv2.imwrite(str(p), frame)
    return p


def test_add_stores_photo_crops_meta_and_cached_embedding(tmp_path, detector, recogniser):
    bank = FaceBank(tmp_path / "faces")
    rec = CountingRecogniser(recogniser)
    entry = bank.add(ASSETS / "astronaut.jpg", detector=detector, recogniser=rec)
    assert entry.name == "astronaut" and rec.calls == 1
    folder = tmp_path / "faces" / "astronaut"
    assert (folder / "photo.jpg").read_bytes() == (ASSETS / "astronaut.jpg").read_bytes()
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["name"] == "astronaut" and len(meta["sha256"]) == 64 and np.asarray(meta["landmarks"]).shape == (5, 2)
    crop128 = cv2.imread(str(folder / "crop_arcface_128.png"))
    assert crop128.shape == (128, 128, 3)
    assert cv2.imread(str(folder / "crop_arcface_112_v2.png")).shape == (112, 112, 3)
    emb_file = folder / "embeddings" / f"arcface_w600k_r50-{meta['sha256'][:32]}.npy"
    assert emb_file.is_file()

    face = bank.load("astronaut", recogniser=rec)
    assert rec.calls == 1  # from the cache
    np.testing.assert_array_equal(face.image, crop128)
    # the crop is the photo aligned at arcface_128 / 128, the classic swapper's source image
    img = cv2.imread(str(ASSETS / "astronaut.jpg"))
    expected = warp_crops_ref(img, estimate(np.asarray(meta["landmarks"]), "arcface_128", 128)[None], 128)[0]
    assert np.abs(face.image.astype(int) - expected.astype(int)).max() <= 1
    np.testing.assert_allclose(face.landmarks, TEMPLATES["arcface_128"] * 128, rtol=1e-6)
    direct = recogniser.embed(img, np.asarray(meta["landmarks"], np.float32)[None])[0]
    np.testing.assert_allclose(face.embeddings["arcface_w600k_r50"], direct, rtol=1e-4, atol=1e-4)
    assert [e.name for e in bank.list()] == ["astronaut"] and bank.list()[0].embeddings == ("arcface_w600k_r50",)

    # a face added without a recogniser gets its embedding on first load, then cached
    bank.add(ASSETS / "grace_hopper.jpg", "hopper", detector=detector)
    assert bank.entry("hopper").embeddings == ()
    bank.load("hopper", recogniser=rec)
    assert rec.calls == 2 and bank.entry("hopper").embeddings == ("arcface_w600k_r50",)
    bank.load("hopper", recogniser=rec)
    assert rec.calls == 2


def test_no_face_several_faces_and_pick(tmp_path, detector):
    bank = FaceBank(tmp_path / "faces")
    blank = tmp_path / "wall.png"
    cv2.imwrite(str(blank), np.full((240, 320, 3), 128, np.uint8))
    with pytest.raises(FaceError, match=rf"^no face found in {blank} \(use a photo where the face is clearly visible\)$"):
        bank.add(blank, detector=detector)
    two = _two_faces(tmp_path)
    with pytest.raises(
        FaceError,
        match=r"2 faces found in .*two people\.png \(1: at x=\d+ y=\d+, \d+x\d+ px, score .*; 2: at .*choose one with --pick K",
    ):
        bank.add(two, detector=detector)
    with pytest.raises(FaceError, match=r"--pick 3 is out of range: 2 face\(s\) found"):
        bank.add(two, pick=3, detector=detector)
    assert bank.names() == []  # nothing half-written
    assert not (tmp_path / "faces").exists() or list((tmp_path / "faces").iterdir()) == []
    right = bank.add(two, "right", pick=2, detector=detector)
    left = bank.add(two, "left", pick=1, detector=detector)
    assert right.landmarks[:, 0].mean() > 480 > left.landmarks[:, 0].mean()
    assert bank.names() == ["left", "right"]


def test_names_duplicates_remove_and_unknown(tmp_path, detector):
    bank = FaceBank(tmp_path / "faces")
    bank.add(ASSETS / "astronaut.jpg", "me", detector=detector)
    with pytest.raises(FaceError, match=r"a face named 'me' already exists \(pass --name, or remove it first"):
        bank.add(ASSETS / "grace_hopper.jpg", "me", detector=detector)
    with pytest.raises(FaceError, match=r"invalid face name '\.\./evil'"):
        bank.add(ASSETS / "grace_hopper.jpg", "../evil", detector=detector)
    with pytest.raises(FaceError, match=r"photo not found: .*nope\.jpg"):
        bank.add(tmp_path / "nope.jpg", detector=detector)
    with pytest.raises(FaceError, match=r"unknown face 'you' \(known faces: me\)"):
        bank.load("you")
    bank.remove("me")
    assert bank.names() == [] and not (tmp_path / "faces" / "me").exists()
    assert (ASSETS / "astronaut.jpg").is_file()  # the user's photo is untouched


@pytest.mark.slow
def test_switching_faces_never_blocks_the_frame_loop(tmp_path, cfg, detector, recogniser):
    """A face is added with a slow recogniser while frames keep flowing; the switch takes effect on
    the next frame."""
    store = model_store(cfg, progress=False)
    swapper = build_role("swapper", cfg, name="inswapper_128", store=store)
    bank = FaceBank(tmp_path / "faces")
    bank.add(ASSETS / "astronaut.jpg", "astronaut", detector=detector, recogniser=recogniser)
    state = RuntimeState()
    state.add_face(bank.load("astronaut", recogniser=recogniser, swappers=[swapper]), activate=True)

    gate = threading.Event()
    slow = CountingRecogniser(recogniser, gate)
    added = threading.Event()
    errors: list[BaseException] = []

    def control():  # what `vcam faces add` + `ctl face hopper` do, off the frame loop
        try:
            bank.add(ASSETS / "grace_hopper.jpg", "hopper", detector=RetinaFaceDetector())
            face = bank.load("hopper", recogniser=slow, swappers=[swapper])
            state.add_face(face)
            added.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            added.set()

    clip = demo.DemoClip(480, 270, seconds=1.0, detector=detector)
    src = clip.frame(0)
    pipe = Pipeline(ops=swapper.ops, tracker=Tracker(detector, cfg.track, 2), swapper=swapper, max_faces=2)
    outputs: list[tuple[str, np.ndarray]] = []
    snap_times: list[float] = []

    def one_frame(seq):
        t = time.perf_counter()
        snap = state.snapshot()
        snap_times.append(time.perf_counter() - t)
        out, stats = pipe.process(Frame(src.copy(), src.shape[1], src.shape[0], PixelFormat.BGR, 0.0, seq), snap)
        outputs.append((snap.face.name, out.copy()))  # the pipeline reuses its output buffer
        return stats

    worker = threading.Thread(target=control, daemon=True)
    worker.start()
    assert slow.entered.wait(30), "the slow recogniser never started"
    seq = 0
    while seq < 5:  # frames flow while the recogniser is stuck inside the new face's load
        one_frame(seq)
        seq += 1
    assert not added.is_set() and slow.calls == 1
    gate.set()
    while not added.wait(0.001):
        one_frame(seq)
        seq += 1
    assert not errors, errors
    worker.join(5)
    one_frame(seq)
    seq += 1
    assert state.set_face("hopper") == "hopper"
    one_frame(seq)  # the very next frame uses the new face
    names = [n for n, _ in outputs]
    assert names[-1] == "hopper" and set(names[:-1]) == {"astronaut"}
    before, after = outputs[-2][1], outputs[-1][1]
    assert np.abs(before.astype(int) - after.astype(int)).max() > 10
    print(f"snapshot max {max(snap_times) * 1e6:.0f} us over {len(snap_times)} frames")


def test_faces_cli(tmp_path, monkeypatch):
    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f'[faces]\ndir = "{tmp_path / "bank"}"\n[models]\ndir = "{tmp_path / "models"}"\n')
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    runner = CliRunner()
    r = runner.invoke(faces_app, ["list"])
    assert r.exit_code == 0 and "no faces in" in r.output
    r = runner.invoke(faces_app, ["add", str(ASSETS / "grace_hopper.jpg"), "--name", "grace"])
    assert r.exit_code == 0, r.output
    assert f"added face 'grace' ({tmp_path / 'bank' / 'grace'})" in r.output
    two = _two_faces(tmp_path)
    r = runner.invoke(faces_app, ["add", str(two)])
    assert r.exit_code == 7 and "2 faces found in" in r.output and "--pick K" in r.output
    r = runner.invoke(faces_app, ["add", str(two), "--pick", "2", "--name", "collins"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(faces_app, ["list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "grace" in r.output and "collins" in r.output
    r = runner.invoke(faces_app, ["remove", "grace"])
    assert r.exit_code == 0 and "removed face 'grace'" in r.output
    r = runner.invoke(faces_app, ["remove", "grace"])
    assert r.exit_code == 7 and "unknown face 'grace' (known faces: collins)" in r.output


# -- a damaged bank, bad photos, faces replaced on disk ---------------------------------------------


def _bank_with_a_damaged_face(root: Path, detector) -> FaceBank:
    bank = FaceBank(root)
    bank.add(ASSETS / "grace_hopper.jpg", "grace", detector=detector)
    (root / "broken").mkdir()
    (root / "broken" / "meta.json").write_text('{"name": "broken"}')
    return bank


def test_a_damaged_face_is_named_with_its_fix_and_the_others_work(tmp_path, detector, monkeypatch):
    bank = _bank_with_a_damaged_face(tmp_path / "bank", detector)
    entries, damaged = bank.scan()
    assert [e.name for e in entries] == ["grace"] and list(damaged) == ["broken"]
    assert str(damaged["broken"]) == (
        "face 'broken' is damaged: its meta.json has no 'photo', 'sha256', 'landmarks', 'box' "
        "(remove it with `vcam faces remove broken` and add the photo again)"
    )
    with pytest.raises(FaceError, match="face 'broken' is damaged"):
        bank.load("broken")
    assert bank.load("grace").name == "grace"
    for meta in ('{"photo": "p.jpg", "sha256": "x", "landmarks": [1, 2], "box": [0, 0, 1, 1]}', "[]", "{", "7"):
        (tmp_path / "bank" / "broken" / "meta.json").write_text(meta)
        with pytest.raises(FaceError, match="face 'broken' is damaged"):
            bank.entry("broken")
    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f'[faces]\ndir = "{tmp_path / "bank"}"\n[models]\ndir = "{tmp_path / "models"}"\n')
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    runner = CliRunner()
    r = runner.invoke(faces_app, ["list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "grace" in r.output and "DAMAGED" in r.output, r.output
    assert "warning: face 'broken' is damaged" in r.output and "vcam faces remove broken" in r.output
    r = runner.invoke(faces_app, ["remove", "broken"])
    assert r.exit_code == 0 and "removed face 'broken'" in r.output
    assert bank.names() == ["grace"]


def test_vcam_run_and_ctl_with_a_damaged_face(tmp_path, detector, caplog):
    """`vcam run` starts with the others (one warning naming the fix); `vcam ctl face broken`
    answers with the fix instead of hanging."""
    import logging

    from obs_harness import CapturingOutput, demo_daemon_config

    from vcam.control.local import send_command
    from vcam.errors import ControlError
    from vcam.runtime.daemon import Daemon

    _bank_with_a_damaged_face(tmp_path / "bank", detector)
    sock = tmp_path / "run" / "vcam.sock"
    cfg = demo_daemon_config(sock)
    cfg = cfg.replace(faces=type(cfg.faces)(**{**cfg.faces.__dict__, "dir": str(tmp_path / "bank")}))
    caplog.set_level(logging.WARNING)
    daemon = Daemon(cfg, output=CapturingOutput())
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
        assert "grace" in daemon.state.names and "broken" not in daemon.state.names
        with pytest.raises(ControlError) as info:
            send_command(sock, {"face": "broken"}, timeout=10)
        assert info.value.message.startswith("face 'broken' is damaged") and "vcam faces remove broken" in info.value.hint
        assert send_command(sock, {"face": "grace"}, timeout=10)["face"] == "grace"
    finally:
        daemon.stop()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(m.startswith("face 'broken' skipped: face 'broken' is damaged") for m in warned), warned


@pytest.mark.slow
@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n not really"), "is not an image that can be read"),
        (lambda p: cv2.imwrite(str(p), np.zeros((64, 64, 4), np.uint8)), "is fully transparent"),
        (lambda p: __import__("PIL.Image").Image.new("1", (8000, 8000)).save(p), "is 8000x8000 pixels, too large"),
        (lambda p: __import__("PIL.Image").Image.new("1", (16000, 16000)).save(p), "too large for a face photo"),
    ],
    ids=["empty", "garbage", "transparent", "large", "huge"],
)
def test_faces_add_refuses_bad_photos_in_one_line(tmp_path, monkeypatch, make, needle):
    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f'[faces]\ndir = "{tmp_path / "bank"}"\n[models]\ndir = "{tmp_path / "models"}"\n')
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    photo = tmp_path / "photo.png"
    make(photo)
    r = CliRunner().invoke(faces_app, ["add", str(photo)])
    assert r.exit_code == 7, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output
    assert not (tmp_path / "bank").exists() or FaceBank(tmp_path / "bank").names() == []


def test_a_photo_with_transparency_is_laid_over_grey(tmp_path):
    from vcam.stages.faces import read_photo

    img = np.zeros((8, 8, 4), np.uint8)
    img[..., :3] = (0, 0, 255)
    img[:4, ..., 3] = 255  # top half opaque red, bottom half transparent
    cv2.imwrite(str(tmp_path / "a.png"), img)
    out = read_photo(tmp_path / "a.png")
    assert out.shape == (8, 8, 3)
    assert (out[0, 0] == (0, 0, 255)).all() and (out[7, 7] == (128, 128, 128)).all()


@pytest.mark.slow
def test_a_face_replaced_on_disk_is_reloaded_while_running(tmp_path, detector):
    """Remove a face and add another photo under the same name: the running daemon swaps the new one
    (the watcher's pass), and the active face stays active."""
    from vcam.stages.faces import BankWatcher

    bank = FaceBank(tmp_path / "bank")
    bank.add(ASSETS / "astronaut.jpg", "me", detector=detector)
    bank.add(ASSETS / "grace_hopper.jpg", "other", detector=detector)
    state = RuntimeState()
    watcher = BankWatcher(bank, state, bank.load, interval=0.05)
    state.set_loader(watcher.load)
    state.set_face("me")
    first = state.snapshot().face.image.copy()
    assert watcher.check() == []  # nothing changed
    bank.remove("me")
    assert watcher.check() == [] and state.active == "me"  # removed: the loaded face stays until it comes back
    bank.add(ASSETS / "grace_hopper.jpg", "me", detector=detector)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and np.array_equal(state.snapshot().face.image, first):
            time.sleep(0.02)
    finally:
        watcher.stop()
    snap = state.snapshot()
    assert state.active == "me" and not np.array_equal(snap.face.image, first)
    assert np.array_equal(snap.face.image, bank.load("other").image)  # the same photo as 'other' now
