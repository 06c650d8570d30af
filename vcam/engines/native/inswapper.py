"""The inswapper architecture as a native PyTorch module, and its loader from an ONNX file.

Architecture (docs/models.md): encoder ReflectPad3-Conv7x7 3->128, Conv3x3 128->256,
Conv3x3/2 256->512, Conv3x3/2 512->1024 (LeakyReLU 0.2) -> six residual blocks at 1024x32x32, each
[ReflectPad1, Conv3x3, AdaIN, ReLU, ReflectPad1, Conv3x3, AdaIN] -> decoder bilinear x2,
Conv 1024->512, x2, Conv 512->256, Conv 256->128, ReflectPad3 Conv7x7 128->3, tanh, (x+1)/2.
AdaIN: per-channel ``(x - mean) / sqrt(var + 1e-8) * gamma + beta`` with ``gamma, beta`` the two
halves of ``Linear(512 -> 2C)(source)``; the module computes the twelve Linears as one (``style``).

Inputs: ``target`` (N, 3, 128, 128) RGB in [0, 1] and ``source`` (N, 512) (the latent
``normalize(e) @ emap``, normalised); output (N, 3, 128, 128) in [0, 1].

The loader reads the per-conv details (reflect or zero padding, stride, the activation after it,
where the upsampling sits and its mode) from the graph and the weights from its initializers in
graph order (Conv nodes in architecture order; one Gemm per AdaIN Linear, in block order), checking
every shape. ``emap`` is the graph's last initializer and is not part of the module
(:func:`vcam.stages.swap_neural.read_emap`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vcam.engines.native.weights import distinct_convs, load_graph_weights, materialize
from vcam.engines.onnx_graph import OnnxGraph, as_graph, attrs, mismatch

LATENT = 512


@dataclass(frozen=True)
class ConvSpec:
    """One plain (non-block) convolution: channels, kernel, stride, zero ``pad`` inside the conv,
    ``reflect`` padding before it, ``up`` upsampling (x2) before it, and the activation after it."""

    cin: int
    cout: int
    k: int
    stride: int = 1
    pad: int = 0
    reflect: int = 0
    up: str | None = None  # "bilinear" | "nearest"
    align_corners: bool = False
    act: str = "lrelu"  # "lrelu" | "relu" | "tanh" | "none"
    alpha: float = 0.2


@dataclass(frozen=True)
class InSwapperSpec:
    encoder: tuple[ConvSpec, ...]
    width: int  # channels of the residual blocks
    blocks: int
    decoder: tuple[ConvSpec, ...]
    latent: int = LATENT
    block_reflect: int = 1  # ReflectPad before each block conv (0: zero padding inside the conv)
    eps: float = 1e-8


def default_spec(width_div: int = 1, blocks: int = 6) -> InSwapperSpec:
    """The architecture of docs/models.md with every width divided by ``width_div``."""
    c1, c2, c3, c4 = (c // width_div for c in (128, 256, 512, 1024))
    if min(c1, c2, c3, c4) < 1:
        raise ValueError(f"width_div={width_div} leaves no channels")
    enc = (
        ConvSpec(3, c1, 7, reflect=3),
        ConvSpec(c1, c2, 3, pad=1),
        ConvSpec(c2, c3, 3, stride=2, pad=1),
        ConvSpec(c3, c4, 3, stride=2, pad=1),
    )
    dec = (
        ConvSpec(c4, c3, 3, pad=1, up="bilinear"),
        ConvSpec(c3, c2, 3, pad=1, up="bilinear"),
        ConvSpec(c2, c1, 3, pad=1),
        ConvSpec(c1, 3, 7, reflect=3, act="tanh"),
    )
    return InSwapperSpec(encoder=enc, width=c4, blocks=blocks, decoder=dec)


class _PlainConv(nn.Module):
    def __init__(self, s: ConvSpec) -> None:
        super().__init__()
        self.spec = s
        self.conv = nn.Conv2d(s.cin, s.cout, s.k, stride=s.stride, padding=s.pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.spec
        if s.up:
            x = F.interpolate(x, scale_factor=2.0, mode=s.up, align_corners=s.align_corners if s.up != "nearest" else None)
        if s.reflect:
            x = F.pad(x, (s.reflect,) * 4, mode="reflect")
        x = self.conv(x)
        if s.act == "lrelu":
            return F.leaky_relu(x, s.alpha)
        if s.act == "relu":
            return F.relu(x)
        if s.act == "tanh":
            return torch.tanh(x)
        return x


class AdaIN(nn.Module):
    """Adaptive instance norm with its style given; statistics accumulate in float32 also for half
    inputs."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        """``style``: (N, 2C) float32, gamma then beta."""
        gamma, beta = style.chunk(2, dim=1)
        var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
        scale = gamma[:, :, None, None] * torch.rsqrt(var.float() + self.eps)
        return torch.addcmul(beta[:, :, None, None].to(x.dtype), x - mean, scale.to(x.dtype))


class ResBlock(nn.Module):
    def __init__(self, width: int, reflect: int, eps: float) -> None:
        super().__init__()
        self.reflect = reflect
        pad = 0 if reflect else 1
        self.conv1 = nn.Conv2d(width, width, 3, padding=pad)
        self.norm1 = AdaIN(eps)
        self.conv2 = nn.Conv2d(width, width, 3, padding=pad)
        self.norm2 = AdaIN(eps)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (self.reflect,) * 4, mode="reflect") if self.reflect else x

    def forward(self, x: torch.Tensor, style1: torch.Tensor, style2: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(self._pad(x)), style1))
        y = self.norm2(self.conv2(self._pad(y)), style2)
        return x + y


@dataclass(frozen=True)
class StyleRows:
    """One AdaIN's Linear (latent -> 2C) as rows of the network's fused style layer: views, which the
    loader fills and the random initialisation scales in place."""

    weight: torch.Tensor
    bias: torch.Tensor


class InSwapper(nn.Module):
    """``forward(target, source) -> output``; see the module docstring for shapes.

    Every AdaIN's Linear depends on the source alone, so all of them are one Linear, ``style``
    (latent -> 2 x 2C per block), applied once at the start: one matrix product a call instead of
    twelve small ones, the same arithmetic per output. :meth:`linears` gives each layer's rows."""

    def __init__(self, spec: InSwapperSpec) -> None:
        super().__init__()
        self.spec = spec
        self.encoder = nn.ModuleList(_PlainConv(s) for s in spec.encoder)
        self.style = nn.Linear(spec.latent, 2 * 2 * spec.width * spec.blocks)
        self.blocks = nn.ModuleList(ResBlock(spec.width, spec.block_reflect, spec.eps) for _ in range(spec.blocks))
        self.decoder = nn.ModuleList(_PlainConv(s) for s in spec.decoder)

    def forward(self, target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        styles = self.style(source).float().split(2 * self.spec.width, dim=1)
        x = target
        for layer in self.encoder:
            x = layer(x)
        for i, block in enumerate(self.blocks):
            x = block(x, styles[2 * i], styles[2 * i + 1])
        for layer in self.decoder:
            x = layer(x)
        return (x + 1.0) * 0.5

    def convs(self) -> list[nn.Conv2d]:
        """Convolutions in graph order."""
        out: list[Any] = [layer.conv for layer in self.encoder]
        for b in self.blocks:
            out += [b.conv1, b.conv2]
        return out + [layer.conv for layer in self.decoder]

    def linears(self) -> list[StyleRows]:
        """Each AdaIN's Linear (its rows of ``style``) in block order (graph order of the Gemm nodes)."""
        rows = 2 * self.spec.width
        w, b = self.style.weight, self.style.bias
        return [StyleRows(w[i * rows : (i + 1) * rows], b[i * rows : (i + 1) * rows]) for i in range(2 * self.spec.blocks)]


def build_inswapper(seed: int = 0, width_div: int = 1) -> InSwapper:
    """An inswapper-architecture module with random weights (for benchmarks and tests).

    At ``width_div=1`` it has 138.3M parameters. Weights are scaled so activations stay in a sane
    range through the six blocks (so FP16 runs stay finite).
    """
    gen = torch.Generator().manual_seed(int(seed))
    model = InSwapper(default_spec(width_div))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (1.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.01)
        c = model.spec.width
        for rows in model.linears():  # gamma around 1, beta around 0
            rows.weight.mul_(0.1)
            rows.bias[:c].add_(1.0)
    return model.eval()


# --------------------------------------------------------------------------------------------------
# Loading from ONNX


def load_inswapper_from_onnx(path: str | os.PathLike | Any) -> InSwapper:
    """A native :class:`InSwapper` with the weights of the inswapper ONNX file at ``path``."""
    return load_inswapper_from_graph(as_graph(path))


def load_inswapper_from_graph(graph: OnnxGraph) -> InSwapper:
    spec = spec_from_graph(graph)
    with torch.device("meta"):  # no random initialisation of 138 M weights that are overwritten next
        model = InSwapper(spec)
    model = materialize(model)
    loaded = load_graph_weights(graph, model.convs(), model.linears())
    # The layers' rows partition ``style`` and each was filled (a count that differs raised above).
    _check_all_loaded(model, [*loaded, model.style.weight, model.style.bias])
    return model.eval()


def _check_all_loaded(model: Any, loaded: Any) -> None:
    """Every parameter and buffer of a module built without initialisation must have been filled."""
    filled = {id(t) for t in loaded} if loaded is not None else None
    if filled is None:
        return
    missing = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if id(t) not in filled]
    if missing:
        raise RuntimeError(f"inswapper weights not loaded from the graph: {missing[:4]}")


def spec_from_graph(graph: OnnxGraph) -> InSwapperSpec:
    """Read the architecture's free details from the graph (see the module docstring)."""
    convs = distinct_convs(graph)
    n_lin = len(graph.of_type("Gemm")) or len([n for n in graph.of_type("MatMul") if graph.shape(n.input[1]) is not None])
    if n_lin % 2 or n_lin == 0:
        raise mismatch(graph, f"expected two linear layers (Gemm) per residual block, found {n_lin}")
    blocks = n_lin // 2
    if len(convs) != 8 + 2 * blocks:
        raise mismatch(graph, f"expected {8 + 2 * blocks} convolutions for {blocks} blocks, found {len(convs)}")
    shapes = []
    for node in convs:
        w = graph.shape(node.input[1])  # the header only: the weights are converted once, by the loader
        if w is None or len(w) != 4:
            raise mismatch(graph, f"Conv {node.name}: weight is not a constant 4-D tensor")
        shapes.append(w)
    plain = [_plain_spec(graph, node, shapes[i]) for i, node in enumerate(convs) if i < 4 or i >= 4 + 2 * blocks]
    width = shapes[4][0]
    block_reflect = _reflect_before(graph, convs[4])
    return InSwapperSpec(
        encoder=tuple(plain[:4]), width=width, blocks=blocks, decoder=tuple(plain[4:]), block_reflect=block_reflect
    )


def _plain_spec(graph: OnnxGraph, node: Any, shape: tuple) -> ConvSpec:
    a = attrs(node)
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if len(set(pads)) != 1:
        raise mismatch(graph, f"Conv {node.name}: asymmetric pads {pads}")
    spec = ConvSpec(
        cin=int(shape[1]) * int(a.get("group", 1)),
        cout=int(shape[0]),
        k=int(shape[2]),
        stride=int(a.get("strides", [1, 1])[0]),
        pad=int(pads[0]),
        reflect=_reflect_before(graph, node),
    )
    up, align = _upsample_before(graph, node)
    act, alpha = _activation_after(graph, node)
    return replace(spec, up=up, align_corners=align, act=act, alpha=alpha)


def _skip_back(graph: OnnxGraph, name: str):
    """Producer of ``name``, looking through Cast nodes."""
    node = graph.producer_of(name)
    while node is not None and node.op_type == "Cast":
        node = graph.producer_of(node.input[0])
    return node


def _reflect_before(graph: OnnxGraph, conv: Any) -> int:
    node = _skip_back(graph, conv.input[0])
    if node is None or node.op_type != "Pad":
        return 0
    a = attrs(node)
    mode = a.get("mode", "constant")
    if mode != "reflect":
        raise mismatch(graph, f"Pad {node.name} before Conv {conv.name}: mode '{mode}' (expected reflect)")
    pads = a.get("pads")
    if pads is None and len(node.input) > 1:
        arr = graph.array(node.input[1])
        pads = None if arr is None else [int(v) for v in arr]
    if not pads:
        raise mismatch(graph, f"Pad {node.name}: pads are not constant")
    spatial = [p for i, p in enumerate(pads) if i % (len(pads) // 2) >= 2]
    if len(set(spatial)) != 1 or any(p for i, p in enumerate(pads) if i % (len(pads) // 2) < 2):
        raise mismatch(graph, f"Pad {node.name}: unsupported pads {list(pads)}")
    return int(spatial[0])


def _upsample_before(graph: OnnxGraph, conv: Any) -> tuple[str | None, bool]:
    node = _skip_back(graph, conv.input[0])
    if node is not None and node.op_type == "Pad":
        node = _skip_back(graph, node.input[0])
    if node is None or node.op_type not in ("Resize", "Upsample"):
        return None, False
    a = attrs(node)
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    if mode == "linear":
        if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise mismatch(graph, f"{node.op_type} {node.name}: linear resize with '{ctm}' coordinates is not supported")
        return "bilinear", ctm == "align_corners"
    if mode == "nearest":
        return "nearest", False
    raise mismatch(graph, f"{node.op_type} {node.name}: mode '{mode}' is not supported")


def _activation_after(graph: OnnxGraph, conv: Any) -> tuple[str, float]:
    follow = graph.consumers_of(conv.output[0])
    if len(follow) != 1:
        return "none", 0.0
    node = follow[0]
    if node.op_type == "LeakyRelu":
        return "lrelu", float(attrs(node).get("alpha", 0.01))
    if node.op_type == "Relu":
        return "relu", 0.0
    if node.op_type == "Tanh":
        return "tanh", 0.0
    return "none", 0.0


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "InSwapper",
    "InSwapperSpec",
    "ConvSpec",
    "default_spec",
    "build_inswapper",
    "load_inswapper_from_onnx",
    "load_inswapper_from_graph",
    "spec_from_graph",
    "param_count",
]
