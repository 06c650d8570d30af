"""Where frames run: the pipeline's device (CUDA or the CPU) from ``[pipeline] device`` and what
is installed, the accelerator an onnxruntime model takes beside a CPU pipeline (DirectML, CoreML),
and the error of a ``--device cuda`` that cannot run (no GPU first, then what to install)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from vcam.config import Config
from vcam.errors import DeviceError
from vcam.runtime import roles as _roles

if TYPE_CHECKING:
    from vcam.engines import Accelerator

#: What the array stages (convert, warp, paste) run on, per device.
PIXELS = {"cpu": "NumPy/OpenCV", "cuda": "CuPy kernels (kernels/*.cu)"}

#: What makes each ``[pipeline] backend`` run on CUDA, beside CuPy (named when ``--device cuda`` cannot run).
CUDA_BACKEND_INSTALL = {
    "auto": "PyTorch with CUDA (pytorch.org)",
    "torch": "PyTorch with CUDA (pytorch.org)",
    "tensorrt": "TensorRT (pip install tensorrt-cu12)",
    "onnxruntime": "onnxruntime-gpu (pip uninstall onnxruntime, then pip install onnxruntime-gpu)",
}
CUPY_INSTALL = "CuPy (pip install 'fastswap-cam[cuda13]', or [cuda] for CUDA 12)"


def no_cuda_error(backend: str, why: str, gpu: tuple[bool, str]) -> DeviceError:
    """The error of ``--device cuda`` that cannot run: ``why`` (:func:`vcam.ops.cuda_status`'s
    reason), ``gpu`` (:func:`vcam.ops.cuda_gpu_found`). Without a GPU it says so first, then what a
    GPU machine needs for ``backend``; with one, what is missing here."""
    need = f"{CUPY_INSTALL} and {CUDA_BACKEND_INSTALL.get(backend, CUDA_BACKEND_INSTALL['auto'])}"
    found, detail = gpu
    if not found:
        return DeviceError(
            f"--device cuda asked, but no CUDA GPU was found ({detail})",
            hint=f"use --device cpu here; a machine with an NVIDIA GPU and its driver needs {need}",
        )
    return DeviceError(f"--device cuda asked, but {why}", hint=f"install {need}, or use --device cpu")


def resolve_device(
    cfg: Config,
    *,
    cuda: Callable[[], tuple[bool, str]] | None = None,
    gpu: Callable[[], tuple[bool, str]] | None = None,
) -> tuple[str, str]:
    """(``cpu`` | ``cuda``, why). ``cuda`` needs CuPy with a device and a CUDA inference backend
    (``[pipeline] backend``); ``--device cuda`` without them raises DeviceError naming the fix
    (:func:`no_cuda_error`), ``auto`` falls back to the CPU and says why. ``cuda``/``gpu``: in place
    of :func:`vcam.ops.cuda_status` and :func:`vcam.ops.cuda_gpu_found` (tests)."""
    from vcam.engines import explain_backends
    from vcam.ops import cuda_gpu_found, cuda_status

    want = cfg.pipeline.device
    if want == "cpu":
        return "cpu", "--device cpu"
    ok, why = (cuda or cuda_status)()
    found_gpu = ok
    if ok:
        rows = explain_backends(device="cuda", backend=cfg.pipeline.backend, first=True)  # no import past the first
        if not any(r[1] for r in rows):
            ok, why = False, "no CUDA inference backend (" + "; ".join(f"{n}: {r}" for n, _, r in rows) + ")"
    if ok:
        return "cuda", "a CUDA GPU with CuPy and a CUDA inference backend"
    if want == "cuda":
        raise no_cuda_error(cfg.pipeline.backend, why, (True, "") if found_gpu else (gpu or cuda_gpu_found)())
    return "cpu", f"no usable GPU: {why}"


def accelerator(cfg: Config, device: str, *, providers: Sequence[str] | None = None) -> Accelerator | None:
    """The accelerator the onnxruntime models run on in a pipeline on ``device`` (DirectML, CoreML;
    :func:`vcam.runtime.roles.engine_backend`), or None."""
    from vcam.engines import ACCELERATORS

    return ACCELERATORS.get(_roles.engine_backend(cfg, "detector", device, providers=providers))


__all__ = ["CUDA_BACKEND_INSTALL", "PIXELS", "accelerator", "no_cuda_error", "resolve_device"]
