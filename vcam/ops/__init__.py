"""Array operations of the pipeline, one implementation per device.

The stage order (:mod:`vcam.pipeline.pipeline`) is written once over an :class:`Ops` object; everything that
depends on where pixels live is here:

- :class:`~vcam.ops.numpy.NumpyOps`: host memory, every call done when it returns.
- :class:`~vcam.ops.cuda.CudaOps`: CuPy memory on a CUDA device, a compute stream and copy streams,
  pinned host rings and device buffers, counted transfers.

The kernels themselves (colour conversion, warp, masks, paste, colour transfer, tiles) are in
:mod:`vcam.kernels`: one front per kernel, ``kernels.<family>.<name>(ops, ...)``, that runs the CUDA
launch on the ops' current stream where ``ops.device == "cuda"`` and the NumPy reference otherwise.

Importing this package never imports CuPy; :func:`cuda_status` says whether the CUDA ops can run.
"""

from __future__ import annotations

from vcam.ops.base import Clock, FrameIO, HostClock, Ops, Transfers

__all__ = ["Clock", "FrameIO", "HostClock", "Ops", "Transfers", "cuda_status", "make_ops"]


def cuda_status() -> tuple[bool, str]:
    """(True, "") when CuPy imports and sees a CUDA device, else (False, why)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy does not import ({exc.__class__.__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no usable CUDA device ({exc})"
    if n < 1:
        return False, "no CUDA device"
    return True, ""


def make_ops(device: str) -> Ops:
    """The ops for ``"cpu"`` or ``"cuda"`` (DeviceError when CUDA cannot run here)."""
    if device == "cuda":
        from vcam.ops.cuda import CudaOps

        return CudaOps()
    from vcam.ops.numpy import NumpyOps

    return NumpyOps()


__all__ = ["Clock", "FrameIO", "HostClock", "Ops", "Transfers", "cuda_status", "make_ops"]
