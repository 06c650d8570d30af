"""Native libraries loaded without the GIL (vcam.platform.native): a real shared
library with a slow static initialiser, loaded while another thread keeps asking for the GIL, against
the same load by the import system (an extension module's library: CPython holds the GIL throughout,
which is what `import torch` does to the early frames)."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import WINDOWS, c_library, require

from vcam.platform import native

#: A library whose initialiser takes 0.4 s (as libtorch_cpu's relocations and initialisers take
#: hundreds of ms) and counts its runs.
SLOW_INIT = r"""
#include <time.h>
static int runs = 0;
__attribute__((constructor)) static void slow(void) {
    struct timespec t = {0, 400000000};
    nanosleep(&t, 0);
    runs++;
}
int init_runs(void) { return runs; }
void *PyInit_slowmod(void) { return 0; }  /* importable: the import loads it, then reports no module */
"""


def _build(tmp_path: Path, name: str) -> Path:
    return c_library(tmp_path, SLOW_INIT, name)


def _longest_gil_wait(load) -> tuple[float, float]:
    """(the longest a thread asking for the GIL every 2 ms waited, the load's seconds) while ``load``
    runs in this thread."""
    from benchmarks.gil_wait import LongestWait

    with LongestWait() as waits:
        t0 = time.perf_counter()
        load()
        took = time.perf_counter() - t0
    return waits.seconds, took


def _import_load(path: Path) -> None:
    """``path`` loaded as an import loads an extension module (its init then says there is none)."""
    spec = importlib.util.spec_from_file_location(
        "slowmod", path, loader=importlib.machinery.ExtensionFileLoader("slowmod", str(path))
    )
    assert spec is not None
    with pytest.raises(SystemError):
        importlib.util.module_from_spec(spec)


def test_a_library_loads_without_holding_the_gil_where_an_import_holds_it(tmp_path):
    """The same slow library (two copies: a loaded one is not loaded again): loaded by the import
    system the other thread waits out the whole 0.4 s initialiser; through load_library it keeps running."""
    held_copy, free_copy = _build(tmp_path, "libheld.so"), tmp_path / "libfree.so"
    shutil.copy(held_copy, free_copy)
    held_wait, held_took = _longest_gil_wait(lambda: _import_load(held_copy))
    free_wait, free_took = _longest_gil_wait(lambda: native.load_library(free_copy))
    assert held_took >= 0.4 and free_took >= 0.4  # both ran the initialiser
    assert held_wait >= 0.3, f"the import let the other thread run ({held_wait:.3f} s): nothing measured"
    assert free_wait < 0.5 * held_wait, (free_wait, held_wait)


def test_a_library_loaded_ahead_is_found_by_the_later_load_without_running_again(tmp_path):
    lib = _build(tmp_path, "libonce.so")
    assert native.load_library(lib)
    t0 = time.perf_counter()
    again = ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)  # as PyTorch loads its global deps
    assert time.perf_counter() - t0 < 0.3  # no second 0.4 s initialiser
    assert again.init_runs() == 1


def test_a_missing_library_or_file_is_reported_not_raised(tmp_path):
    assert native.load_library(tmp_path / "absent.so") is False
    not_a_library = tmp_path / "text.so"
    not_a_library.write_text("not ELF")
    assert native.load_library(not_a_library) is False


@pytest.mark.skipif(not WINDOWS, reason="LoadLibraryExW: Windows only (runs under Wine in tools/windows-tests)")
def test_windows_loads_a_system_library_by_its_path_and_reports_a_missing_one(tmp_path):
    system = Path(os.environ.get("SystemRoot", r"C:\Windows"), "System32")
    assert native.load_library(system / "version.dll")
    assert native.load_library(tmp_path / "absent.dll") is False


def test_without_an_nvidia_driver_no_context_is_made():
    if native._driver(WINDOWS) is not None:
        pytest.skip("this machine has the NVIDIA driver's CUDA library (the GPU test covers it)")
    assert native.cuda_primary_context() is False


@pytest.mark.gpu
def test_the_primary_context_made_ahead_is_the_one_pytorch_and_cupy_use():
    """In a fresh process: the driver started and the context made here, then PyTorch and CuPy run on
    that context (the driver's current context after their first work is the primary one retained)."""
    if not native.nvidia_driver():
        require("gpu", "no NVIDIA driver here")
    code = (
        "import ctypes\n"
        "from vcam.platform import native\n"
        "assert native.cuda_primary_context(0)\n"
        "lib = native._driver(native.WINDOWS)\n"
        "ahead = ctypes.c_void_p(); lib.cuDevicePrimaryCtxRetain(ctypes.byref(ahead), 0)\n"
        "import torch, cupy\n"
        "x = torch.ones(4, device='cuda'); assert float(x.sum()) == 4.0\n"
        "assert float(cupy.ones(4).sum()) == 4.0\n"
        "cur = ctypes.c_void_p(); lib.cuCtxGetCurrent(ctypes.byref(cur))\n"
        "print(cur.value == ahead.value)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "True"
