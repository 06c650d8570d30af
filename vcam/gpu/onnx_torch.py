"""Run a small convolutional ONNX graph as a PyTorch module (the embedded RetinaFace detector).

onnx2torch trips over the embedded RetinaFace because its weights pass through ``Identity`` nodes;
this module interprets the graph directly instead. Weights (initializers, Identity-forwarded) become
buffers on the module's device; shape arithmetic (``Shape``/``Gather``/``Unsqueeze``/``Concat``/
``Slice``/``Cast`` on shape tensors) runs on the host as Python ints, so ``forward`` issues only
device kernels and can be captured in a CUDA graph. Only the operators the detector uses are
implemented; any other raises :class:`~vcam.errors.ModelError` naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelError

_SUPPORTED = {
    "Conv", "LeakyRelu", "Relu", "Add", "Concat", "Transpose", "Reshape", "Softmax", "Resize", "Identity",
    "Constant", "Shape", "Gather", "Unsqueeze", "Slice", "Cast",
}


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def build(model: bytes | Any, *, device: str = "cuda", dtype: Any = None) -> Any:
    """Return a ``torch.nn.Module`` computing the ONNX graph ``model`` (bytes or ModelProto).

    ``dtype``: torch dtype of the weights and activations (e.g. ``torch.float16``), default float32.
    ``forward(x)`` returns the graph outputs as a tuple, in graph order.
    """
    import onnx
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    proto = onnx.load_from_string(model) if isinstance(model, (bytes, bytearray)) else model
    graph = proto.graph
    unknown = sorted({n.op_type for n in graph.node} - _SUPPORTED)
    if unknown:
        raise ModelError(f"ONNX graph uses operators the torch runner lacks: {', '.join(unknown)}",
                         hint="use the onnxruntime backend for this model")
    dtype = dtype or torch.float32

    class OnnxModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._names: dict[str, str] = {}
            self._host: dict[str, np.ndarray] = {}  # small integer constants for shape arithmetic
            for i, init in enumerate(graph.initializer):
                arr = numpy_helper.to_array(init)
                if arr.dtype.kind == "f":
                    key = f"w{i}"
                    self.register_buffer(key, torch.from_numpy(arr.copy()).to(device=device, dtype=dtype))
                    self._names[init.name] = key
                else:
                    self._host[init.name] = arr
            self._nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in graph.node]
            self._inputs = [i.name for i in graph.input if i.name not in self._names and i.name not in self._host]
            self._outputs = [o.name for o in graph.output]

        def forward(self, x: Any) -> tuple:
            env: dict[str, Any] = {self._inputs[0]: x}
            for name, key in self._names.items():
                env[name] = getattr(self, key)
            env.update(self._host)
            for op, ins, outs, at in self._nodes:
                a = [env[i] if i else None for i in ins]
                if op == "Conv":
                    pads = at.get("pads", [0, 0, 0, 0])
                    y = F.conv2d(a[0], a[1], a[2] if len(a) > 2 else None, stride=tuple(at.get("strides", [1, 1])),
                                 padding=(pads[0], pads[1]), dilation=tuple(at.get("dilations", [1, 1])),
                                 groups=at.get("group", 1))
                elif op == "LeakyRelu":
                    y = F.leaky_relu(a[0], at.get("alpha", 0.01))
                elif op == "Relu":
                    y = F.relu(a[0])
                elif op == "Add":
                    y = a[0] + a[1]
                elif op == "Identity":
                    y = a[0]
                elif op == "Concat":
                    ax = at["axis"]
                    y = (np.concatenate(a, axis=ax) if isinstance(a[0], np.ndarray) else torch.cat(a, dim=ax))
                elif op == "Transpose":
                    y = a[0].permute(*at["perm"])
                elif op == "Reshape":
                    shape = [int(s) for s in np.asarray(a[1]).reshape(-1)]
                    shape = [a[0].shape[k] if s == 0 else s for k, s in enumerate(shape)]
                    y = a[0].reshape(shape)
                elif op == "Softmax":
                    y = torch.softmax(a[0], dim=at.get("axis", 1))
                elif op == "Resize":
                    if (at.get("mode", b"nearest") != b"nearest"
                            or at.get("coordinate_transformation_mode") != b"asymmetric"
                            or at.get("nearest_mode", b"round_prefer_floor") != b"floor"):
                        raise ModelError("Resize: only nearest/asymmetric/floor is supported")
                    sizes = a[3] if len(a) > 3 and a[3] is not None and np.asarray(a[3]).size else None
                    if sizes is not None:
                        y = F.interpolate(a[0], size=tuple(int(s) for s in np.asarray(sizes)[2:]), mode="nearest")
                    else:
                        sc = [float(s) for s in np.asarray(a[2])[2:]]
                        y = F.interpolate(a[0], scale_factor=tuple(sc), mode="nearest")
                elif op == "Constant":
                    from onnx import numpy_helper as nh

                    y = nh.to_array(at["value"])
                elif op == "Shape":
                    y = np.asarray(a[0].shape, dtype=np.int64)
                elif op == "Gather":
                    y = np.take(np.asarray(a[0]), np.asarray(a[1]), axis=at.get("axis", 0))
                elif op == "Unsqueeze":
                    y = np.asarray(a[0])
                    for ax in sorted(at["axes"]):
                        y = np.expand_dims(y, ax)
                elif op == "Slice":
                    data = np.asarray(a[0])
                    starts, ends = np.asarray(a[1]).reshape(-1), np.asarray(a[2]).reshape(-1)
                    axes = np.asarray(a[3]).reshape(-1) if len(a) > 3 and a[3] is not None else np.arange(len(starts))
                    steps = np.asarray(a[4]).reshape(-1) if len(a) > 4 and a[4] is not None else np.ones(len(starts), int)
                    sl = [slice(None)] * data.ndim
                    for s, e, ax, st in zip(starts, ends, axes, steps):
                        sl[int(ax)] = slice(int(s), int(min(e, np.iinfo(np.int64).max)), int(st))
                    y = data[tuple(sl)]
                elif op == "Cast":
                    from onnx import helper as oh

                    y = np.asarray(a[0]).astype(oh.tensor_dtype_to_np_dtype(at["to"]))
                else:  # pragma: no cover - rejected in build()
                    raise ModelError(f"unsupported ONNX operator {op}")
                env[outs[0]] = y
            return tuple(env[o] for o in self._outputs)

    return OnnxModule().eval()
