"""The one place that finds, compiles and caches the CUDA modules in ``kernels/``.

Lookup order: the installed copy ``vcam/kernels/NAME.cu`` (package data), then the repository's
top-level ``kernels/NAME.cu``. Modules are compiled by CuPy's NVRTC for the current device's
architecture (``sm_90`` on Hopper; CuPy picks the real architecture when NVRTC supports it, so the
result is machine code, not PTX for the driver to JIT), once per :class:`Kernels` (one per device context), and CuPy keeps
the binary in its on-disk kernel cache across processes. ``--fmad=false`` keeps the float order of
operations equal to the NumPy twins. Compiler logs become :class:`~vcam.errors.DeviceError`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from vcam.errors import DeviceError
from vcam.kernels.records import by_reference

OPTIONS = ("--std=c++17", "--fmad=false")


def kernel_path(name: str) -> Path:
    """Path of ``kernels/<name>.cu``: the installed copy (``vcam/kernels/cu/``) first, then the repository's."""
    here = Path(__file__).resolve().parent  # vcam/kernels/
    for cand in (here / "cu" / f"{name}.cu", here.parents[1] / "kernels" / f"{name}.cu"):
        if cand.is_file():
            return cand
    raise DeviceError(f"CUDA kernel source {name}.cu not found", hint="reinstall fastswap-cam (package data kernels/*.cu)")


def arch() -> str:
    """``sm_XY`` of the current device (what the modules are built for)."""
    import cupy

    return "sm_" + cupy.cuda.Device().compute_capability


class Kernels:
    """Compiled ``kernels/*.cu`` modules of one device, built on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        #: Per-device objects of the kernel families (see :func:`scratch`).
        self.cache: dict[str, Any] = {}

    def module(self, name: str) -> Any:
        """The compiled ``cupy.RawModule`` for ``kernels/<name>.cu``."""
        mod = self._modules.get(name)
        if mod is not None:
            return mod
        import cupy

        with self._lock:
            mod = self._modules.get(name)
            if mod is None:
                src = kernel_path(name).read_text()
                try:
                    mod = cupy.RawModule(code=src, options=OPTIONS)
                    mod.compile()
                except cupy.cuda.compiler.CompileException as exc:
                    log = str(exc).strip().splitlines()
                    first = next((ln for ln in log if "error" in ln), log[0] if log else "unknown error")
                    raise DeviceError(
                        f"compiling kernels/{name}.cu for {arch()} failed: {first}",
                        hint="check the CUDA toolkit/driver match (CuPy build vs. driver version)",
                    ) from exc
                except Exception as exc:  # driver/NVRTC missing or too old
                    raise DeviceError(
                        f"cannot build kernels/{name}.cu: {exc}", hint="check the CUDA driver and CuPy install"
                    ) from exc
                self._modules[name] = mod
        return mod

    def launch(self, name: str, kernel: str, grid: tuple, block: tuple, args: tuple, stream: Any = None) -> None:
        """Launch ``kernel`` of ``kernels/<name>.cu`` on ``stream`` (CuPy stream or None: current)."""
        fn = self._functions.get((name, kernel))
        if fn is None:
            fn = self._functions[(name, kernel)] = self.module(name).get_function(kernel)
        if stream is None:
            fn(grid, block, args)
        else:
            with stream:
                fn(grid, block, args)


# -- helpers shared by the kernel families' CUDA launches ------------------------------------------
BLOCK = 256  # threads per block of the one-thread-per-pixel kernels


def grid(n: int) -> int:
    """Blocks of :data:`BLOCK` threads that cover ``n`` items (at least one)."""
    return max(1, (n + BLOCK - 1) // BLOCK)


def on_device(ops: Any) -> bool:
    """True where ``ops`` keeps arrays on a CUDA device (the kernels launch); False on the CPU (the
    NumPy references run)."""
    return getattr(ops, "device", "cpu") == "cuda"


def launch(
    ops: Any, module: str, kernel: str, blocks: tuple, args: tuple, block: tuple = (BLOCK,), *, fixed: tuple | None = None
) -> None:
    """Queue ``kernel`` of ``kernels/<module>.cu`` on the ops' current stream. ``fixed``: the kernel
    has a ``_rec`` twin that reads its parameter struct through a pointer; under a parameter record
    (:func:`vcam.kernels.records.recording`) that twin is launched on the grid ``fixed`` instead."""
    record = getattr(ops, "params", None) if fixed is not None else None
    if record is not None:
        kernel, blocks = kernel + "_rec", fixed
        args = by_reference(ops, record, module, kernel, blocks, args)
    ops.kernels.launch(module, kernel, blocks, block, args, ops.stream)


def dense(out: Any, dtype: Any) -> Any:
    """``out`` itself, after checking it is a C-contiguous array of ``dtype`` (kernels write it flat)."""
    import numpy as np

    if not out.flags.c_contiguous or out.dtype != np.dtype(dtype):
        raise ValueError(f"the output buffer must be C-contiguous {np.dtype(dtype)}, got {out.dtype}")
    return out


def scratch(ops: Any, key: str, make: Any) -> Any:
    """A per-device object built once by ``make()`` and kept with the ops' compiled modules (small
    device buffers and cached parameter blocks a launch reuses on every frame)."""
    cache = ops.kernels.cache
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
    return value
