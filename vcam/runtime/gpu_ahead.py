"""A GPU start's native side ahead of its imports (issue 39: the first seconds): PyTorch's CUDA
libraries and cuDNN's convolution parts loaded and the GPU's context made without the interpreter
lock (:func:`load`), so the early frames published meanwhile keep their rate and budget.

Measured on the H200 (``benchmarks.first_seconds --stalls``, a cold start): without this, the load
thread held the GIL 680 ms in one piece importing ``torch._C`` (the dynamic loader: libtorch_cpu,
libtorch_cuda and the CUDA libraries they link, relocations and static initialisers, all under the
import's lock) and 260 ms more in PyTorch's own preloading of the CUDA libraries; with it, 60-80 ms.
:mod:`vcam.platform.native` loads them through ctypes, which lets go of the GIL; the import then
finds them loaded. The files come from the installed packages' own folders (``torch/lib``, the
``nvidia`` wheels). Reading the libraries ahead from the command's start (``posix_fadvise(WILLNEED)``
on 3.3 GB of them) was tried and left out: on a cold disk it queued the start's own reads (the
CLI, the model file) behind it, and the GPU took over at 12.8 s against 7.2 s without.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vcam.platform import native

log = logging.getLogger(__name__)

#: PyTorch's native libraries under ``torch/lib``, each before those that need it (stems: Linux
#: ``lib{stem}.so``, Windows ``{stem}.dll``). ``torch_python`` is left to the import: its
#: initialisers belong with the interpreter.
TORCH_LIBRARIES = ("torch_global_deps", "c10", "torch_cpu", "c10_cuda", "torch_cuda", "torch")

#: The parts of cuDNN 9 its first convolution loads (it loads them on first use, by name; one
#: loaded before is found): Linux ``libcudnn_{part}.so.9``, Windows ``cudnn_{part}64_9.dll``.
CUDNN_PARTS = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic")


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


def wanted(device: str | None) -> Path | None:
    """Where PyTorch is (the folder its libraries are found from) when a start may run on the GPU:
    ``device`` (the ``--device`` asked, None: not said) is not ``cpu``, an NVIDIA driver is
    installed and PyTorch is a CUDA build; else None."""
    if device == "cpu" or not native.nvidia_driver():
        return None
    site = site_packages()
    return site if site is not None and torch_libraries(site) else None


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` did (all of it without the GIL): the libraries loaded and not, whether the
    GPU's context is made; ``beside``: the thread still making it (``load(..., beside=True)``) until
    :meth:`made` waits for it."""

    loaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    context: bool = False
    beside: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        what = f"{len(self.loaded)} GPU libraries loaded, the context {'made' if self.context else 'left to CUDA'}"
        return what + (f" ({', '.join(self.failed)} left to the import)" if self.failed else "")

    def made(self) -> Loaded:
        """This load with its context there: waits for the thread that makes it, if any."""
        if self.beside is None:
            return self
        return replace(self, context=self.beside.result(), beside=None)


class _ContextBeside:
    """:func:`vcam.platform.native.cuda_primary_context` in a thread of its own (the driver's calls
    let go of the GIL): :meth:`result` waits for it."""

    def __init__(self, index: int) -> None:
        self._made = False
        self._thread = threading.Thread(target=self._run, args=(index,), name="vcam-gpu-context", daemon=True)
        self._thread.start()

    def _run(self, index: int) -> None:
        self._made = native.cuda_primary_context(index)

    def result(self) -> bool:
        self._thread.join()
        return self._made


def load(device: str | None = None, *, index: int = 0, beside: bool = False) -> Loaded:
    """PyTorch's CUDA libraries and cuDNN's convolution parts loaded, then GPU ``index``'s primary
    context made (:mod:`vcam.platform.native`), all without the GIL, when :func:`wanted`; call it in
    the load, just before importing PyTorch. ``beside``: the context is made in a thread while the
    caller goes on (to import PyTorch, which needs the libraries but not the context: about 0.27 s
    of the H200's start, ``benchmarks.gpu_floor``, that came before the import); :meth:`Loaded.made`
    waits for it. A library that cannot be loaded is left to the import (which then says why);
    nothing raises."""
    site = wanted(device)
    if site is None:
        return Loaded()
    loaded: list[str] = []
    failed: list[str] = []
    for path in torch_libraries(site) + cudnn_libraries(site):
        (loaded if native.load_library(path) else failed).append(path.name)
    # The driver reads this at its start; PyTorch sets it (if unset) before its own: the same here.
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    if beside:
        return Loaded(tuple(loaded), tuple(failed), False, _ContextBeside(index))
    context = native.cuda_primary_context(index)
    return Loaded(tuple(loaded), tuple(failed), context)


__all__ = ["CUDNN_PARTS", "TORCH_LIBRARIES", "Loaded", "cudnn_libraries", "load", "torch_libraries", "wanted"]
