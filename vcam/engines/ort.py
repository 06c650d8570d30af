"""onnxruntime backend: the CPU engine (and the test oracle for the GPU engines).

On ``device="cuda"`` it uses onnxruntime's CUDA provider when the installed onnxruntime has one,
and raises :class:`~vcam.errors.EngineUnavailable` otherwise. ``fp16`` is ignored (the model's own
input dtypes decide); feeds are cast to each input's dtype, so FP16 models take float32 arrays.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineUnavailable, ModelError
from . import TensorInfo

log = logging.getLogger(__name__)


def _dims(shape: list) -> tuple:
    return tuple(d if isinstance(d, int) and d > 0 else (d if isinstance(d, str) else None) for d in shape)


class OrtEngine:
    """One onnxruntime ``InferenceSession``. ``run`` is thread-safe (onnxruntime sessions are)."""

    backend = "onnxruntime"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str = "cpu",
        fp16: bool = False,
        max_batch: int = 8,
        cache_dir: str | os.PathLike | None = None,
        threads: int = 0,
    ) -> None:
        import onnxruntime as ort  # ImportError -> "not installed" in create_engine

        self.model_path = Path(model_path)
        self.device = device
        self.max_batch = int(max_batch)
        available = ort.get_available_providers()
        if device == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise EngineUnavailable(
                    "onnxruntime has no CUDA provider here",
                    hint="install onnxruntime-gpu, or use --device cpu",
                )
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        elif device == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            raise EngineUnavailable(f"onnxruntime cannot run on device '{device}'", hint="use --device cpu or cuda")
        if fp16 and device == "cpu":
            log.info("fp16 requested on the CPU: running %s in its own precision", self.model_path.name)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = int(threads)
        try:
            self.session = ort.InferenceSession(str(self.model_path), sess_options=opts, providers=providers)
        except Exception as exc:
            if not self.model_path.is_file():
                raise ModelError(f"model file not found: {self.model_path}", hint="run `vcam models pull NAME`") from None
            raise ModelError(f"onnxruntime cannot load {self.model_path.name}: {exc}", hint="the file may be corrupt; run `vcam models verify`") from None
        self.inputs = [TensorInfo(i.name, _dims(i.shape), i.type) for i in self.session.get_inputs()]
        self.outputs = [TensorInfo(o.name, _dims(o.shape), o.type) for o in self.session.get_outputs()]
        self._names = [o.name for o in self.outputs]

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        cast = {}
        for info in self.inputs:
            if info.name not in feeds:
                raise ModelError(
                    f"{self.model_path.name}: missing input '{info.name}'",
                    hint=f"the model takes {', '.join(i.name for i in self.inputs)}",
                )
            arr = np.asarray(feeds[info.name])
            cast[info.name] = np.ascontiguousarray(arr, dtype=info.dtype) if arr.dtype != info.dtype else np.ascontiguousarray(arr)
        return self.session.run(self._names, cast)

    def __repr__(self) -> str:
        return f"OrtEngine({self.model_path.name!r}, device={self.device!r})"
