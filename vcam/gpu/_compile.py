"""The one place that finds, compiles and caches the CUDA modules in ``kernels/``.

Lookup order: the installed copy ``vcam/kernels/NAME.cu`` (package data), then the repository's
top-level ``kernels/NAME.cu``. Modules are compiled by CuPy's NVRTC for the current device's
architecture (``sm_90`` on Hopper; CuPy picks the real architecture when NVRTC supports it, so the
result is machine code, not PTX for the driver to JIT), once per process per device, and CuPy keeps
the binary in its on-disk kernel cache across processes. ``--fmad=false`` keeps the float order of
operations equal to the NumPy twins. Compiler logs become :class:`~vcam.errors.DeviceError`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..errors import DeviceError

OPTIONS = ("--std=c++17", "--fmad=false")

_lock = threading.Lock()
_modules: dict[tuple[str, int], Any] = {}


def kernel_path(name: str) -> Path:
    """Path of ``kernels/<name>.cu``: the installed copy first, then the repository's."""
    here = Path(__file__).resolve().parent.parent  # vcam/
    for cand in (here / "kernels" / f"{name}.cu", here.parent / "kernels" / f"{name}.cu"):
        if cand.is_file():
            return cand
    raise DeviceError(f"CUDA kernel source {name}.cu not found", hint="reinstall fastswap-cam (package data kernels/*.cu)")


def arch() -> str:
    """``sm_XY`` of the current device (what the modules are built for)."""
    import cupy

    return "sm_" + cupy.cuda.Device().compute_capability


def module(name: str) -> Any:
    """The compiled ``cupy.RawModule`` for ``kernels/<name>.cu`` on the current device."""
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError("CuPy is not installed", hint="pip install 'fastswap-cam[cuda13]' (or [cuda] for CUDA 12)") from exc
    dev = cupy.cuda.Device().id
    key = (name, dev)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            src = kernel_path(name).read_text()
            try:
                mod = cupy.RawModule(code=src, options=OPTIONS)
                mod.compile()
            except cupy.cuda.compiler.CompileException as exc:
                log = str(exc).strip().splitlines()
                first = next((ln for ln in log if "error" in ln), log[0] if log else "unknown error")
                raise DeviceError(f"compiling kernels/{name}.cu for {arch()} failed: {first}",
                                  hint="check the CUDA toolkit/driver match (CuPy build vs. driver version)") from exc
            except Exception as exc:  # driver/NVRTC missing or too old
                raise DeviceError(f"cannot build kernels/{name}.cu: {exc}", hint="check the CUDA driver and CuPy install") from exc
            _modules[key] = mod
    return mod


def function(name: str, kernel: str) -> Any:
    """One kernel of a compiled module."""
    return module(name).get_function(kernel)


def launch(name: str, kernel: str, grid: tuple, block: tuple, args: tuple, stream: Any = None) -> None:
    """Launch ``kernel`` of ``kernels/<name>.cu`` on ``stream`` (CuPy stream or None: current)."""
    fn = function(name, kernel)
    if stream is None:
        fn(grid, block, args)
    else:
        with stream:
            fn(grid, block, args)
