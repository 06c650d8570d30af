"""TensorRT backend: the engine cache (keys, paths, atomic files) and the build progress run
everywhere; building and running an engine runs only where ``import tensorrt`` works and a CUDA
device exists (skipped with that reason elsewhere, a failure when VCAM_REQUIRE names tensorrt)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from vcam.engines import cache
from vcam.engines.tensorrt import BuildProgress, TensorRTEngine
from vcam.errors import EngineUnavailable
from vcam.models import standin

try:
    import tensorrt  # noqa: F401

    HAVE_TRT = True
except ImportError:
    HAVE_TRT = False

BASE = dict(
    model_sha256="ab" * 32,
    gpu="NVIDIA H200 (sm_90)",
    library="tensorrt 10.7.0",
    precision="fp16",
    profile={"target": ((1, 3, 128, 128), (8, 3, 128, 128), (8, 3, 128, 128)), "source": ((1, 512), (8, 512), (8, 512))},
)


def key(**changes) -> cache.EngineKey:
    return cache.EngineKey.make(**{**BASE, **changes})


# -- cache keys ------------------------------------------------------------------------------------


def test_key_is_stable_and_independent_of_profile_order():
    a = key()
    b = key(profile=dict(reversed(list(BASE["profile"].items()))))
    assert a == b and a.digest() == b.digest()
    assert len(a.digest()) == 16 and int(a.digest(), 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "cd" * 32},
        {"gpu": "NVIDIA GeForce RTX 4090 (sm_89)"},
        {"library": "tensorrt 10.8.0"},
        {"precision": "fp32"},
        {"profile": {**BASE["profile"], "target": ((1, 3, 128, 128), (4, 3, 128, 128), (4, 3, 128, 128))}},
    ],
    ids=["model", "gpu", "tensorrt", "precision", "profile"],
)
def test_every_key_field_changes_the_file(change, tmp_path):
    model = tmp_path / "inswapper_128.onnx"
    a, b = key(), key(**change)
    assert a.digest() != b.digest()
    assert cache.engine_path(tmp_path, model, a) != cache.engine_path(tmp_path, model, b)


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be fp16 or fp32, got 'int8'"):
        key(precision="int8")


def test_profile_for_batch_and_dynamic_dims():
    prof = cache.profile_for(
        {"target": ("N", 3, 128, 128), "source": (None, 512), "input": ("N", 3, "H", "W")}, 8, dynamic=(32, 640, 1920)
    )
    assert prof["target"] == ((1, 3, 128, 128), (8, 3, 128, 128), (8, 3, 128, 128))
    assert prof["source"] == ((1, 512), (8, 512), (8, 512))
    assert prof["input"] == ((1, 3, 32, 32), (8, 3, 640, 640), (8, 3, 1920, 1920))
    fixed = cache.profile_for({"x": (1, 3, 64, 64)}, 8)
    assert fixed["x"] == ((1, 3, 64, 64),) * 3  # a fixed batch stays fixed
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        cache.profile_for({"x": ("N", 4)}, 0)


def test_engine_path_names_model_precision_and_digest(tmp_path):
    k = key()
    path = cache.engine_path(tmp_path, "/models/inswapper_128.onnx", k)
    assert path == tmp_path / f"inswapper_128.fp16.{k.digest()}.plan"


def test_store_then_lookup_roundtrip_and_mismatch(tmp_path):
    k = key()
    path = cache.engine_path(tmp_path / "engines", "m.onnx", k)
    assert cache.lookup(path, k) is None  # nothing built yet
    cache.store(path, k, b"PLAN-BYTES")
    assert cache.lookup(path, k) == b"PLAN-BYTES"
    assert json.loads(cache.sidecar(path).read_text())["model_sha256"] == "ab" * 32
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []  # no temp leftovers
    # a plan whose sidecar records another key is never trusted (renamed or hand-copied file)
    other = key(gpu="other GPU (sm_80)")
    assert cache.lookup(path, other) is None
    cache.sidecar(path).write_text("{not json")
    assert cache.lookup(path, k) is None


def test_key_json_roundtrip():
    k = key()
    assert cache.EngineKey.from_json(json.loads(json.dumps(k.to_json()))) == k
    stale = dict(k.to_json(), key_version=0)
    with pytest.raises(ValueError, match="engine key version 0"):
        cache.EngineKey.from_json(stale)


def test_sha256_file_matches_hashlib(tmp_path):
    data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)  # spans several read chunks
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert cache.sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_default_cache_dir_is_the_checkout_engines_folder(monkeypatch, tmp_path):
    repo = Path(cache.__file__).resolve().parents[2]
    monkeypatch.delenv("VCAM_ENGINE_CACHE")
    assert cache.default_cache_dir() == repo / "engines"
    monkeypatch.setenv("VCAM_ENGINE_CACHE", str(tmp_path))
    assert cache.default_cache_dir() == tmp_path
    assert cache.resolve_cache_dir("~/x") == Path.home() / "x"


# -- build progress --------------------------------------------------------------------------------


def test_build_progress_reports_phases():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=100)
    with BuildProgress("Building TensorRT engine for m.onnx", console=console) as ui:
        ui.phase_start("Building engine", None, 3)
        ui.phase_start("Tactic selection", "Building engine", 2)
        assert ui.step_complete("Tactic selection", 0) is True
        ui.phase_finish("Tactic selection")
        for step in range(3):
            ui.step_complete("Building engine", step)
        ui.phase_finish("Building engine")
        ui.cancelled = True
        assert ui.step_complete("Building engine", 3) is False  # a cancelled build tells TensorRT to stop
        assert [t.description for t in ui.progress.tasks] == ["Building engine"]
        assert ui.progress.tasks[0].completed == 3
    text = out.getvalue()
    assert "Building TensorRT engine for m.onnx" in text and "Building engine" in text


# -- availability ----------------------------------------------------------------------------------


def test_not_installed_reason():
    if HAVE_TRT:
        pytest.skip("tensorrt is installed here")
    assert TensorRTEngine.unavailable_reason("cuda") == "tensorrt not installed"
    with pytest.raises(EngineUnavailable, match=r"^tensorrt not installed \(install TensorRT 10"):
        TensorRTEngine("any.onnx", device="cuda")


def test_cpu_device_is_refused():
    assert TensorRTEngine.unavailable_reason("cpu") == "TensorRT runs on CUDA only (device is cpu)"


# -- real TensorRT -----------------------------------------------------------------------------------


def test_build_cache_and_parity(tmp_path):
    if not HAVE_TRT:
        require("tensorrt", "tensorrt is not installed (its wheels fetch NVIDIA binaries at install time)")
    reason = TensorRTEngine.unavailable_reason("cuda")
    if reason:
        require("cuda", reason)
    import onnxruntime as ort

    model = standin.write("inswapper_128", tmp_path / "inswapper_tiny.onnx", tiny=True)
    engines = tmp_path / "engines"
    first = TensorRTEngine(model, fp16=False, max_batch=4, cache_dir=engines, progress=False)
    assert first.built and first.engine_file.is_file()
    rng = np.random.default_rng(0)
    feeds = {"target": rng.random((3, 3, 128, 128), dtype=np.float32), "source": rng.standard_normal((3, 512)).astype(np.float32)}
    (out,) = first.run(feeds)
    (ref,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2  # TF32 tactics allowed
    again = TensorRTEngine(model, fp16=False, max_batch=4, cache_dir=engines, progress=False)
    assert not again.built and again.engine_file == first.engine_file
    half = TensorRTEngine(model, fp16=True, max_batch=4, cache_dir=engines, progress=False)
    assert half.built and half.engine_file != first.engine_file
