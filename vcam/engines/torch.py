"""PyTorch backend: ONNX models run as native PyTorch modules, on CUDA (FP16, CUDA graphs) or the CPU.

The two known architectures (the inswapper swapper and the embedded RetinaFace mobilenet0.25
detector) are rebuilt as native modules (:mod:`vcam.engines.inswapper_torch`,
:mod:`vcam.engines.retinaface_torch`) whose weights are read from the ONNX file's initializers, in
graph order, with every shape checked. Other graphs go through ``onnx2torch`` when it is installed
(after folding ``Identity`` nodes, which it cannot follow), else the engine is unavailable.

Two ways to call an engine:

- ``run(feeds)``: NumPy (host) arrays in, NumPy float arrays out (copies).
- ``run_device(feeds, stream=None)``: CuPy arrays or torch CUDA tensors in, arrays of the same kind
  out, exchanged through DLPack on the caller's stream (zero copy, no host synchronisation). The
  outputs are views of buffers owned by the engine and stay valid until the next call.

On CUDA each batch size is padded up to a captured size (1, 2, 4, ... up to ``max_batch``) and run
by replaying a CUDA graph captured for that size and those input shapes. Calls must not overlap:
one engine serves one stream at a time.

This module imports without PyTorch (so the package and its tests import everywhere); constructing
:class:`TorchEngine` without it raises :class:`~vcam.errors.EngineUnavailable`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import EngineUnavailable, ModelError

try:  # absolute import: the top-level PyTorch package, not this module
    import torch as _torch
except ImportError:  # pragma: no cover - exercised where torch is absent (CI)
    _torch = None

log = logging.getLogger(__name__)

TORCH_HINT = "install PyTorch for your CUDA (pip install 'fastswap-cam[torch]'), or use --backend onnxruntime"


# --------------------------------------------------------------------------------------------------
# ONNX graph reading (no torch needed)


class OnnxGraph:
    """Read-only view of an ONNX graph with ``Identity`` indirections folded.

    ``resolve(name)`` follows Identity chains to the tensor that really holds the data, so weights
    that pass through Identity nodes (as in the embedded RetinaFace) are found by their source name.
    """

    def __init__(self, model: Any, *, name: str = "model") -> None:
        import onnx
        from onnx import numpy_helper

        self._numpy_helper = numpy_helper
        self.model = model
        self.name = name
        graph = model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.alias: dict[str, str] = {}
        self.constants: dict[str, Any] = {}
        for node in graph.node:
            if node.op_type == "Identity" and len(node.input) == 1:
                self.alias[node.output[0]] = node.input[0]
            elif node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.nodes = [n for n in graph.node if n.op_type not in ("Identity", "Constant")]
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list] = defaultdict(list)
        for node in self.nodes:
            for out in node.output:
                self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[self.resolve(inp)].append(node)
        init_names = set(self.initializers)
        self.inputs = [(v.name, _value_shape(v), _value_dtype(onnx, v)) for v in graph.input if v.name not in init_names]
        self.outputs = [(v.name, _value_shape(v), _value_dtype(onnx, v)) for v in graph.output]

    def resolve(self, name: str) -> str:
        seen = set()
        while name in self.alias and name not in seen:
            seen.add(name)
            name = self.alias[name]
        return name

    def array(self, name: str) -> np.ndarray | None:
        """The constant data behind a tensor name (initializer or Constant node), or None."""
        name = self.resolve(name)
        if name in self.initializers:
            return self._numpy_helper.to_array(self.initializers[name])
        if name in self.constants:
            return self._numpy_helper.to_array(self.constants[name])
        return None

    def of_type(self, *ops: str) -> list:
        return [n for n in self.nodes if n.op_type in ops]

    def producer_of(self, name: str):
        return self.producer.get(self.resolve(name))

    def consumers_of(self, name: str) -> list:
        return self.consumers.get(self.resolve(name), [])

    @property
    def input_names(self) -> list[str]:
        return [n for n, _, _ in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [n for n, _, _ in self.outputs]


def attrs(node: Any) -> dict[str, Any]:
    """A node's attributes as plain Python values (bytes decoded)."""
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _value_shape(v: Any) -> tuple:
    dims = []
    for d in v.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return tuple(dims)


def _value_dtype(onnx: Any, v: Any) -> np.dtype:
    elem = v.type.tensor_type.elem_type
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    except Exception:
        return np.dtype(np.float32)


def fold_identities(model: Any) -> Any:
    """A copy of ``model`` with Identity nodes removed and their consumers rewired to the source.

    Identities whose output is a graph output are kept (the output name must survive).
    """
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    keep_names = {o.name for o in graph.output}
    alias = {}
    for n in graph.node:
        if n.op_type == "Identity" and n.output[0] not in keep_names:
            alias[n.output[0]] = n.input[0]

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    nodes = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    for n in nodes:
        for i, name in enumerate(n.input):
            if name:
                n.input[i] = resolve(name)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def recognise(graph: OnnxGraph) -> str | None:
    """Name of the native architecture this graph is (``"inswapper"``, ``"retinaface"``) or None."""
    ins = {n: s for n, s, _ in graph.inputs}
    outs = graph.output_names
    if set(ins) == {"target", "source"} and len(outs) == 1:
        t, s = ins["target"], ins["source"]
        if len(t) == 4 and tuple(t[1:]) == (3, 128, 128) and len(s) == 2 and s[1] == 512:
            return "inswapper"
    if list(ins) == ["input"] and len(ins["input"]) == 4 and set(outs) == {"loc", "conf", "landmarks"}:
        return "retinaface"
    return None


# --------------------------------------------------------------------------------------------------
# Weight loading (torch needed)


def load_graph_weights(graph: OnnxGraph, convs: Sequence[Any], linears: Sequence[Any] = ()) -> None:
    """Copy Conv and Gemm/MatMul weights from ``graph`` into ``convs`` / ``linears`` in graph order.

    Conv nodes that reuse a weight (directly or through Identity) count once. A BatchNormalization
    that directly follows a Conv is folded into it. Every tensor's shape and every conv's stride,
    padding, dilation and groups are checked; the first mismatch raises :class:`ModelError`.
    """
    torch = _require_torch()
    conv_nodes, seen = [], set()
    for node in graph.of_type("Conv"):
        key = graph.resolve(node.input[1])
        if key not in seen:
            seen.add(key)
            conv_nodes.append(node)
    if len(conv_nodes) != len(convs):
        raise _mismatch(graph, f"expected {len(convs)} convolutions, the graph has {len(conv_nodes)}")
    for i, (node, mod) in enumerate(zip(conv_nodes, convs)):
        w = graph.array(node.input[1])
        b = graph.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        where = f"Conv #{i} ({node.name or node.output[0]})"
        if w is None:
            raise _mismatch(graph, f"{where}: weight '{node.input[1]}' is not a constant")
        a = attrs(node)
        k = tuple(w.shape[2:])
        got = {
            "stride": tuple(a.get("strides", [1] * len(k))),
            "dilation": tuple(a.get("dilations", [1] * len(k))),
            "groups": int(a.get("group", 1)),
            "padding": tuple(a.get("pads", [0] * 2 * len(k))),
        }
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise _mismatch(graph, f"{where}: auto_pad={a['auto_pad']} is not supported")
        want = {
            "stride": tuple(mod.stride),
            "dilation": tuple(mod.dilation),
            "groups": int(mod.groups),
            "padding": tuple(mod.padding) * 2,
        }
        for field, value in want.items():
            if got[field] != value:
                raise _mismatch(graph, f"{where}: {field} {got[field]} != expected {value}")
        bn = _following_bn(graph, node)
        if bn is not None:
            w, b = _fold_bn(graph, bn, w, b)
        _copy(graph, where + " weight", mod.weight, w)
        if mod.bias is not None:
            _copy(graph, where + " bias", mod.bias, b if b is not None else np.zeros(w.shape[0], np.float32))
        elif b is not None and np.any(b):
            raise _mismatch(graph, f"{where}: the graph has a bias the module lacks")
    lin = _linear_weights(graph)
    if len(lin) != len(linears):
        raise _mismatch(graph, f"expected {len(linears)} linear layers (Gemm), the graph has {len(lin)}")
    for i, ((where, w, b), mod) in enumerate(zip(lin, linears)):
        _copy(graph, f"Gemm #{i} ({where}) weight", mod.weight, w)
        _copy(graph, f"Gemm #{i} ({where}) bias", mod.bias, b if b is not None else np.zeros(w.shape[0], np.float32))
    del torch


def _linear_weights(graph: OnnxGraph) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(name, weight (out, in), bias) of every Gemm, and of every MatMul by a constant, in graph order."""
    out = []
    for node in graph.of_type("Gemm", "MatMul"):
        name = node.name or node.output[0]
        if node.op_type == "Gemm":
            a = attrs(node)
            w = graph.array(node.input[1])
            if w is None:
                continue
            if a.get("transA", 0):
                raise _mismatch(graph, f"Gemm {name}: transA=1 is not supported")
            w = w if a.get("transB", 0) else w.T
            w = w * float(a.get("alpha", 1.0))
            b = graph.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if b is not None:
                b = np.broadcast_to(b * float(a.get("beta", 1.0)), (w.shape[0],)).copy()
            out.append((name, np.ascontiguousarray(w), b))
        else:
            w = graph.array(node.input[1])
            if w is None or w.ndim != 2:
                continue
            b = None
            follow = graph.consumers_of(node.output[0])
            if len(follow) == 1 and follow[0].op_type == "Add":
                other = [x for x in follow[0].input if graph.resolve(x) != graph.resolve(node.output[0])]
                b = graph.array(other[0]) if other else None
            out.append((name, np.ascontiguousarray(w.T), b))
    return out


def _following_bn(graph: OnnxGraph, conv: Any):
    follow = graph.consumers_of(conv.output[0])
    if len(follow) == 1 and follow[0].op_type == "BatchNormalization":
        return follow[0]
    return None


def _fold_bn(graph: OnnxGraph, bn: Any, w: np.ndarray, b: np.ndarray | None):
    scale, shift, mean, var = (graph.array(x) for x in bn.input[1:5])
    if any(v is None for v in (scale, shift, mean, var)):
        raise _mismatch(graph, f"BatchNormalization {bn.name}: parameters are not constants")
    eps = float(attrs(bn).get("epsilon", 1e-5))
    k = scale / np.sqrt(var + eps)
    b = np.zeros(w.shape[0], np.float32) if b is None else b
    return (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32), ((b - mean) * k + shift).astype(np.float32)


def _copy(graph: OnnxGraph, where: str, param: Any, value: np.ndarray) -> None:
    torch = _require_torch()
    if tuple(value.shape) != tuple(param.shape):
        raise _mismatch(graph, f"{where}: shape {tuple(value.shape)} != expected {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(torch.from_numpy(np.array(value, dtype=np.float32)))


def _mismatch(graph: OnnxGraph, what: str) -> ModelError:
    return ModelError(
        f"{graph.name}: unsupported graph for the native PyTorch module: {what}",
        hint="use --backend onnxruntime for this model, or check that the file is the expected model",
    )


def _require_torch():
    if _torch is None:
        raise EngineUnavailable("torch not installed", hint=TORCH_HINT)
    return _torch


# --------------------------------------------------------------------------------------------------
# FP16 guard


def finite_mask(out: Any) -> Any:
    """Per batch item, True where every value of ``out[i]`` is finite (no NaN/Inf).

    Works on torch tensors, CuPy arrays and NumPy arrays and returns the same kind on the same
    device (no host synchronisation for device arrays). The swap stage passes faces whose mask is
    False through unswapped and counts them.
    """
    n = out.shape[0]
    if _torch is not None and isinstance(out, _torch.Tensor):
        return _torch.isfinite(out.reshape(n, -1)).all(dim=1)
    mod = type(out).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return cupy.isfinite(out.reshape(n, -1)).all(axis=1)
    arr = np.asarray(out)
    return np.isfinite(arr.reshape(n, -1)).all(axis=1)


# --------------------------------------------------------------------------------------------------
# The engine


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Captured batch sizes: powers of two below ``max_batch``, and ``max_batch`` itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(int(max_batch))
    return tuple(sizes)


class _Captured:
    __slots__ = ("graph", "inputs", "outputs", "batch")

    def __init__(self, graph, inputs, outputs, batch):
        self.graph, self.inputs, self.outputs, self.batch = graph, inputs, outputs, batch


class TorchEngine:
    """An ONNX model run by PyTorch. See the module docstring for the calling conventions.

    ``device``: ``"cuda"`` (default) or ``"cpu"``. ``fp16``: run in half precision (CUDA only; on
    the CPU it is ignored with a log line). ``max_batch``: largest batch a call may pass.
    ``cache_dir``: where ``torch.compile`` keeps its Inductor cache when ``compile=True``.
    ``cuda_graphs``: replay captured CUDA graphs (default on CUDA). ``channels_last``: NHWC memory
    layout for the convolutions (None: on for the native modules on CUDA in FP16, where it measured faster).
    ``compile``: ``torch.compile(mode="max-autotune-no-cudagraphs")`` before capture (slow first
    build, cached under ``cache_dir``). ``warmup``: capture every batch size at construction when all
    input shapes are fixed (otherwise shapes are captured on first use; call :meth:`warmup` early).
    """

    backend = "torch"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str = "cuda",
        fp16: bool = False,
        max_batch: int = 8,
        cache_dir: str | os.PathLike | None = None,
        cuda_graphs: bool = True,
        channels_last: bool | None = None,
        compile: bool = False,
        warmup: bool = True,
        tf32: bool = False,
    ) -> None:
        reason = self.unavailable_reason(device)
        if reason:
            hint = TORCH_HINT if "torch" in reason else "use --device cpu or --backend onnxruntime"
            raise EngineUnavailable(reason, hint=hint)
        torch = _torch
        self.model_path = Path(model_path)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        if fp16 and device != "cuda":
            log.info("fp16 requested on the CPU: running %s in float32", self.model_path.name)
            fp16 = False
        self.fp16 = bool(fp16)
        self.dtype = torch.float16 if self.fp16 else torch.float32
        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.batch_sizes = batch_buckets(self.max_batch)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.tf32 = bool(tf32)

        graph = _load_onnx(self.model_path)
        self.architecture = recognise(graph)
        from . import TensorInfo

        self.inputs = [TensorInfo(n, s, d) for n, s, d in graph.inputs]
        self.outputs = [TensorInfo(n, s, d) for n, s, d in graph.outputs]
        self._in_names = [i.name for i in self.inputs]
        self._out_names = [o.name for o in self.outputs]

        module, call_order, out_order = self._build_module(graph)
        self._call_order = call_order  # module argument order, by input name
        self._out_index = [out_order.index(n) for n in self._out_names]
        if channels_last is None:
            channels_last = self.device.type == "cuda" and self.fp16 and self.architecture is not None
        self.channels_last = bool(channels_last)
        module = module.eval().requires_grad_(False).to(self.device, self.dtype)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        self.module = module
        self._fn = module
        if compile:
            self._fn = self._compiled(module)
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._streams: dict[int, Any] = {}
        self._closed = False
        if warmup and self.device.type == "cuda" and all(
            all(isinstance(d, int) for d in i.shape[1:]) for i in self.inputs
        ):
            self.warmup()

    # -- availability -----------------------------------------------------------------------------

    @staticmethod
    def unavailable_reason(device: str = "cuda") -> str | None:
        """Why this backend cannot run on ``device`` here, or None if it can."""
        if _torch is None:
            return "torch not installed"
        if device == "cuda":
            if not _torch.cuda.is_available():
                return "no CUDA device"
            return None
        if device == "cpu":
            return None
        return f"unknown device '{device}' (use cuda or cpu)"

    # -- construction helpers ---------------------------------------------------------------------

    def _build_module(self, graph: OnnxGraph):
        if self.architecture == "inswapper":
            from .inswapper_torch import load_inswapper_from_graph

            module = load_inswapper_from_graph(graph)
            return module, ["target", "source"], ["output"] if graph.output_names == ["output"] else graph.output_names
        if self.architecture == "retinaface":
            from .retinaface_torch import load_retinaface_from_graph

            module = load_retinaface_from_graph(graph)
            return module, ["input"], ["loc", "conf", "landmarks"]
        try:
            from onnx2torch import convert
        except ImportError:
            names = ", ".join(f"{n}{tuple(s)}" for n, s, _ in graph.inputs)
            raise EngineUnavailable(
                f"unsupported graph: no native PyTorch module for {self.model_path.name} (inputs {names}) "
                "and onnx2torch is not installed",
                hint="pip install onnx2torch, or use --backend onnxruntime",
            ) from None
        try:
            module = convert(fold_identities(graph.model))
        except Exception as exc:
            raise EngineUnavailable(
                f"unsupported graph: onnx2torch cannot convert {self.model_path.name}: {exc}",
                hint="use --backend onnxruntime",
            ) from None
        return module, list(self._in_names), list(self._out_names)

    def _compiled(self, module):
        return compile_module(module, self.cache_dir)

    def _backend_flags(self):
        torch = _torch
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=self.tf32)

    # -- calling ----------------------------------------------------------------------------------

    def _forward(self, args: Sequence[Any]) -> list:
        """Module call with inputs in graph-input order; outputs in ``self.outputs`` order, in the
        declared dtypes, contiguous."""
        by_name = dict(zip(self._in_names, args))
        res = self._fn(*[by_name[n] for n in self._call_order])
        if not isinstance(res, (tuple, list)):
            res = (res,)
        outs = []
        for idx, info in zip(self._out_index, self.outputs):
            t = res[idx]
            outs.append(t.to(dtype=_torch_dtype(info.dtype)).contiguous())
        return outs

    def _static_input(self, info, shape):
        torch = _torch
        t = torch.zeros(shape, dtype=self.dtype if np.issubdtype(info.dtype, np.floating) else _torch_dtype(info.dtype), device=self.device)
        if self.channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    def _capture(self, shapes: dict[str, tuple]) -> _Captured:
        torch = _torch
        batch = shapes[self._in_names[0]][0]
        static = [self._static_input(info, shapes[info.name]) for info in self.inputs]
        with torch.inference_mode(), self._backend_flags():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # cuDNN autotune, lazy init and (with compile) the compilation itself
                    self._forward(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self._forward(static)
        torch.cuda.synchronize(self.device)
        return _Captured(graph, static, outputs, batch)

    def _padded(self, n: int) -> int:
        for b in self.batch_sizes:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} is larger than max_batch={self.max_batch}")

    def _captured_for(self, shapes: dict[str, tuple]) -> _Captured:
        key = tuple((name, tuple(shapes[name])) for name in self._in_names)
        cap = self._graphs.get(key)
        if cap is None:
            cap = self._capture(shapes)
            self._graphs[key] = cap
            while len(self._graphs) > 32:  # dynamic-shape models: keep the most recent shapes
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return cap

    def warmup(self, shapes: dict[str, Sequence[int]] | None = None) -> None:
        """Capture the CUDA graph of every batch size now (so no live frame pays for it).

        ``shapes``: per input, the shape without the batch dim; defaults to the model's fixed dims.
        """
        if not self.cuda_graphs:
            return
        per_item = {}
        for info in self.inputs:
            dims = tuple(shapes[info.name]) if shapes and info.name in shapes else tuple(info.shape[1:])
            if not all(isinstance(d, int) for d in dims):
                raise ValueError(f"input '{info.name}' has dynamic dims {info.shape}: pass shapes={{'{info.name}': (...)}}")
            per_item[info.name] = dims
        for b in self.batch_sizes:
            self._captured_for({n: (b, *d) for n, d in per_item.items()})

    def _run_tensors(self, tensors: list, n: int) -> list:
        """Run on torch tensors already on the engine's device (current stream)."""
        torch = _torch
        if not self.cuda_graphs:
            with torch.inference_mode(), self._backend_flags():
                return self._forward([t.to(self.dtype) if t.is_floating_point() else t for t in tensors])
        b = self._padded(n)
        shapes = {name: (b, *t.shape[1:]) for name, t in zip(self._in_names, tensors)}
        cap = self._captured_for(shapes)
        for dst, src in zip(cap.inputs, tensors):
            view = dst[:n]
            if src.data_ptr() != view.data_ptr() or src.stride() != view.stride():
                view.copy_(src)
        cap.graph.replay()
        return [o[:n] for o in cap.outputs]

    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """The captured graph's own input tensors for a batch of ``n`` (torch, on the device).

        A producer (e.g. the warp-crop kernel, through DLPack) may write straight into them; passing
        them back to :meth:`run_device` then skips the copy into the graph's inputs.
        """
        if not self.cuda_graphs:
            raise RuntimeError("input_buffers needs CUDA graphs (device='cuda')")
        b = self._padded(n)
        dims = {i.name: tuple(shapes[i.name]) if shapes and i.name in shapes else tuple(i.shape[1:]) for i in self.inputs}
        cap = self._captured_for({k: (b, *v) for k, v in dims.items()})
        return {name: t[:n] for name, t in zip(self._in_names, cap.inputs)}

    def _check_feeds(self, feeds: dict[str, Any]) -> list:
        missing = [n for n in self._in_names if n not in feeds]
        if missing:
            raise ModelError(
                f"{self.model_path.name}: missing input '{missing[0]}'",
                hint=f"the model takes {', '.join(self._in_names)}",
            )
        arrs = [feeds[n] for n in self._in_names]
        n = arrs[0].shape[0]
        for name, a in zip(self._in_names, arrs):
            if a.shape[0] != n:
                raise ValueError(f"{self.model_path.name}: input '{name}' has batch {a.shape[0]} != {n}")
        return arrs

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        """Host arrays in, host arrays out (copies, in the model's declared dtypes)."""
        torch = _torch
        arrs = [np.asarray(a) for a in self._check_feeds(feeds)]
        arrs = [np.ascontiguousarray(a, dtype=info.dtype) for a, info in zip(arrs, self.inputs)]
        n = arrs[0].shape[0]
        results: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for start in range(0, max(n, 1), self.max_batch):
            chunk = [torch.from_numpy(a[start : start + self.max_batch]) for a in arrs]
            m = chunk[0].shape[0]
            dev = [c.to(self.device, non_blocking=False) for c in chunk]
            outs = self._run_tensors(dev, m)
            for acc, o in zip(results, outs):
                acc.append(o.detach().cpu().numpy().copy())
        return [np.concatenate(r, axis=0) if len(r) > 1 else r[0] for r in results]

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list:
        """Device arrays in (CuPy or torch), the same kind out, on ``stream`` without host sync.

        ``stream``: a torch or CuPy stream, a raw ``cudaStream_t`` int, or None for the current
        stream of the inputs' library. Outputs are views of engine buffers valid until the next call.
        """
        torch = _torch
        arrs = self._check_feeds(feeds)
        kind = _kind(arrs[0])
        if self.device.type != "cuda":
            tensors = [_to_torch(a, kind) for a in arrs]
            outs = self._run_tensors([t.to(self.device) for t in tensors], tensors[0].shape[0])
            return [_from_torch(o, kind) for o in outs]
        tstream = self._stream_for(stream, kind)
        with torch.cuda.stream(tstream):
            tensors = [_to_torch(a, kind) for a in arrs]
            for name, t in zip(self._in_names, tensors):
                if t.device != self.device:
                    raise ValueError(f"input '{name}' is on {t.device}, the engine runs on {self.device}")
            outs = self._run_tensors(tensors, tensors[0].shape[0])
            return [_from_torch(o, kind) for o in outs]

    def _stream_for(self, stream: Any, kind: str):
        torch = _torch
        if isinstance(stream, torch.cuda.Stream):
            return stream
        if stream is None:
            if kind == "torch":
                return torch.cuda.current_stream(self.device)
            import cupy

            ptr = int(cupy.cuda.get_current_stream().ptr)
        else:
            ptr = int(getattr(stream, "ptr", getattr(stream, "cuda_stream", stream)))
        if ptr == 0:
            return torch.cuda.default_stream(self.device)
        s = self._streams.get(ptr)
        if s is None:
            s = self._streams[ptr] = torch.cuda.ExternalStream(ptr, device=self.device)
        return s

    def close(self) -> None:
        """Drop the captured graphs and the module (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._graphs.clear()
        self._streams.clear()

    def __enter__(self) -> TorchEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        arch = self.architecture or "onnx2torch"
        return f"TorchEngine({self.model_path.name!r}, {arch}, device={self.device.type!r}, fp16={self.fp16})"


# --------------------------------------------------------------------------------------------------
# helpers


def _load_onnx(path: Path) -> OnnxGraph:
    import onnx

    if not path.is_file():
        raise ModelError(f"model file not found: {path}", hint="run `vcam models pull NAME`")
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise ModelError(f"cannot read {path.name} as ONNX: {exc}", hint="the file may be corrupt; run `vcam models verify`") from None
    return OnnxGraph(model, name=path.name)


def _torch_dtype(dtype: np.dtype):
    torch = _torch
    return {
        np.dtype(np.float32): torch.float32,
        np.dtype(np.float16): torch.float16,
        np.dtype(np.float64): torch.float64,
        np.dtype(np.int64): torch.int64,
        np.dtype(np.int32): torch.int32,
        np.dtype(np.uint8): torch.uint8,
        np.dtype(np.bool_): torch.bool,
    }[np.dtype(dtype)]


def _kind(arr: Any) -> str:
    if _torch is not None and isinstance(arr, _torch.Tensor):
        return "torch"
    if type(arr).__module__.split(".")[0] == "cupy":
        return "cupy"
    raise TypeError(f"run_device takes CuPy arrays or torch tensors, got {type(arr).__name__} (use run() for NumPy)")


def _to_torch(arr: Any, kind: str):
    if kind == "torch":
        return arr
    return _torch.from_dlpack(arr)


def _from_torch(t: Any, kind: str):
    if kind == "torch":
        return t
    import cupy

    return cupy.from_dlpack(t)


def iter_params(module: Any, kind: type) -> Iterable[Any]:
    """Submodules of ``module`` of type ``kind`` in registration order."""
    return (m for m in module.modules() if isinstance(m, kind))


__all__ = ["TorchEngine", "OnnxGraph", "finite_mask", "fold_identities", "recognise", "load_graph_weights", "batch_buckets"]


def compile_module(module, cache_dir=None):
    """``torch.compile`` for fixed shapes with Triton autotuning (max-autotune), leaving CUDA graphs to
    the caller. The Inductor cache goes under ``cache_dir/inductor`` (default: the engine cache), so
    only the first start pays the minutes of compiling."""
    from .cache import resolve_cache_dir

    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        path = resolve_cache_dir(cache_dir) / "inductor"
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return _torch.compile(module, mode="max-autotune-no-cudagraphs", dynamic=False)
