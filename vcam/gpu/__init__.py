"""GPU hot path: CuPy kernels (``kernels/*.cu``) with the NumPy twins' signatures, and the pipeline.

Importing this package never imports CuPy or PyTorch; :func:`available` says whether they can run.
"""

from __future__ import annotations


def available() -> tuple[bool, str]:
    """(True, "") when CuPy and PyTorch import and see a CUDA device, else (False, why)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"cupy does not import ({exc.__class__.__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no usable CUDA device ({exc})"
    if n < 1:
        return False, "no CUDA device"
    try:  # the detector and neural swappers run on PyTorch CUDA
        import torch
    except Exception as exc:
        return False, f"torch does not import ({exc.__class__.__name__}: {exc})"
    if not torch.cuda.is_available():
        return False, "torch was built without CUDA"
    return True, ""
