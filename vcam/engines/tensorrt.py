"""TensorRT backend (TensorRT 10 Python API): an engine built from the ONNX file, cached on disk.

The first use of a model builds a plan with one optimisation profile covering batch 1..``max_batch``
(other dynamic dims, e.g. a detector's H and W, span ``dynamic`` = (min, opt, max)), in FP16 when
asked, and stores it under :func:`vcam.engines.cache.engine_path` with a key of the model's SHA-256,
the GPU, the TensorRT version, the precision and the profile. Later uses with the same key load the
plan; a changed key builds a new one. Building shows a rich progress bar fed by TensorRT's
``IProgressMonitor`` (a spinner on versions without it).

TensorRT's Python wheels cannot be installed on the project's machines (they fetch NVIDIA binaries
at install time), so this backend is exercised only where ``import tensorrt`` works; everywhere
else constructing it raises :class:`~vcam.errors.EngineUnavailable` ("tensorrt not installed").

Buffers are CuPy arrays or torch CUDA tensors (whichever the caller uses; :meth:`run` on host
arrays uses torch if installed, else CuPy). ``run_device`` enqueues on the caller's stream with
``execute_async_v3`` and returns views of engine-owned output buffers, valid until the next call.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from vcam.engines import cache
from vcam.engines.onnx_graph import ModelSource, OnnxGraph, load_onnx, source_name
from vcam.errors import EngineUnavailable, ModelError

log = logging.getLogger(__name__)

INSTALL_HINT = "install TensorRT 10 for your CUDA (pip install tensorrt-cu12), or use --backend torch / onnxruntime"


# --------------------------------------------------------------------------------------------------
# build progress (plain Python, testable without TensorRT)


class BuildProgress:
    """Rich progress bars for TensorRT's build phases; ``step_complete`` returns True (go on).

    TensorRT calls these from its own threads, hence the lock. Nested phases get indented rows.
    """

    def __init__(self, title: str, *, console: Any = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

        self.title = title
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._depth: dict[str, int] = {}
        self._totals: dict[str, int] = {}
        self._lock = threading.Lock()
        self.cancelled = False

    def __enter__(self) -> BuildProgress:
        self.progress.start()
        self.progress.console.print(f"[bold]{self.title}[/bold] (first use of this model on this GPU; cached afterwards)")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self._lock:
            depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self._depth[phase_name] = depth
            total = max(int(num_steps), 1)
            self._tasks[phase_name] = self.progress.add_task("  " * depth + phase_name, total=total)
            self._totals[phase_name] = total

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self._lock:
            task = self._tasks.get(phase_name)
            if task is not None:
                self.progress.update(task, completed=int(step) + 1)
        return not self.cancelled

    def phase_finish(self, phase_name: str) -> None:
        """Top-level phases stay on screen, complete; nested ones disappear."""
        with self._lock:
            task = self._tasks.pop(phase_name, None)
            depth = self._depth.pop(phase_name, 0)
            total = self._totals.pop(phase_name, 1)
            if task is None:
                return
            if depth:
                self.progress.remove_task(task)
            else:
                self.progress.update(task, completed=total)


def _monitor(trt: Any, ui: BuildProgress) -> Any:
    """A ``trt.IProgressMonitor`` forwarding to ``ui`` (None where TensorRT lacks the interface)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class _Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()

        def phase_start(self, phase_name, parent_phase, num_steps):
            ui.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name, step):
            return ui.step_complete(phase_name, step)

        def phase_finish(self, phase_name):
            ui.phase_finish(phase_name)

    return _Monitor()


# --------------------------------------------------------------------------------------------------
# device arrays: CuPy or torch


class _Arrays:
    """The few device-array operations the engine needs, for one library ("torch" or "cupy")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "torch":
            import torch

            self.torch = torch
        else:
            import cupy

            self.cupy = cupy

    @staticmethod
    def pick() -> _Arrays:
        try:
            import torch

            if torch.cuda.is_available():
                return _Arrays("torch")
        except ImportError:
            pass
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return _Arrays("cupy")
        except Exception:
            pass
        raise EngineUnavailable("no CUDA device (neither torch nor CuPy sees one)", hint="use --device cpu")

    def gpu_name(self) -> str:
        if self.kind == "torch":
            name = self.torch.cuda.get_device_name()
            major, minor = self.torch.cuda.get_device_capability()
        else:
            props = self.cupy.cuda.runtime.getDeviceProperties(self.cupy.cuda.Device().id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            major, minor = props["major"], props["minor"]
        return f"{name} (sm_{major}{minor})"

    def empty(self, shape: tuple, dtype: np.dtype) -> Any:
        if self.kind == "torch":
            from vcam.engines.arrays import torch_dtype

            return self.torch.empty(shape, dtype=torch_dtype(dtype), device="cuda")
        return self.cupy.empty(shape, dtype=dtype)

    def ptr(self, arr: Any) -> int:
        return int(arr.data_ptr()) if self.kind == "torch" else int(arr.data.ptr)

    def contiguous_as(self, arr: Any, dtype: np.dtype) -> Any:
        if self.kind == "torch":
            from vcam.engines.arrays import torch_dtype

            return arr.to(dtype=torch_dtype(dtype)).contiguous()
        return self.cupy.ascontiguousarray(arr, dtype=dtype)

    def is_ready(self, arr: Any, dtype: np.dtype) -> bool:
        if self.kind == "torch":
            from vcam.engines.arrays import torch_dtype

            return arr.is_contiguous() and arr.dtype == torch_dtype(dtype)
        return bool(arr.flags.c_contiguous) and arr.dtype == dtype

    def current_stream(self) -> int:
        if self.kind == "torch":
            return int(self.torch.cuda.current_stream().cuda_stream)
        return int(self.cupy.cuda.get_current_stream().ptr)

    def from_host(self, arr: np.ndarray) -> Any:
        if self.kind == "torch":
            return self.torch.from_numpy(arr).to("cuda", non_blocking=False)
        return self.cupy.asarray(arr)

    def to_host(self, arr: Any) -> np.ndarray:
        if self.kind == "torch":
            return arr.cpu().numpy().copy()
        return self.cupy.asnumpy(arr)

    def synchronize(self) -> None:
        if self.kind == "torch":
            self.torch.cuda.current_stream().synchronize()
        else:
            self.cupy.cuda.get_current_stream().synchronize()


def _has_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def _from_dlpack_cupy(t: Any) -> Any:
    import cupy

    return cupy.from_dlpack(t)


def _kind_of(arr: Any) -> str:
    mod = type(arr).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    raise TypeError(f"run_device takes CuPy arrays or torch CUDA tensors, got {type(arr).__name__} (use run() for NumPy)")


def _stream_handle(stream: Any, arrays: _Arrays) -> int:
    if stream is None:
        return arrays.current_stream()
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


# --------------------------------------------------------------------------------------------------
# the engine


class TensorRTEngine:
    """One TensorRT engine for one ONNX model. Constructor as every backend, plus:

    ``dynamic``: (min, opt, max) for dynamic dims other than the batch (detector H and W).
    ``workspace``: builder workspace limit in bytes. ``progress``: show the build progress.
    """

    backend = "tensorrt"

    def __init__(
        self,
        model: ModelSource,
        *,
        name: str | None = None,
        device: str = "cuda",
        fp16: bool = False,
        max_batch: int = 8,
        cache_dir: str | os.PathLike | None = None,
        epilogue: Any = None,
        dynamic: tuple[int, int, int] = (32, 640, 2048),
        workspace: int = 4 << 30,
        progress: bool = True,
    ) -> None:
        reason = self.unavailable_reason(device)
        if reason:
            raise EngineUnavailable(reason, hint=INSTALL_HINT if "tensorrt" in reason else "use --device cpu or another backend")
        import tensorrt as trt

        self.trt = trt
        self.name = source_name(model, name)
        self.device = "cuda"
        self.model_bytes: bytes | None = None
        self.model_path: Path | None = None
        if isinstance(model, (bytes, bytearray)):
            self.model_bytes = bytes(model)
        else:
            self.model_path = Path(model)
        self.fp16 = bool(fp16)
        self.precision = "fp16" if self.fp16 else "fp32"
        self.max_batch = int(max_batch)
        self.epilogue = epilogue
        self.skipped: list[str] = []
        self._arrays = _Arrays.pick()

        from vcam.engines import TensorInfo

        graph = OnnxGraph(load_onnx(model, name, external_data=False), name=self.name)
        self.profile = cache.profile_for({n: s for n, s, _ in graph.inputs}, self.max_batch, dynamic=dynamic)
        if self.model_bytes is not None:
            digest = hashlib.sha256(self.model_bytes).hexdigest()
        else:
            assert self.model_path is not None
            digest = cache.sha256_file(self.model_path)
        self.key = cache.EngineKey.make(
            model_sha256=digest,
            gpu=self._arrays.gpu_name(),
            library=f"tensorrt {trt.__version__}",
            precision=self.precision,
            profile=self.profile,
        )
        self.engine_file = cache.engine_path(cache_dir, Path(self.name), self.key)

        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        plan = cache.lookup(self.engine_file, self.key)
        engine = self._runtime.deserialize_cuda_engine(plan) if plan else None
        self.built = engine is None
        if engine is None:
            plan = self._build(workspace=workspace, progress=progress)
            cache.store(self.engine_file, self.key, plan)
            engine = self._runtime.deserialize_cuda_engine(plan)
            if engine is None:
                raise EngineUnavailable(
                    f"TensorRT cannot load the engine it just built for {self.name}", hint="see the TensorRT log above"
                )
        self._engine = engine
        self._context = engine.create_execution_context()
        if self._context is None:
            raise EngineUnavailable(
                "TensorRT could not create an execution context (out of GPU memory?)", hint="free GPU memory or lower max_batch"
            )

        self._io: dict[str, tuple[bool, np.dtype]] = {}
        ins: list[TensorInfo] = []
        outs: list[TensorInfo] = []
        for i in range(engine.num_io_tensors):
            tname = engine.get_tensor_name(i)
            is_input = engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(tname)))
            shape = tuple(int(d) if int(d) >= 0 else None for d in engine.get_tensor_shape(tname))
            self._io[tname] = (is_input, dtype)
            (ins if is_input else outs).append(TensorInfo(tname, shape, dtype))
        order_in = [n for n, _, _ in graph.inputs]
        order_out = [n for n, _, _ in graph.outputs]
        self.inputs = sorted(ins, key=lambda t: order_in.index(t.name) if t.name in order_in else len(order_in))
        self._raw_outputs = sorted(outs, key=lambda t: order_out.index(t.name) if t.name in order_out else len(order_out))
        self.outputs = list(epilogue.outputs) if epilogue is not None else self._raw_outputs
        self._out_bufs: dict[tuple, Any] = {}
        self._storage: dict[tuple, Any] = {}
        self._keep: list = []

    def describe(self) -> str:
        return f"tensorrt {self.precision} on cuda ({'built now' if self.built else 'cached plan'})"

    def input_buffers(self, n: int, shapes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Device arrays ``[:n]`` (CuPy when installed, else torch), reused across calls."""
        from vcam.engines import item_shapes

        items = item_shapes(self.inputs, shapes)
        arrays = _Arrays("cupy") if _has_cupy() else self._arrays
        out = {}
        for info in self.inputs:
            key = (arrays.kind, info.name, items[info.name])
            buf = self._storage.get(key)
            if buf is None:
                buf = self._storage[key] = arrays.empty((self.max_batch, *items[info.name]), info.dtype)
            out[info.name] = buf[:n]
        return out

    # -- availability -----------------------------------------------------------------------------

    @staticmethod
    def unavailable_reason(device: str = "cuda") -> str | None:
        """Why TensorRT cannot run on ``device`` here, or None if it can."""
        if device != "cuda":
            return f"TensorRT runs on CUDA only (device is {device})"
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            return "tensorrt not installed"
        try:
            _Arrays.pick()
        except EngineUnavailable as exc:
            return exc.message
        return None

    # -- build ------------------------------------------------------------------------------------

    def _build(self, *, workspace: int, progress: bool) -> bytes:
        trt = self.trt
        builder = trt.Builder(self._logger)
        major = int(str(trt.__version__).split(".")[0])
        # TensorRT 10 networks are always explicit-batch (the flag is deprecated and ignored).
        flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        parsed = parser.parse(self.model_bytes) if self.model_bytes is not None else parser.parse_from_file(str(self.model_path))
        if not parsed:
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise EngineUnavailable(
                f"unsupported graph: TensorRT cannot parse {self.name}: {errors[0] if errors else 'unknown error'}",
                hint="use --backend torch or onnxruntime",
            )
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace))
        if self.fp16:
            if not getattr(builder, "platform_has_fast_fp16", True):
                log.warning("this GPU has no fast FP16; building %s in FP16 anyway", self.name)
            config.set_flag(trt.BuilderFlag.FP16)
        opt = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            lo, mid, hi = self.profile[tensor.name]
            opt.set_shape(tensor.name, lo, mid, hi)
        config.add_optimization_profile(opt)
        title = f"Building TensorRT engine for {self.name} ({self.key.precision}, batch 1..{self.max_batch})"
        if progress:
            with BuildProgress(title) as ui:
                monitor = _monitor(trt, ui)
                if monitor is not None:
                    config.progress_monitor = monitor
                    plan = builder.build_serialized_network(network, config)
                else:  # older TensorRT: no phase callbacks, a spinner instead
                    with ui.progress.console.status(title):
                        plan = builder.build_serialized_network(network, config)
        else:
            plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise EngineUnavailable(
                f"unsupported graph: TensorRT failed to build {self.name}", hint="see the TensorRT log above; use --backend torch"
            )
        return bytes(plan)

    # -- run --------------------------------------------------------------------------------------

    def _check(self, feeds: dict[str, Any]) -> None:
        for info in self.inputs:
            if info.name not in feeds:
                raise ModelError(
                    f"{self.name}: missing input '{info.name}'",
                    hint=f"the model takes {', '.join(i.name for i in self.inputs)}",
                )

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list:
        """Device arrays (CuPy or torch) in, the same kind out; enqueued on ``stream`` (None: the
        library's current stream). Outputs are engine buffers valid until the next call."""
        self._check(feeds)
        first = feeds[self.inputs[0].name]
        arrays = self._arrays if self._arrays.kind == _kind_of(first) else _Arrays(_kind_of(first))
        handle = _stream_handle(stream, arrays)
        ctx = self._context
        keep = []
        for info in self.inputs:
            arr = feeds[info.name]
            n = int(arr.shape[0])
            if n > self.max_batch:
                raise ValueError(f"batch of {n} is larger than max_batch={self.max_batch}")
            if not arrays.is_ready(arr, info.dtype):
                arr = arrays.contiguous_as(arr, info.dtype)
            keep.append(arr)
            if not ctx.set_input_shape(info.name, tuple(int(d) for d in arr.shape)):
                lo, _, hi = self.profile[info.name]
                raise ValueError(f"input '{info.name}' shape {tuple(arr.shape)} is outside the engine profile {lo}..{hi}")
            ctx.set_tensor_address(info.name, arrays.ptr(arr))
        outs = []
        for info in self._raw_outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(info.name))
            key = (arrays.kind, info.name, shape)
            buf = self._out_bufs.get(key)
            if buf is None:
                buf = self._out_bufs[key] = arrays.empty(shape, info.dtype)
            ctx.set_tensor_address(info.name, arrays.ptr(buf))
            outs.append(buf)
        if not ctx.execute_async_v3(handle):
            raise ModelError(f"TensorRT execution of {self.name} failed", hint="see the TensorRT log above")
        self._keep = keep  # converted inputs stay alive until the next call
        if self.epilogue is not None:  # after the plan, on the same stream (torch ops through DLPack)
            import torch

            with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
                res = self.epilogue.torch([o if arrays.kind == "torch" else torch.from_dlpack(o) for o in outs])
            outs = res if arrays.kind == "torch" else [_from_dlpack_cupy(r) for r in res]
        return outs

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        """Host arrays in, host arrays out (synchronous)."""
        self._check(feeds)
        arrays = self._arrays
        n = int(np.asarray(feeds[self.inputs[0].name]).shape[0])
        parts: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for start in range(0, max(n, 1), self.max_batch):
            dev = {
                i.name: arrays.from_host(
                    np.ascontiguousarray(np.asarray(feeds[i.name])[start : start + self.max_batch], dtype=i.dtype)
                )
                for i in self.inputs
            }
            outs = self.run_device(dev)
            arrays.synchronize()
            for acc, o in zip(parts, outs):
                acc.append(arrays.to_host(o))
        return [np.concatenate(p, axis=0) if len(p) > 1 else p[0] for p in parts]

    def close(self) -> None:
        self._out_bufs.clear()
        self._keep = []

    def __repr__(self) -> str:
        return f"TensorRTEngine({self.name!r}, {self.key.precision}, plan={self.engine_file.name!r})"


__all__ = ["TensorRTEngine", "BuildProgress"]
