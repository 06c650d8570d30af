"""Compiled swap networks (vcam.engines.compiled): built once into the engine cache, loaded on later
starts, a bad entry answered with one log line; on the CPU (Inductor's C++ kernels) and on CUDA.

The builds are real TorchInductor compiles of the tiny inswapper stand-in (about 15 s each on two
CPU cores); one module fixture builds batch sizes 1 and 2 and the tests copy its cache.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch, require, vcam_cli

from vcam.models import standin

try:
    import torch
except ImportError:  # CI without the torch extra
    torch = None

TOL = 1e-4  # compiled against eager, float32: reassociated sums only
# The module's builds take 15 s each on two idle cores, minutes on a shared busy machine.
pytestmark = pytest.mark.timeout(900)


def need_compiler():
    if torch is None:
        require("torch", "PyTorch is not installed")
    if not (shutil.which("g++") or shutil.which("c++")):
        require("compiler", "Inductor's CPU kernels need a C++ compiler (g++)")


def feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "target": rng.random((n, 3, 128, 128), dtype=np.float32),
        "source": rng.standard_normal((n, 512)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    a = standin.write("inswapper_128", root / "inswapper_a.onnx", tiny=True, seed=3)
    b = standin.write("inswapper_128", root / "inswapper_b.onnx", tiny=True, seed=4)  # other weights, same shapes
    return a, b


@pytest.fixture(scope="module")
def built(models, tmp_path_factory):
    """An engine cache with batch sizes 1 and 2 of the tiny inswapper built on the CPU."""
    need_compiler()
    from vcam.engines.compiled import torch_engine

    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    cache = tmp_path_factory.mktemp("engines")
    engine = torch_engine(models[0], device="cpu", max_batch=2, compile="build", cache_dir=cache)
    yield cache, engine
    engine.close()
    mp.undo()


@pytest.fixture
def cache(built, tmp_path, monkeypatch):
    """A private copy of the built cache (tests remove and damage entries)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(built[0].parent / "inductor0"))
    dst = tmp_path / "engines"
    shutil.copytree(built[0], dst)
    return dst


def arts(cache: Path) -> list[Path]:
    return sorted((cache / "compiled").glob("*.art"))


@pytest.mark.slow
def test_build_writes_one_artifact_per_batch_size_and_matches_eager(built, models):
    from vcam.engines.torch import TorchEngine

    cache, engine = built
    files = arts(cache)
    assert [f.name.split(".")[2] for f in files] == ["b1", "b2"]
    for f in files:  # the sidecar: the key in clear text and the graph's inputs
        meta = json.loads(Path(str(f) + ".json").read_text())
        assert meta["key"]["precision"] == "fp32" and meta["key"]["gpu"].startswith("cpu ")
        assert "torch " + torch.__version__ in meta["key"]["library"]
        assert "@0" in meta["inputs"] and "@1" in meta["inputs"]
        assert Path(str(f) + ".log").is_file()  # what the compiler said, not on the user's terminal
    assert engine.compiled_batches == (1, 2) and "compiled batch 1,2" in engine.describe()
    eager = TorchEngine(models[0], device="cpu", max_batch=2)
    for n in (1, 2):
        f = feeds(n, seed=n)
        got, want = engine.run(f)[0], eager.run(f)[0]
        assert np.abs(got - want).max() < TOL
        assert not np.array_equal(got, want)  # the compiled code ran, not the module


@pytest.mark.slow
def test_auto_loads_built_sizes_in_the_background(cache, models):
    """The built sizes load in a background thread and are adopted at a call; the interpreter's
    switch interval, shortened while they load, is the same again afterwards."""
    import sys

    from vcam.engines.compiled import torch_engine
    from vcam.engines.torch import TorchEngine

    interval = sys.getswitchinterval()
    engine = torch_engine(models[0], device="cpu", max_batch=2, compile="auto", cache_dir=cache)
    assert engine.wait_compiled(timeout=120)
    assert sys.getswitchinterval() == interval
    f = feeds(2, seed=7)
    out = engine.run(f)[0]  # the call adopts what the loader finished
    assert engine.compiled_batches == (1, 2)
    assert np.abs(out - TorchEngine(models[0], device="cpu", max_batch=2).run(f)[0]).max() < TOL
    engine.close()


@pytest.mark.slow
def test_auto_imports_inductor_while_the_module_builds_only_when_an_artifact_is_there(cache, models, tmp_path, caplog):
    """With a built artifact of the architecture in the cache, the engine imports what a load needs
    in a thread of its own from its construction on (the load that starts with the frames then has
    only the artifact left), and the load and the adopted engine are as before; without one, or
    with compiling off, no such thread."""
    import sys

    from vcam.engines import artifacts
    from vcam.engines.compiled import torch_engine
    from vcam.engines.torch import TorchEngine

    assert artifacts.built_any(cache, "inswapper", "fp32")
    assert not artifacts.built_any(cache, "inswapper", "fp16")  # the tests built FP32 only
    assert not artifacts.built_any(tmp_path, "inswapper", "fp32")
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        engine = torch_engine(models[0], device="cpu", max_batch=2, compile="auto", cache_dir=cache)
        assert engine.loader._prepared is not None and engine.loader._prepared.name.endswith("-inductor")
        engine.loader._prepared.join(120)
        assert engine.wait_compiled(timeout=120)
    assert all(name in sys.modules for name in artifacts.LOAD_IMPORTS)
    assert [r.getMessage() for r in caplog.records if "Inductor imported" in r.getMessage()]
    f = feeds(2, seed=5)
    out = engine.run(f)[0]
    assert engine.compiled_batches == (1, 2)
    in_use = [r.getMessage() for r in caplog.records if "in use" in r.getMessage()]
    assert len(in_use) == 2 and all("after its load started; 0 earlier calls ran uncompiled" in m for m in in_use)
    assert np.abs(out - TorchEngine(models[0], device="cpu", max_batch=2).run(f)[0]).max() < TOL
    engine.close()
    for where, mode in ((tmp_path, "auto"), (cache, "off")):
        other = torch_engine(models[0], device="cpu", max_batch=2, compile=mode, cache_dir=where)
        assert other.loader._prepared is None
        other.close()


@pytest.mark.slow
def test_one_artifact_serves_every_weights_file_of_the_architecture(cache, models):
    from vcam.engines.compiled import torch_engine
    from vcam.engines.torch import TorchEngine

    engine = torch_engine(models[1], device="cpu", max_batch=2, compile="auto", cache_dir=cache)
    engine.wait_compiled(timeout=120)
    f = feeds(1, seed=9)
    got = engine.run(f)[0]
    assert engine.compiled_batches == (1, 2)
    want_b = TorchEngine(models[1], device="cpu", max_batch=2).run(f)[0]
    want_a = TorchEngine(models[0], device="cpu", max_batch=2).run(f)[0]
    assert np.abs(got - want_b).max() < TOL  # its own weights, bound at load
    assert np.abs(want_a - want_b).max() > 100 * TOL
    assert len(arts(cache)) == 2  # nothing new was built


def test_auto_without_artifacts_runs_uncompiled_and_says_how_to_build(models, tmp_path, caplog):
    need_torch()  # no compiler needed: nothing is built
    from vcam.engines.compiled import torch_engine

    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        engine = torch_engine(models[0], device="cpu", max_batch=2, compile="auto", cache_dir=tmp_path)
    assert engine.wait_compiled() and engine.compiled_batches == ()
    lines = [r.getMessage() for r in caplog.records if "vcam engines build" in r.getMessage()]
    assert len(lines) == 1 and "batch 1,2" in lines[0]
    assert engine.run(feeds(1, seed=1))[0].shape == (1, 3, 128, 128)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "foreign_key", "no_sidecar"])
def test_a_bad_entry_is_removed_in_auto_and_rebuilt_in_build(cache, models, caplog, damage):
    from vcam.engines.compiled import torch_engine

    bad = arts(cache)[0]  # batch 1
    meta_path = Path(str(bad) + ".json")
    if damage == "truncated":
        bad.write_bytes(bad.read_bytes()[:1000])
    elif damage == "foreign_key":  # a file copied from another GPU under this name
        meta = json.loads(meta_path.read_text())
        meta["key"]["gpu"] = "NVIDIA Other (sm_80)"
        meta_path.write_text(json.dumps(meta))
    else:
        meta_path.unlink()
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        engine = torch_engine(models[0], device="cpu", max_batch=2, compile="auto", cache_dir=cache)
        engine.wait_compiled(timeout=120)
        out = engine.run(feeds(1, seed=3))[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "batch 1" in warnings[0] and "vcam engines build" in warnings[0], warnings
    assert engine.compiled_batches == (2,) and np.isfinite(out).all()
    assert not bad.exists() and not meta_path.exists() and not Path(str(bad) + ".log").exists()  # removed, never trusted
    engine.close()
    if damage != "truncated":
        return
    # compile="build" puts it back, with one line
    caplog.clear()
    bad.write_bytes(b"\0" * 100)
    meta_path.write_text("{not json")
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        engine = torch_engine(models[0], device="cpu", max_batch=2, compile="build", cache_dir=cache)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rebuilding" in warnings[0]
    assert engine.compiled_batches == (1, 2) and bad.stat().st_size > 1000
    engine.close()


def test_compile_values():
    from vcam.engines.compiled import compile_mode

    assert [compile_mode(v) for v in (True, False, None, "auto", "BUILD", "off", "on", "Load", "background")] == [
        "build",
        "off",
        "off",
        "auto",
        "build",
        "off",
        "build",
        "load",
        "background",
    ]
    with pytest.raises(ValueError, match="auto, background, load, build, off"):
        compile_mode("fast")


def test_config_takes_the_modes_and_rejects_a_bool_with_the_fix(tmp_path):
    from vcam import config_file as config_mod
    from vcam.errors import ConfigError

    assert config_mod.load(None).pipeline.compile == "auto"
    p = tmp_path / "c.toml"
    p.write_text("[pipeline]\ncompile = true\n")
    with pytest.raises(ConfigError, match="'auto', 'background', 'load', 'build', 'off'"):
        config_mod.load(p)


@pytest.mark.slow
def test_cli_build_and_list(cache, models, monkeypatch):
    monkeypatch.setenv("VCAM_ENGINE_CACHE", str(cache))
    monkeypatch.setenv("COLUMNS", "200")
    r = vcam_cli("engines", "list")
    assert r.returncode == 0, r.stderr
    assert "2 compiled engines" in r.stdout and r.stdout.count("usable here") == 2
    # a size not built yet is built; the built ones are reported as cached
    r = vcam_cli("engines", "build", "--model", str(models[1]), "--device", "cpu", "--batch", "1", timeout=600)
    assert r.returncode == 0, r.stderr
    assert "cached" in r.stdout
    Path(str(arts(cache)[0]) + ".json").write_text("{")
    r = vcam_cli("engines", "list")
    assert r.returncode == 0 and "unreadable" in r.stdout and r.stdout.count("usable here") == 1
    r = vcam_cli("engines", "build", "--model", "no_such_model", "--device", "cpu")
    assert r.returncode != 0 and r.stderr.count("\n") <= 2 and "error:" in r.stderr


@pytest.mark.slow
@pytest.mark.gpu
def test_cuda_compiled_in_a_cuda_graph_matches_cudnn(models, tmp_path, monkeypatch):
    """On the device: a build (Inductor's defaults here; `vcam engines build` autotunes), the
    artifact replayed in the engine's CUDA graph against cuDNN, and the background load adopted
    between two run_device calls on a CuPy stream."""
    if torch is None or not torch.cuda.is_available():
        require("gpu", "no CUDA device")
    from vcam.engines import artifacts
    from vcam.engines.compiled import torch_engine
    from vcam.engines.torch import TorchEngine

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(artifacts, "build_options", lambda device: {})
    cache = tmp_path / "engines"
    ref = TorchEngine(models[0], device="cuda", fp16=True, max_batch=2)
    built = torch_engine(models[0], device="cuda", fp16=True, max_batch=2, compile="build", cache_dir=cache)
    assert built.compiled_batches == (1, 2) and built.cuda_graphs
    for n in (1, 2):
        f = feeds(n, seed=20 + n)
        a, b = built.run(f)[0].astype(np.float32), ref.run(f)[0].astype(np.float32)
        assert np.abs(a - b).max() < 2e-2 and np.abs(a - b).mean() < 2e-3, n
    built.close()
    import cupy

    auto = torch_engine(models[0], device="cuda", fp16=True, max_batch=2, compile="auto", cache_dir=cache)
    stream = cupy.cuda.Stream(non_blocking=True)
    f = feeds(2, seed=5)
    want = ref.run(f)[0].astype(np.float32)
    seen = set()
    for _ in range(400):  # the frame loop's pattern: input_buffers, write, run_device, read
        with stream:
            bufs = auto.input_buffers(2)
            for k, v in f.items():
                bufs[k][...] = cupy.asarray(v, dtype=bufs[k].dtype)
            out = auto.run_device(bufs, stream=stream)[0]
            got = cupy.asnumpy(out).astype(np.float32)
        seen.add(auto.compiled_for(2))
        assert np.abs(got - want).max() < 2e-2
        if auto.compiled_for(2) and not auto.loader.loading:
            break
    assert seen == {False, True} or auto.compiled_for(2)
    assert auto.compiled_batches == (1, 2)
    auto.close()


def test_a_generic_graph_runs_uncompiled_with_one_line(tmp_path, caplog):
    from vcam.engines.compiled import torch_engine

    if torch is None:
        require("torch", "PyTorch is not installed")
    path = standin.write("simswap_256", tmp_path / "simswap.onnx", tiny=True, seed=1)
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        engine = torch_engine(path, device="cpu", max_batch=1, compile="build", cache_dir=tmp_path / "engines")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "native architectures" in lines[0]
    assert engine.architecture is None and engine.compile_mode == "off" and engine.compiled_batches == ()
    assert not (tmp_path / "engines").exists()
