"""A Triton model repository for vcam's models (``vcam serve export``), for existing servers only.

:func:`export_repository` writes, for one registry model:

- ``DIR/NAME/1/model.onnx``: the model with a dynamic batch dimension; with ``uint8_input`` its image
  inputs take uint8 pixels (a ``Cast`` and the model's own normalisation in the graph, so crops
  cross the network at a quarter of FP32); with ``fp16`` its FP32 inputs and outputs are FP16 on
  the wire (casts at the edges; the compute precision is the server's: TensorRT FP16 on a GPU);
- ``DIR/NAME/config.pbtxt``: the ``onnxruntime_onnx`` platform, ``max_batch_size``, the dynamic
  batcher (preferred sizes, queue delay in microseconds), an instance group (GPU or CPU) and, on
  the GPU with ``fp16``, the TensorRT execution accelerator; built as tritonclient's
  ``ModelConfig`` protobuf, so it is valid by construction (tests parse it back);
- ``DIR/inferenceservice.yaml``: a KServe ``InferenceService`` serving the repository with Triton.

The same repository is what ``vcam serve`` (PyTriton's bundled Triton) serves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vcam.errors import EngineUnavailable, ModelError
from vcam.models import registry

#: NVIDIA's Triton container the docs and the manifest name.
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "uint8": "TYPE_UINT8", "int64": "TYPE_INT64", "int32": "TYPE_INT32"}


@dataclass(frozen=True)
class Exported:
    """What :func:`export_repository` wrote."""

    repository: Path
    model: Path
    config: Path
    manifest: Path
    name: str


def _image_inputs(spec: registry.ModelSpec) -> list[str]:
    return [t.name for t in spec.inputs if len(t.shape) == 4]


def prepare_onnx(model: Any, spec: registry.ModelSpec, *, fp16: bool = False, uint8_input: bool = False) -> Any:
    """``model`` (an ``onnx.ModelProto``) with a dynamic batch dim, uint8 image inputs and/or FP16
    edges (see the module docstring). The graph itself is left as it is."""
    import onnx
    from onnx import TensorProto, helper

    g = model.graph
    for vi in list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "N"
    inits = {t.name for t in g.initializer}
    new_nodes, new_inits = [], []
    images = set(_image_inputs(spec)) if uint8_input else set()
    mean = np.asarray(spec.mean, np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(spec.std, np.float32).reshape(1, 3, 1, 1)
    for vi in g.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if vi.name in images:
            wire = TensorProto.UINT8
        elif fp16 and tt.elem_type == TensorProto.FLOAT:
            wire = TensorProto.FLOAT16
        else:
            continue
        inner = f"{vi.name}__f32"
        for node in g.node:
            node.input[:] = [inner if x == vi.name else x for x in node.input]
        if wire == TensorProto.UINT8:  # x = u * 1/(255 std) - mean/std: the model's own normalisation
            scale, shift = 1.0 / (255.0 * std), -mean / std
            new_inits += [
                helper.make_tensor(f"{vi.name}__scale", TensorProto.FLOAT, scale.shape, scale.ravel()),
                helper.make_tensor(f"{vi.name}__shift", TensorProto.FLOAT, shift.shape, shift.ravel()),
            ]
            new_nodes += [
                helper.make_node("Cast", [vi.name], [f"{vi.name}__cast"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [f"{vi.name}__cast", f"{vi.name}__scale"], [f"{vi.name}__mul"]),
                helper.make_node("Add", [f"{vi.name}__mul", f"{vi.name}__shift"], [inner]),
            ]
        else:
            new_nodes.append(helper.make_node("Cast", [vi.name], [inner], to=TensorProto.FLOAT))
        tt.elem_type = wire
    if fp16:
        for vo in g.output:
            tt = vo.type.tensor_type
            if tt.elem_type != TensorProto.FLOAT:
                continue
            inner = f"{vo.name}__f32"
            for node in g.node:
                node.output[:] = [inner if x == vo.name else x for x in node.output]
            g.node.append(helper.make_node("Cast", [inner], [vo.name], to=TensorProto.FLOAT16))
            tt.elem_type = TensorProto.FLOAT16
    nodes = new_nodes + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    onnx.checker.check_model(model)
    return model


#: tritonclient's config messages, a protobuf module that imports nothing of gRPC.
CONFIG_MODULE = "tritonclient.grpc.model_config_pb2"


def config_messages() -> Any:
    """tritonclient's ``model_config_pb2`` (Triton's config messages), or EngineUnavailable naming
    the extra. Loaded from its file, not through ``tritonclient.grpc``, whose package imports gRPC:
    gRPC's fork handlers in a process that then starts the server (``vcam serve``) once left its
    poller on a closed descriptor ("epoll_wait error: Bad file descriptor") and the command ended at
    start. Kept under its own name, so a later ``import tritonclient.grpc`` reuses it."""
    import importlib.util
    import sys

    if CONFIG_MODULE in sys.modules:
        return sys.modules[CONFIG_MODULE]
    from vcam.engines.remote import INSTALL

    package = importlib.util.find_spec("tritonclient")
    path = Path(package.origin or "").parent / "grpc" / "model_config_pb2.py" if package else None
    if path is None or not path.is_file():
        raise EngineUnavailable("writing a Triton model repository needs tritonclient (not installed)", hint=INSTALL)
    spec = importlib.util.spec_from_file_location(CONFIG_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[CONFIG_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[CONFIG_MODULE]
        if isinstance(exc, ImportError):  # protobuf missing (tritonclient without its grpc extra)
            raise EngineUnavailable(f"writing a Triton model repository needs tritonclient ({exc})", hint=INSTALL) from None
        raise
    return module


def model_config(
    name: str,
    model: Any,
    *,
    max_batch: int = 8,
    preferred: tuple[int, ...] = (),
    queue_delay_us: int = 100,
    instances: int = 1,
    gpu: bool = True,
    fp16: bool = False,
) -> Any:
    """Triton's ``ModelConfig`` message for ``model`` (an ``onnx.ModelProto``)."""
    from onnx import helper

    mc = config_messages()

    cfg = mc.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=int(max_batch))
    inits = {t.name for t in model.graph.initializer}
    for vi, target in [(v, cfg.input) for v in model.graph.input if v.name not in inits] + [
        (v, cfg.output) for v in model.graph.output
    ]:
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim][1:]
        target.add(name=vi.name, data_type=mc.DataType.Value(_TYPES[dtype]), dims=dims)
    sizes = preferred or tuple(sorted({b for b in (max_batch // 2, max_batch) if b > 1}))
    cfg.dynamic_batching.preferred_batch_size.extend(int(b) for b in sizes)
    cfg.dynamic_batching.max_queue_delay_microseconds = int(queue_delay_us)
    cfg.instance_group.add(count=int(instances), kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU)
    if gpu and fp16:
        acc = cfg.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
        acc.parameters["precision_mode"] = "FP16"
        acc.parameters["max_workspace_size_bytes"] = str(1 << 30)
    return cfg


def config_text(cfg: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def manifest(name: str, storage_uri: str = "pvc://vcam-models/triton") -> str:
    """A KServe ``InferenceService`` serving the repository with Triton (GPU, gRPC on 8001)."""
    return f"""apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: vcam-{name.replace("_", "-").replace(".", "-")}
spec:
  predictor:
    triton:
      storageUri: {storage_uri}
      runtimeVersion: {TRITON_IMAGE.rsplit(":", 1)[1]}
      args: ["--strict-model-config=true", "--allow-metrics=true"]
      ports:
        - name: h2c
          containerPort: 8001
          protocol: TCP
      resources:
        limits:
          nvidia.com/gpu: "1"
"""


def docker_line(repository: str | os.PathLike[str]) -> str:
    """The ``docker run`` line serving ``repository`` with NVIDIA's Triton container."""
    repo = Path(repository).resolve()
    return (
        f"docker run --rm --gpus all -p 8000:8000 -p 8001:8001 -p 8002:8002 -v {repo}:/models "
        f"{TRITON_IMAGE} tritonserver --model-repository=/models"
    )


def export_repository(
    out: str | os.PathLike[str],
    name: str,
    source: str | os.PathLike[str],
    *,
    fp16: bool = False,
    uint8_input: bool = False,
    max_batch: int = 8,
    queue_delay_us: int = 100,
    instances: int = 1,
    gpu: bool = True,
    served_as: str | None = None,
) -> Exported:
    """Write the Triton repository for registry model ``name`` from its ONNX file ``source``
    (served under ``served_as``, default ``name``)."""
    import onnx

    config_messages()  # before anything is written
    spec = registry.get(name)
    if uint8_input and not _image_inputs(spec):
        raise ModelError(f"{name} has no image input to take as uint8", hint="leave out --uint8-input")
    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise ModelError(f"cannot read {source}: {exc}", hint="run `vcam models verify`") from None
    model = prepare_onnx(model, spec, fp16=fp16, uint8_input=uint8_input)
    repo = Path(out)
    name_out = served_as or name
    mdir = repo / name_out
    try:
        (mdir / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(mdir / "1" / "model.onnx"))
        cfg = model_config(
            name_out, model, max_batch=max_batch, queue_delay_us=queue_delay_us, instances=instances, gpu=gpu, fp16=fp16
        )
        (mdir / "config.pbtxt").write_text(config_text(cfg))
        (repo / "inferenceservice.yaml").write_text(manifest(name_out))
    except OSError as exc:
        raise ModelError(f"cannot write {repo}: {exc.strerror or exc}", hint="choose a writable directory") from None
    return Exported(repo, mdir / "1" / "model.onnx", mdir / "config.pbtxt", repo / "inferenceservice.yaml", name_out)


#: The Python backend's model file (``vcam serve --server python-backend``).
PYTHON_MODEL = Path(__file__).resolve().parents[1] / "assets" / "triton_model.py"


def python_backend_repository(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    threads: int = 0,
    instances: int = 1,
    runner: str = "",
    sources: dict[str, str] | None = None,
    runner_path: str = "",
) -> Path:
    """A repository for Triton's own Python backend made from ``source`` (one written by
    :func:`export_repository`, ONNX models): per model, the same tensors, max batch and dynamic
    batcher with ``backend: "python"``, ``NAME/1/model.py`` (:data:`PYTHON_MODEL`) and a link to the
    ONNX file; ``count`` instances on the CPU kind (the model itself takes the GPU where its runtime
    has one; Triton's GPU kind needs a GPU Triton sees). ``runner`` and ``sources[name]``: run the
    model in that callable instead, imported from the folders of ``runner_path`` (``os.pathsep``
    between them; see the model file). ``out`` is made again."""
    import shutil

    from google.protobuf import text_format

    mc = config_messages()
    src, dest = Path(source), Path(out)
    models = sorted(p for p in src.iterdir() if (p / "config.pbtxt").is_file()) if src.is_dir() else []
    if not models:
        raise ModelError(f"no model in {src} (NAME/config.pbtxt)", hint="write one with `vcam serve export DIR --model NAME`")
    shutil.rmtree(dest, ignore_errors=True)
    for mdir in models:
        try:
            cfg = text_format.Parse((mdir / "config.pbtxt").read_text(), mc.ModelConfig())
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            raise ModelError(f"{mdir / 'config.pbtxt'} is not a Triton model config: {exc}", hint="export it again") from None
        name = cfg.name or mdir.name
        cfg.ClearField("platform")
        cfg.ClearField("optimization")  # TensorRT as an onnxruntime accelerator: the ONNX backend's, not ours
        cfg.backend = "python"
        del cfg.instance_group[:]
        cfg.instance_group.add(count=int(instances), kind=mc.ModelInstanceGroup.KIND_CPU)
        cfg.parameters["threads"].string_value = str(int(threads))
        if runner and (sources or {}).get(name):
            cfg.parameters["runner"].string_value = runner
            cfg.parameters["source"].string_value = str((sources or {})[name])
            cfg.parameters["runner_path"].string_value = runner_path
        version = dest / name / "1"
        version.mkdir(parents=True)
        onnx_file = mdir / "1" / "model.onnx"
        if onnx_file.is_file():
            (version / "model.onnx").symlink_to(onnx_file.resolve())
        shutil.copyfile(PYTHON_MODEL, version / "model.py")
        (dest / name / "config.pbtxt").write_text(config_text(cfg))
    return dest


__all__ = [
    "Exported",
    "PYTHON_MODEL",
    "python_backend_repository",
    "TRITON_IMAGE",
    "config_text",
    "docker_line",
    "export_repository",
    "manifest",
    "model_config",
    "prepare_onnx",
]
