"""Inference engines: one small interface, several backends picked by name.

Every backend class takes the same constructor ``(model_path, *, device, fp16, max_batch, cache_dir)``
and exposes ``inputs``, ``outputs`` (lists of :class:`TensorInfo`) and ``run(feeds) -> list[array]``.
Backends are registered as lazy ``"module:Class"`` strings in :data:`BACKENDS`, so importing this
package never imports TensorRT, PyTorch or onnxruntime.

``backend="auto"`` tries TensorRT, then PyTorch (CUDA only), then onnxruntime, and keeps the reason
each one was skipped; :func:`explain_backends` returns those reasons and :func:`create_engine`
raises :class:`~vcam.errors.EngineUnavailable` with all of them when none works.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import EngineUnavailable

BACKENDS: dict[str, str] = {
    "tensorrt": "vcam.engines.tensorrt:TensorRTEngine",
    "torch": "vcam.engines.torch:TorchEngine",
    "onnxruntime": "vcam.engines.ort:OrtEngine",
}

#: Order tried by ``backend="auto"``.
AUTO_ORDER = ("tensorrt", "torch", "onnxruntime")
#: Backends that only run on a CUDA device.
CUDA_ONLY = frozenset({"tensorrt", "torch"})


def _as_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        # torch.float16 -> "float16"; onnxruntime "tensor(float)" -> "float32"
        text = str(dtype).replace("torch.", "")
        if text.startswith("tensor(") and text.endswith(")"):
            text = {"float": "float32", "double": "float64"}.get(text[7:-1], text[7:-1])
        return np.dtype(text)


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output. ``shape``: ints for fixed dims, a str (or None) for dynamic ones;
    ``dtype``: a NumPy dtype (strings and framework dtypes are converted)."""

    name: str
    shape: tuple
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))

    @property
    def fixed_batch(self) -> int | None:
        """The first dim if it is a fixed int, else None (dynamic batch)."""
        return self.shape[0] if self.shape and isinstance(self.shape[0], int) else None


@runtime_checkable
class Engine(Protocol):
    """A loaded model. ``run`` takes host arrays keyed by input name (cast to the input dtype by the
    engine) and returns the outputs in ``outputs`` order."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]

    def run(self, feeds: dict[str, Any]) -> list[Any]: ...


def _load_class(name: str) -> type:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise EngineUnavailable(
            f"unknown inference backend '{name}'", hint=f"choose one of: auto, {', '.join(BACKENDS)}"
        ) from None
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr)


def _missing_module(exc: ImportError) -> str | None:
    """Name of the third-party module behind an ImportError, or None if it is our own code."""
    missing = getattr(exc, "name", None)
    if missing and not missing.startswith("vcam"):
        return missing
    return None


def _try(name: str, model_path: Path | None, *, device: str, fp16: bool, max_batch: int, cache_dir: Any):
    """Try one backend. Returns (engine or None, ok, reason)."""
    if name in CUDA_ONLY and device != "cuda":
        return None, False, f"needs a CUDA device (device is {device})"
    try:
        cls = _load_class(name)
    except EngineUnavailable:
        raise
    except ImportError as exc:
        missing = _missing_module(exc)
        if missing:
            return None, False, f"not installed (no module named '{missing}')"
        return None, False, f"broken: {exc}"
    except Exception as exc:  # a backend module that fails at import time is broken, not absent
        return None, False, f"broken: {type(exc).__name__}: {exc}"
    if model_path is None:
        # Backend modules import without their library; ask the class what it lacks here.
        probe = getattr(cls, "unavailable_reason", None)
        reason = probe(device) if probe is not None else None
        return (None, False, reason) if reason else (None, True, "available")
    try:
        engine = cls(model_path, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir)
    except EngineUnavailable as exc:
        return None, False, exc.message
    except ImportError as exc:
        missing = _missing_module(exc)
        return None, False, f"not installed (no module named '{missing}')" if missing else f"broken: {exc}"
    except Exception as exc:
        return None, False, f"broken: {type(exc).__name__}: {exc}"
    return engine, True, "selected"


def _order(backend: str) -> tuple[str, ...]:
    if backend == "auto":
        return AUTO_ORDER
    if backend not in BACKENDS:
        raise EngineUnavailable(f"unknown inference backend '{backend}'", hint=f"choose one of: auto, {', '.join(BACKENDS)}")
    return (backend,)


def explain_backends(
    model_path: str | os.PathLike | None = None,
    *,
    backend: str = "auto",
    device: str = "cpu",
    fp16: bool = False,
    max_batch: int = 8,
    cache_dir: str | os.PathLike | None = None,
) -> list[tuple[str, bool, str]]:
    """Why each backend would be picked or skipped: ``[(name, ok, reason)]`` in the order tried.

    Without ``model_path`` only importability and the device are checked; with it each backend
    actually loads the model (slow for TensorRT). ``auto`` stops at the first that works.
    """
    path = Path(model_path) if model_path is not None else None
    out: list[tuple[str, bool, str]] = []
    for name in _order(backend):
        _, ok, reason = _try(name, path, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir)
        out.append((name, ok, reason))
        if ok and path is not None:
            break
    return out


def create_engine(
    model_path: str | os.PathLike,
    *,
    backend: str = "auto",
    device: str = "cpu",
    fp16: bool = False,
    max_batch: int = 8,
    cache_dir: str | os.PathLike | None = None,
) -> Engine:
    """Load ``model_path`` with ``backend`` (or the first that works for ``auto``).

    Raises :class:`EngineUnavailable` listing every backend tried and why it was skipped.
    """
    path = Path(model_path)
    reasons: list[str] = []
    for name in _order(backend):
        engine, ok, reason = _try(name, path, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir)
        if ok and engine is not None:
            return engine
        reasons.append(f"{name}: {reason}")
    hint = (
        "install onnxruntime (CPU) or use --backend onnxruntime --device cpu"
        if backend == "auto"
        else "pick another backend with --backend, or auto"
    )
    raise EngineUnavailable(f"no inference backend can run {path.name} on {device}: " + "; ".join(reasons), hint=hint)


__all__ = ["BACKENDS", "AUTO_ORDER", "Engine", "TensorInfo", "create_engine", "explain_backends"]
