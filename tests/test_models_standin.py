"""Stand-in ONNX files: the registry's real tensors, and inswapper's real architecture."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from vcam.cli.models import app
from vcam.engines import create_engine
from vcam.models import registry, standin

DOWNLOADABLE = [m.name for m in registry.MODELS.values() if m.file]


def _concrete(shape, n=2):
    return [d if isinstance(d, int) else n for d in shape]


@pytest.mark.parametrize("name", DOWNLOADABLE)
def test_standin_has_the_registry_tensors(name, tmp_path):
    spec = registry.get(name)
    path = standin.write(name, tmp_path, tiny=True)
    assert path.name == spec.file
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    init = {i.name for i in model.graph.initializer}
    got_in = [
        (i.name, [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim])
        for i in model.graph.input
        if i.name not in init
    ]
    assert got_in == [(t.name, list(t.shape)) for t in spec.inputs]
    got_out = [(o.name, [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]) for o in model.graph.output]
    assert got_out == [(t.name, list(t.shape)) for t in spec.outputs]
    eng = create_engine(path)
    rng = np.random.default_rng(0)
    outs = eng.run({t.name: rng.random(_concrete(t.shape)).astype(np.float32) for t in spec.inputs})
    for arr, t in zip(outs, spec.outputs):
        assert list(arr.shape) == _concrete(t.shape) and arr.dtype == np.float32
        assert np.isfinite(arr).all()


def _conv_gemm(model):
    w = {i.name: tuple(i.dims) for i in model.graph.initializer}
    convs = [
        (n.input[1], w[n.input[1]], [a.ints for a in n.attribute if a.name == "strides"][0][0])
        for n in model.graph.node
        if n.op_type == "Conv"
    ]
    gemms = [(n.input[1], w[n.input[1]]) for n in model.graph.node if n.op_type == "Gemm"]
    return convs, gemms


def test_inswapper_architecture_and_node_order():
    model = standin.build("inswapper_128", tiny=True)
    d = 16
    c = [128 // d, 256 // d, 512 // d, 1024 // d]
    convs, gemms = _conv_gemm(model)
    expected = [
        ("enc.0", (c[0], 3, 7, 7), 1),
        ("enc.1", (c[1], c[0], 3, 3), 1),
        ("enc.2", (c[2], c[1], 3, 3), 2),
        ("enc.3", (c[3], c[2], 3, 3), 2),
    ]
    for b in range(6):
        expected += [(f"blk.{b}.conv1", (c[3], c[3], 3, 3), 1), (f"blk.{b}.conv2", (c[3], c[3], 3, 3), 1)]
    expected += [
        ("dec.0", (c[2], c[3], 3, 3), 1),
        ("dec.1", (c[1], c[2], 3, 3), 1),
        ("dec.2", (c[0], c[1], 3, 3), 1),
        ("out", (3, c[0], 7, 7), 1),
    ]
    assert [(n.removesuffix(".weight"), s, st) for n, s, st in convs] == expected
    assert gemms == [(f"blk.{b}.style{k}.weight", (2 * c[3], 512)) for b in range(6) for k in (1, 2)]
    assert model.graph.initializer[-1].name == "emap" and tuple(model.graph.initializer[-1].dims) == (512, 512)
    assert "emap" not in {i for n in model.graph.node for i in n.input}

    # the weight count follows the architecture formula (the full size gives 138,292,739)
    def count(c0, c1, c2, c3):
        conv = lambda i, o, k: i * o * k * k + o  # noqa: E731
        enc = conv(3, c0, 7) + conv(c0, c1, 3) + conv(c1, c2, 3) + conv(c2, c3, 3)
        blocks = 6 * (2 * conv(c3, c3, 3) + 2 * (512 * 2 * c3 + 2 * c3))
        dec = conv(c3, c2, 3) + conv(c2, c1, 3) + conv(c1, c0, 3) + conv(c0, 3, 7)
        return enc + blocks + dec

    assert standin.count_parameters(model) == count(*c)
    assert count(128, 256, 512, 1024) == 138_292_739
    ops = {n.op_type for n in model.graph.node}
    assert {"Pad", "Conv", "LeakyRelu", "ReduceMean", "Gemm", "Relu", "Resize", "Tanh"} <= ops


def test_inswapper_standin_is_batched_and_the_source_matters(tmp_path):
    path = standin.write("inswapper_128", tmp_path / "i.onnx", tiny=True)
    eng = create_engine(path)
    assert eng.inputs[0].fixed_batch is None
    rng = np.random.default_rng(1)
    x = rng.random((3, 3, 128, 128), dtype=np.float32)
    s = rng.standard_normal((3, 512)).astype(np.float32)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    batch = eng.run({"target": x, "source": s})[0]
    one = eng.run({"target": x[1:2], "source": s[1:2]})[0]
    np.testing.assert_allclose(batch[1:2], one, atol=1e-5)
    assert 0.0 <= batch.min() and batch.max() <= 1.0
    other = eng.run({"target": x[1:2], "source": s[2:3]})[0]
    assert np.abs(other - one).mean() > 1e-3
    # seeded: the same seed gives the same file, another seed other weights
    assert standin.write("inswapper_128", tmp_path / "j.onnx", tiny=True).read_bytes() == path.read_bytes()
    assert standin.write("inswapper_128", tmp_path / "k.onnx", tiny=True, seed=5).read_bytes() != path.read_bytes()


def test_cli_stand_in(tmp_path):
    r = CliRunner().invoke(app, ["stand-in", "hyperswap_1a_256", "--out", str(tmp_path / "h.onnx"), "--tiny"])
    assert r.exit_code == 0, r.output
    assert "random weights, for tests and benchmarks only" in r.output
    assert [i.name for i in create_engine(tmp_path / "h.onnx").inputs] == ["source", "target"]
    r = CliRunner().invoke(app, ["stand-in", "inswapper_256", "--out", str(tmp_path / "x.onnx")])
    assert r.exit_code == 6 and "unknown model 'inswapper_256' (did you mean inswapper_128" in r.output


def test_registry_rows_are_consistent():
    from vcam.align import TEMPLATES

    for spec in registry.MODELS.values():
        assert spec.kind in registry.KINDS
        if spec.kind in ("swapper", "recogniser", "enhancer"):
            assert spec.template in TEMPLATES and spec.size > 0
        if spec.kind == "swapper":
            assert spec.source in ("emap", "normed", "converted") and spec.recogniser in registry.MODELS
        if spec.file:
            base, file = spec.base, spec.file
            assert spec.urls() == [
                f"https://github.com/facefusion/facefusion-assets/releases/download/{base}/{file}",
                f"https://huggingface.co/facefusion/{base}/resolve/main/{file}",
            ]
    assert registry.requirements("simswap_256") == ["simswap_256", "arcface_w600k_r50", "crossface_simswap"]
    assert registry.get("yunet_2023_mar").base == "models-3.4.0" and registry.get("hyperswap_1a_256").base == "models-3.3.0"
