"""A GPU start's native side ahead of its imports (issue 39: the first seconds): PyTorch's and
CUDA's libraries read from disk from the command's start (:func:`read_ahead`), then, in the load,
loaded and the GPU's context made without the interpreter lock (:func:`load`), so the early frames
published meanwhile keep their rate and budget.

Measured before this (H200): ``import torch`` holds the GIL for most of its 1.2 s warm (4.9 s on a
fresh machine's disk), mostly in the dynamic loader (libtorch_cpu, libtorch_cuda and the CUDA
libraries they link: relocations, static initialisers); the first cuDNN convolution loads cuDNN's
engine libraries the same way. :mod:`vcam.platform.native` does both through ctypes, which lets go
of the GIL; the import then finds the libraries loaded. The files come from the installed
packages' own folders (``torch/lib``, the ``nvidia`` wheels), never from a list recorded earlier,
so a machine's first start gets the same as its hundredth.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vcam.platform import native

log = logging.getLogger(__name__)

#: PyTorch's native libraries under ``torch/lib``, each before those that need it (stems: Linux
#: ``lib{stem}.so``, Windows ``{stem}.dll``). ``torch_python`` is left to the import: its
#: initialisers belong with the interpreter.
TORCH_LIBRARIES = ("torch_global_deps", "c10", "torch_cpu", "c10_cuda", "torch_cuda", "torch")

#: The parts of cuDNN 9 its first convolution loads (it loads them on first use, by name; one
#: loaded before is found): Linux ``libcudnn_{part}.so.9``, Windows ``cudnn_{part}64_9.dll``.
CUDNN_PARTS = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic")

#: Library files of the NVIDIA wheels a start never opens (profilers, alternate builds,
#: multi-GPU solvers, transports, RNN/attention kernels): not read ahead.
UNREAD = (".alt.", "nvperf", "cusolverMg", "nvshmem_transport", "cudnn_adv", "checkpoint")


def site_packages() -> Path | None:
    """The folder PyTorch is installed in (found without importing it), or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent


def _first(folder: Path, *names: str) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def torch_libraries(site: Path) -> list[Path]:
    """:data:`TORCH_LIBRARIES` as installed under ``site``, in order; [] unless PyTorch is a CUDA
    build (a CPU build has no torch_cuda, and nothing of a GPU start to take off the GIL)."""
    lib = site / "torch" / "lib"
    found = [_first(lib, f"lib{stem}.so", f"{stem}.dll") for stem in TORCH_LIBRARIES]
    if found[TORCH_LIBRARIES.index("torch_cuda")] is None:
        return []
    return [p for p in found if p is not None]


def cudnn_libraries(site: Path) -> list[Path]:
    """:data:`CUDNN_PARTS` of the cuDNN wheel under ``site`` that exist, in order."""
    root = site / "nvidia" / "cudnn"
    out = []
    for part in CUDNN_PARTS:
        hits = sorted(root.glob(f"lib/libcudnn_{part}.so.*")) + sorted(root.glob(f"bin/cudnn_{part}64_*.dll"))
        out += hits[:1]
    return out


def read_list(site: Path) -> list[Path]:
    """What :func:`read_ahead` reads: the libraries :func:`load` loads, in its order, then the rest
    of the NVIDIA wheels' libraries (those they link), less :data:`UNREAD`; [] without a CUDA PyTorch."""
    first = torch_libraries(site)
    if not first:
        return []
    python = _first(site / "torch" / "lib", "libtorch_python.so", "torch_python.dll")
    first += ([python] if python is not None else []) + cudnn_libraries(site)
    rest = sorted(p for pat in ("nvidia/*/lib/*.so*", "nvidia/*/bin/*.dll") for p in site.glob(pat))
    seen = set(first)
    out = list(first)
    out += [p for p in rest if p not in seen and p.is_file() and not any(u in p.name for u in UNREAD)]
    return out


def wanted(device: str | None) -> Path | None:
    """Where PyTorch is (the folder its libraries are found from) when a start may run on the GPU:
    ``device`` (the ``--device`` asked, None: not said) is not ``cpu``, an NVIDIA driver is
    installed and PyTorch is a CUDA build; else None."""
    if device == "cpu" or not native.nvidia_driver():
        return None
    site = site_packages()
    return site if site is not None and torch_libraries(site) else None


def read_ahead(device: str | None) -> threading.Thread:
    """From the command's start, in a thread (returned, started): when :func:`wanted`, the disk asked
    to read :func:`read_list` (the kernel reads in the background; nothing waits for it). Measured on
    a fresh H200 (evicted starts, median of 2): import torch + CUDA + the first convolution + import
    cupy 5.64 s without, 4.92 s with the files read ahead whole."""

    def advise() -> None:
        t0 = time.perf_counter()
        site = wanted(device)
        if site is None:
            return
        files = read_list(site)
        asked = native.read_ahead(files)
        log.debug(
            "GPU libraries read ahead: %d files, %.0f MB asked in %.2f s", len(files), asked / 1e6, time.perf_counter() - t0
        )

    thread = threading.Thread(target=advise, name="vcam-read-ahead", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` did: the libraries loaded and not, whether the GPU's context is made, the
    seconds it took (all of it without the GIL)."""

    loaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    context: bool = False
    seconds: float = 0.0

    def describe(self) -> str:
        what = f"{len(self.loaded)} GPU libraries loaded, the context {'made' if self.context else 'left to CUDA'}"
        return what + (f" ({', '.join(self.failed)} left to the import)" if self.failed else "")


def load(device: str | None = None, *, index: int = 0) -> Loaded:
    """PyTorch's CUDA libraries and cuDNN's convolution parts loaded, then GPU ``index``'s primary
    context made (:mod:`vcam.platform.native`), all without the GIL, when :func:`wanted`; call it in
    the load, just before importing PyTorch. A library that cannot be loaded is left to the import
    (which then says why); nothing raises."""
    site = wanted(device)
    if site is None:
        return Loaded()
    t0 = time.perf_counter()
    loaded: list[str] = []
    failed: list[str] = []
    for path in torch_libraries(site) + cudnn_libraries(site):
        (loaded if native.load_library(path) else failed).append(path.name)
    # The driver reads this at its start; PyTorch sets it (if unset) before its own: the same here.
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    context = native.cuda_primary_context(index)
    return Loaded(tuple(loaded), tuple(failed), context, time.perf_counter() - t0)


__all__ = ["CUDNN_PARTS", "TORCH_LIBRARIES", "Loaded", "load", "read_ahead", "read_list", "torch_libraries", "wanted"]
