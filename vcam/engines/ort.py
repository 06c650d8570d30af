"""onnxruntime backend: the CPU engine (and the test oracle for the GPU engines).

On ``device="cuda"`` it asks for onnxruntime's CUDA provider and checks what the session really got
(``get_providers()``): a session that fell back to the CPU says so once in the log and reports
``device == "cpu"``, so nobody mistakes it for a GPU engine. ``run_device`` on CUDA goes through host
memory (onnxruntime's own device binding is not used): correct, and slower than the torch backend.

``fp16`` is ignored (the model's own input dtypes decide); feeds are cast to each input's dtype. A
model with a fixed batch (files exported for one image) runs item by item.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vcam.engines import ACCELERATORS, Accelerator, Epilogue, TensorInfo, check_feeds, reused_inputs
from vcam.engines.onnx_graph import ModelSource, source_name
from vcam.errors import EngineUnavailable, ModelError
from vcam.platform.cpu import usable_cores

log = logging.getLogger(__name__)


#: Bump when what an optimised-graph file holds changes.
OPTIMIZED_FORMAT = 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@functools.lru_cache(maxsize=1)
def _host_key() -> str:
    """The onnxruntime version and this CPU's instruction sets: an optimised graph may hold kernels
    and layouts for them (ORT_ENABLE_ALL), so it is kept per host kind."""
    import platform

    import onnxruntime as ort

    from vcam.platform import cpu

    flags = cpu.features_line()
    return f"{ort.__version__}|{platform.machine()}|{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def optimized_path(model_path: Path, cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """``<engine cache>/ort/<stem>.<digest>.onnx``: the optimised graph of ``model_path`` for this
    host (:func:`_host_key`), keyed by the file's identity (:func:`vcam.engines.cache.model_identity`);
    None when the file cannot be read (the session's own error says so)."""
    from vcam.engines.cache import model_identity, resolve_cache_dir

    try:
        ident = model_identity(model_path)
    except OSError:
        return None
    blob = json.dumps({"format": OPTIMIZED_FORMAT, "host": _host_key(), "model": ident}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return resolve_cache_dir(cache_dir) / "ort" / f"{model_path.stem}.{digest}.onnx"


def _drop_older(path: Path) -> None:
    """Remove the cached graphs of the same model stem under other keys (an older file or onnxruntime)."""
    stem = path.name.rsplit(".", 2)[0]
    for old in path.parent.glob("*.onnx"):
        if old != path and old.name.rsplit(".", 2)[0] == stem:
            old.unlink(missing_ok=True)


def _dims(shape: list) -> tuple:
    return tuple(d if isinstance(d, int) and d > 0 else (d if isinstance(d, str) else None) for d in shape)


class OrtEngine:
    """One onnxruntime ``InferenceSession`` (see :class:`vcam.engines.Engine`). ``provider``: the
    execution provider the session really runs on first (``get_providers()[0]``)."""

    backend = "onnxruntime"
    #: The provider asked for before the CPU's on device "cpu" (:class:`DirectMLEngine`, :class:`CoreMLEngine`).
    accelerator: Accelerator | None = None

    @classmethod
    def unavailable_reason(cls, device: str = "cpu") -> str | None:
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime not installed"
        acc = cls.accelerator
        if acc is not None:
            if device != "cpu":
                return f"{acc.label} takes the models of a CPU pipeline (device cpu), not {device}"
            if acc.provider not in ort.get_available_providers():
                return f"onnxruntime has no {acc.label} provider here ({acc.provider})"
            return None
        if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDA provider here (the CPU build is installed)"
        if device not in ("cpu", "cuda"):
            return f"unknown device '{device}' (use cuda or cpu)"
        return None

    def __init__(
        self,
        model: ModelSource,
        *,
        name: str | None = None,
        device: str = "cpu",
        fp16: bool = False,
        max_batch: int = 8,
        cache_dir: str | os.PathLike[str] | None = None,
        epilogue: Epilogue | None = None,
        threads: int = 0,
        short_lived: bool = False,
        lean_below: int = 0,
    ) -> None:
        import onnxruntime as ort

        reason = self.unavailable_reason(device)
        if reason:
            acc = self.accelerator
            raise EngineUnavailable(
                reason, hint=f"install {acc.install}" if acc else "install onnxruntime-gpu, or use --device cpu"
            )
        self.name = source_name(model, name)
        self.model_path = None if isinstance(model, (bytes, bytearray)) else Path(model)
        self.max_batch = int(max_batch)
        self.precision = "fp32"
        self.epilogue = epilogue
        self.skipped: list[str] = []
        first = "CUDAExecutionProvider" if device == "cuda" else (self.accelerator.provider if self.accelerator else "")
        providers = [first, "CPUExecutionProvider"] if first else ["CPUExecutionProvider"]
        if self.model_path is not None and not self.model_path.is_file():
            raise ModelError(f"model file not found: {self.model_path}", hint="run `vcam models pull NAME`")
        src = bytes(model) if isinstance(model, (bytes, bytearray)) else str(self.model_path)
        # On the CPU a model file's optimised graph is kept in the engine cache: building it is most of
        # a session's creation (7 s of 7.3 for the 550 MB inswapper on a busy 2-core host; 2.1 s to load).
        # A short-lived engine (seconds of an early swap) neither reads nor writes it: the basic
        # optimisations alone open the 550 MB inswapper in 0.9-1.3 s on that host against 1.2-3.6 s
        # for the cached graph and 8 s to write it on a fresh H200 host, and run it as fast.
        keep = device == "cpu" and not short_lived and self.accelerator is None  # a CPU graph (its layouts) only
        optimized = optimized_path(self.model_path, cache_dir) if keep and self.model_path is not None else None
        session = self._cached_session(ort, optimized, providers, threads) if optimized is not None else None
        if session is None:
            session = self._new_session(ort, src, providers, threads, optimized, basic=short_lived)
        self.session = session
        # Small calls on one thread (``lean_below``: input elements): waking a second thread costs
        # more than it saves on a tracked face's 160-pixel region (1.36 against 1.62 ms on 2 cores,
        # 1.31 against 1.57 beside the search worker), while larger inputs gain from it (a 640x384
        # scan 11.6 against 7.9 ms). Only where the thread count is onnxruntime's own choice.
        self.lean_below = int(lean_below) if device == "cpu" and not threads and usable_cores() > 1 else 0
        self._lean = None
        if self.lean_below and self.accelerator is None:
            self._lean = self._cached_session(ort, optimized, providers, 1) if optimized is not None else None
            if self._lean is None:
                self._lean = self._new_session(ort, src, providers, 1, None, basic=short_lived)
        got = self.session.get_providers()
        self.provider = got[0] if got else "CPUExecutionProvider"
        self.device = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"
        if first and self.provider != first:
            log.warning(
                "onnxruntime was asked to run %s on %s but runs it on the CPU (providers: %s)",
                self.name,
                "CUDA" if device == "cuda" else first,
                ", ".join(got),
            )
        self.inputs = [TensorInfo(i.name, _dims(i.shape), i.type) for i in self.session.get_inputs()]
        raw = [TensorInfo(o.name, _dims(o.shape), o.type) for o in self.session.get_outputs()]
        self._names = [o.name for o in raw]
        self.outputs = list(epilogue.outputs) if epilogue is not None else raw
        self.item_batch = self.inputs[0].fixed_batch if self.inputs else None
        self._storage: dict[tuple, np.ndarray] = {}

    def _options(self, ort: Any, threads: int, level: Any) -> Any:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        opts.log_severity_level = 3
        if self.accelerator is not None and self.accelerator.backend == "directml":
            opts.enable_mem_pattern = False  # the DirectML provider refuses memory patterns and parallel runs
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle worker threads sleep instead of spinning between calls: on a small CPU a spinning
        # worker held a whole core between frames (the daemon's frame rate swung 30-80 fps on 2 cores).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads:
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
        return opts

    def _cached_session(self, ort: Any, optimized: Path, providers: list[str], threads: int) -> Any:
        """A session of the optimised graph kept in the cache, or None (none, or damaged: removed with
        one warning, and built again by :meth:`_new_session`)."""
        if not optimized.is_file():
            return None
        opts = self._options(ort, threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        try:
            return ort.InferenceSession(str(optimized), sess_options=opts, providers=providers)
        except Exception as exc:
            log.warning(
                "%s: the cached optimised graph %s is damaged (%s); rebuilding it", self.name, optimized, _first_line(exc)
            )
            optimized.unlink(missing_ok=True)
            return None

    def _new_session(
        self, ort: Any, src: Any, providers: list[str], threads: int, optimized: Path | None, basic: bool = False
    ) -> Any:
        """A session optimising the graph now (``basic``: the basic optimisations only); with
        ``optimized`` the result is written there too (a cache that cannot be written costs the
        optimisation at the next start, nothing more)."""
        level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if basic else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        tmp = None
        if optimized is not None:
            try:
                optimized.parent.mkdir(parents=True, exist_ok=True)
                tmp = optimized.with_name(f".{optimized.name}.{os.getpid()}.tmp.onnx")
            except OSError:
                tmp = None
        for attempt in [tmp, None] if tmp is not None else [None]:
            opts = self._options(ort, threads, level)
            if attempt is not None:
                opts.optimized_model_filepath = str(attempt)
            try:
                session = ort.InferenceSession(src, sess_options=opts, providers=providers)
            except Exception as exc:
                if attempt is not None:
                    with contextlib.suppress(OSError):
                        attempt.unlink(missing_ok=True)
                    continue  # perhaps the write failed: once more without it
                raise ModelError(
                    f"onnxruntime cannot load {self.name}: {_first_line(exc)}",
                    hint="the file may be corrupt; run `vcam models verify`",
                ) from None
            if attempt is not None and optimized is not None:
                try:
                    os.replace(attempt, optimized)
                    _drop_older(optimized)
                except OSError:
                    with contextlib.suppress(OSError):
                        attempt.unlink(missing_ok=True)
            return session
        raise AssertionError("unreachable")  # pragma: no cover

    def describe(self) -> str:
        if self.accelerator is not None and self.provider == self.accelerator.provider:
            return f"onnxruntime {self.precision} on {self.accelerator.label} ({self.provider})"
        return f"onnxruntime {self.precision} on {self.device}"

    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """Host arrays ``[:n]`` (reused across calls) in each input's dtype."""
        out = reused_inputs(self.inputs, self._storage, n, self.max_batch, shapes)
        if self.device == "cuda":
            import cupy

            return {k: cupy.asarray(v) for k, v in out.items()}
        return out

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        arrs = check_feeds(self, feeds)
        cast = {}
        for info, a in zip(self.inputs, arrs):
            a = np.asarray(a)
            cast[info.name] = np.ascontiguousarray(a, dtype=info.dtype) if a.dtype != info.dtype else np.ascontiguousarray(a)
        first = next(iter(cast.values()))
        n = first.shape[0]
        session = self._lean if self._lean is not None and first.size < self.lean_below else self.session
        step = self.item_batch or n
        if step >= n:
            outs = session.run(self._names, cast)
        else:  # a file exported for a fixed batch: item by item
            parts = [session.run(self._names, {k: v[s : s + step] for k, v in cast.items()}) for s in range(0, n, step)]
            outs = [np.concatenate(p, axis=0) for p in zip(*parts)]
        return self.epilogue.numpy(outs) if self.epilogue is not None else outs

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        """NumPy in and out on the CPU. CuPy in and out on CUDA, through host memory (synchronous)."""
        first = next(iter(feeds.values()), None)
        if type(first).__module__.split(".")[0] != "cupy":
            return self.run(feeds)
        import cupy

        with stream if stream is not None else cupy.cuda.get_current_stream():
            host = {k: cupy.asnumpy(v) for k, v in feeds.items()}
            return [cupy.asarray(o) for o in self.run(host)]

    def close(self) -> None:
        self._storage.clear()

    def __repr__(self) -> str:
        return f"OrtEngine({self.name!r}, {self.describe()})"


class DirectMLEngine(OrtEngine):
    """onnxruntime on DirectML (Windows, ``onnxruntime-directml``), the CPU's provider behind it."""

    backend = "directml"
    accelerator = ACCELERATORS["directml"]


class CoreMLEngine(OrtEngine):
    """onnxruntime on CoreML (macOS), the CPU's provider behind it."""

    backend = "coreml"
    accelerator = ACCELERATORS["coreml"]


__all__ = ["CoreMLEngine", "DirectMLEngine", "OrtEngine"]
