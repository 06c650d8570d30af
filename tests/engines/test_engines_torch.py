"""PyTorch backend: native inswapper / RetinaFace modules against onnxruntime on the same ONNX files.

Runs everywhere the pieces exist: graph reading and the FP16 guard need no torch; parity tests need
torch (CPU is enough); the CUDA tests (FP16, CUDA graphs, DLPack with CuPy) need a GPU. Missing
components skip with the reason (a failure when VCAM_REQUIRE names them).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import need_torch, require

from vcam.engines.onnx_graph import OnnxGraph, recognise
from vcam.errors import EngineUnavailable, ModelError
from vcam.models import standin

try:
    import torch
except ImportError:  # CI without the torch extra
    torch = None

ASSETS = Path(__file__).resolve().parents[2] / "vcam" / "assets"
REL_FP32 = 1e-3
REL_FP16 = 2e-2


def need_cuda():
    need_torch()
    if not torch.cuda.is_available():
        require("cuda", "no CUDA device")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite values in the engine output"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def tiny_inswapper(tmp_path_factory) -> Path:
    return standin.write("inswapper_128", tmp_path_factory.mktemp("m") / "inswapper_tiny.onnx", tiny=True, seed=3)


@pytest.fixture(scope="module")
def retinaface_file(tmp_path_factory) -> Path:
    from retinaface.weights import WEIGHTS

    path = tmp_path_factory.mktemp("m") / "retinaface_mnet025.onnx"
    path.write_bytes(WEIGHTS)
    return path


def swap_feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((n, 512)).astype(np.float32)
    src /= np.linalg.norm(src, axis=1, keepdims=True)
    return {"target": rng.random((n, 3, 128, 128), dtype=np.float32), "source": src}


def portrait_feed() -> dict[str, np.ndarray]:
    import cv2

    img = cv2.imread(str(ASSETS / "grace_hopper.jpg"))
    assert img is not None
    img = cv2.resize(img, (320, 384)).astype(np.float32)
    x = (img - np.array([104, 117, 123], np.float32)).transpose(2, 0, 1)[None]
    return {"input": np.ascontiguousarray(x)}


def ort_run(path: Path, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


# -- no torch needed ---------------------------------------------------------------------------


def test_engine_modules_import_without_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # make `import torch` fail as on CI
        import vcam.engines.torch as t, vcam.engines.tensorrt, vcam.engines.cache
        from vcam.errors import EngineUnavailable
        try:
            t.TorchEngine("missing.onnx", device="cuda")
        except EngineUnavailable as exc:
            print("REASON", exc.message)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr
    assert "REASON torch not installed" in res.stdout


def test_recognise_known_graphs(tiny_inswapper, retinaface_file):
    assert recognise(OnnxGraph(onnx.load(str(tiny_inswapper)))) == "inswapper"
    assert recognise(OnnxGraph(onnx.load(str(retinaface_file)))) == "retinaface"
    assert recognise(OnnxGraph(standin.build("arcface_w600k_r50"))) is None


def test_identity_chains_resolve_to_shared_weights(retinaface_file):
    graph = OnnxGraph(onnx.load(str(retinaface_file)))
    convs = graph.of_type("Conv")
    distinct = {graph.resolve(n.input[1]) for n in convs}
    assert len(convs) == 59 and len(distinct) == 56  # three SSH convs reuse weights through Identity
    assert all(graph.array(n.input[1]) is not None for n in convs)


# -- torch on the CPU --------------------------------------------------------------------------


@pytest.mark.slow
def test_inswapper_native_matches_onnxruntime_cpu(tiny_inswapper):
    need_torch()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(tiny_inswapper, device="cpu", max_batch=2)
    assert engine.architecture == "inswapper"
    assert [i.name for i in engine.inputs] == ["target", "source"] and [o.name for o in engine.outputs] == ["output"]
    feeds = swap_feeds(3, seed=1)  # 3 > max_batch: run() splits into chunks
    (out,) = engine.run(feeds)
    (ref,) = ort_run(tiny_inswapper, feeds)
    assert out.shape == ref.shape == (3, 3, 128, 128) and out.dtype == np.float32
    assert rel(out, ref) < REL_FP32
    # the source latent changes the output (the AdaIN path is really wired)
    other = dict(feeds, source=feeds["source"][::-1].copy())
    assert rel(engine.run(other)[0][0], out[0]) > 1e-3


@pytest.mark.slow
def test_retinaface_native_matches_onnxruntime_cpu(retinaface_file):
    need_torch()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(retinaface_file, device="cpu")
    assert engine.architecture == "retinaface"
    feeds = portrait_feed()
    outs = engine.run(feeds)
    refs = ort_run(retinaface_file, feeds)
    for name, o, r in zip(["loc", "conf", "landmarks"], outs, refs):
        assert o.shape == r.shape, name
        assert rel(o, r) < REL_FP32, name
    assert refs[1][0, :, 1].max() > 0.9  # the portrait has a confident face: the comparison is meaningful


def test_loader_names_first_mismatched_tensor(tiny_inswapper, tmp_path):
    need_torch()
    from vcam.engines.torch import TorchEngine

    model = onnx.load(str(tiny_inswapper))
    for init in model.graph.initializer:
        if init.name == "blk.3.style2.weight":  # Gemm #7: (2C, 512) -> (2C, 500)
            arr = onnx.numpy_helper.to_array(init)[:, :500]
            init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(arr), init.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(ModelError, match=r"Gemm #7 .* weight: shape \(128, 500\) != expected \(128, 512\)"):
        TorchEngine(bad, device="cpu")


def test_an_operator_the_generic_path_lacks_makes_the_backend_unavailable(tmp_path):
    need_torch()
    from onnx import TensorProto, helper

    from vcam.engines.torch import TorchEngine

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["out"])
    graph = helper.make_graph(
        [node],
        "nms",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 4]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.INT64, [None, 3])],
    )
    path = tmp_path / "nms.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(EngineUnavailable, match="nms.onnx: operators NonMaxSuppression are not supported") as err:
        TorchEngine(path, device="cpu")
    assert "--backend onnxruntime" in err.value.hint


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "arcface_w600k_r50",
        "hyperswap_1a_256",
        "simswap_256",
        "crossface_simswap",
        "gfpgan_1.4",
        "scrfd_2.5g",
        "yoloface_8n",
        "yunet_2023_mar",
        "xseg_1",
    ],
)
def test_generic_graph_path_matches_onnxruntime_on_every_standin(tmp_path, name):
    """Models without a native module run as a generic graph of torch operators, outputs equal to
    onnxruntime's; fixed-batch files run item by item inside the engine."""
    need_torch()
    from vcam.engines.torch import TorchEngine

    path = standin.write(name, tmp_path, tiny=True)
    engine = TorchEngine(path, device="cpu", max_batch=3)
    assert engine.architecture is None and "generic graph" in engine.describe()
    rng = np.random.default_rng(3)
    feeds = {}
    for info in engine.inputs:
        shape = [3 if not isinstance(d, int) else d for d in info.shape]
        if info.shape[0] == 1:
            shape[0] = 3  # a batch-1 file given 3 items: the engine loops
        if name in ("scrfd_2.5g",):
            shape[2:] = [96, 160]  # a dynamic input size
        feeds[info.name] = rng.random(shape, dtype=np.float32)
    got = engine.run(feeds)
    ref_engine = __import__("vcam.engines", fromlist=["create_engine"]).create_engine(path, backend="onnxruntime")
    want = ref_engine.run(feeds)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        assert rel(g, w) < REL_FP32


def test_missing_model_file_is_a_model_error(tmp_path):
    need_torch()
    from vcam.engines.torch import TorchEngine

    with pytest.raises(ModelError, match="model file not found"):
        TorchEngine(tmp_path / "nope.onnx", device="cpu")


def test_cuda_request_without_gpu_is_unavailable(tiny_inswapper):
    need_torch()
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from vcam.engines.torch import TorchEngine

    with pytest.raises(EngineUnavailable, match="torch sees no CUDA device"):
        TorchEngine(tiny_inswapper, device="cuda")


@pytest.mark.slow
def test_build_inswapper_architecture():
    need_torch()
    from vcam.engines.native.inswapper import InSwapper, build_inswapper, default_spec, param_count

    with torch.device("meta"):
        full = InSwapper(default_spec(1))
    assert param_count(full) == 138_292_739  # docs/models.md: 138.3M
    small = build_inswapper(seed=0, width_div=16)
    feeds = swap_feeds(2, seed=5)
    with torch.no_grad():
        out = small(torch.from_numpy(feeds["target"]), torch.from_numpy(feeds["source"]))
    assert out.shape == (2, 3, 128, 128)
    assert torch.isfinite(out).all() and 0.0 <= float(out.min()) and float(out.max()) <= 1.0


# -- CUDA ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_cuda_parity_and_graph_replay(tiny_inswapper, retinaface_file, fp16):
    need_cuda()
    from vcam.engines.torch import TorchEngine

    tol = REL_FP16 if fp16 else REL_FP32
    engine = TorchEngine(tiny_inswapper, device="cuda", fp16=fp16, max_batch=8)
    assert engine.cuda_graphs and len(engine._graphs) >= 1  # the first size captured at construction
    assert engine.wait_graphs(60) and len(engine._graphs) == len(engine.batch_sizes)  # the others in the background
    assert engine.describe() == f"torch {'fp16' if fp16 else 'fp32'} on cuda (native inswapper, CUDA graphs)"
    for n in (1, 3, 8):  # 3 runs at its own size (every size up to 8 is captured)
        feeds = swap_feeds(n, seed=10 + n)
        (out,) = engine.run(feeds)
        assert rel(out, ort_run(tiny_inswapper, feeds)[0]) < tol, n
    # replay after a different batch size: stale buffers never leak into the result
    feeds = swap_feeds(3, seed=99)
    a = engine.run(feeds)[0]
    engine.run(swap_feeds(8, seed=7))
    b = engine.run(feeds)[0]
    np.testing.assert_array_equal(a, b)

    det = TorchEngine(retinaface_file, device="cuda", fp16=fp16)
    feeds = portrait_feed()
    for name, o, r in zip(["loc", "conf", "landmarks"], det.run(feeds), ort_run(retinaface_file, feeds)):
        assert rel(o, r) < tol, name
    # The detector's epilogue runs inside the CUDA graph and equals its NumPy form.
    from vcam.stages.detections import TopCandidates

    fused = TorchEngine(retinaface_file, device="cuda", fp16=fp16, epilogue=TopCandidates())
    (cand,) = fused.run(feeds)
    (want,) = TopCandidates().numpy(det.run(feeds))
    assert cand.shape == want.shape and len(fused._graphs) == 1
    np.testing.assert_array_equal(cand[0, :5, 15], want[0, :5, 15])  # the same best anchors
    assert rel(cand[..., :15], want[..., :15]) < tol


@pytest.mark.gpu
def test_run_device_torch_and_cupy_zero_copy(tiny_inswapper):
    need_cuda()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(tiny_inswapper, device="cuda", fp16=True, max_batch=4)
    feeds = swap_feeds(2, seed=4)
    host = engine.run(feeds)[0]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dev = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        (out,) = engine.run_device(dev)
        assert isinstance(out, torch.Tensor) and out.is_cuda and out.shape == (2, 3, 128, 128)
    stream.synchronize()
    np.testing.assert_allclose(out.cpu().numpy(), host, rtol=0, atol=1e-6)
    # outputs are views of the engine's buffer (no copy per call)
    (again,) = engine.run_device(dev, stream=stream)
    assert again.data_ptr() == out.data_ptr()
    try:
        import cupy
    except ImportError:
        require("cupy", "CuPy is not installed")
    cs = cupy.cuda.Stream(non_blocking=True)
    with cs:
        cfeeds = {k: cupy.asarray(v) for k, v in feeds.items()}
        (cout,) = engine.run_device(cfeeds)
        assert isinstance(cout, cupy.ndarray)
    cs.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(cout), host, rtol=0, atol=1e-6)
    # input_buffers are the graph's own static inputs: writing into them and passing them back
    # costs no copy, and every batch size shares them (a latent written once serves all).
    bufs = engine.input_buffers(3)
    with cs:
        bufs["target"][...] = cupy.asarray(swap_feeds(3, seed=8)["target"])
        bufs["source"][...] = cupy.asarray(np.repeat(feeds["source"][:1], 3, axis=0))
        (a,) = engine.run_device(bufs, stream=cs)
        a = a.copy()
        small = engine.input_buffers(1)
        assert small["source"].data.ptr == bufs["source"].data.ptr
        (b,) = engine.run_device(small, stream=cs)
    cs.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(b[0]), cupy.asnumpy(a[0]), rtol=0, atol=2e-3)


def test_onnxruntime_asked_for_cuda_that_runs_on_the_cpu_says_so(tiny_inswapper, monkeypatch, caplog):
    """onnxruntime can accept the CUDA provider and still build a CPU session (a missing CUDA
    library): the engine reports device 'cpu' and says so once in the log."""
    import onnxruntime

    from vcam.engines.ort import OrtEngine

    real = onnxruntime.InferenceSession

    class CpuOnly(real):
        def __init__(self, path, sess_options=None, providers=None):
            super().__init__(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(onnxruntime, "InferenceSession", CpuOnly)
    with caplog.at_level("WARNING", logger="vcam.engines.ort"):
        engine = OrtEngine(tiny_inswapper, device="cuda")
    assert engine.device == "cpu" and engine.describe() == "onnxruntime fp32 on cpu"
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "asked to run inswapper_tiny.onnx on CUDA but runs it on the CPU" in msgs[0]
