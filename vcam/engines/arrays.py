"""Device arrays the engines take and give: NumPy, CuPy and torch, converted without copies
(DLPack between CuPy and torch). Imports without PyTorch; the conversions need it."""

from __future__ import annotations

from typing import Any

import numpy as np

try:  # optional: the package imports everywhere
    import torch as _torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    _torch = None  # type: ignore[assignment]


def torch_dtype(dtype: np.dtype) -> Any:
    """The torch dtype of a NumPy dtype."""
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


def array_kind(arr: Any) -> str:
    """``"torch"``, ``"cupy"`` or ``"numpy"``: which library ``arr`` belongs to."""
    if _torch is not None and isinstance(arr, _torch.Tensor):
        return "torch"
    if type(arr).__module__.split(".")[0] == "cupy":
        return "cupy"
    if isinstance(arr, np.ndarray):
        return "numpy"
    raise TypeError(f"run_device takes CuPy, NumPy or torch arrays, got {type(arr).__name__}")


def to_torch(arr: Any, kind: str) -> Any:
    """``arr`` (of ``kind``) as a torch tensor sharing its memory (DLPack for CuPy)."""
    if kind == "torch":
        return arr
    if kind == "numpy":
        return _torch.from_numpy(np.ascontiguousarray(arr))
    return _torch.from_dlpack(arr)


def from_torch(t: Any, kind: str) -> Any:
    """A torch tensor as an array of ``kind`` sharing its memory."""
    if kind == "torch":
        return t
    if kind == "numpy":
        return t.numpy()
    import cupy

    return cupy.from_dlpack(t)


__all__ = ["array_kind", "from_torch", "to_torch", "torch_dtype"]
