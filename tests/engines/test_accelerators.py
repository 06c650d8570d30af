"""Accelerators beyond CUDA (DirectML on Windows, CoreML on macOS) through onnxruntime's provider
list: a fake ``get_available_providers`` stands for a machine that has the provider, and the session
underneath is the real CPU one (the real providers are not verified on this machine). Also the
message of ``--device cuda`` on a machine without a GPU."""

from __future__ import annotations

import logging
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from vcam.config import Config
from vcam.engines import ACCELERATORS, accelerator_here, create_engine, explain_backends
from vcam.engines.ort import CoreMLEngine, DirectMLEngine, OrtEngine
from vcam.errors import DeviceError, EngineUnavailable
from vcam.models import standin
from vcam.ops import cuda_gpu_found
from vcam.runtime import roles
from vcam.runtime.check import check_accelerator
from vcam.runtime.device import accelerator, resolve_device

DML = ["DmlExecutionProvider", "CPUExecutionProvider"]
DML_INSTALL = (
    "onnxruntime-directml: pip uninstall onnxruntime, then pip install onnxruntime-directml "
    "(the two packages conflict: keep only one)"
)


@pytest.fixture()
def tiny(tmp_path) -> Path:
    return standin.write("inswapper_128", tmp_path / "inswapper_128.onnx", tiny=True, seed=3)


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    src = rng.standard_normal((1, 512)).astype(np.float32)
    return {"target": rng.random((1, 3, 128, 128), dtype=np.float32), "source": src / np.linalg.norm(src, axis=1, keepdims=True)}


@pytest.fixture()
def providers(monkeypatch):
    """Set onnxruntime's provider list; sessions then record what they were asked for and report the
    first provider asked for as taken (``claim=True``) while the real CPU session computes."""
    asked: list[list[str]] = []
    options: list = []
    real = onnxruntime.InferenceSession
    state = {"claim": True}

    class Claiming(real):
        def __init__(self, src, sess_options=None, providers=None):
            asked.append(list(providers or []))
            options.append(sess_options)
            super().__init__(src, sess_options=sess_options, providers=["CPUExecutionProvider"])

        def get_providers(self):
            return list(asked[-1]) if state["claim"] else super().get_providers()

    def set_list(names: list[str], *, claim: bool = True):
        monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: list(names))
        monkeypatch.setattr(onnxruntime, "InferenceSession", Claiming)
        state["claim"] = claim
        return asked, options

    return set_list


def test_the_accelerator_is_found_in_the_provider_list():
    assert accelerator_here([]) is None and accelerator_here(["CPUExecutionProvider"]) is None
    assert accelerator_here(DML) is ACCELERATORS["directml"]
    assert accelerator_here(["CoreMLExecutionProvider", "CPUExecutionProvider"]) is ACCELERATORS["coreml"]


def test_directml_engine_asks_for_directml_first_and_says_so(tiny, providers, tmp_path):
    asked, options = providers(DML)
    engine = create_engine(tiny, backend="directml", device="cpu", cache_dir=tmp_path / "cache")
    assert isinstance(engine, DirectMLEngine) and asked == [DML]
    assert engine.device == "cpu" and engine.provider == "DmlExecutionProvider"  # host arrays in and out
    assert engine.describe() == "onnxruntime fp32 on DirectML (DmlExecutionProvider)"
    assert options[0].enable_mem_pattern is False  # the DirectML provider refuses memory patterns
    assert not (tmp_path / "cache" / "ort").exists()  # no optimised CPU graph kept for another provider
    reference = OrtEngine(tiny).run(feeds())
    np.testing.assert_allclose(engine.run(feeds())[0], reference[0], rtol=1e-5, atol=1e-6)


def test_a_session_that_falls_back_to_the_cpu_says_so(tiny, providers, caplog):
    providers(["CoreMLExecutionProvider", "CPUExecutionProvider"], claim=False)
    with caplog.at_level(logging.WARNING, logger="vcam.engines.ort"):
        engine = create_engine(tiny, backend="coreml", device="cpu", name="swap")
    assert isinstance(engine, CoreMLEngine) and engine.provider == "CPUExecutionProvider"
    assert engine.describe() == "onnxruntime fp32 on cpu"
    assert [r.getMessage() for r in caplog.records] == [
        "onnxruntime was asked to run swap on CoreMLExecutionProvider but runs it on the CPU (providers: CPUExecutionProvider)"
    ]


def test_a_missing_provider_names_the_package(tiny, providers):
    providers(["CPUExecutionProvider"])
    assert DirectMLEngine.unavailable_reason("cpu") == "onnxruntime has no DirectML provider here (DmlExecutionProvider)"
    assert explain_backends(backend="directml") == [
        ("directml", False, "onnxruntime has no DirectML provider here (DmlExecutionProvider)")
    ]
    with pytest.raises(EngineUnavailable) as ei:
        create_engine(tiny, backend="directml", device="cpu", name="swap")
    assert (
        ei.value.message
        == "no inference backend can run swap on cpu: directml: onnxruntime has no DirectML provider here (DmlExecutionProvider)"
    )
    assert ei.value.hint == f"install {DML_INSTALL}; or use --device cpu"


def test_an_accelerator_serves_cpu_pipelines_only(providers):
    providers(DML)
    assert DirectMLEngine.unavailable_reason("cuda") == "DirectML takes the models of a CPU pipeline (device cpu), not cuda"


def cfg_with(device: str = "auto", backend: str = "auto") -> Config:
    cfg = Config()
    return cfg.replace(pipeline=replace(cfg.pipeline, device=device, backend=backend))


@pytest.mark.parametrize(
    "device,backend,pipeline,want",
    [
        ("auto", "auto", "cpu", "directml"),  # --device auto without a GPU: the accelerator
        ("auto", "onnxruntime", "cpu", "directml"),
        ("cpu", "auto", "cpu", "auto"),  # --device cpu keeps everything on the CPU
        ("auto", "torch", "cpu", "torch"),  # another backend asked: not onnxruntime's provider
        ("auto", "auto", "cuda", "auto"),  # CUDA pipelines are unchanged
    ],
)
def test_engine_backend_takes_the_accelerator_for_device_auto_only(device, backend, pipeline, want):
    assert roles.engine_backend(cfg_with(device, backend), "detector", pipeline, providers=DML) == want


def test_device_auto_builds_the_detector_on_the_accelerator(providers):
    asked, _ = providers(DML)
    detector = roles.build("detector", cfg_with("auto"), device="cpu")
    assert detector.engine.describe() == "onnxruntime fp32 on DirectML (DmlExecutionProvider)"
    assert asked and all(a == DML for a in asked)
    asked.clear()
    plain = roles.build("detector", cfg_with("cpu"), device="cpu")
    sessions = 2 if plain.engine._lean is not None else 1  # and one of one thread for a tracked region
    assert plain.engine.describe() == "onnxruntime fp32 on cpu" and asked == [["CPUExecutionProvider"]] * sessions


def test_check_names_the_provider_in_use():
    (item,) = check_accelerator(cfg_with("auto"), "cpu", platform="win32", providers=DML)
    assert (item.level, item.detail) == ("ok", "the onnxruntime models run on DirectML (DmlExecutionProvider); pixels on the CPU")
    assert accelerator(cfg_with("auto"), "cpu", providers=DML) is ACCELERATORS["directml"]


def test_check_names_the_package_of_a_missing_provider():
    (item,) = check_accelerator(cfg_with("auto"), "cpu", platform="win32", providers=["CPUExecutionProvider"])
    assert (item.level, item.detail, item.fix) == (
        "info",
        "onnxruntime has no DirectML provider here (CPUExecutionProvider): the models run on the CPU",
        DML_INSTALL,
    )
    (mac,) = check_accelerator(cfg_with("auto"), "cpu", platform="darwin", providers=["CPUExecutionProvider"])
    assert (
        mac.fix == "onnxruntime with its CoreML provider: pip install --force-reinstall onnxruntime (PyPI's macOS build has it)"
    )
    assert check_accelerator(cfg_with("auto"), "cpu", platform="linux", providers=["CPUExecutionProvider"]) == []
    assert check_accelerator(cfg_with("auto"), "cuda", platform="win32", providers=DML) == []


def test_check_says_when_the_accelerator_is_left_unused():
    (item,) = check_accelerator(cfg_with("cpu"), "cpu", platform="win32", providers=DML)
    assert (item.level, item.detail) == ("info", "DirectML is here, unused (--device cpu); --device auto uses it")


# -- --device cuda without a GPU ---------------------------------------------------------------------

NO_CUPY = (False, "CuPy does not import (ModuleNotFoundError: No module named 'cupy')")
NO_GPU = (False, "no NVIDIA driver: nvidia-smi is not on PATH")


def test_device_cuda_without_a_gpu_says_so_first_then_what_to_install():
    with pytest.raises(DeviceError) as ei:
        resolve_device(cfg_with("cuda", "onnxruntime"), cuda=lambda: NO_CUPY, gpu=lambda: NO_GPU)
    assert str(ei.value) == (
        "--device cuda asked, but no CUDA GPU was found (no NVIDIA driver: nvidia-smi is not on PATH) "
        "(use --device cpu here; a machine with an NVIDIA GPU and its driver needs CuPy (pip install "
        "'fastswap-cam[cuda13]', or [cuda] for CUDA 12) and onnxruntime-gpu (pip uninstall onnxruntime, then "
        "pip install onnxruntime-gpu))"
    )


def test_device_cuda_with_a_gpu_but_no_cupy_names_what_is_missing():
    with pytest.raises(DeviceError) as ei:
        resolve_device(cfg_with("cuda", "torch"), cuda=lambda: NO_CUPY, gpu=lambda: (True, "GPU 0: NVIDIA H200"))
    assert ei.value.message == "--device cuda asked, but CuPy does not import (ModuleNotFoundError: No module named 'cupy')"
    assert ei.value.hint == (
        "install CuPy (pip install 'fastswap-cam[cuda13]', or [cuda] for CUDA 12) and PyTorch with CUDA (pytorch.org), "
        "or use --device cpu"
    )


def test_device_auto_without_a_gpu_runs_on_the_cpu_without_asking_nvidia_smi():
    def never():
        raise AssertionError("nvidia-smi asked for --device auto")

    assert resolve_device(cfg_with("auto"), cuda=lambda: NO_CUPY, gpu=never) == (
        "cpu",
        "no usable GPU: CuPy does not import (ModuleNotFoundError: No module named 'cupy')",
    )


def test_cuda_gpu_found_reads_nvidia_smi():
    assert cuda_gpu_found(which=lambda name: None) == NO_GPU

    def smi(stdout: str, rc: int = 0, stderr: str = ""):
        return lambda cmd, **kw: subprocess.CompletedProcess(cmd, rc, stdout, stderr)

    found = cuda_gpu_found(which=lambda n: "/usr/bin/nvidia-smi", run=smi("GPU 0: NVIDIA H200 (UUID: GPU-1)\n"))
    assert found == (True, "GPU 0: NVIDIA H200 (UUID: GPU-1)")
    failed = smi("", 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    assert cuda_gpu_found(which=lambda n: "nvidia-smi", run=failed) == (
        False,
        "nvidia-smi lists no GPU (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)",
    )
