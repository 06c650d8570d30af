"""Face bank on disk, its CLI, and face switching that never stalls the frame loop."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import need_symlinks
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
from vcam.stages.faces import SOURCE_SIZE, FaceBank
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
    # the source image is the photo aligned at arcface_128 at SOURCE_SIZE (the classic swap draws
    # from it at the frame's resolution), its 5 points in it
    img = cv2.imread(str(ASSETS / "astronaut.jpg"))
    m = estimate(np.asarray(meta["landmarks"]), "arcface_128", SOURCE_SIZE)
    expected = warp_crops_ref(img, m[None], SOURCE_SIZE)[0]
    assert face.image.shape == (SOURCE_SIZE, SOURCE_SIZE, 3)
    assert np.abs(face.image.astype(int) - expected.astype(int)).max() <= 1
    lm = np.asarray(meta["landmarks"], np.float64) @ m[:, :2].T + m[:, 2]
    np.testing.assert_allclose(face.landmarks, lm, rtol=1e-5)
    assert np.abs(face.landmarks - TEMPLATES["arcface_128"] * SOURCE_SIZE).max() < 0.05 * SOURCE_SIZE
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
    where = re.escape(str(blank))
    with pytest.raises(FaceError, match=rf"^no face found in {where} \(use a photo where the face is clearly visible\)$"):
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
    for bad in ("grace\n", "gr\x1bace", "grace\r", "tab\tname"):  # control characters, a trailing newline
        with pytest.raises(FaceError, match=r"invalid face name '(grace|gr\\x1bace|tab\\tname)"):
            bank.add(ASSETS / "grace_hopper.jpg", bad, detector=detector)
        assert bad not in bank
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
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
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
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
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

    from vcam.control.client import send_command
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
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    photo = tmp_path / "photo.png"
    make(photo)
    r = CliRunner().invoke(faces_app, ["add", str(photo)])
    assert r.exit_code == 7, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output
    assert not (tmp_path / "bank").exists() or FaceBank(tmp_path / "bank").names() == []


def test_a_photo_with_transparency_is_laid_over_grey(tmp_path):
    from vcam.stages.photos import read_photo

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


# -- sizes checked before decoding, crops, full disks, links (issue 27) ------------------------------


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with no pixel data at all (a few dozen bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def _no_decoding(monkeypatch) -> None:
    """Make every whole-file reader of the photo path fail loudly: a refusal must come from a header."""

    def boom(*args, **kwargs):
        raise AssertionError("the image was read or decoded in full")

    monkeypatch.setattr(cv2, "imdecode", boom)
    monkeypatch.setattr(cv2, "imread", boom)
    monkeypatch.setattr(np, "fromfile", boom)


def _sparse(p: Path, size: int) -> None:
    with open(p, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n")
        fh.truncate(size)


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 10000 +X 10000\n" + bytes(4096), "is 10000x10000 pixels, too large"),
        (b"#?RGBE\n# a comment\n\n+X 9000 -Y 7000\n" + bytes(64), "is 9000x7000 pixels, too large"),
        (b"P7\nWIDTH 8000\nHEIGHT 8000\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n" + bytes(4096), "is 8000x8000 pixels"),
        (b"PF\n10000 10000\n-1.0\n" + bytes(4096), "is 10000x10000 pixels, too large"),
        (b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n" + bytes(64), "its Radiance HDR header is damaged"),
        (b"v/1\x01\x02\x00\x00\x00" + bytes(64), "whose size cannot be checked before decoding"),
        (None, "is 2147.5 MB, too large for a face photo (at most 64 MiB)"),
    ],
    ids=["hdr", "hdr-x-first", "pam", "pfm", "hdr-damaged", "exr", "sparse-2GiB"],
)
def test_photos_are_refused_from_their_header_or_file_size(tmp_path, monkeypatch, data, needle):
    """Every format is sized before decoding (or refused), and a big file before any byte is read:
    one line, the decoders never called, little memory used."""
    import tracemalloc

    from vcam.stages.photos import read_photo

    photo = tmp_path / "photo.img"
    if data is None:
        _sparse(photo, 2 << 30)
    else:
        photo.write_bytes(data)
    _no_decoding(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(FaceError) as info:
            read_photo(photo)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert peak < 4 << 20, peak


def test_faces_add_refuses_a_huge_hdr_and_a_2gib_file_in_one_line(tmp_path, monkeypatch):
    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    hdr = tmp_path / "big.hdr"
    hdr.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 10000 +X 10000\n" + bytes(4096))
    huge = tmp_path / "huge.png"
    _sparse(huge, 2 << 30)
    _no_decoding(monkeypatch)
    for photo, needle in ((hdr, "big.hdr is 10000x10000 pixels, too large"), (huge, "huge.png is 2147.5 MB, too large")):
        r = CliRunner().invoke(faces_app, ["add", str(photo)])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 7 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output


def test_formats_sized_from_their_own_headers_still_decode(tmp_path):
    """The header parsers agree with OpenCV on what it writes (width and height not swapped)."""
    from vcam.stages.photos import image_size, read_photo

    img = (np.arange(30 * 40 * 3) % 251).astype(np.uint8).reshape(30, 40, 3)
    for ext in ("hdr", "pam", "pfm", "ppm", "ras", "png", "jpg"):
        p = tmp_path / f"a.{ext}"
        assert cv2.imwrite(str(p), img.astype(np.float32) / 255 if ext in ("hdr", "pfm") else img), ext
        assert image_size(p) == (40, 30), ext
        assert read_photo(p).shape == (30, 40, 3), ext
    (tmp_path / "g.pgm").write_bytes(b"P5\n# made by hand\n40 30\n255\n" + bytes(1200))
    assert image_size(tmp_path / "g.pgm") == (40, 30) and read_photo(tmp_path / "g.pgm").shape == (30, 40, 3)


def test_an_oversized_stored_crop_is_refused_without_decoding(tmp_path, detector, monkeypatch):
    bank = FaceBank(tmp_path / "bank")
    bank.add(ASSETS / "grace_hopper.jpg", "grace", detector=detector)
    crop = tmp_path / "bank" / "grace" / "crop_arcface_128.png"
    crop.write_bytes(_png_header(16000, 16000))
    monkeypatch.setattr(cv2, "imread", lambda *a, **k: pytest.fail("the crop was decoded"))
    with pytest.raises(FaceError) as info:
        bank.load("grace")
    assert str(info.value) == (
        f"face 'grace' is damaged: its crop {crop} is 16000x16000 pixels, not 128x128 "
        "(remove it with `vcam faces remove grace` and add the photo again)"
    )


@pytest.mark.parametrize("where", ["photo copy", "meta.json", "embedding"])
def test_a_full_disk_during_add_is_one_error_and_leaves_nothing(tmp_path, detector, recogniser, monkeypatch, where):
    import errno
    import shutil

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "photo copy":
        monkeypatch.setattr(shutil, "copyfile", full)
    elif where == "meta.json":
        monkeypatch.setattr(Path, "write_text", full)
    else:
        monkeypatch.setattr(np, "save", full)
    bank = FaceBank(tmp_path / "bank")
    with pytest.raises(FaceError) as info:
        bank.add(ASSETS / "grace_hopper.jpg", "grace", detector=detector, recogniser=recogniser)
    assert str(info.value).endswith(": No space left on device (the disk is full: free some space and try again)")
    assert str(info.value).startswith("cannot ")
    assert list((tmp_path / "bank").iterdir()) == []  # no face folder, no temporary one


def test_faces_add_on_a_full_disk_prints_one_line(tmp_path, monkeypatch):
    import errno
    import shutil

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    monkeypatch.setattr(shutil, "copyfile", full)
    r = CliRunner().invoke(faces_app, ["add", str(ASSETS / "grace_hopper.jpg"), "--name", "grace"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 7 and len(lines) == 1, r.output
    assert lines[0] == (
        f"error: cannot write face 'grace' into {tmp_path / 'bank'}: No space left on device "
        "(the disk is full: free some space and try again)"
    )
    assert list((tmp_path / "bank").iterdir()) == []


def test_a_damaged_meta_json_warns_once_per_change(tmp_path, detector, caplog):
    import logging
    import os

    from vcam.stages.faces import BankWatcher

    bank = FaceBank(tmp_path / "bank")
    bank.add(ASSETS / "grace_hopper.jpg", "me", detector=detector)
    state = RuntimeState()
    watcher = BankWatcher(bank, state, bank.load)
    state.set_loader(watcher.load)
    state.set_face("me")
    meta = tmp_path / "bank" / "me" / "meta.json"
    good = meta.read_text()
    st = meta.stat()
    caplog.set_level(logging.WARNING)

    def damage(seconds: int) -> None:
        meta.write_text("{")
        os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))

    def warnings() -> int:
        return sum("changed on disk but cannot be loaded" in r.getMessage() for r in caplog.records)

    damage(1)
    for _ in range(3):
        assert watcher.check() == []
    assert warnings() == 1
    damage(2)  # changed again, still damaged: one more warning
    for _ in range(3):
        watcher.check()
    assert warnings() == 2
    meta.write_text(good)
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 3_000_000_000))
    assert watcher.check() == ["me"] and warnings() == 2


def test_remove_of_a_symlinked_face_removes_only_the_link(tmp_path, detector, monkeypatch):
    need_symlinks(tmp_path)
    elsewhere = FaceBank(tmp_path / "elsewhere")
    elsewhere.add(ASSETS / "grace_hopper.jpg", "grace", detector=detector)
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "linked").symlink_to(tmp_path / "elsewhere" / "grace")
    bank = FaceBank(tmp_path / "bank")
    assert bank.names() == ["linked"] and bank.entry("linked").name == "linked"  # a linked folder is a face
    cfgfile = tmp_path / "config.toml"
    cfgfile.write_text(f"[faces]\ndir = '{tmp_path / 'bank'}'\n[models]\ndir = '{tmp_path / 'models'}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfgfile))
    r = CliRunner().invoke(faces_app, ["remove", "linked"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"removed face 'linked' (only the link: {tmp_path / 'elsewhere' / 'grace'} was left alone)"
    assert not (tmp_path / "bank" / "linked").is_symlink() and bank.names() == []
    assert elsewhere.entry("grace").photo.is_file()  # the target is untouched


def test_a_photo_linking_outside_its_face_folder_is_damaged_and_left_out_of_obs(tmp_path, detector):
    need_symlinks(tmp_path)
    from vcam.cli.control import bank_images

    bank = FaceBank(tmp_path / "bank")
    bank.add(ASSETS / "grace_hopper.jpg", "grace", detector=detector)
    bank.add(ASSETS / "astronaut.jpg", "astro", detector=detector)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes((ASSETS / "grace_hopper.jpg").read_bytes())
    photo = bank.entry("grace").photo
    photo.unlink()
    photo.symlink_to(secret)
    with pytest.raises(FaceError, match="face 'grace' is damaged: its photo photo.jpg is a link to a file outside"):
        bank.entry("grace")
    assert bank_images(tmp_path / "bank") == {"astro": bank.entry("astro").photo}


def _png_ihdr(width: int, height: int, bits: int, colour: int) -> bytes:
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, bits, colour, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))


def test_decoded_size_and_bit_depth_are_capped_from_the_header_before_decoding(tmp_path, monkeypatch):
    """A 16-bit RGBA 7000x7000 PNG (49 MP, under the pixel cap, 392 MB decoded) is refused from its
    header alone: nothing is decoded (cv2.imdecode would fail the test). An 8-bit RGB picture of
    the same size still passes the header check."""
    from vcam.stages import photos

    def no_decode(*a, **k):
        raise AssertionError("decoded")

    monkeypatch.setattr(cv2, "imdecode", no_decode)
    deep = tmp_path / "deep.png"
    deep.write_bytes(_png_ihdr(7000, 7000, 16, 6) + bytes(64))
    with pytest.raises(FaceError, match=r"deep\.png is 7000x7000 16-bit RGBA, 392 MB once decoded, too large for a face photo"):
        photos.read_photo(deep)
    flat = tmp_path / "flat.png"
    flat.write_bytes(_png_ihdr(7000, 7000, 8, 2) + bytes(64))
    assert photos.image_size(flat) == (7000, 7000)
    wide = tmp_path / "wide.tif"
    from PIL import Image

    Image.new("I;16", (7000, 4000)).save(wide)  # Pillow's own header read: 16-bit grey, 56 MB: fine
    assert photos.image_size(wide) == (7000, 4000)


def test_a_group_photo_as_face_is_refused_listing_its_faces_and_pick_chooses(tmp_path, detector):
    """Issue 40: a photo of several faces given as --face (load_face_arg, what --face, [swap]
    source and a map's source go through) is one FaceError listing the faces and naming --pick;
    --pick K takes the K-th face from the left; --pick with a face-bank name is an error."""
    from vcam.stages.faces import load_face_arg

    two = _two_faces(tmp_path)
    with pytest.raises(
        FaceError,
        match=r"^2 faces found in source photo 'two people' \(1: at x=\d+ y=\d+, \d+x\d+ px, score [\d.]+; 2: at .*--pick K",
    ):
        load_face_arg(str(two), faces_dir=tmp_path / "bank", detector=detector)
    with pytest.raises(FaceError, match=r"--pick 3 is out of range: 2 face\(s\) found"):
        load_face_arg(str(two), faces_dir=tmp_path / "bank", detector=detector, pick=3)
    left = load_face_arg(str(two), faces_dir=tmp_path / "bank", detector=detector, pick=1)
    right = load_face_arg(str(two), faces_dir=tmp_path / "bank", detector=detector, pick=2)
    assert not np.array_equal(left.image, right.image)
    # the same face as `vcam faces add --pick` stores
    entry = FaceBank(tmp_path / "bank").add(two, "right", pick=2, detector=detector)
    again = load_face_arg(str(two), faces_dir=tmp_path / "bank", detector=detector, pick=2)  # cached now
    assert np.array_equal(again.image, right.image)
    assert float(np.abs(FaceBank(tmp_path / "bank").load("right").image.astype(int) - right.image).mean()) < 2, entry
    with pytest.raises(FaceError, match=r"--pick 2 chooses a face of a photo, and 'right' is a face-bank name"):
        load_face_arg("right", faces_dir=tmp_path / "bank", detector=detector, pick=2)
    # a photo of one face needs no --pick
    assert load_face_arg(str(ASSETS / "grace_hopper.jpg"), faces_dir=tmp_path / "bank", detector=detector).name == "grace_hopper"


def test_vcam_run_refuses_a_group_photo_in_one_line_and_runs_with_pick(tmp_path):
    from vcam.cli import app

    two = _two_faces(tmp_path)
    base = ["run", "--input", "demo", "--output", "null", "--frames", "2", "--quiet", "--device", "cpu", "--face", str(two)]
    runner = CliRunner()
    r = runner.invoke(app, base)
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 7 and len(lines) == 1 and lines[0].startswith("error: 2 faces found in source photo"), r.output
    assert "1: at x=" in r.output and "2: at x=" in r.output and "--pick K" in r.output
    r = runner.invoke(app, [*base, "--pick", "2"])
    assert r.exit_code == 0, r.output
