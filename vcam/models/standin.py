"""Stand-in ONNX files: the real tensors (names, shapes, dtypes) with seeded random weights.

Tests and benchmarks run offline on these; nothing here is a trained model. Built with
``onnx.helper`` only (no PyTorch), opset 17, IR version 8.

inswapper_128 stand-in: the real architecture
=============================================
Inputs ``target`` (N, 3, 128, 128) float32 RGB in [0, 1] and ``source`` (N, 512) float32 (the
latent); output ``output`` (N, 3, 128, 128) float32 in [0, 1]. N is dynamic. Full size: 138,292,739
weights in the graph plus ``emap`` (512 x 512), which is the LAST initializer and unused by the graph.
``--tiny`` divides every channel count by 16 (the AdaIN Linear becomes 512 -> 2*C) and keeps the I/O.

Node order (a loader may rely on it). Only Conv and Gemm nodes carry weights; every other
constant is a ``Constant`` node, so the initializers are exactly the weights below, in this order,
followed by ``emap``:

  Conv  0  enc.0   7x7 3->128,   stride 1, after Pad(reflect, 3)     -> LeakyRelu(0.2)
  Conv  1  enc.1   3x3 128->256, stride 1, zero pad 1               -> LeakyRelu(0.2)
  Conv  2  enc.2   3x3 256->512, stride 2, zero pad 1               -> LeakyRelu(0.2)
  Conv  3  enc.3   3x3 512->1024, stride 2, zero pad 1              -> LeakyRelu(0.2)
  for b in 0..5 (residual block at 1024 x 32 x 32, h = h + r):
    Conv  4+2b  blk.b.conv1  3x3 1024->1024 after Pad(reflect, 1)
    Gemm  2b    blk.b.style1 source (N,512) x W^T + bias: W (2048, 512), transB=1, bias (2048,)
                AdaIN: x_hat = (x - mean_hw) / sqrt(var_hw + 1e-8); y = x_hat * gamma + beta
                with gamma = out[:, :1024], beta = out[:, 1024:]                -> Relu
    Conv  5+2b  blk.b.conv2  3x3 1024->1024 after Pad(reflect, 1)
    Gemm  2b+1  blk.b.style2 as above, then AdaIN (no activation)
  Resize x2 (bilinear, half_pixel)
  Conv 16  dec.0   3x3 1024->512, zero pad 1                        -> LeakyRelu(0.2)
  Resize x2 (bilinear, half_pixel)
  Conv 17  dec.1   3x3 512->256, zero pad 1                         -> LeakyRelu(0.2)
  Conv 18  dec.2   3x3 256->128, zero pad 1                         -> LeakyRelu(0.2)
  Conv 19  out     7x7 128->3 after Pad(reflect, 3) -> Tanh -> (x + 1) / 2

Conv weights are (Cout, Cin, kh, kw) with a bias (Cout,); Gemm weights are stored like PyTorch's
``nn.Linear.weight`` (out, in) with ``transB=1``. Weights: He-normal convolutions (the last one
scaled by 0.1 so tanh does not saturate), style Linear weights N(0, 0.3^2) with bias 1 for gamma
and 0 for beta, zero conv biases: activations stay finite and the source visibly changes the output.

Real-ESRGAN stand-ins (``upscaler``): the real architecture
==========================================================
RRDBNet as basicsr builds it (:func:`build_upscaler`): [x2: pixel-unshuffle by 2 (Reshape/Transpose,
12 channels)] -> conv_first -> 23 RRDB blocks (3 residual dense blocks of 5 convs each, growth 32,
LeakyReLU 0.2, residuals scaled by 0.2) -> conv_body, added to the trunk -> 2 x (nearest x2, conv,
LeakyReLU) -> conv_hr, LeakyReLU -> conv_last; 64 features, all convs 3x3 with zero padding 1. Full
size: 16,697,987 weights (x4), 16,703,171 (x2), as in RealESRGAN_x4plus / x2plus; ``--tiny``: one
block, 16 features, growth 8. Weights: kaiming-normal times 0.1, zero biases (ESRGAN's initialisation
of its dense blocks, which keeps the trunk stable), plus a pass-through of the picture on feature
channels 0-2 (conv_first averages each colour's sub-pixels into them, the upsampling convs blur them
with a [1 2 1] kernel, conv_hr and conv_last copy them), so the output is the input upscaled plus a
random texture, and a tile's zero-padded border shows as it would in a trained network.

Other stand-ins are small random networks with the real tensors (see :data:`BUILDERS`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vcam.errors import ModelError
from vcam.models import registry

OPSET = 17
IR_VERSION = 8


class _Graph:
    """Collects nodes and initializers with unique names."""

    def __init__(self, seed: int) -> None:
        from onnx import helper

        self.h = helper
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def init(self, name: str, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, arr, dtype=np.int64) -> str:
        from onnx import numpy_helper

        out = self.name("const")
        value = numpy_helper.from_array(np.asarray(arr, dtype=dtype), out + "_value")
        self.nodes.append(self.h.make_node("Constant", [], [out], value=value))
        return out

    def op(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.name(op.lower())
        self.nodes.append(self.h.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out

    # -- layers --------------------------------------------------------------------------------
    def conv(
        self, x: str, cin: int, cout: int, k: int, *, stride: int = 1, pad: int = 0, reflect: int = 0, tag: str, gain: float = 1.0
    ) -> str:
        if reflect:
            x = self.op("Pad", [x, self.const([0, 0, reflect, reflect, 0, 0, reflect, reflect])], mode="reflect")
        std = gain * np.sqrt(2.0 / (cin * k * k))
        w = self.rng.standard_normal((cout, cin, k, k), dtype=np.float32) * np.float32(std)
        b = np.zeros((cout,), np.float32)
        wn = self.init(f"{tag}.weight", w)
        bn = self.init(f"{tag}.bias", b)
        return self.op("Conv", [x, wn, bn], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def lrelu(self, x: str) -> str:
        return self.op("LeakyRelu", [x], alpha=0.2)

    def gemm(self, x: str, cin: int, cout: int, *, tag: str, std: float, bias: np.ndarray | None = None) -> str:
        w = self.rng.standard_normal((cout, cin), dtype=np.float32) * np.float32(std)
        b = np.zeros((cout,), np.float32) if bias is None else bias.astype(np.float32)
        return self.op("Gemm", [x, self.init(f"{tag}.weight", w), self.init(f"{tag}.bias", b)], transB=1)

    def adain(self, x: str, source: str, c: int, *, tag: str) -> str:
        mean = self.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
        d = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Mul", [d, d])], axes=[2, 3], keepdims=1)
        eps = self.const(np.float32(1e-8), np.float32)
        norm = self.op("Div", [d, self.op("Sqrt", [self.op("Add", [var, eps])])])
        bias = np.concatenate([np.ones(c, np.float32), np.zeros(c, np.float32)])
        style = self.gemm(source, 512, 2 * c, tag=tag, std=0.3, bias=bias)
        axes1 = self.const([1])
        gamma = self.op("Slice", [style, self.const([0]), self.const([c]), axes1])
        beta = self.op("Slice", [style, self.const([c]), self.const([2 * c]), axes1])
        gamma = self.op("Unsqueeze", [gamma, self.const([2, 3])])
        beta = self.op("Unsqueeze", [beta, self.const([2, 3])])
        return self.op("Add", [self.op("Mul", [norm, gamma]), beta])

    def up2(self, x: str) -> str:
        scales = self.const(np.array([1, 1, 2, 2], np.float32), np.float32)
        return self.op("Resize", [x, "", scales], mode="linear", coordinate_transformation_mode="half_pixel")

    def model(self, inputs: list, outputs: list, name: str, doc: str = ""):
        graph = self.h.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        m = self.h.make_model(graph, opset_imports=[self.h.make_opsetid("", OPSET)], producer_name="vcam-standin")
        m.ir_version = IR_VERSION
        m.doc_string = doc or f"vcam stand-in for {name}: seeded random weights, not a trained model"
        return m


def _vi(t: registry.Tensor):
    from onnx import TensorProto, helper

    dt = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[t.dtype]
    return helper.make_tensor_value_info(t.name, dt, list(t.shape))


# -- inswapper ----------------------------------------------------------------------------------
def build_inswapper(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    div = 16 if tiny else 1
    c1, c2, c3, c4 = (128 // div, 256 // div, 512 // div, 1024 // div)
    g = _Graph(seed)
    tgt, src = "target", "source"
    h = g.lrelu(g.conv(tgt, 3, c1, 7, reflect=3, tag="enc.0"))
    h = g.lrelu(g.conv(h, c1, c2, 3, pad=1, tag="enc.1"))
    h = g.lrelu(g.conv(h, c2, c3, 3, stride=2, pad=1, tag="enc.2"))
    h = g.lrelu(g.conv(h, c3, c4, 3, stride=2, pad=1, tag="enc.3"))
    for b in range(6):
        r = g.conv(h, c4, c4, 3, reflect=1, tag=f"blk.{b}.conv1")
        r = g.op("Relu", [g.adain(r, src, c4, tag=f"blk.{b}.style1")])
        r = g.conv(r, c4, c4, 3, reflect=1, tag=f"blk.{b}.conv2")
        r = g.adain(r, src, c4, tag=f"blk.{b}.style2")
        h = g.op("Add", [h, r])
    h = g.lrelu(g.conv(g.up2(h), c4, c3, 3, pad=1, tag="dec.0"))
    h = g.lrelu(g.conv(g.up2(h), c3, c2, 3, pad=1, tag="dec.1"))
    h = g.lrelu(g.conv(h, c2, c1, 3, pad=1, tag="dec.2"))
    h = g.op("Tanh", [g.conv(h, c1, 3, 7, reflect=3, tag="out", gain=0.1)])
    half = g.const(np.float32(0.5), np.float32)
    one = g.const(np.float32(1.0), np.float32)
    g.op("Mul", [g.op("Add", [h, one]), half], out="output")
    emap = g.rng.standard_normal((512, 512), dtype=np.float32) / np.float32(np.sqrt(512.0))
    g.init("emap", emap)  # LAST initializer, unused by the graph (the real file's layout)
    inputs = [_vi(t) for t in spec.inputs]
    return g.model(
        inputs,
        [_vi(spec.outputs[0])],
        spec.name,
        f"vcam stand-in for {spec.name} ({'tiny' if tiny else 'full size'}): inswapper architecture, random weights",
    )


# -- small random networks with the real tensors ------------------------------------------------
def build_recogniser(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    g = _Graph(seed)
    x = spec.inputs[0]
    s = x.shape[2]
    k = 8
    h = g.op("Tanh", [g.conv(x.name, 3, 16, k, stride=k, tag="features")])
    h = g.op("Sub", [h, g.op("ReduceMean", [h], axes=[2, 3], keepdims=1)])  # keep the layout, drop the DC
    h = g.op("Flatten", [h], axis=1)
    g.op(
        "Gemm",
        [
            h,
            g.init("proj.weight", g.rng.standard_normal((512, 16 * (s // k) ** 2), dtype=np.float32)),
            g.init("proj.bias", np.zeros(512, np.float32)),
        ],
        out=spec.outputs[0].name,
        transB=1,
    )
    return g.model([_vi(x)], [_vi(spec.outputs[0])], spec.name)


def build_image_to_image(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    """Swappers other than inswapper, and enhancers: conv -> (source-modulated) -> conv -> range; a
    second one-channel output (hyperswap's mask) is a sigmoid of its own conv."""
    g = _Graph(seed)
    img = next(t for t in spec.inputs if len(t.shape) == 4)
    vec = next((t for t in spec.inputs if len(t.shape) == 2), None)
    h = g.op("Tanh", [g.conv(img.name, 3, 8, 3, pad=1, tag="enc")])
    if vec is not None:
        gamma = g.gemm(vec.name, 512, 8, tag="style", std=0.5, bias=np.ones(8, np.float32))
        h = g.op("Mul", [h, g.op("Unsqueeze", [gamma, g.const([2, 3])])])
    feat = h
    h = g.conv(feat, 8, 3, 3, pad=1, tag="dec")
    h = g.op("Add", [h, img.name])  # keep the picture recognisable
    out = spec.outputs[0]
    g.op("Sigmoid" if spec.output == "unit" else "Tanh", [h], out=out.name)
    for extra in spec.outputs[1:]:
        g.op("Sigmoid", [g.conv(feat, 8, 1, 3, pad=1, tag=extra.name)], out=extra.name)
    return g.model([_vi(t) for t in spec.inputs], [_vi(t) for t in spec.outputs], spec.name)


def build_converter(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    g = _Graph(seed)
    x = spec.inputs[0]
    w = np.eye(512, dtype=np.float32) + g.rng.standard_normal((512, 512), dtype=np.float32) * np.float32(0.05)
    g.op(
        "Gemm",
        [x.name, g.init("map.weight", w), g.init("map.bias", np.zeros(512, np.float32))],
        out=spec.outputs[0].name,
        transB=1,
    )
    return g.model([_vi(x)], [_vi(spec.outputs[0])], spec.name)


def build_detector(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    """Each output from the input pooled to its stride, a 1x1 conv and a reshape to its shape (rows
    per cell with the anchors innermost, as the real heads); a dynamic input size stays dynamic."""
    g = _Graph(seed)
    x = spec.inputs[0]
    pooled: dict[int, str] = {}

    def pool(stride: int) -> str:
        if stride not in pooled:
            pooled[stride] = g.op("AveragePool", [x.name], kernel_shape=[stride, stride], strides=[stride, stride])
        return pooled[stride]

    def head(stride: int, channels: int, tag: str) -> str:
        h = g.conv(pool(stride), 3, channels, 1, tag=tag, gain=0.01)
        return g.op("Transpose", [h], perm=[0, 2, 3, 1])

    outputs = []
    if spec.name == "yoloface_8n":
        parts = []
        for stride in (8, 16, 32):
            h = g.conv(pool(stride), 3, 20, 1, tag=f"head{stride}", gain=0.01)
            parts.append(g.op("Reshape", [h, g.const([1, 20, -1])]))
        g.op("Sigmoid", [g.op("Concat", parts, axis=2)], out=spec.outputs[0].name)
        outputs = list(spec.outputs)
    else:
        for t in spec.outputs:
            stride = int(t.name.rsplit("_", 1)[1])
            width = t.shape[-1]
            per_cell = 1 if spec.name.startswith("yunet") else 2  # anchors per cell
            h = head(stride, per_cell * width, t.name.replace("_", "."))
            shape = [1, -1, width] if len(t.shape) == 3 else [-1, width]
            h = g.op("Reshape", [h, g.const(shape)])
            last = t.name.split("_")[0] in ("score", "cls", "obj")
            g.op("Sigmoid" if last else "Identity", [h], out=t.name)
            outputs.append(t)
    return g.model([_vi(x)], [_vi(t) for t in outputs], spec.name)


def build_occluder(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    """XSeg layout: NHWC in, a strided conv down and a transposed conv back up (as the real
    network upsamples), a sigmoid, NHWC out."""
    g = _Graph(seed)
    x = spec.inputs[0]
    h = g.op("Transpose", [x.name], perm=[0, 3, 1, 2])
    h = g.op("Relu", [g.conv(h, 3, 8, 3, stride=2, pad=1, tag="down")])
    w = g.rng.standard_normal((8, 1, 4, 4), dtype=np.float32) * np.float32(np.sqrt(2.0 / (8 * 4)))
    h = g.op(
        "ConvTranspose",
        [h, g.init("up.weight", w), g.init("up.bias", np.zeros(1, np.float32))],
        kernel_shape=[4, 4],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    g.op("Sigmoid", [g.op("Transpose", [h], perm=[0, 2, 3, 1])], out=spec.outputs[0].name)
    return g.model([_vi(x)], [_vi(t) for t in spec.outputs], spec.name)


def build_parser(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    """BiSeNet's tensors: logits of every class at 1/8 resolution from the pooled colours plus a
    smooth per-class pattern over the crop (so the argmax changes across the crop even on a flat
    image), each head upsampled x8 to the input size."""
    g = _Graph(seed)
    x = spec.inputs[0]
    classes, size = spec.outputs[0].shape[1], x.shape[2]
    low = size // 8
    h = g.op("AveragePool", [x.name], kernel_shape=[8, 8], strides=[8, 8])
    h = g.conv(h, 3, classes, 1, tag="classes", gain=2.0)
    v, u = np.mgrid[0:low, 0:low].astype(np.float32) / np.float32(low)
    freq = g.rng.uniform(1.0, 3.0, (classes, 2)).astype(np.float32)
    phase = g.rng.uniform(0.0, 2 * np.pi, classes).astype(np.float32)
    pattern = np.cos(2 * np.pi * (freq[:, :1, None] * u + freq[:, 1:, None] * v) + phase[:, None, None])
    h = g.op("Add", [h, g.init("pattern", (2.0 * pattern)[None].astype(np.float32))])
    scales = g.const(np.array([1, 1, 8, 8], np.float32), np.float32)
    for i, t in enumerate(spec.outputs):
        head = h if i == 0 else g.conv(h, classes, classes, 1, tag=f"aux{i}")
        g.op("Resize", [head, "", scales], out=t.name, mode="linear", coordinate_transformation_mode="half_pixel")
    return g.model([_vi(x)], [_vi(t) for t in spec.outputs], spec.name)


def mean_face_68() -> np.ndarray:
    """A rough 68-point face (iBUG order: jaw, brows, nose, eyes, lips) in unit coordinates of the
    face box (x right, y down), (68, 2) float64. The stand-in landmarkers' resting shape."""
    pts = []
    phi = np.linspace(np.pi, 0.0, 17)
    pts += list(zip(0.5 + 0.45 * np.cos(phi), 0.35 + 0.63 * np.sin(phi)))  # jaw, 0..16
    for x0, x1 in ((0.15, 0.42), (0.58, 0.85)):  # brows, 17..26
        xs = np.linspace(x0, x1, 5)
        pts += [(x, 0.28 - 0.04 * np.sin(np.pi * (x - x0) / (x1 - x0))) for x in xs]
    pts += [(0.5, y) for y in np.linspace(0.36, 0.58, 4)]  # bridge, 27..30
    pts += [(x, 0.64) for x in np.linspace(0.4, 0.6, 5)]  # nostrils, 31..35
    for cx in (0.3, 0.7):  # eyes, 36..47
        a = np.linspace(np.pi, -np.pi, 7)[:6]
        pts += list(zip(cx + 0.08 * np.cos(a), 0.4 - 0.03 * np.sin(a)))
    a = np.linspace(np.pi, -np.pi, 13)[:12]  # outer lips, 48..59
    pts += list(zip(0.5 + 0.16 * np.cos(a), 0.8 - 0.07 * np.sin(a)))
    a = np.linspace(np.pi, -np.pi, 9)[:8]  # inner lips, 60..67
    pts += list(zip(0.5 + 0.1 * np.cos(a), 0.8 - 0.03 * np.sin(a)))
    return np.asarray(pts, np.float64)


def build_landmarker(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0):
    """2DFAN4's tensors (an image input): per-point heatmap logits at 1/4 resolution = a bump at the
    point's place on :func:`mean_face_68` (the box crop of FaceFusion's recipe) plus a content term;
    ``heatmaps`` their sigmoid, ``landmarks_xyscore`` the soft-argmax (x, y in heatmap pixels, so
    always inside the map) and the peak heatmap value. fan_68_5's tensors (5 points in): a fixed
    affine combination of the 5 points per output point (weights summing to 1, so the stand-in
    commutes with any affine map of its input), resting on :func:`mean_face_68` for the ffhq_512
    template's points."""
    x = spec.inputs[0]
    if len(x.shape) != 4:
        return _build_fan_68_5(spec, seed=seed)
    g = _Graph(seed)
    lm_t, heat_t = spec.outputs
    points, res = heat_t.shape[1], heat_t.shape[2]
    k = x.shape[2] // res
    h = g.op("AveragePool", [x.name], kernel_shape=[k, k], strides=[k, k])
    h = g.op("Tanh", [g.conv(h, 3, 16, 3, pad=1, tag="features")])
    h = g.conv(h, 16, points, 1, tag="points")
    # where each point rests: the box spans 195 of the 256 crop pixels, centred
    rest = (0.5 * (x.shape[2] - 195) + mean_face_68()[:points] * 195) / k
    v, u = np.mgrid[0:res, 0:res].astype(np.float32)
    d2 = (u[None] - rest[:, 0, None, None]) ** 2 + (v[None] - rest[:, 1, None, None]) ** 2
    bump = (-d2 / (2 * 4.0**2)).astype(np.float32)[None]
    logits = g.op("Add", [g.op("Mul", [h, g.const(np.float32(2.0), np.float32)]), g.init("rest", bump)])
    heat = g.op("Sigmoid", [logits], out=heat_t.name)
    flat = g.op("Reshape", [logits, g.const([-1, points, res * res])])
    prob = g.op("Softmax", [flat], axis=2)
    grid = np.stack([u.reshape(-1), v.reshape(-1)], axis=1).astype(np.float32)  # (res*res, 2): x, y
    xy = g.op("MatMul", [prob, g.init("grid", grid)])
    peak = g.op("ReduceMax", [g.op("Reshape", [heat, g.const([-1, points, res * res])])], axes=[2], keepdims=1)
    g.op("Concat", [xy, peak], out=lm_t.name, axis=2)
    return g.model([_vi(x)], [_vi(t) for t in spec.outputs], spec.name)


def _build_fan_68_5(spec: registry.ModelSpec, *, seed: int = 0):
    from vcam.align import TEMPLATES, apply, umeyama

    g = _Graph(seed)
    x, out = spec.inputs[0], spec.outputs[0]
    tpl = TEMPLATES[spec.template or "ffhq_512"]
    face = mean_face_68()
    five = np.stack([face[36:42].mean(0), face[42:48].mean(0), face[30], face[48], face[54]])
    face = apply(umeyama(five, tpl), face)  # the resting face in the template's frame
    # affine weights: tpl^T w = p and sum(w) = 1, the minimum-norm solution per point, jittered
    # within the constraint so the weights are the stand-in's own
    a = np.vstack([tpl.T, np.ones((1, 5))])
    w = np.linalg.lstsq(a, np.vstack([face.T, np.ones((1, face.shape[0]))]), rcond=None)[0].T
    jitter = g.rng.standard_normal(w.shape) * 0.01
    null = np.linalg.svd(a)[2][3:]  # directions that change neither the point nor the sum
    w = w + (jitter @ null.T) @ null
    g.op("MatMul", [g.init("weights", w.astype(np.float32)), x.name], out=out.name)
    return g.model([_vi(x)], [_vi(out)], spec.name)


# -- Real-ESRGAN (RRDBNet) ----------------------------------------------------------------------
def _pixel_unshuffle(g: _Graph, x: str, r: int) -> str:
    """PyTorch's ``pixel_unshuffle(x, r)`` (channel ``c * r*r + dy * r + dx``) for dynamic H, W:
    Reshape/Transpose only, so every backend runs it without shape arithmetic."""
    h = g.op("Reshape", [x, g.const([0, 0, 0, -1, r])])  # N, C, H, W/r, dx
    h = g.op("Transpose", [h], perm=[0, 1, 3, 4, 2])  # N, C, W/r, dx, H
    h = g.op("Reshape", [h, g.const([0, 0, 0, 0, -1, r])])  # N, C, W/r, dx, H/r, dy
    h = g.op("Transpose", [h], perm=[0, 4, 2, 1, 5, 3])  # N, H/r, W/r, C, dy, dx
    h = g.op("Reshape", [h, g.const([0, 0, 0, -1])])  # N, H/r, W/r, C*r*r
    return g.op("Transpose", [h], perm=[0, 3, 1, 2])


def _esrgan_conv(
    g: _Graph, x: str, cin: int, cout: int, tag: str, *, gain: float = 0.1, through: np.ndarray | None = None
) -> str:
    """3x3 conv, zero padding 1: kaiming-normal weights times ``gain``, zero bias, plus ``through``
    (cout, cin, 3, 3) added (the pass-through part, see the module docstring)."""
    w = g.rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) * np.float32(gain * np.sqrt(2.0 / (cin * 9)))
    if through is not None:
        w += through.astype(np.float32)
    wn = g.init(f"{tag}.weight", w)
    bn = g.init(f"{tag}.bias", np.zeros((cout,), np.float32))
    return g.op("Conv", [x, wn, bn], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])


def _through(cout: int, cin: int, taps: np.ndarray, pairs) -> np.ndarray:
    """A pass-through kernel: ``taps`` (3, 3) from input channel i to output channel o per (o, i)."""
    w = np.zeros((cout, cin, 3, 3), np.float32)
    for o, i in pairs:
        w[o, i] += taps
    return w


def build_upscaler(spec: registry.ModelSpec, *, tiny: bool = False, seed: int = 0, dynamic: bool = False):
    """Real-ESRGAN's RRDBNet for ``spec.scale`` (see the module docstring). ``dynamic``: the file
    declares dynamic H and W (any tile side; the untiled baseline) instead of the registry's tile."""
    feat, grow, blocks = (16, 8, 1) if tiny else (64, 32, 23)
    scale = int(spec.scale)
    if scale not in (1, 2, 4):
        raise ModelError(f"{spec.name}: no RRDBNet stand-in for scale {scale}", hint="scales 1, 2 and 4 are built")
    g = _Graph(seed)
    x = spec.inputs[0]
    unshuffle = {1: 4, 2: 2, 4: 1}[scale]
    h = x.name if unshuffle == 1 else _pixel_unshuffle(g, x.name, unshuffle)
    cin = 3 * unshuffle * unshuffle
    dirac = np.zeros((3, 3), np.float32)
    dirac[1, 1] = 1.0
    blur = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]).astype(np.float32) / np.float32(16.0)
    sub = unshuffle * unshuffle  # each colour's sub-pixels, averaged into its pass-through channel
    first = _through(feat, cin, dirac / np.float32(sub), [(c, c * sub + k) for c in range(3) for k in range(sub)])
    fea = _esrgan_conv(g, h, cin, feat, "conv_first", through=first)
    trunk = fea
    slope = g.const(np.float32(0.2), np.float32)
    for b in range(blocks):
        block_in = trunk
        for r in range(3):
            rdb_in = trunk
            parts = [rdb_in]
            for k in range(1, 6):
                cat = parts[0] if len(parts) == 1 else g.op("Concat", list(parts), axis=1)
                c_in = feat + grow * (k - 1)
                y = _esrgan_conv(g, cat, c_in, grow if k < 5 else feat, f"body.{b}.rdb{r + 1}.conv{k}")
                if k < 5:
                    parts.append(g.lrelu(y))
            trunk = g.op("Add", [g.op("Mul", [y, slope]), rdb_in])
        trunk = g.op("Add", [g.op("Mul", [trunk, slope]), block_in])
    # each RRDB returns about 1.2 times its input at this initialisation: conv_body undoes the growth
    body = _esrgan_conv(g, trunk, feat, feat, "conv_body", gain=0.1 / 1.2**blocks)
    h = g.op("Add", [fea, body])
    keep = [(c, c) for c in range(3)]
    scales = g.const(np.array([1, 1, 2, 2], np.float32), np.float32)
    for k in (1, 2):
        up = g.op("Resize", [h, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        h = g.lrelu(_esrgan_conv(g, up, feat, feat, f"conv_up{k}", through=_through(feat, feat, blur, keep)))
    h = g.lrelu(_esrgan_conv(g, h, feat, feat, "conv_hr", through=_through(feat, feat, dirac, keep)))
    out_t = spec.outputs[0]
    w = _through(3, feat, dirac, keep)
    w += g.rng.standard_normal(w.shape, dtype=np.float32) * np.float32(0.1 * np.sqrt(2.0 / (feat * 9)))
    g.op(
        "Conv",
        [h, g.init("conv_last.weight", w), g.init("conv_last.bias", np.zeros((3,), np.float32))],
        out=out_t.name,
        kernel_shape=[3, 3],
        strides=[1, 1],
        pads=[1, 1, 1, 1],
    )
    if dynamic:
        x = registry.Tensor(x.name, (x.shape[0], 3, "H", "W"), x.dtype)
        out_t = registry.Tensor(out_t.name, (out_t.shape[0], 3, f"H*{scale}", f"W*{scale}"), out_t.dtype)
    kind = "tiny" if tiny else "full size"
    return g.model(
        [_vi(x)],
        [_vi(out_t)],
        spec.name,
        f"vcam stand-in for {spec.name} ({kind}): Real-ESRGAN RRDBNet x{scale}, random weights with a pass-through",
    )


BUILDERS: dict[str, Callable] = {
    "detector": build_detector,
    "recogniser": build_recogniser,
    "swapper": build_image_to_image,
    "enhancer": build_image_to_image,
    "converter": build_converter,
    "occluder": build_occluder,
    "parser": build_parser,
    "landmarker": build_landmarker,
    "upscaler": build_upscaler,
}


def build(name: str, *, tiny: bool = False, seed: int = 0):
    """The stand-in ``onnx.ModelProto`` for registry model ``name``."""
    spec = registry.get(name)
    if spec.embedded:
        import onnx

        module, _, attr = spec.embedded.partition(":")
        import importlib

        return onnx.load_from_string(getattr(importlib.import_module(module), attr))
    if spec.source == "emap":
        return build_inswapper(spec, tiny=tiny, seed=seed)
    return BUILDERS[spec.kind](spec, tiny=tiny, seed=seed)


def write(name: str, out: str | os.PathLike, *, tiny: bool = False, seed: int = 0) -> Path:
    """Build and save the stand-in for ``name`` to ``out`` (written to a temp name, then renamed)."""
    import onnx

    out = Path(out)
    if out.is_dir():
        spec = registry.get(name)
        out = out / (spec.file or f"{name}.onnx")
    model = build(name, tiny=tiny, seed=seed)
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(tmp))
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ModelError(f"cannot write {out}: {exc.strerror or exc}", hint="choose a writable --out path") from None
    return out


def count_parameters(model, *, exclude: tuple[str, ...] = ("emap",)) -> int:
    """Number of weights in ``model``'s initializers (``emap`` excluded by default)."""
    total = 0
    for t in model.graph.initializer:
        if t.name not in exclude:
            total += int(np.prod(t.dims)) if len(t.dims) else 1
    return total
