"""Native libraries and the GPU driver, touched ahead of their use without holding the interpreter
lock: a shared library loaded and its static initialisers run (:func:`load_library`), the NVIDIA
driver started and a GPU's primary context made (:func:`cuda_primary_context`).

Why: CPython loads an extension module's library (``dlopen``, its relocations and static
initialisers: hundreds of milliseconds for PyTorch's CUDA libraries) while holding the GIL, as does
``ctypes.CDLL``, so every other thread (the early frames a video call sees while the models load)
stops meanwhile. Here the loader itself is called as a ctypes foreign function, which runs without
the GIL; the import that follows finds the libraries loaded and only counts a reference. A library
loaded here is loaded local (its symbols are not offered to later libraries); a later load that
asks for them global (``RTLD_GLOBAL``) still gets that, as it would have.

Linux: ``dlopen(RTLD_NOW | RTLD_LOCAL)``, ``libcuda.so.1``. Windows: ``LoadLibraryExW`` searching
the library's own folder and the process's DLL folders (as PyTorch loads its DLLs), ``nvcuda.dll``.
Every call returns what it managed and never raises for a missing file, library or driver: what it
could not do is left to the import.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

from vcam.platform import WINDOWS

#: LoadLibraryExW's LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR | LOAD_LIBRARY_SEARCH_DEFAULT_DIRS.
_WINDOWS_SEARCH = 0x00000100 | 0x00001000


@functools.lru_cache(maxsize=1)
def _dlopen() -> Any:
    """The C library's ``dlopen`` as a ctypes function (glibc 2.34+ has it in libc, older ones in
    libdl), or None where there is none."""
    for name in (None, "libdl.so.2"):
        try:
            fn = ctypes.CDLL(name).dlopen
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = (ctypes.c_char_p, ctypes.c_int)
        return fn
    return None


@functools.lru_cache(maxsize=1)
def _load_library_ex() -> Any:
    """kernel32's ``LoadLibraryExW`` as a ctypes function, or None."""
    try:
        fn = ctypes.WinDLL("kernel32", use_last_error=True).LoadLibraryExW  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = (ctypes.c_wchar_p, ctypes.c_void_p, ctypes.c_uint32)
    return fn


def load_library(path: Path, *, windows: bool = WINDOWS) -> bool:
    """Load the shared library at ``path`` (and what it needs) into this process, its static
    initialisers run, without holding the GIL. True when it is loaded (now or before); False where
    it cannot be (a missing file, a dependency not found, no loader to call). The library stays
    loaded for the process's life, as an imported extension's does."""
    if windows:
        fn = _load_library_ex()
        return fn is not None and bool(fn(str(path), None, _WINDOWS_SEARCH))
    fn = _dlopen()
    if fn is None:
        return False
    return bool(fn(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL))


@functools.lru_cache(maxsize=1)
def _driver(windows: bool) -> ctypes.CDLL | None:
    """The NVIDIA driver's CUDA library, or None where it is not installed."""
    try:
        return ctypes.CDLL("nvcuda.dll" if windows else "libcuda.so.1")
    except OSError:
        return None


def nvidia_driver(*, windows: bool = WINDOWS) -> bool:
    """An NVIDIA driver is installed, found without loading it: Linux, its kernel module's
    ``/proc/driver/nvidia`` or its control device (what a container is given); Windows, its CUDA
    library in the system folder."""
    if windows:
        root = os.environ.get("SystemRoot", r"C:\Windows")
        return Path(root, "System32", "nvcuda.dll").is_file()
    return Path("/proc/driver/nvidia/version").is_file() or Path("/dev/nvidiactl").exists()


def cuda_primary_context(index: int = 0, *, windows: bool = WINDOWS) -> bool:
    """Start the CUDA driver (``cuInit``) and make GPU ``index``'s primary context
    (``cuDevicePrimaryCtxRetain``, the context CUDA's runtime, PyTorch and CuPy all use), without
    holding the GIL: the library that next asks for it finds it made. The retain is kept for the
    process's life. True when the context exists; False without a driver or such a GPU."""
    lib = _driver(windows)
    if lib is None:
        return False
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    try:
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return False
        return lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    except AttributeError:  # not a CUDA driver
        return False


__all__ = ["cuda_primary_context", "load_library", "nvidia_driver"]
