"""A GPU start's libraries ahead of its imports (vcam.runtime.gpu_ahead): which, in which order,
only where a GPU start may follow; on a GPU, PyTorch imported after them holds the GIL for
less than it does alone (the early frames' stalls), and before CuPy (assemble.device_for_load)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import WINDOWS, c_library, require

from vcam.platform import native
from vcam.runtime import gpu_ahead

#: The cuDNN wheel's parts laid out (the first is its front library); not engines_runtime_compiled.
CUDNN = ("", "adv", "heuristic", "graph", "engines_precompiled")


def _lib(stem: str) -> str:
    """PyTorch's file name for library ``stem`` on this OS (its wheels' layout)."""
    return f"{stem}.dll" if WINDOWS else f"lib{stem}.so"


def _cudnn(site: Path, part: str) -> Path:
    """cuDNN's ``part`` where its wheel puts it on this OS (Linux ``lib/libcudnn_graph.so.9``,
    Windows ``bin/cudnn_graph64_9.dll``)."""
    name = f"cudnn{'_' if part else ''}{part}"
    folder = site / "nvidia" / "cudnn"
    return folder / "bin" / f"{name}64_9.dll" if WINDOWS else folder / "lib" / f"lib{name}.so.9"


def _site(tmp_path: Path, *, cuda: bool = True, make=None) -> Path:
    """A site-packages folder laid out as PyTorch's CUDA wheels are on this OS (empty files unless ``make``)."""
    site = tmp_path / "site"
    lib = site / "torch" / "lib"
    lib.mkdir(parents=True)
    stems = [s for s in gpu_ahead.TORCH_LIBRARIES if cuda or s not in ("torch_cuda", "c10_cuda")]
    for stem in [*stems, "torch_python", "shm"]:
        (make or Path.touch)(lib / _lib(stem))
    _cudnn(site, "").parent.mkdir(parents=True)
    for part in CUDNN:
        (make or Path.touch)(_cudnn(site, part))
    return site


def _names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_pytorch_s_libraries_come_in_load_order_and_only_from_a_cuda_build(tmp_path):
    site = _site(tmp_path)
    assert _names(gpu_ahead.torch_libraries(site)) == [_lib(s) for s in gpu_ahead.TORCH_LIBRARIES]
    cpu_build = _site(tmp_path / "cpu", cuda=False)
    assert gpu_ahead.torch_libraries(cpu_build) == []


def test_cudnn_s_convolution_parts_are_loaded_in_order_and_its_other_parts_are_not(tmp_path):
    site = _site(tmp_path)
    parts = ["graph", "engines_precompiled", "heuristic"]
    assert gpu_ahead.cudnn_libraries(site) == [_cudnn(site, p) for p in parts]
    # engines_runtime_compiled is not in this layout: left out, not an error


def test_only_a_start_that_may_run_on_a_gpu_reads_or_loads_anything(tmp_path, monkeypatch):
    site = _site(tmp_path)
    monkeypatch.setattr(gpu_ahead, "site_packages", lambda: site)
    monkeypatch.setattr(native, "nvidia_driver", lambda: True)
    assert gpu_ahead.wanted("cpu") is None
    assert gpu_ahead.wanted(None) == site and gpu_ahead.wanted("cuda") == site
    monkeypatch.setattr(native, "nvidia_driver", lambda: False)
    assert gpu_ahead.wanted("cuda") is None
    assert gpu_ahead.load("cuda") == gpu_ahead.Loaded()  # nothing done, nothing said


def _stand_in_library(tmp_path: Path) -> Path:
    """A real shared library to copy under PyTorch's names: built with cc on POSIX, a copy of a
    system DLL on Windows."""
    if WINDOWS:
        return Path(os.environ.get("SystemRoot", r"C:\Windows"), "System32", "version.dll")
    return c_library(tmp_path, "int stand_in(void) { return 1; }\n", "libstandin.so")


def test_load_loads_each_library_in_order_and_leaves_a_broken_one_to_the_import(tmp_path, monkeypatch):
    built = _stand_in_library(tmp_path)
    site = _site(tmp_path, make=lambda p: shutil.copy(built, p))
    broken = _cudnn(site, "heuristic")
    broken.write_text("not a library")
    monkeypatch.setattr(gpu_ahead, "site_packages", lambda: site)
    monkeypatch.setattr(native, "nvidia_driver", lambda: True)
    monkeypatch.setattr(native, "cuda_primary_context", lambda index: False)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    got = gpu_ahead.load("cuda")
    cudnn = [_cudnn(site, p).name for p in ("graph", "engines_precompiled")]
    assert got.loaded == (*(_lib(s) for s in gpu_ahead.TORCH_LIBRARIES), *cudnn)
    assert got.failed == (broken.name,) and got.context is False
    assert "left to the import" in got.describe() and "8 GPU libraries loaded" in got.describe()
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"  # what PyTorch sets before CUDA starts


def test_the_context_made_beside_lets_the_caller_go_on_and_is_there_once_waited_for(tmp_path, monkeypatch):
    """``load(beside=True)``: the libraries loaded in the caller's thread, the context in a thread of
    its own, so PyTorch's import (which needs the libraries, not the context) runs meanwhile
    (issue 39: the context was about 0.27 s of the start before the import)."""
    import threading
    import time

    site = _site(tmp_path, make=lambda p: shutil.copy(_stand_in_library(tmp_path), p))
    monkeypatch.setattr(gpu_ahead, "site_packages", lambda: site)
    monkeypatch.setattr(native, "nvidia_driver", lambda: True)
    made: list[str] = []
    go = threading.Event()

    def context(index):
        go.wait(5)  # made only once the caller has gone on
        made.append(threading.current_thread().name)
        return True

    monkeypatch.setattr(native, "cuda_primary_context", context)
    t0 = time.perf_counter()
    got = gpu_ahead.load("cuda", beside=True)
    assert not got.context and not made and time.perf_counter() - t0 < 4  # the caller goes on
    go.set()
    done = got.made()
    assert done.context and made == ["vcam-gpu-context"] and done.loaded == got.loaded
    assert done.made() is done and "the context made" in done.describe()


#: A fresh process's GPU start (PyTorch imported, CUDA's context, a first cuDNN convolution, as a
#: GPU load begins) while a thread asks for the GIL every 2 ms: the longest it waited, in seconds.
GPU_START = textwrap.dedent(
    """
    import json, sys
    from benchmarks.gil_wait import LongestWait
    waits = LongestWait().__enter__()
    ahead = None
    if sys.argv[1] == "ahead":
        from vcam.runtime import gpu_ahead
        ahead = gpu_ahead.load("cuda")
    import torch
    x = torch.randn(1, 3, 64, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(8, 3, 3, 3, device="cuda", dtype=torch.float16)
    torch.nn.functional.conv2d(x, w).sum().item()
    waits.__exit__(None, None, None)
    done = {"loaded": list(ahead.loaded) if ahead else [], "context": bool(ahead and ahead.context)}
    print(json.dumps({"longest": waits.seconds, **done}))
    """
)


@pytest.mark.gpu
def test_on_a_gpu_the_libraries_loaded_ahead_cut_the_longest_gil_wait_of_a_start():
    if not native.nvidia_driver() or gpu_ahead.wanted("cuda") is None:
        require("gpu", "no NVIDIA driver or no CUDA build of PyTorch here")
    runs = {}
    for mode in ("plain", "ahead", "ahead", "plain", "plain", "ahead"):  # ABBA: the disk cache warm for both
        root = Path(__file__).resolve().parents[2]  # benchmarks.gil_wait importable
        r = subprocess.run([sys.executable, "-c", GPU_START, mode], capture_output=True, text=True, timeout=300, cwd=root)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.setdefault(mode, []).append(json.loads(r.stdout.strip().splitlines()[-1]))
    ahead = runs["ahead"][-1]
    assert "libtorch_cuda.so" in ahead["loaded"] and ahead["context"]
    # Medians of three: the H200 (a slow library load) waited 60-80 ms ahead against 680 ms; a fast
    # H100 host 140 / 210 ms, where what is left is the first convolution's own (2026-12-06: the
    # 0.6 ratio this asked for, one run's worst against the other's best, failed there once in three).
    plain_wait = statistics.median(r["longest"] for r in runs["plain"])
    ahead_wait = statistics.median(r["longest"] for r in runs["ahead"])
    assert ahead_wait < 0.85 * plain_wait, (runs, "the GIL waits with the libraries loaded ahead are not shorter")


def _recorded_start(monkeypatch, loaded: tuple[str, ...]) -> list[str]:
    """``assemble.device_for_load``'s steps, in order, with ``gpu_ahead.load`` reporting ``loaded``."""
    from vcam.runtime import assemble

    steps: list[str] = []

    class Beside:
        def result(self):
            steps.append("context waited for")
            return True

    def load(device, *, beside=False):
        steps.append("ahead")
        return gpu_ahead.Loaded(loaded, (), False, Beside()) if beside else gpu_ahead.Loaded(loaded, (), True)

    monkeypatch.setattr(assemble.gpu_ahead, "load", load)
    monkeypatch.setattr(assemble, "_torch_before_cupy", lambda: steps.append("torch"))
    monkeypatch.setattr(assemble, "resolve_device", lambda cfg: steps.append("resolve (CuPy)") or ("cuda", "test"))
    return steps


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_a_gpu_start_on_pytorch_imports_it_after_its_libraries_and_before_cupy(monkeypatch, backend):
    from vcam.config import Config
    from vcam.runtime import assemble

    steps = _recorded_start(monkeypatch, ("libtorch_cuda.so",))
    said: list[str] = []
    cfg = Config()
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, device="cuda", backend=backend))
    assert assemble.device_for_load(cfg, said.append) == ("cuda", "test")
    # the context is made beside the import (a thread), waited for before CuPy's import needs it
    assert steps == ["ahead", "torch", "context waited for", "resolve (CuPy)"]
    assert said[0] == "1 GPU libraries loaded" and said[1] == "import torch (before CuPy)" and "the context made" in said[2]


def test_a_start_without_pytorch_s_gpu_libraries_or_on_another_backend_imports_no_pytorch(monkeypatch):
    from vcam.config import Config
    from vcam.runtime import assemble

    steps = _recorded_start(monkeypatch, ())  # the CPU, no driver, or a CPU build of PyTorch
    assemble.device_for_load(Config())
    assert steps == ["ahead", "context waited for", "resolve (CuPy)"]
    steps = _recorded_start(monkeypatch, ("libtorch_cuda.so",))
    cfg = Config()
    assemble.device_for_load(cfg.replace(pipeline=replace(cfg.pipeline, backend="tensorrt")))
    assert steps == ["ahead", "context waited for", "resolve (CuPy)"]


#: A fresh process's device resolution as a GPU load does it; which of CuPy's lazily loaded parts
#: (and their SciPy and pytest) came in with PyTorch's import (``cupy.testing`` itself is CuPy's own).
LAZY_PARTS = textwrap.dedent(
    """
    import json, sys
    from vcam.config import Config
    from vcam.runtime import assemble
    from dataclasses import replace
    cfg = Config()
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, device="cuda"))
    device, why = assemble.device_for_load(cfg)
    lazy = sorted(m for m in sys.modules if m.startswith(("cupyx.linalg", "cupyx.profiler", "cupy.testing.", "scipy", "pytest")))
    print(json.dumps({"device": device, "torch": "torch" in sys.modules, "cupy": "cupy" in sys.modules, "lazy": lazy}))
    """
)


@pytest.mark.gpu
def test_on_a_gpu_the_start_s_imports_leave_cupy_s_lazy_parts_alone():
    if not native.nvidia_driver() or gpu_ahead.wanted("cuda") is None:
        require("gpu", "no NVIDIA driver or no CUDA build of PyTorch here")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", LAZY_PARTS], capture_output=True, text=True, timeout=300, cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["device"] == "cuda" and got["torch"] and got["cupy"], got
    assert got["lazy"] == [], got  # CuPy first: 92 modules, 0.2-0.35 s of every GPU start (H100)
