"""Compiled engines built in other processes (vcam.engines.autobuild): one build per entry at a
time (its lock), a failed build remembered and never retried by a daemon, the progress line.

Nothing here compiles a network: the lock test gives the waiting job a finished entry, the failure
test points Inductor at a C++ compiler that does not exist (a real failure, within seconds). The
full background build is tests/runtime/test_autocompile.py.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from conftest import need_torch

from vcam.models import standin


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return standin.write("inswapper_128", tmp_path_factory.mktemp("m") / "inswapper_128.onnx", tiny=True, seed=3)


def feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "target": rng.random((n, 3, 128, 128), dtype=np.float32),
        "source": rng.standard_normal((n, 512)).astype(np.float32),
    }


def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_progress_line_counts_sizes_done_and_the_time_left():
    from vcam.engines.autobuild import BuildProgress, deal, default_jobs

    now = 1000.0
    p = BuildProgress(sizes=["1", "2", "4", "8"], done=["1", "2"], current={"4": now - 10}, durations=[30.0, 30.0], jobs=1)
    assert p.text(now) == "compiling engines: 2/4, ~50 s left"  # 20 s of batch 4, then 30 s of batch 8
    assert BuildProgress(sizes=["1", "2"], guess_s=90.0).text(now) == "compiling engines: 0/2, ~3 min left"
    assert BuildProgress(sizes=["1", "2"], done=["1"], failed={"2": "x"}).text(now) == ""  # nothing left
    one = BuildProgress(sizes=["1-8"], current={"1-8": now - 30}, guess_s=90.0)  # the one artifact of every size
    assert one.text(now) == "compiling engines: 0/1, ~60 s left"
    assert deal([8, 1, 4, 2], 2) == [[1, 4], [2, 8]] and deal([1, 2], 4) == [[1], [2]]
    assert default_jobs("cpu", 4) == 1 and 1 <= default_jobs("cuda", 4) <= 4


@pytest.mark.slow
def test_an_entry_another_process_builds_is_waited_for_and_never_built_twice(model, tmp_path):
    """While one process holds an entry's lock, the loader leaves that size to it (or waits), and a
    build job (a second daemon's) waits without building; once the holder's entry is there the job
    takes it as built. `vcam check`'s view of running jobs says who waits."""
    need_torch()
    from vcam.engines import artifacts, item_shapes
    from vcam.engines.autobuild import BackgroundBuild, running_builds
    from vcam.engines.compiled import job_spec, torch_engine

    cache = tmp_path / "engines"
    engine = torch_engine(model, device="cpu", max_batch=1, compile="load", cache_dir=cache, warmup=False)
    items = item_shapes(engine.inputs, None)
    key, path = engine.loader.target(1, items)
    held = artifacts.lock(path)
    held.acquire()
    try:
        assert artifacts.locked(path)
        assert engine.loader.build([1], items, wait_locked=False) == [("1", "busy", 0.0)]
        job = BackgroundBuild(job_spec(engine, cache, items), [1], name="inswapper", precision="fp32", nice=0, wait_locked=True)
        until(lambda: job.progress().waiting == ["1"], 120, "the job to wait for the lock")
        time.sleep(1.0)
        assert job.running and not path.exists() and not artifacts.build_log(path).exists()  # nothing built meanwhile
        seen = running_builds(cache)
        assert seen is not None and seen.waiting == ["1"] and seen.text().startswith("compiling engines: 0/1")
        # the holder finishes its entry (here: written by hand) and lets go
        path.write_bytes(b"built elsewhere")
        path.with_name(path.name + ".json").write_text(json.dumps({"key": key.to_json(), "inputs": ["@0", "@1"]}))
    finally:
        held.release()
    assert job.wait(60) and job.returncodes == [0]
    state = job.progress()
    assert state.done == ["1"] and state.durations == [] and not state.failed  # cached, not built
    assert path.read_bytes() == b"built elsewhere"
    job.stop()
    assert running_builds(cache) is None
    engine.close()


@pytest.mark.slow
def test_a_failed_background_build_is_one_warning_uncompiled_swapping_and_no_retry(model, tmp_path, monkeypatch, caplog):
    need_torch()
    monkeypatch.delenv("VCAM_NO_BACKGROUND_COMPILE")
    from vcam.engines import artifacts
    from vcam.engines.compiled import torch_engine
    from vcam.engines.torch import TorchEngine

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))  # Inductor's CPU kernels cannot be compiled
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cache = tmp_path / "engines"
    f = feeds(1, seed=4)
    want = TorchEngine(model, device="cpu", max_batch=1).run(f)[0]
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        engine = torch_engine(model, device="cpu", max_batch=1, compile="background", cache_dir=cache)
        assert engine.loader._builder is not None and engine.compile_progress.startswith("compiling engines: 0/1")
        # swapping at once, uncompiled (within float32 reordering: on a loaded machine two calls of
        # the same network once differed by 2.5e-5, a product split differently between threads)
        assert np.abs(engine.run(f)[0] - want).max() < 1e-4
        assert engine.wait_compiled(timeout=300)
        out = engine.run(f)[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "compiling for batch 1 failed" in warnings[0], warnings
    assert "vcam engines build --batch 1" in warnings[0]
    assert engine.compiled_batches == () and engine.compile_progress == "" and np.abs(out - want).max() < 1e-4
    path = engine.loader.target(1, {"target": (3, 128, 128), "source": (512,)})[1]
    assert artifacts.failure(path) is not None and not path.exists()
    engine.close()
    # the next start remembers it: one line, no build job
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        again = torch_engine(model, device="cpu", max_batch=1, compile="background", cache_dir=cache)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "failed before" in warnings[0] and again.loader._builder is None
    assert again.compile_progress == ""
    again.close()


@pytest.mark.slow
def test_a_daemons_background_build_is_one_job_for_one_artifact_and_falls_back_in_it(model, tmp_path, monkeypatch, caplog):
    """An engine of batch 1-4 without compiled engines starts one build job for one artifact (the
    progress line counts 0/1); where it fails (here: no C++ compiler, a real failure within
    seconds) the same job goes on with each size's, one after the other, and the progress line
    counts those; every failure is one line, the frames swap uncompiled throughout."""
    need_torch()
    monkeypatch.delenv("VCAM_NO_BACKGROUND_COMPILE")
    from vcam.engines import artifacts
    from vcam.engines.compiled import torch_engine

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cache = tmp_path / "engines"
    seen: set[str] = set()
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        engine = torch_engine(model, device="cpu", max_batch=4, compile="background", cache_dir=cache)
        builder = engine.loader._builder
        assert builder is not None and builder.jobs == [[1, 2, 4]] and builder.labels == ["1-4"]
        assert engine.compile_progress.startswith("compiling engines: 0/1, ~")
        f = feeds(1, seed=4)
        while engine.loader.loading:
            seen.add(engine.compile_progress.split(",")[0])
            assert np.isfinite(engine.run(f)[0]).all()
            time.sleep(0.05)
        assert engine.wait_compiled(timeout=300)
    assert "compiling engines: 0/1" in seen and "compiling engines: 0/3" in seen, seen
    assert builder.returncodes == [1]  # one process, and it built nothing
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "compiling one engine for batch 1-4 failed" in warnings[0] and "compiling each batch size instead" in warnings[0]
    assert len(warnings) == 4 and all("failed" in w and "runs uncompiled" in w for w in warnings[1:]), warnings
    assert engine.compiled_batches == () and engine.compile_progress == ""
    items = {"target": (3, 128, 128), "source": (512,)}
    assert artifacts.failure(engine.loader.dynamic_unit(items).path) is not None
    assert all(artifacts.failure(engine.loader.unit(b, items).path) is not None for b in (1, 2, 4))
    assert not list((cache / "compiled").glob("*.art"))
    engine.close()


def test_auto_builds_in_the_background_on_cuda_only_and_load_never(model, tmp_path, monkeypatch):
    """``auto`` builds where it pays (CUDA); on the CPU it loads only, as ``load`` does everywhere;
    ``VCAM_NO_BACKGROUND_COMPILE`` (benchmark sessions, the test suite) turns building off."""
    need_torch()
    from vcam.engines.compiled import torch_engine

    for env, mode, builds in (("", "auto", False), ("", "load", False), ("", "background", True), ("1", "background", False)):
        monkeypatch.setenv("VCAM_NO_BACKGROUND_COMPILE", env)
        engine = torch_engine(model, device="cpu", max_batch=1, compile=mode, cache_dir=tmp_path, warmup=False)
        assert engine.loader.builds is builds and engine.compile_mode == "auto", (env, mode)
        engine.close()


def test_jobs_side_by_side_time_their_kernels_in_turns(tmp_path, monkeypatch):
    """A job's Inductor benchmarks run under a lock the other jobs share (their compiling overlaps,
    their timing on the GPU does not)."""
    need_torch()
    from filelock import FileLock, Timeout
    from torch._inductor.runtime import benchmarking

    from vcam.engines.build_job import serialise_benchmarks

    lock_path = tmp_path / ".benchmark.lock"
    held: list[bool] = []

    def fake_benchmark(*args, **kwargs):
        try:
            FileLock(lock_path).acquire(timeout=0)  # another process's view (another fd)
            held.append(False)
        except Timeout:
            held.append(True)
        return 1.0

    bm = benchmarking.benchmarker
    monkeypatch.setattr(bm, "benchmark_gpu", fake_benchmark)
    monkeypatch.setattr(bm, "benchmark_gpu_with_cuda_graph", fake_benchmark, raising=False)
    assert serialise_benchmarks(lock_path)
    assert bm.benchmark_gpu(lambda: None) == 1.0 and bm.benchmark_gpu_with_cuda_graph(lambda: None) == 1.0
    assert held == [True, True]


def test_engines_build_on_cuda_without_a_gpu_names_the_builds_own_fixes(tmp_path):
    """`vcam engines build` has no --backend: its fixes are PyTorch with CUDA or --device cpu."""
    torch = need_torch()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the build would start")
    from typer.testing import CliRunner

    from vcam.cli import app

    r = CliRunner().invoke(app, ["engines", "build", "--device", "cuda", "--model", str(tmp_path / "inswapper_128.onnx")])
    assert r.exit_code == 6, r.output
    assert "compiling engines needs PyTorch: torch sees no CUDA device" in r.output and "--device cpu" in r.output
    assert "use --backend" not in r.output
