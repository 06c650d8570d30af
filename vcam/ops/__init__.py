"""Array operations of the pipeline, one implementation per device.

The stage order (:mod:`vcam.pipeline.pipeline`) is written once over an :class:`Ops` object; everything that
depends on where pixels live is here:

- :class:`~vcam.ops.numpy.NumpyOps`: host memory, every call done when it returns.
- :class:`~vcam.ops.cuda.CudaOps`: CuPy memory on a CUDA device, a compute stream and copy streams,
  pinned host rings and device buffers, counted transfers.

The kernels themselves (colour conversion, warp, masks, paste, colour transfer, tiles) are in
:mod:`vcam.kernels`: one front per kernel, ``kernels.<family>.<name>(ops, ...)``, that runs the CUDA
launch on the ops' current stream where ``ops.device == "cuda"`` and the NumPy reference otherwise.

Importing this package never imports CuPy; :func:`cuda_status` says whether the CUDA ops can run,
:func:`cuda_gpu_found` whether there is a CUDA GPU at all (its driver's ``nvidia-smi``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from vcam.ops.base import Clock, FrameIO, HostClock, Ops, Transfers

__all__ = ["Clock", "FrameIO", "HostClock", "Ops", "Transfers", "cuda_gpu_found", "cuda_status", "make_ops"]


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


def cuda_gpu_found(
    which: Callable[[str], str | None] = shutil.which, run: Callable[..., Any] = subprocess.run
) -> tuple[bool, str]:
    """(True, the first GPU ``nvidia-smi -L`` lists) where an NVIDIA GPU and its driver are, else
    (False, why): no ``nvidia-smi`` on PATH (no driver), or it fails or lists no GPU. Asked only when
    :func:`cuda_status` fails, to say whether a GPU is missing or only its Python packages."""
    exe = which("nvidia-smi")
    if exe is None:
        return False, "no NVIDIA driver: nvidia-smi is not on PATH"
    try:
        done = run([exe, "-L"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"nvidia-smi does not run: {exc}"
    gpus = [ln.strip() for ln in (done.stdout or "").splitlines() if ln.strip().startswith("GPU ")]
    if done.returncode != 0 or not gpus:
        said = next((ln.strip() for ln in f"{done.stderr or ''}\n{done.stdout or ''}".splitlines() if ln.strip()), "")
        return False, f"nvidia-smi lists no GPU{f' ({said})' if said else ''}"
    return True, gpus[0]


def make_ops(device: str) -> Ops:
    """The ops for ``"cpu"`` or ``"cuda"`` (DeviceError when CUDA cannot run here). ``$VCAM_SPIN_WAITS=1``:
    CUDA host waits spin instead of sleeping (the A/B measurement of issue 43 only)."""
    if device == "cuda":
        from vcam.ops.cuda import CudaOps

        return CudaOps(sleep_waits=os.environ.get("VCAM_SPIN_WAITS", "") != "1")
    from vcam.ops.numpy import NumpyOps

    return NumpyOps()


__all__ = ["Clock", "FrameIO", "HostClock", "Ops", "Transfers", "cuda_status", "make_ops"]
