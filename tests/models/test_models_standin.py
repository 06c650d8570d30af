"""Stand-in ONNX files: the registry's real tensors, inswapper's real architecture, and the mask and landmark models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import need_torch
from typer.testing import CliRunner

from vcam.cli.models import app
from vcam.engines import create_engine
from vcam.models import registry, standin

DOWNLOADABLE = [m.name for m in registry.MODELS.values() if m.file]


def _concrete(shape, n=2):
    return [d if isinstance(d, int) else n for d in shape]


@pytest.mark.slow
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


# -- occluders, parsers, landmarkers ----------------------------------------------------------------
MASK_MODELS = ["xseg_1", "xseg_2", "xseg_3", "bisenet_resnet_18", "bisenet_resnet_34", "2dfan4", "fan_68_5"]


def test_mask_and_landmark_rows():
    kinds = {n: registry.get(n).kind for n in MASK_MODELS}
    assert kinds == {
        "xseg_1": "occluder",
        "xseg_2": "occluder",
        "xseg_3": "occluder",
        "bisenet_resnet_18": "parser",
        "bisenet_resnet_34": "parser",
        "2dfan4": "landmarker",
        "fan_68_5": "landmarker",
    }
    bases = {n: registry.get(n).base for n in MASK_MODELS}
    assert bases == {
        "xseg_1": "models-3.1.0",
        "xseg_2": "models-3.1.0",
        "xseg_3": "models-3.2.0",
        "bisenet_resnet_18": "models-3.1.0",
        "bisenet_resnet_34": "models-3.0.0",
        "2dfan4": "models-3.0.0",
        "fan_68_5": "models-3.0.0",
    }
    for n in MASK_MODELS:
        spec = registry.get(n)
        assert spec.file == f"{n}.onnx" and spec.hash_file == f"{n}.hash" and spec.licence and spec.approx_mb > 0
    xseg = registry.get("xseg_2")
    assert [(t.name, t.shape) for t in xseg.inputs + xseg.outputs] == [
        ("input", ("N", 256, 256, 3)),
        ("output", ("N", 256, 256, 1)),
    ]
    assert (xseg.rgb, xseg.input_mean_std_255) == (False, ((0.0,) * 3, (255.0,) * 3))  # BGR / 255
    parser = registry.get("bisenet_resnet_34")
    assert parser.inputs[0].shape == ("N", 3, 512, 512) and parser.outputs[0].name == "output"
    assert parser.rgb and parser.mean == (0.485, 0.456, 0.406) and parser.std == (0.229, 0.224, 0.225)
    fan = registry.get("2dfan4")
    assert [t.name for t in fan.outputs] == ["landmarks_xyscore", "heatmaps"] and fan.input_mean_std_255[1] == (255.0,) * 3
    assert registry.get("fan_68_5").template == "ffhq_512"


def test_parser_class_table():
    from vcam.config import REGIONS

    assert len(registry.PARSER_LABELS) == 19 and registry.PARSER_LABELS[0] == "background"
    assert set(registry.PARSER_CLASSES) == set(REGIONS)
    labels = {r: [registry.PARSER_LABELS[i] for i in c] for r, c in registry.PARSER_CLASSES.items()}
    assert labels == {
        "skin": ["skin"],
        "brows": ["l_brow", "r_brow"],
        "eyes": ["l_eye", "r_eye"],
        "glasses": ["eye_g"],
        "nose": ["nose"],
        "mouth": ["mouth"],
        "lips": ["u_lip", "l_lip"],
        "ears": ["l_ear", "r_ear"],
        "hair": ["hair"],
        "neck": ["neck"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", MASK_MODELS)
def test_mask_standins_run_on_the_torch_graph_path(name, tmp_path):
    """The generic torch path runs every new stand-in with onnxruntime's outputs (a batch-1 file
    given 3 items loops inside the engine)."""
    need_torch()
    from vcam.engines.torch import TorchEngine

    path = standin.write(name, tmp_path)
    engine = TorchEngine(path, device="cpu", max_batch=3)
    assert engine.architecture is None
    rng = np.random.default_rng(4)
    feeds = {t.name: rng.random((3, *t.shape[1:]), dtype=np.float32) for t in registry.get(name).inputs}
    got = engine.run(feeds)
    want = create_engine(path, backend="onnxruntime").run(feeds)
    assert [o.name for o in engine.outputs] == [t.name for t in registry.get(name).outputs]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.shape[0] == 3
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))


def test_parser_standin_argmax_varies(tmp_path):
    eng = create_engine(standin.write("bisenet_resnet_34", tmp_path))
    flat = np.zeros((1, 3, 512, 512), np.float32)  # a flat grey crop: only the class pattern varies
    noisy = np.random.default_rng(2).standard_normal((1, 3, 512, 512)).astype(np.float32)
    for x in (flat, noisy):
        logits = eng.run({"input": x})[0]
        classes = np.unique(logits.argmax(axis=1))
        assert classes.size >= 4 and np.isfinite(logits).all()


def test_landmarker_standins_give_points_in_range(tmp_path):
    eng = create_engine(standin.write("2dfan4", tmp_path))
    x = np.random.default_rng(5).random((2, 3, 256, 256), dtype=np.float32)
    pts, heat = eng.run({"input": x})
    assert pts.shape == (2, 68, 3) and heat.shape == (2, 68, 64, 64)
    assert np.isfinite(pts).all() and 0 <= pts[..., :2].min() and pts[..., :2].max() <= 64
    assert 0 <= pts[..., 2].min() and pts[..., 2].max() <= 1
    np.testing.assert_allclose(pts[..., 2], heat.max(axis=(2, 3)), rtol=1e-6)
    assert np.abs(pts[0] - pts[1]).max() > 1e-3  # the image moves the points
    # the resting face is a face: eyes above the nose above the mouth, jaw left to right
    rest = pts[0, :, :2]
    assert rest[36:48, 1].mean() < rest[30, 1] < rest[48:68, 1].mean() and rest[0, 0] < rest[8, 0] < rest[16, 0]


def test_fan_68_5_standin_follows_any_similarity_of_its_points(tmp_path):
    from vcam.align import TEMPLATES

    path = standin.write("fan_68_5", tmp_path)
    eng = create_engine(path)
    tpl = TEMPLATES["ffhq_512"].astype(np.float32)
    (base,) = eng.run({"input": tpl[None]})
    assert base.shape == (1, 68, 2) and np.isfinite(base).all() and 0 < base.min() and base.max() < 1
    c, s = np.cos(0.3) * 1.7, np.sin(0.3) * 1.7
    moved = tpl @ np.array([[c, s], [-s, c]], np.float32) + np.float32([40.0, -12.0])
    (out,) = eng.run({"input": moved[None]})
    np.testing.assert_allclose(out[0], base[0] @ np.array([[c, s], [-s, c]]) + [40.0, -12.0], atol=1e-4)


def test_cli_lists_and_writes_the_new_kinds(tmp_path):
    r = CliRunner().invoke(app, ["list", "--kind", "parser"])
    assert r.exit_code == 0, r.output
    assert "bisenet_resnet_18" in r.output and "bisenet_resnet_34" in r.output and "xseg_1" not in r.output
    r = CliRunner().invoke(app, ["list", "--kind", "landmarker"])
    assert r.exit_code == 0 and "2dfan4" in r.output and "fan_68_5" in r.output
    for name in ("2dfan4", "fan_68_5", "bisenet_resnet_18", "xseg_3"):
        r = CliRunner().invoke(app, ["stand-in", name, "--out", str(tmp_path)])
        assert r.exit_code == 0, r.output
        assert [o.name for o in create_engine(tmp_path / f"{name}.onnx").outputs] == [t.name for t in registry.get(name).outputs]
