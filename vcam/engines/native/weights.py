"""Copying ONNX initializers into native PyTorch modules, every shape and conv attribute checked."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vcam.engines.onnx_graph import OnnxGraph, attrs, mismatch


def materialize(model: Any, device: str = "cpu") -> Any:
    """Uninitialised storage on ``device`` for every parameter and buffer of ``model``, built on
    the meta device (no random initialisation of weights that are overwritten next). The same as
    ``model.to_empty(device=...)``, which goes through torch's Python reference ops for every
    tensor: 0.4 s for the inswapper's 64 tensors with warm bytecode caches, seconds at a cold
    start; this takes a millisecond."""
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), p.requires_grad))
        for name, b in list(mod.named_buffers(recurse=False)):
            setattr(mod, name, torch.empty(b.shape, dtype=b.dtype, device=device))
    return model


def load_graph_weights(graph: OnnxGraph, convs: Sequence[Any], linears: Sequence[Any] = ()) -> list:
    """Copy Conv and Gemm/MatMul weights from ``graph`` into ``convs`` / ``linears`` in graph order;
    returns the tensors filled (a module built without initialisation checks it has them all).

    Conv nodes that reuse a weight (directly or through Identity) count once. A BatchNormalization
    that directly follows a Conv is folded into it. Every tensor's shape and every conv's stride,
    padding, dilation and groups are checked; the first mismatch raises :class:`ModelError`.
    """
    filled: list = []
    conv_nodes = distinct_convs(graph)
    if len(conv_nodes) != len(convs):
        raise mismatch(graph, f"expected {len(convs)} convolutions, the graph has {len(conv_nodes)}")
    for i, (node, mod) in enumerate(zip(conv_nodes, convs)):
        w = graph.array(node.input[1])
        b = graph.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        where = f"Conv #{i} ({node.name or node.output[0]})"
        if w is None:
            raise mismatch(graph, f"{where}: weight '{node.input[1]}' is not a constant")
        a = attrs(node)
        k = tuple(w.shape[2:])
        got = {
            "stride": tuple(a.get("strides", [1] * len(k))),
            "dilation": tuple(a.get("dilations", [1] * len(k))),
            "groups": int(a.get("group", 1)),
            "padding": tuple(a.get("pads", [0] * 2 * len(k))),
        }
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise mismatch(graph, f"{where}: auto_pad={a['auto_pad']} is not supported")
        want = {
            "stride": tuple(mod.stride),
            "dilation": tuple(mod.dilation),
            "groups": int(mod.groups),
            "padding": tuple(mod.padding) * 2,
        }
        for field, value in want.items():
            if got[field] != value:
                raise mismatch(graph, f"{where}: {field} {got[field]} != expected {value}")
        bn = _following_bn(graph, node)
        if bn is not None:
            w, b = _fold_bn(graph, bn, w, b)
        _copy(graph, where + " weight", mod.weight, w)
        filled.append(mod.weight)
        if mod.bias is not None:
            _copy(graph, where + " bias", mod.bias, b if b is not None else np.zeros(w.shape[0], np.float32))
            filled.append(mod.bias)
        elif b is not None and np.any(b):
            raise mismatch(graph, f"{where}: the graph has a bias the module lacks")
    lin = _linear_weights(graph)
    if len(lin) != len(linears):
        raise mismatch(graph, f"expected {len(linears)} linear layers (Gemm), the graph has {len(lin)}")
    for i, ((where, w, b), mod) in enumerate(zip(lin, linears)):
        _copy(graph, f"Gemm #{i} ({where}) weight", mod.weight, w)
        _copy(graph, f"Gemm #{i} ({where}) bias", mod.bias, b if b is not None else np.zeros(w.shape[0], np.float32))
        filled += [mod.weight, mod.bias]
    return filled


def distinct_convs(graph: OnnxGraph) -> list:
    """Conv nodes in graph order, a weight shared by several nodes counted once."""
    out, seen = [], set()
    for node in graph.of_type("Conv"):
        key = graph.resolve(node.input[1])
        if key not in seen:
            seen.add(key)
            out.append(node)
    return out


def _linear_weights(graph: OnnxGraph) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(name, weight (out, in), bias) of every Gemm, and of every MatMul by a constant, in graph order."""
    out = []
    for node in graph.of_type("Gemm", "MatMul"):
        name = node.name or node.output[0]
        w = graph.array(node.input[1])
        if node.op_type == "Gemm":
            if w is None:
                continue
            a = attrs(node)
            if a.get("transA", 0):
                raise mismatch(graph, f"Gemm {name}: transA=1 is not supported")
            w = (w if a.get("transB", 0) else w.T) * float(a.get("alpha", 1.0))
            b = graph.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if b is not None:
                b = np.broadcast_to(b * float(a.get("beta", 1.0)), (w.shape[0],)).copy()
            out.append((name, np.ascontiguousarray(w), b))
        else:
            if w is None or w.ndim != 2:
                continue
            b = None
            follow = graph.consumers_of(node.output[0])
            if len(follow) == 1 and follow[0].op_type == "Add":
                other = [x for x in follow[0].input if graph.resolve(x) != graph.resolve(node.output[0])]
                b = graph.array(other[0]) if other else None
            out.append((name, np.ascontiguousarray(w.T), b))
    return out


def _following_bn(graph: OnnxGraph, conv: Any) -> Any:
    follow = graph.consumers_of(conv.output[0])
    if len(follow) == 1 and follow[0].op_type == "BatchNormalization":
        return follow[0]
    return None


def _fold_bn(graph: OnnxGraph, bn: Any, w: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    scale, shift, mean, var = (graph.array(x) for x in bn.input[1:5])
    if scale is None or shift is None or mean is None or var is None:
        raise mismatch(graph, f"BatchNormalization {bn.name}: parameters are not constants")
    eps = float(attrs(bn).get("epsilon", 1e-5))
    k = scale / np.sqrt(var + eps)
    b = np.zeros(w.shape[0], np.float32) if b is None else b
    return (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32), ((b - mean) * k + shift).astype(np.float32)


def _copy(graph: OnnxGraph, where: str, param: Any, value: np.ndarray) -> None:
    if tuple(value.shape) != tuple(param.shape):
        raise mismatch(graph, f"{where}: shape {tuple(value.shape)} != expected {tuple(param.shape)}")
    src = value if value.dtype == np.float32 and value.flags.c_contiguous else np.ascontiguousarray(value, dtype=np.float32)
    with torch.no_grad(), warnings.catch_warnings():
        # The arrays of the protobuf's bytes are read-only; they are only read here (one copy).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        param.copy_(torch.from_numpy(src))


__all__ = ["distinct_convs", "load_graph_weights"]
