"""Neural swapper adapters end to end on tiny stand-ins through onnxruntime and the real pipeline."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch

from vcam import config_file as vconfig
from vcam.align import estimate
from vcam.engines import create_engine, explain_backends
from vcam.errors import EngineUnavailable, FaceError, ModelError
from vcam.kernels.paste import box_mask, paste_boxes
from vcam.models import registry, standin
from vcam.models.download import crc32_text
from vcam.pipeline.pipeline import Pipeline
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.enhance import Enhancer
from vcam.stages.faces import FaceBank
from vcam.stages.recognize import pick_by_reference, reference_filter, similarity
from vcam.stages.swap_neural import NeuralSwapper, inswapper_latent, read_emap
from vcam.stages.track import Tracker
from vcam.state import Snapshot
from vcam.types import Frame, PixelFormat, SourceFace

ASSETS = Path(demo.__file__).parents[1] / "assets"
ADAPTERS = ["inswapper_128", "hyperswap_1a_256", "simswap_256"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """Tiny stand-ins placed by hand (with their .hash files), as a user would."""
    d = tmp_path_factory.mktemp("models")
    for name in ("arcface_w600k_r50", "inswapper_128", "hyperswap_1a_256", "simswap_256", "crossface_simswap", "gfpgan_1.4"):
        p = standin.write(name, d, tiny=True)
        (d / registry.get(name).hash_file).write_text(crc32_text(p.read_bytes()))
    return d


@pytest.fixture(scope="module")
def cfg(models_dir, tmp_path_factory):
    return vconfig.build(
        {
            "models": {"dir": str(models_dir)},
            "faces": {"dir": str(tmp_path_factory.mktemp("faces"))},
            "pipeline": {"backend": "onnxruntime", "device": "cpu", "max_faces": 4},
            "track": {"rescan_every": 5},
        }
    )


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector()


@pytest.fixture(scope="module")
def recogniser(cfg):
    return build_role("recogniser", cfg, store=model_store(cfg, progress=False))


@pytest.fixture(scope="module")
def bank(cfg, detector, recogniser) -> FaceBank:
    b = FaceBank(cfg.faces_dir)
    b.add(ASSETS / "astronaut.jpg", "astronaut", detector=detector, recogniser=recogniser)
    b.add(ASSETS / "grace_hopper.jpg", "hopper", detector=detector, recogniser=recogniser)
    return b


def _frame(img: np.ndarray, seq: int) -> Frame:
    return Frame(img.copy(), img.shape[1], img.shape[0], PixelFormat.BGR, 0.0, seq)


def _pipeline(cfg, detector, swapper, **kw):
    return Pipeline(
        ops=swapper.ops,
        tracker=Tracker(detector, cfg.track, cfg.pipeline.max_faces),
        swapper=swapper,
        max_faces=cfg.pipeline.max_faces,
        **kw,
    )


SHIFT = [np.array([[1.0, 0.0, -128.0 * k], [0.0, 1.0, 0.0]]) for k in range(3)]  # crop k = frame[:, 128k:128k+128]


def test_inswapper_latent_matches_numpy(models_dir, bank, recogniser):
    import onnx
    from onnx import numpy_helper

    path = models_dir / "inswapper_128.onnx"
    model = onnx.load(str(path))
    last = model.graph.initializer[-1]
    assert last.name == "emap"
    used = {i for n in model.graph.node for i in n.input}
    assert "emap" not in used
    emap_direct = numpy_helper.to_array(last)
    np.testing.assert_array_equal(read_emap(path), emap_direct)

    face = bank.load("astronaut", recogniser=recogniser)
    e = face.embeddings["arcface_w600k_r50"].astype(np.float64)
    expected = (e / np.sqrt((e * e).sum())) @ emap_direct.astype(np.float64)
    expected /= np.sqrt((expected * expected).sum())
    swapper = NeuralSwapper("inswapper_128", create_engine(path), emap=emap_direct)
    prepared = swapper.prepare(face)
    np.testing.assert_allclose(prepared.latents["inswapper_128"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inswapper_latent(e, emap_direct), expected, rtol=1e-5, atol=1e-6)
    assert prepared.latents["inswapper_128"].dtype == np.float32


def test_source_recipes_for_hyperswap_and_simswap(cfg, bank, recogniser, models_dir):
    face = bank.load("astronaut", recogniser=recogniser)
    e = face.embeddings["arcface_w600k_r50"]
    hyper = build_role("swapper", cfg, name="hyperswap_1a_256", store=model_store(cfg, progress=False))
    np.testing.assert_allclose(hyper.prepare(face).latents["hyperswap_1a_256"], e / np.linalg.norm(e), rtol=1e-6)
    sim = build_role("swapper", cfg, name="simswap_256", store=model_store(cfg, progress=False))
    conv = create_engine(models_dir / "crossface_simswap.onnx")
    c = conv.run({"input": e[None]})[0][0]
    np.testing.assert_allclose(sim.prepare(face).latents["simswap_256"], c / np.linalg.norm(c), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTERS)
def test_adapter_end_to_end_in_the_pipeline(name, cfg, bank, recogniser, detector):
    """detector -> recogniser -> swapper -> paste-back on the demo clip, through vcam.pipeline.pipeline."""
    store = model_store(cfg, progress=False)
    swapper = build_role("swapper", cfg, name=name, store=store)
    spec = registry.get(name)
    assert (swapper.template, swapper.crop_size) == (spec.template, spec.size)
    astronaut = bank.load("astronaut", recogniser=recogniser, swappers=[swapper])
    hopper = bank.load("hopper", recogniser=recogniser, swappers=[swapper])
    assert not np.allclose(astronaut.latents[name], hopper.latents[name])

    clip = demo.DemoClip(640, 360, seconds=1.0, detector=detector)
    pipe = _pipeline(cfg, detector, swapper)
    other = _pipeline(cfg, detector, build_role("swapper", cfg, name=name, store=store))
    for i in range(3):
        src = clip.frame(i)
        out, stats = pipe.process(_frame(src, i), Snapshot(astronaut, True, 0))
        out_b, _ = other.process(_frame(src, i), Snapshot(hopper, True, 0))
        assert stats.swapped == 1 and pipe.guarded() == 0
        assert out.shape == src.shape and out.dtype == np.uint8
        x1, y1, x2, y2 = clip.truth(i)[0].astype(int)
        inner = (slice(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4), slice(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4))
        diff = np.abs(out[inner].astype(int) - src[inner].astype(int)).mean()
        assert diff > 2.0, f"{name}: the face was not changed (mean diff {diff:.2f})"
        # outside the paste box nothing moves
        tr = pipe.last_tracks[0]
        m = estimate(tr.landmarks, swapper.template, swapper.crop_size)
        bx0, by0, bx1, by1 = paste_boxes(m[None], swapper.crop_size, *src.shape[:2])[0]
        outside = np.ones(src.shape[:2], bool)
        outside[by0:by1, bx0:bx1] = False
        np.testing.assert_array_equal(out[outside], src[outside])
        # the source identity reaches the output
        assert np.abs(out[inner].astype(int) - out_b[inner].astype(int)).mean() > 0.5


def test_nan_output_passes_the_face_through(tmp_path):
    from onnx import TensorProto, helper

    # output = sqrt(target - 0.5): NaN for a dark face, finite for a bright one
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes = [helper.make_node("Sub", ["target", "half"], ["d"]), helper.make_node("Sqrt", ["d"], ["output"])]
    graph = helper.make_graph(
        nodes,
        "nan",
        [
            helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 3, 128, 128]),
            helper.make_tensor_value_info("source", TensorProto.FLOAT, ["N", 512]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, 128, 128])],
        initializer=[half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    import onnx

    onnx.save(model, tmp_path / "nan.onnx")
    swapper = NeuralSwapper("inswapper_128", create_engine(tmp_path / "nan.onnx"), emap=np.eye(512, dtype=np.float32))
    face = swapper.prepare(
        SourceFace("x", np.zeros((128, 128, 3), np.uint8), embeddings={"arcface_w600k_r50": np.ones(512, np.float32)})
    )
    frame = np.concatenate([np.full((128, 128, 3), v, np.uint8) for v in (250, 20, 200)], axis=1)
    out, mask = swapper.swap(frame, np.stack(SHIFT), face)
    assert swapper.guarded() == 1
    np.testing.assert_array_equal(out[1], frame[:, 128:256])
    expected0 = np.floor(np.sqrt(250 / 255 - 0.5) * 255 + 0.5)
    assert np.all(out[0] == expected0)
    np.testing.assert_array_equal(mask, box_mask(128))
    swapper.swap(frame[:, 128:256], SHIFT[0][None], face)
    assert swapper.guarded() == 2


def test_unprepared_face_and_wrong_model_are_clear_errors(cfg, models_dir):
    swapper = build_role("swapper", cfg, name="inswapper_128", store=model_store(cfg, progress=False))
    face = SourceFace("bare", np.zeros((128, 128, 3), np.uint8))
    with pytest.raises(FaceError, match="face 'bare' has no arcface_w600k_r50 embedding"):
        swapper.prepare(face)
    with pytest.raises(FaceError, match="face 'bare' is not prepared for inswapper_128"):
        swapper.swap(np.zeros((128, 128, 3), np.uint8), SHIFT[0][None], face)
    with pytest.raises(ModelError, match="gfpgan_1.4 is a enhancer, not a swapper"):
        build_role("swapper", cfg, name="gfpgan_1.4")
    with pytest.raises(ModelError, match=r"has inputs \['input'\], expected \['target', 'source'\]"):
        NeuralSwapper("inswapper_128", create_engine(models_dir / "crossface_simswap.onnx"), emap=np.eye(512))


def test_identity_lock_swaps_only_the_reference_person(cfg, bank, recogniser, detector):
    a, h = demo.portrait("astronaut"), demo.portrait("grace_hopper")
    frame = demo.compose(
        (960, 480), [(a, demo.placement((192, 160), (250, 230), 1.0, 4)), (h, demo.placement((256, 250), (700, 250), 0.7, -3))]
    )
    dets = sorted(detector.detect(frame), key=lambda d: float(d.box[0]))
    assert len(dets) == 2
    emb = recogniser.embed(frame, np.stack([d.landmarks for d in dets]))
    ref_a = bank.load("astronaut", recogniser=recogniser).embeddings["arcface_w600k_r50"]
    ref_h = bank.load("hopper", recogniser=recogniser).embeddings["arcface_w600k_r50"]
    sims = similarity(emb, ref_a)
    assert sims.shape == (2,) and sims[0] > sims[1]
    assert pick_by_reference(emb, ref_a, cfg.swap.reference_threshold).tolist() == [0]
    assert pick_by_reference(emb, ref_h, cfg.swap.reference_threshold).tolist() == [1]
    assert pick_by_reference(emb, ref_a, 0.999).tolist() == []
    assert pick_by_reference(np.zeros((0, 512), np.float32), ref_a, 0.0).tolist() == []

    # inside the pipeline: only the astronaut (left) changes
    swapper = build_role("swapper", cfg, name="inswapper_128", store=model_store(cfg, progress=False))
    source = bank.load("hopper", recogniser=recogniser, swappers=[swapper])
    pipe = _pipeline(cfg, detector, swapper, face_filter=reference_filter(recogniser, ref_a, cfg.swap.reference_threshold))
    out, stats = pipe.process(_frame(frame, 0), Snapshot(source, True, 0))
    assert stats.faces == 2 and stats.swapped == 1
    left, right = (slice(None), slice(0, 480)), (slice(None), slice(480, 960))
    assert np.abs(out[left].astype(int) - frame[left].astype(int)).max() > 30
    np.testing.assert_array_equal(out[right], frame[right])
    tracks = sorted(pipe.last_tracks, key=lambda t: float(t.box[0]))
    assert tracks[0].similarity > tracks[1].similarity


def test_enhancer_blends_by_amount(cfg, detector):
    """The restored face is pasted with the box mask scaled by ``amount``: 0 changes nothing, half
    the amount moves every pixel half as far (within rounding)."""
    store = model_store(cfg, progress=False)
    img = demo.portrait("astronaut")
    lms = detector.detect(img)[0].landmarks[None]
    off = build_role("enhancer", cfg.replace(swap=replace(cfg.swap, enhancer_amount=0.0)), name="gfpgan_1.4", store=store)
    np.testing.assert_array_equal(off.enhance(img.copy(), lms), img)
    full = build_role("enhancer", cfg.replace(swap=replace(cfg.swap, enhancer_amount=1.0)), name="gfpgan_1.4", store=store)
    half = Enhancer("gfpgan_1.4", full.engine, amount=0.5)
    e1 = full.enhance(img.copy(), lms).astype(int) - img
    e5 = half.enhance(img.copy(), lms).astype(int) - img
    assert np.abs(e1).mean() > 1
    assert np.abs(e5 - e1 / 2).max() <= 1.01
    m = estimate(lms[0], "ffhq_512", 512)
    x0, y0, x1, y1 = paste_boxes(m[None], 512, *img.shape[:2])[0]
    outside = np.ones(img.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert not e1[outside].any()


def test_the_enhancer_amount_changes_between_frames(cfg, detector):
    """``enhance(..., amount=A)`` (the desk's amount slider, passed by the pipeline per frame) blends
    as an enhancer built with amount A does, from that frame on; 0 leaves the frame as it was."""
    store = model_store(cfg, progress=False)
    img = demo.portrait("astronaut")
    lms = detector.detect(img)[0].landmarks[None]
    enh = build_role("enhancer", cfg.replace(swap=replace(cfg.swap, enhancer_amount=1.0)), name="gfpgan_1.4", store=store)
    half = Enhancer("gfpgan_1.4", enh.engine, amount=0.5)
    np.testing.assert_array_equal(enh.enhance(img.copy(), lms, amount=0.5), half.enhance(img.copy(), lms))
    assert enh.amount == 0.5
    np.testing.assert_array_equal(enh.enhance(img.copy(), lms), half.enhance(img.copy(), lms))  # kept
    np.testing.assert_array_equal(enh.enhance(img.copy(), lms, amount=0.0), img)


def test_backend_selection_explains_each_choice(models_dir, monkeypatch):
    path = models_dir / "crossface_simswap.onnx"
    assert explain_backends(path, device="cpu") == [("onnxruntime", True, "selected")]
    assert explain_backends(path, backend="tensorrt", device="cpu") == [
        ("tensorrt", False, "TensorRT runs on CUDA only (device is cpu)")
    ]
    eng = create_engine(path, backend="auto", device="cpu")
    assert (eng.backend, eng.device) == ("onnxruntime", "cpu")
    assert [t.name for t in eng.inputs] == ["input"] and eng.inputs[0].dtype == np.float32
    assert eng.inputs[0].fixed_batch is None
    from vcam import engines

    monkeypatch.setitem(engines.BACKENDS, "onnxruntime", "some_missing_runtime_pkg:Engine")
    monkeypatch.setitem(engines.BACKENDS, "torch", "another_missing_pkg:Engine")
    with pytest.raises(
        EngineUnavailable,
        match=r"onnxruntime: not installed \(no module named 'some_missing_runtime_pkg'\); "
        r"torch: not installed \(no module named 'another_missing_pkg'\)",
    ):
        create_engine(path, device="cpu")
    monkeypatch.setitem(engines.BACKENDS, "onnxruntime", "vcam.engines.ort:NoSuchClass")
    assert explain_backends(path, backend="onnxruntime")[0][2].startswith("broken: AttributeError")
    with pytest.raises(EngineUnavailable, match="unknown inference backend 'cuda-magic'"):
        create_engine(path, backend="cuda-magic")


@pytest.mark.skipif(
    not os.environ.get("VCAM_FULL_STANDIN"), reason="set VCAM_FULL_STANDIN=1 to build the 550 MB inswapper stand-in"
)
def test_full_size_inswapper_standin(tmp_path):
    p = standin.write("inswapper_128", tmp_path / "inswapper_128.onnx")
    import onnx

    model = onnx.load(str(p))
    assert standin.count_parameters(model) == 138_292_739
    eng = create_engine(p)
    sw = NeuralSwapper("inswapper_128", eng, emap=read_emap(p))
    face = sw.prepare(
        SourceFace("x", np.zeros((128, 128, 3), np.uint8), embeddings={"arcface_w600k_r50": np.ones(512, np.float32)})
    )
    out, _ = sw.swap(demo.portrait("astronaut")[100:228, 100:228].copy(), SHIFT[0][None], face)
    assert out.shape == (1, 128, 128, 3) and sw.guarded() == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTERS + ["gfpgan_1.4"])
def test_every_swapper_family_on_each_device_and_backend(name, cfg, models_dir, bank, recogniser, device):
    """Each swapper family (and the enhancer) on torch with the ops of ``device`` gives the crops
    onnxruntime on the CPU gives (one level of rounding), masks included."""
    need_torch()
    from vcam.ops import make_ops

    ops = make_ops(device)
    store = model_store(cfg, progress=False)
    frame = demo.DemoClip(640, 360, seconds=1.0).frame(3)
    dets = RetinaFaceDetector().detect(frame)
    assert dets
    if name == "gfpgan_1.4":
        ref = build_role("enhancer", cfg, name=name, store=store).enhance(frame.copy(), dets[0].landmarks[None])
        enh = build_role("enhancer", cfg, name=name, store=store, ops=ops, device=device, backend="torch")
        assert enh.engine.backend == "torch" and enh.engine.device == device
        got = (
            enh.ops.to_host(enh.enhance(ops.asarray(frame.copy()), dets[0].landmarks[None]))
            if device != "cpu"
            else enh.enhance(frame.copy(), dets[0].landmarks[None])
        )
        assert np.abs(got.astype(int) - ref).max() <= 1
        return
    ref_sw = build_role("swapper", cfg, name=name, store=store)
    sw = build_role("swapper", cfg, name=name, store=store, ops=ops, device=device, backend="torch")
    assert sw.engine.backend == "torch" and sw.engine.device == device
    face = bank.load("astronaut", recogniser=recogniser, swappers=[ref_sw, sw])
    mats = np.stack([estimate(d.landmarks, sw.template, sw.crop_size) for d in dets])
    want, want_mask = ref_sw.swap(frame, mats, face)
    got, got_mask = sw.swap(ops.asarray(frame) if device != "cpu" else frame, mats, face)
    got, got_mask = (ops.to_host(got), ops.to_host(got_mask)) if device != "cpu" else (got, got_mask)
    assert np.abs(got.astype(int) - want).max() <= 1
    np.testing.assert_allclose(got_mask, want_mask, atol=1e-4)


def test_hyperswap_pastes_with_the_smaller_of_its_mask_and_the_box(cfg, bank, recogniser):
    """hyperswap's files have a second output, ``mask``: it is kept (downloads with it verify) and
    the paste mask is min(box, model mask) per face."""
    store = model_store(cfg, progress=False)
    sw = build_role("swapper", cfg, name="hyperswap_1a_256", store=store)
    assert [o.name for o in sw.engine.outputs] == ["output", "mask"]
    store.verify("hyperswap_1a_256")  # two outputs where the registry once listed one: accepted
    face = bank.load("hopper", recogniser=recogniser, swappers=[sw])
    frame = demo.DemoClip(640, 360, seconds=1.0).frame(0)
    m = estimate(RetinaFaceDetector().detect(frame)[0].landmarks, sw.template, sw.crop_size)[None]
    _, mask = sw.swap(frame, m, face)
    raw = sw.engine.run({"target": sw.engine.input_buffers(1)["target"], "source": sw.engine.input_buffers(1)["source"]})[1]
    assert mask.shape == (1, 256, 256)
    np.testing.assert_allclose(mask[0], np.minimum(raw[0, 0], box_mask(256, cfg.swap.blur)), atol=1e-6)
    assert (mask[0] < box_mask(256, cfg.swap.blur) - 1e-3).any()  # the model's mask is not all ones


def test_emap_is_read_once_then_cached(tmp_path, monkeypatch):
    """read_emap parses the ONNX file once; later starts read the cached matrix (keyed by the file's
    size and mtime); a damaged cache entry is rebuilt; a changed file gets its own entry."""
    from vcam.platform import folders
    from vcam.stages import swap_neural as swap

    p = standin.write("inswapper_128", tmp_path / "inswapper_128.onnx", tiny=True)
    parses = []
    real = swap._emap_from_onnx
    monkeypatch.setattr(swap, "_emap_from_onnx", lambda path: parses.append(path) or real(path))
    first = swap.read_emap(p)
    assert first.shape == (512, 512) and len(parses) == 1
    assert np.array_equal(swap.read_emap(p), first) and len(parses) == 1
    [entry] = list((folders.cache_dir() / "emap").glob("inswapper_128-*.npy"))
    entry.write_bytes(b"not a numpy file")
    assert np.array_equal(swap.read_emap(p), first) and len(parses) == 2
    standin.write("inswapper_128", p, tiny=True, seed=5)  # another file under the same name
    assert not np.array_equal(swap.read_emap(p), first) and len(parses) == 3


class _Counting:
    """An engine wrapper that counts the device calls and the batch sizes asked for."""

    def __init__(self, engine):
        self.engine, self.calls, self.sizes = engine, 0, []

    def input_buffers(self, n, shapes=None):
        self.sizes.append(n)
        return self.engine.input_buffers(n, shapes)

    def run_device(self, feeds, stream=None):
        self.calls += 1
        return self.engine.run_device(feeds, stream)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_warm_calls_the_network_once_for_one_face_and_the_assembly_asks_on_a_gpu_unless_told_not_to(models_dir, monkeypatch):
    """NeuralSwapper.warm: one call at batch 1 on the engine's own buffers (the kernels' first use in
    the load, not the first frame), or at the first rounds' batch when told (one face a stream; an
    engine that captures graphs captures that batch instead: capture_first); the assembly's warm-up
    makes it on a GPU unless $VCAM_WARM_SWAP=0, on the CPU only with $VCAM_WARM_SWAP=1, for one face
    a stream."""
    from types import SimpleNamespace

    from vcam.runtime import assemble

    engine = _Counting(create_engine(models_dir / "inswapper_128.onnx", backend="onnxruntime"))
    swapper = NeuralSwapper("inswapper_128", engine, emap=read_emap(models_dir / "inswapper_128.onnx"))
    swapper.warm()
    assert (engine.calls, engine.sizes) == (1, [1])
    swapper.warm(3)
    swapper.warm(99)  # never more than the swapper's faces
    assert (engine.calls, engine.sizes) == (3, [1, 3, swapper.max_faces])
    engine.calls, engine.sizes = 1, [1]
    firsts: list[int] = []
    engine.capture_first = lambda n: firsts.append(n) or True  # as a torch engine on CUDA: captured, no call
    swapper.warm(4)
    assert (firsts, engine.calls) == ([4], 1)
    engine.capture_first = lambda n: False  # one that captures no graph: the call instead
    swapper.warm(2)
    assert (engine.calls, engine.sizes[-1]) == (2, 2)
    del engine.capture_first
    engine.calls, engine.sizes = 1, [1]
    engine.submit = lambda feeds: None  # as a remote engine: no round trip of zeros
    swapper.warm()
    assert engine.calls == 1
    del engine.submit

    class Stub:
        """The parts of an Assembly its warm-up touches."""

        device, _warm, upscaler = "cpu", set(), None
        cfg = SimpleNamespace(streams=())
        ops = swapper.ops
        detector = RetinaFaceDetector()
        tracker = Tracker(detector)
        warmup = assemble.Assembly.warmup

    monkeypatch.delenv(assemble.WARM_SWAP_ENV, raising=False)
    stub = Stub()
    stub.swapper = swapper
    stub.warmup(64, 48)
    assert engine.calls == 1  # the default on the CPU: no call (a first call costs what any call does)
    monkeypatch.setenv(assemble.WARM_SWAP_ENV, "1")
    stub._warm = set()
    stub.warmup(64, 48)
    assert engine.calls == 2
    stub.warmup(64, 48)  # once per frame size
    assert engine.calls == 2
    monkeypatch.delenv(assemble.WARM_SWAP_ENV, raising=False)
    stub.device, stub._warm = "cuda", set()  # the default on a GPU: the call (the ops are the CPU's here)
    stub.warmup(64, 48)
    assert engine.calls == 3
    monkeypatch.setenv(assemble.WARM_SWAP_ENV, "0")
    stub._warm = set()
    stub.warmup(64, 48)
    assert engine.calls == 3
    monkeypatch.delenv(assemble.WARM_SWAP_ENV, raising=False)
    stub.cfg, stub._warm = SimpleNamespace(streams=("s1", "s2", "s3")), set()  # three streams: a face each
    stub.warmup(64, 48)
    assert (engine.calls, engine.sizes[-1]) == (4, 3)
