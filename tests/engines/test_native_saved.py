"""Saved native builds (vcam.engines.native.saved): a start with a saved build does not read the ONNX
file and runs the same weights bit for bit; a damaged save is rebuilt with one warning; the key
follows the model file. Torch on the CPU is enough."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import WINDOWS, need_torch, windows_lacks

from vcam.models import standin

# The saves are memory-mapped (torch.load(mmap=True)), and Windows rewrites or removes no file a live
# engine maps. (Under Wine 8.0, freeing those engines early with gc, or mapping a save cut in half,
# left the process corrupt: later native calls crashed.)
MAPPED = "rewriting a file a live engine memory-maps"


@pytest.fixture()
def tiny(tmp_path) -> Path:
    return standin.write("inswapper_128", tmp_path / "inswapper_128.onnx", tiny=True, seed=3)


def feeds(n: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    src = rng.standard_normal((n, 512)).astype(np.float32)
    return {"target": rng.random((n, 3, 128, 128), dtype=np.float32), "source": src / np.linalg.norm(src, axis=1, keepdims=True)}


def engine(path, cache, **kw):
    from vcam.engines.torch import TorchEngine

    return TorchEngine(path, device="cpu", cache_dir=cache, max_batch=2, **kw)


def first_build(path, cache):
    """An engine built from the ONNX file, its save written."""
    from vcam.engines.native import saved

    e = engine(path, cache)
    assert not e.from_saved
    assert saved.wait_saves(60)
    return e


def saves(cache: Path) -> list[Path]:
    return sorted((cache / "native").glob("*.pt"))


def test_saved_build_is_bit_exact_and_skips_the_onnx_parse(tiny, tmp_path, monkeypatch):
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    fresh = first_build(tiny, cache)
    assert [p.name.split(".")[0] for p in saves(cache)] == ["inswapper_128"]
    want = fresh.run(feeds())

    def no_parse(*a, **k):
        raise AssertionError("the ONNX file was read although a saved build exists")

    monkeypatch.setattr(saved.OnnxGraph, "load", no_parse)
    again = engine(tiny, cache)
    assert again.from_saved and again.architecture == "inswapper"
    assert [(i.name, i.shape, i.dtype) for i in again.inputs] == [(i.name, i.shape, i.dtype) for i in fresh.inputs]
    assert [o.name for o in again.outputs] == [o.name for o in fresh.outputs]
    got = again.run(feeds())
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    # the weights are the file's pages (memory-mapped), not a copy
    assert all(not p.is_meta for p in again.module.parameters())


@windows_lacks(MAPPED)
def test_damaged_save_is_rebuilt_with_one_warning(tiny, tmp_path, caplog):
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    want = first_build(tiny, cache).run(feeds())
    (path,) = saves(cache)
    for damage in (b"not a torch archive", path.read_bytes()[: path.stat().st_size // 2]):
        path.write_bytes(damage)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vcam.engines.torch"):
            e = engine(tiny, cache)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "damaged" in warnings[0].getMessage() and "rebuilding" in warnings[0].getMessage()
        assert not e.from_saved
        assert all(np.array_equal(g, w) for g, w in zip(e.run(feeds()), want))
        assert saved.wait_saves(60)
        assert engine(tiny, cache).from_saved  # written again, good again


def test_save_with_the_wrong_weights_is_rebuilt(tiny, tmp_path, caplog):
    """A save whose weights do not fit the module (another model's, renamed) is not trusted."""
    need_torch()
    import torch

    cache = tmp_path / "cache"
    first_build(tiny, cache)
    (path,) = saves(cache)
    blob = torch.load(path, weights_only=True)
    name = next(iter(blob["state"]))
    blob["state"][name] = torch.zeros(3)
    torch.save(blob, path)
    with caplog.at_level(logging.WARNING, logger="vcam.engines.torch"):
        e = engine(tiny, cache)
    assert not e.from_saved
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_key_follows_the_model_file(tiny, tmp_path):
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    before = saved.saved_path(tiny, cache)
    first_build(tiny, cache)
    assert saves(cache) == [before]
    assert saved.saved_path(tiny, cache) == before  # stable while the file is unchanged
    want = engine(tiny, cache).run(feeds())

    standin.write("inswapper_128", tiny, tiny=True, seed=4)  # other weights, same name and size
    os.utime(tiny, ns=(before.stat().st_atime_ns, tiny.stat().st_mtime_ns + 1))
    after = saved.saved_path(tiny, cache)
    assert after != before
    e = engine(tiny, cache)
    assert not e.from_saved  # rebuilt from the new file, not the old save
    got = e.run(feeds())
    assert not np.array_equal(got[0], want[0])
    assert saved.wait_saves(60)
    if WINDOWS:  # the engine of `want` still maps the old save: a later save removes it
        assert after in saves(cache)
    else:
        assert saves(cache) == [after]  # the old model's save is gone
    again = engine(tiny, cache)
    assert again.from_saved and np.array_equal(again.run(feeds())[0], got[0])


def test_key_changes_with_the_converter_and_ignores_unrelated_models(tiny, tmp_path, monkeypatch):
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    a = saved.saved_path(tiny, cache)
    monkeypatch.setattr(saved, "converter_digest", lambda: "another converter")
    assert saved.saved_path(tiny, cache) != a
    monkeypatch.undo()
    # a graph without a native module is never saved
    other = standin.write("arcface_w600k_r50", tmp_path / "arcface.onnx", tiny=True)
    e = engine(other, cache)
    assert e.architecture is None and not e.from_saved
    assert saved.wait_saves(60)
    assert saves(cache) == []


def test_embedded_detector_bytes_are_saved_too(tmp_path):
    need_torch()
    from retinaface.weights import WEIGHTS

    from vcam.engines.native import saved
    from vcam.engines.torch import TorchEngine

    cache = tmp_path / "cache"
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 96)).astype(np.float32)
    a = TorchEngine(WEIGHTS, name="retinaface", device="cpu", cache_dir=cache, max_batch=1)
    assert saved.wait_saves(60)
    b = TorchEngine(WEIGHTS, name="retinaface", device="cpu", cache_dir=cache, max_batch=1)
    assert b.from_saved and b.architecture == "retinaface"
    for g, w in zip(b.run({"input": x}), a.run({"input": x})):
        assert np.array_equal(g, w)


def test_unwritable_cache_is_not_fatal(tiny, tmp_path, caplog):
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        e = engine(tiny, cache)
        assert saved.wait_saves(60)
    assert e.run(feeds())[0].shape == (2, 3, 128, 128)
    assert any("was not saved" in r.getMessage() for r in caplog.records)


@pytest.mark.gpu
def test_saved_build_on_cuda_fp16_has_the_same_weights_and_outputs(tiny, tmp_path):
    torch = need_torch()
    if not torch.cuda.is_available():
        from conftest import require

        require("cuda", "no CUDA device")
    from vcam.engines.native import saved
    from vcam.engines.torch import TorchEngine

    cache = tmp_path / "cache"
    fresh = TorchEngine(tiny, device="cuda", fp16=True, cache_dir=cache, max_batch=2)
    assert saved.wait_saves(60) and not fresh.from_saved
    again = TorchEngine(tiny, device="cuda", fp16=True, cache_dir=cache, max_batch=2)
    assert again.from_saved
    for (n, a), (_, b) in zip(fresh.module.state_dict().items(), again.module.state_dict().items()):
        assert a.dtype == b.dtype == torch.float16 and a.is_cuda and torch.equal(a, b), n
    for g, w in zip(again.run(feeds()), fresh.run(feeds())):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)


def test_prepare_writes_the_build_a_first_start_would_and_that_start_reads_no_onnx(tiny, tmp_path, monkeypatch):
    """`vcam models pull` writes the swap network's saved build (saved.prepare): an engine made after
    it takes the save without parsing the ONNX file; a second prepare keeps it; a damaged one is
    written again; a graph of no native architecture gets none."""
    need_torch()
    from vcam.engines.native import saved

    cache = tmp_path / "cache"
    path, written = saved.prepare(tiny, cache)
    assert written and saves(cache) == [path] and path == saved.saved_path(tiny, cache)
    assert saved.prepare(tiny, cache) == (path, False)
    stamp = path.stat().st_mtime_ns

    def no_parse(*a, **k):
        raise AssertionError("the ONNX file was read although pull wrote the saved build")

    with monkeypatch.context() as m:
        m.setattr(saved.OnnxGraph, "load", no_parse)
        e = engine(tiny, cache)
    assert e.from_saved and e.architecture == "inswapper" and path.stat().st_mtime_ns == stamp
    del e
    if not WINDOWS:  # a live engine's mapping kept Windows from rewriting it (MAPPED)
        path.write_bytes(b"not a torch archive")
        assert saved.prepare(tiny, cache) == (path, True) and saved.load(path).architecture == "inswapper"
    other = standin.write("arcface_w600k_r50", tmp_path / "arcface_w600k_r50.onnx", tiny=True)
    assert saved.prepare(other, cache) is None and len(saves(cache)) == 1


def test_models_pull_writes_the_gpu_build_of_a_swap_network_beside_a_driver(tiny, tmp_path, monkeypatch):
    """The CLI: `vcam models pull inswapper_128` on a file placed by hand verifies and locks it and,
    where an NVIDIA driver is installed, writes its GPU build (one `ok` line); without a driver it
    writes none."""
    need_torch()
    import shutil

    from typer.testing import CliRunner

    from vcam.cli.models import app
    from vcam.platform import native

    models = tmp_path / "m"
    models.mkdir()
    shutil.copy(tiny, models / "inswapper_128.onnx")
    standin.write("arcface_w600k_r50", models / "arcface_w600k_r50.onnx", tiny=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[models]\ndir = '{models.as_posix()}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfg))
    cache = tmp_path / "engines"
    monkeypatch.setenv("VCAM_ENGINE_CACHE", str(cache))
    runner = CliRunner()
    monkeypatch.setattr(native, "nvidia_driver", lambda **k: False)
    r = runner.invoke(app, ["pull", "inswapper_128", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "GPU build" not in r.output and not saves(cache)
    monkeypatch.setattr(native, "nvidia_driver", lambda **k: True)
    r = runner.invoke(app, ["pull", "inswapper_128", "--no-progress"])
    assert r.exit_code == 0, r.output
    [save] = saves(cache)
    assert f"ok {save} (its GPU build)" in r.output.replace("\n", ""), r.output
    r = runner.invoke(app, ["pull", "inswapper_128", "--no-progress"])
    assert "(its GPU build, already there)" in r.output.replace("\n", ""), r.output
