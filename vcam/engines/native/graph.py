"""Any ONNX graph of common operators as a PyTorch module: the torch backend's generic path.

Models without a native module (the registry's detectors, the recogniser, hyperswap, simswap,
gfpgan, ...) run as a :class:`GraphModule`, which executes the graph's nodes in order with torch
operators. Shape arithmetic stays on the host: ``Shape`` gives host integers and integer
constants are NumPy arrays, so a graph that computes its own reshape sizes never reads the GPU (a
CUDA graph can capture it). Float weights are module buffers (moved and cast with the module);
scalar float constants are Python numbers. An operator outside :data:`OPS` makes the backend
unavailable for that file, with the operator named, at load time.

(onnx2torch does the same job but needs torchvision, whose CUDA build does not import next to a
CPU PyTorch; this covers the operators face models use.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vcam.engines.onnx_graph import OnnxGraph, attrs
from vcam.errors import EngineUnavailable

Value = Any  # a torch.Tensor, a NumPy array (host integers) or a Python number


def _host(v: Value) -> np.ndarray:
    """A host (shape, axes, sizes) argument as NumPy; a device tensor here would cost a sync."""
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def _ints(v: Value) -> list[int]:
    return [int(x) for x in _host(v).reshape(-1)]


def _tensor(v: Value, like: torch.Tensor) -> Value:
    """``v`` usable in an arithmetic op with ``like``: tensors as they are, scalars as numbers."""
    if isinstance(v, torch.Tensor):
        return v
    a = np.asarray(v)
    if a.size == 1:
        return a.item()
    return torch.as_tensor(a, device=like.device, dtype=like.dtype if a.dtype.kind == "f" else None)


def _binary(fn: Callable, np_fn: Callable) -> Callable:
    def op(node: Any, args: list, a: dict) -> Value:
        x, y = args
        if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
            return np_fn(np.asarray(x), np.asarray(y))
        like = x if isinstance(x, torch.Tensor) else y
        return fn(_tensor(x, like), _tensor(y, like))

    return op


def _unary(fn: Callable) -> Callable:
    return lambda node, args, a: fn(args[0])


def _conv(node: Any, args: list, a: dict) -> Value:
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = w.dim() - 2
    pads = list(a.get("pads", [0] * 2 * k))
    auto = a.get("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise EngineUnavailable(
            f"Conv auto_pad={auto} is not supported by the generic torch path", hint="use --backend onnxruntime"
        )
    stride, dilation, groups = a.get("strides", [1] * k), a.get("dilations", [1] * k), int(a.get("group", 1))
    if pads[:k] == pads[k:]:
        pad: Any = pads[:k]
    else:
        x = F.pad(x, [p for i in reversed(range(k)) for p in (pads[i], pads[i + k])])
        pad = 0
    conv = F.conv2d if k == 2 else F.conv1d
    return conv(x, w, b, stride=stride, padding=pad, dilation=dilation, groups=groups)


def _conv_transpose(node: Any, args: list, a: dict) -> Value:
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = w.dim() - 2
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or "output_shape" in a or k != 2:
        raise EngineUnavailable(
            "ConvTranspose with auto_pad, output_shape or a rank other than 2D is not supported by the generic torch path",
            hint="use --backend onnxruntime",
        )
    pads = list(a.get("pads", [0] * 2 * k))
    stride, dilation = a.get("strides", [1] * k), a.get("dilations", [1] * k)
    y = F.conv_transpose2d(
        x, w, b, stride=stride, output_padding=a.get("output_padding", [0] * k), groups=int(a.get("group", 1)), dilation=dilation
    )
    # ONNX pads crop the full transposed output, begin and end per axis (they may differ)
    return y[..., pads[0] : y.shape[2] - pads[2], pads[1] : y.shape[3] - pads[3]]


def _gemm(node: Any, args: list, a: dict) -> Value:
    x, w = args[0], args[1]
    if a.get("transA", 0):
        x = x.t()
    if a.get("transB", 0):
        w = w.t()
    y = torch.matmul(x, w) * float(a.get("alpha", 1.0))
    if len(args) > 2 and args[2] is not None:
        y = y + _tensor(args[2], y) * float(a.get("beta", 1.0))
    return y


def _axes(args: list, a: dict, index: int = 1) -> list[int] | None:
    if "axes" in a:
        return [int(v) for v in a["axes"]]
    if len(args) > index and args[index] is not None:
        return _ints(args[index])
    return None


def _reduce(fn: str) -> Callable:
    def op(node: Any, args: list, a: dict) -> Value:
        x = args[0]
        axes = _axes(args, a)
        keep = bool(a.get("keepdims", 1))
        if axes is None:
            if a.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        if fn == "max":
            return torch.amax(x, dim=axes, keepdim=keep)
        return getattr(torch, fn)(x, dim=axes, keepdim=keep)

    return op


def _reshape(node: Any, args: list, a: dict) -> Value:
    x, shape = args[0], _ints(args[1])
    dims = list(x.shape)
    if not a.get("allowzero", 0):
        shape = [dims[i] if s == 0 else s for i, s in enumerate(shape)]
    if isinstance(x, torch.Tensor):
        return x.reshape(shape)
    return np.asarray(x).reshape(shape)


def _slice(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    if "starts" in a:  # opset < 10
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = _ints(args[1]), _ints(args[2])
        axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else None
        steps = _ints(args[4]) if len(args) > 4 and args[4] is not None else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index: list[Any] = [slice(None)] * len(x.shape)
    for s, e, ax, st in zip(starts, ends, axes, steps):
        n = x.shape[ax]
        s, e = int(s), int(e)
        s = max(-n, min(s, n)) if st > 0 else max(-n - 1, min(s, n - 1))
        e = max(-n - 1, min(e, n))
        if st < 0:
            if not isinstance(x, torch.Tensor):
                index[ax] = slice(s, None if e < -n else e, st)
                continue
            idx = torch.arange(s % n if s >= -n else -1, (e % n) if e >= -n else -1, st, device=x.device)
            x = x.index_select(ax, idx) if idx.numel() else x.narrow(ax, 0, 0)
            continue
        index[ax] = slice(s, e, st)
    return x[tuple(index)]


def _concat(node: Any, args: list, a: dict) -> Value:
    axis = int(a["axis"])
    if any(isinstance(v, torch.Tensor) for v in args):
        like = next(v for v in args if isinstance(v, torch.Tensor))
        return torch.cat([_tensor(v, like) if not isinstance(v, torch.Tensor) else v for v in args], dim=axis)
    return np.concatenate([np.atleast_1d(np.asarray(v)) for v in args], axis=axis)


def _unsqueeze(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    rank = len(np.shape(x)) + len(_axes(args, a) or [])
    for ax in sorted(ax % rank for ax in (_axes(args, a) or [])):
        x = x.unsqueeze(ax) if isinstance(x, torch.Tensor) else np.expand_dims(x, ax)
    return x


def _squeeze(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    axes = _axes(args, a)
    if isinstance(x, torch.Tensor):
        return x.squeeze() if axes is None else x.squeeze(tuple(axes))
    return np.squeeze(x, axis=None if axes is None else tuple(axes))


def _gather(node: Any, args: list, a: dict) -> Value:
    x, idx = args
    axis = int(a.get("axis", 0))
    if not isinstance(x, torch.Tensor):
        return np.take(np.asarray(x), _host(idx).astype(np.int64), axis=axis)
    i = torch.as_tensor(_host(idx).astype(np.int64), device=x.device) if not isinstance(idx, torch.Tensor) else idx.long()
    out = torch.index_select(x, axis, i.reshape(-1))
    return out.reshape(*x.shape[:axis], *i.shape, *x.shape[axis + 1 :])


def _split(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    axis = int(a.get("axis", 0))
    if "split" in a:
        sizes = list(a["split"])
    elif len(args) > 1 and args[1] is not None:
        sizes = _ints(args[1])
    else:
        parts = int(a.get("num_outputs", len(node.output)))
        n = x.shape[axis]
        sizes = [-(-n // parts)] * (parts - 1) + [n - -(-n // parts) * (parts - 1)]
    return list(torch.split(x, sizes, dim=axis))


def _resize(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if node.op_type == "Resize" else "asymmetric")
    if node.op_type == "Upsample":
        scales = _host(args[1]).astype(float).tolist() if len(args) > 1 else list(a["scales"])
        sizes = None
    else:
        scales = (
            _host(args[2]).astype(float).tolist() if len(args) > 2 and args[2] is not None and np.size(_host(args[2])) else None
        )
        sizes = _ints(args[3])[2:] if len(args) > 3 and args[3] is not None else None
    size = sizes or [int(np.floor(d * s)) for d, s in zip(x.shape[2:], scales[2:])]
    if mode == "nearest":
        if ctm not in ("asymmetric", "half_pixel", "tf_half_pixel_for_nn") or a.get("nearest_mode", "round_prefer_floor") not in (
            "floor",
            "round_prefer_floor",
        ):
            raise EngineUnavailable(
                f"Resize nearest with {ctm}/{a.get('nearest_mode')} is not supported by the generic torch path",
                hint="use --backend onnxruntime",
            )
        return F.interpolate(x, size=size, mode="nearest" if ctm == "asymmetric" else "nearest-exact")
    if mode == "linear":
        if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise EngineUnavailable(
                f"Resize linear with {ctm} is not supported by the generic torch path", hint="use --backend onnxruntime"
            )
        return F.interpolate(x, size=size, mode="bilinear" if x.dim() == 4 else "linear", align_corners=ctm == "align_corners")
    raise EngineUnavailable(f"Resize mode {mode} is not supported by the generic torch path", hint="use --backend onnxruntime")


def _pad(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    pads = list(a["pads"]) if "pads" in a else _ints(args[1])
    value = float(_host(args[2]).reshape(-1)[0]) if len(args) > 2 and args[2] is not None else float(a.get("value", 0.0))
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[a.get("mode", "constant")]
    k = len(pads) // 2
    torch_pads = [p for i in reversed(range(k)) for p in (pads[i], pads[i + k])]
    while torch_pads and torch_pads[-1] == 0 and torch_pads[-2] == 0 and mode != "constant":
        torch_pads = torch_pads[:-2]
    return F.pad(x, torch_pads, mode=mode, value=value) if mode == "constant" else F.pad(x, torch_pads, mode=mode)


def _pool(kind: str) -> Callable:
    def op(node: Any, args: list, a: dict) -> Value:
        x = args[0]
        k = a["kernel_shape"]
        pads = list(a.get("pads", [0] * 2 * len(k)))
        stride = a.get("strides", [1] * len(k))
        if pads[: len(k)] != pads[len(k) :]:
            x = F.pad(
                x,
                [p for i in reversed(range(len(k))) for p in (pads[i], pads[i + len(k)])],
                value=float("-inf") if kind == "max" else 0.0,
            )
            pads = [0] * 2 * len(k)
        if kind == "max":
            return F.max_pool2d(x, k, stride, pads[: len(k)], ceil_mode=bool(a.get("ceil_mode", 0)))
        return F.avg_pool2d(
            x,
            k,
            stride,
            pads[: len(k)],
            ceil_mode=bool(a.get("ceil_mode", 0)),
            count_include_pad=bool(a.get("count_include_pad", 0)),
        )

    return op


def _clip(node: Any, args: list, a: dict) -> Value:
    lo = args[1] if len(args) > 1 and args[1] is not None else a.get("min")
    hi = args[2] if len(args) > 2 and args[2] is not None else a.get("max")
    lo = None if lo is None else float(_host(lo).reshape(-1)[0])
    hi = None if hi is None else float(_host(hi).reshape(-1)[0])
    return torch.clamp(args[0], lo, hi)


def _batchnorm(node: Any, args: list, a: dict) -> Value:
    x, scale, bias, mean, var = args[:5]
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=float(a.get("epsilon", 1e-5)))


def _instancenorm(node: Any, args: list, a: dict) -> Value:
    x, scale, bias = args
    return F.instance_norm(x, weight=scale, bias=bias, eps=float(a.get("epsilon", 1e-5)))


def _cast(node: Any, args: list, a: dict) -> Value:
    import onnx

    dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(a["to"])))
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return np.asarray(x).astype(dt)
    if dt.kind == "f":
        return x.float() if dt == np.float32 and x.dtype not in (torch.float16, torch.float32) else x  # keep the compute dtype
    return x.to(
        {
            np.dtype(np.int64): torch.int64,
            np.dtype(np.int32): torch.int32,
            np.dtype(np.bool_): torch.bool,
            np.dtype(np.uint8): torch.uint8,
        }[dt]
    )


def _constant_of_shape(node: Any, args: list, a: dict) -> Value:
    from onnx import numpy_helper

    value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    return np.full(_ints(args[0]), value.reshape(-1)[0], dtype=value.dtype)


def _expand(node: Any, args: list, a: dict) -> Value:
    x, shape = args[0], _ints(args[1])
    if not isinstance(x, torch.Tensor):
        return np.broadcast_to(np.asarray(x), np.broadcast_shapes(np.shape(x), tuple(shape))).copy()
    target = torch.broadcast_shapes(tuple(x.shape), tuple(shape))
    return x.expand(target)


def _where(node: Any, args: list, a: dict) -> Value:
    c, x, y = args
    if not any(isinstance(v, torch.Tensor) for v in args):
        return np.where(c, x, y)
    like = next(v for v in (x, y, c) if isinstance(v, torch.Tensor))
    cond = c if isinstance(c, torch.Tensor) else torch.as_tensor(np.asarray(c), device=like.device)
    return torch.where(cond.bool(), _tensor(x, like), _tensor(y, like))


def _prelu(node: Any, args: list, a: dict) -> Value:
    x, slope = args
    return torch.where(x >= 0, x, x * _tensor(slope, x))


def _softmax(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    return torch.softmax(x.float(), dim=int(a.get("axis", -1))).to(x.dtype)


def _depth_to_space(node: Any, args: list, a: dict) -> Value:
    x = args[0]
    b = int(a["blocksize"])
    if a.get("mode", "DCR") == "CRD":
        return F.pixel_shuffle(x, b)
    n, c, h, w = x.shape
    return x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2).reshape(n, c // (b * b), h * b, w * b)


OPS: dict[str, Callable[[Any, list, dict], Value]] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _binary(torch.matmul, np.matmul),
    "Add": _binary(torch.add, np.add),
    "Sub": _binary(torch.sub, np.subtract),
    "Mul": _binary(torch.mul, np.multiply),
    "Div": _binary(torch.div, lambda x, y: x // y if x.dtype.kind in "iu" else x / y),
    "Pow": _binary(torch.pow, np.power),
    "Equal": _binary(torch.eq, np.equal),
    "Min": _binary(torch.minimum, np.minimum),
    "Max": _binary(torch.maximum, np.maximum),
    "Sqrt": _unary(torch.sqrt),
    "Exp": _unary(torch.exp),
    "Log": _unary(torch.log),
    "Neg": _unary(torch.neg),
    "Abs": _unary(torch.abs),
    "Reciprocal": _unary(torch.reciprocal),
    "Erf": _unary(torch.erf),
    "Tanh": _unary(torch.tanh),
    "Sigmoid": _unary(torch.sigmoid),
    "Relu": _unary(F.relu),
    "Floor": _unary(torch.floor),
    "LeakyRelu": lambda n, args, a: F.leaky_relu(args[0], float(a.get("alpha", 0.01))),
    "Elu": lambda n, args, a: F.elu(args[0], float(a.get("alpha", 1.0))),
    "HardSigmoid": lambda n, args, a: torch.clamp(args[0] * float(a.get("alpha", 0.2)) + float(a.get("beta", 0.5)), 0, 1),
    "Softplus": _unary(F.softplus),
    "PRelu": _prelu,
    "Clip": _clip,
    "Softmax": _softmax,
    "Identity": _unary(lambda x: x),
    "Cast": _cast,
    "Transpose": lambda n, args, a: (
        args[0].permute(*a["perm"]) if isinstance(args[0], torch.Tensor) else np.transpose(args[0], a["perm"])
    ),
    "Reshape": _reshape,
    "Flatten": lambda n, args, a: args[0].reshape(int(np.prod(args[0].shape[: int(a.get("axis", 1))])), -1),
    "Concat": _concat,
    "Slice": _slice,
    "Split": _split,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Gather": _gather,
    "Shape": lambda n, args, a: np.asarray(args[0].shape, dtype=np.int64),
    "Resize": _resize,
    "Upsample": _resize,
    "Pad": _pad,
    "AveragePool": _pool("avg"),
    "MaxPool": _pool("max"),
    "GlobalAveragePool": lambda n, args, a: args[0].mean(dim=tuple(range(2, args[0].dim())), keepdim=True),
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
    "BatchNormalization": _batchnorm,
    "InstanceNormalization": _instancenorm,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Where": _where,
    "DepthToSpace": _depth_to_space,
}


#: Inputs that are parameters of the op (shapes, axes, pads, scales, bounds): read on the host.
HOST_ARGS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Expand": (1,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "Pad": (1, 2, 3),
    "Clip": (1, 2),
    "ReduceMean": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ConstantOfShape": (0,),
    "Gather": (1,),
}


class GraphModule(nn.Module):
    """``forward(*inputs)`` runs ``graph`` node by node (see the module docstring); returns the graph
    outputs in order as a tuple."""

    def __init__(self, graph: OnnxGraph) -> None:
        super().__init__()
        unsupported = sorted({n.op_type for n in graph.nodes} - set(OPS))
        if unsupported:
            raise EngineUnavailable(
                f"{graph.name}: operators {', '.join(unsupported)} are not supported by the generic torch path",
                hint="use --backend onnxruntime for this model",
            )
        self.graph_name = graph.name
        self.input_names = graph.input_names
        self.output_names = [graph.resolve(o) for o in graph.output_names]
        self._arrays: dict[str, np.ndarray] = {}  # every constant, on the host
        self._buffers_by_name: dict[str, str] = {}  # float weights: module buffers (moved and cast with it)
        for i, name in enumerate(list(graph.initializers) + list(graph.constants)):
            arr = graph.array(name)
            if arr is None:
                continue
            self._arrays[name] = arr
            if arr.dtype.kind == "f" and (name in graph.initializers or arr.size > 1):
                key = f"c{i}"
                self.register_buffer(key, torch.from_numpy(np.array(arr, dtype=np.float32)))
                self._buffers_by_name[name] = key
        self._nodes = [
            (n, [graph.resolve(x) if x else "" for x in n.input], list(n.output), attrs(n), HOST_ARGS.get(n.op_type, ()))
            for n in graph.nodes
        ]
        self._drops = self._last_uses()

    def _value(self, env: dict[str, Value], name: str, host: bool) -> Value:
        if not name:
            return None
        if name in env:
            return env[name]
        if not host and name in self._buffers_by_name:
            return getattr(self, self._buffers_by_name[name])
        arr = self._arrays[name]
        return float(arr.reshape(-1)[0]) if arr.dtype.kind == "f" and arr.size == 1 and not host else arr

    def _last_uses(self) -> list[tuple[str, ...]]:
        """Per node, the values computed in the graph whose last reader it is (not graph outputs):
        :meth:`forward` drops them there, so a deep network holds only its live activations (the
        peak memory of a CUDA graph capture is the widest cut, not the sum of every layer)."""
        last: dict[str, int] = {}
        for k, (_, ins, _, _, _) in enumerate(self._nodes):
            for x in ins:
                if x:
                    last[x] = k
        keep = set(self.output_names) | set(self._arrays)
        out: list[list[str]] = [[] for _ in self._nodes]
        for name, k in last.items():
            if name not in keep:
                out[k].append(name)
        return [tuple(v) for v in out]

    def forward(self, *inputs: torch.Tensor) -> tuple:
        env: dict[str, Value] = dict(zip(self.input_names, inputs))
        for (node, ins, outs, a, host), dead in zip(self._nodes, self._drops):
            res = OPS[node.op_type](node, [self._value(env, x, i in host) for i, x in enumerate(ins)], a)
            if isinstance(res, list):
                env.update(zip(outs, res))
            else:
                env[outs[0]] = res
            for name in dead:
                env.pop(name, None)
        return tuple(env[o] if o in env else self._value(env, o, False) for o in self.output_names)


__all__ = ["GraphModule", "OPS"]
