"""onnxruntime on the CPU keeps a model file's optimised graph in the engine cache: a later start
loads it (no optimisation pass) and computes the same outputs bit for bit; a damaged file is
rebuilt with one warning; a changed model file is a new key; an unwritable cache is not fatal."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from vcam.engines.ort import OrtEngine, optimized_path
from vcam.models import standin


@pytest.fixture()
def tiny(tmp_path) -> Path:
    return standin.write("inswapper_128", tmp_path / "inswapper_128.onnx", tiny=True, seed=3)


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    src = rng.standard_normal((2, 512)).astype(np.float32)
    return {"target": rng.random((2, 3, 128, 128), dtype=np.float32), "source": src / np.linalg.norm(src, axis=1, keepdims=True)}


@pytest.fixture()
def opened(monkeypatch) -> list[str]:
    """The sources every onnxruntime session is created from, in order."""
    seen: list[str] = []
    real = onnxruntime.InferenceSession

    class Recording(real):
        def __init__(self, src, sess_options=None, providers=None):
            seen.append(src if isinstance(src, str) else "<bytes>")
            super().__init__(src, sess_options=sess_options, providers=providers)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Recording)
    return seen


def test_second_start_loads_the_optimised_graph_bit_exact(tiny, tmp_path, opened):
    cache = tmp_path / "cache"
    first = OrtEngine(tiny, cache_dir=cache)
    cached = optimized_path(tiny, cache)
    assert cached is not None and cached.is_file() and opened == [str(tiny)]
    second = OrtEngine(tiny, cache_dir=cache)
    assert opened == [str(tiny), str(cached)]
    for a, b in zip(first.run(feeds()), second.run(feeds())):
        assert np.array_equal(a, b)
    assert [i.name for i in second.inputs] == [i.name for i in first.inputs]


def test_damaged_graph_is_rebuilt_with_one_warning(tiny, tmp_path, caplog, opened):
    cache = tmp_path / "cache"
    want = OrtEngine(tiny, cache_dir=cache).run(feeds())
    cached = optimized_path(tiny, cache)
    cached.write_bytes(b"\x00not onnx")
    with caplog.at_level(logging.WARNING, logger="vcam.engines.ort"):
        e = OrtEngine(tiny, cache_dir=cache)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "damaged" in warnings[0] and "rebuilding" in warnings[0]
    assert all(np.array_equal(a, b) for a, b in zip(e.run(feeds()), want))
    assert cached.stat().st_size > 100  # written again
    OrtEngine(tiny, cache_dir=cache)
    assert opened[-1] == str(cached)


def test_a_changed_model_file_is_a_new_key(tiny, tmp_path):
    cache = tmp_path / "cache"
    OrtEngine(tiny, cache_dir=cache)
    before = optimized_path(tiny, cache)
    standin.write("inswapper_128", tiny, tiny=True, seed=4)
    os.utime(tiny, ns=(tiny.stat().st_atime_ns, tiny.stat().st_mtime_ns + 1))
    after = optimized_path(tiny, cache)
    assert after != before
    fresh = OrtEngine(tiny, cache_dir=cache).run(feeds())[0]
    assert sorted(p.name for p in (cache / "ort").glob("*.onnx")) == [after.name]  # the old one is gone
    direct = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(None, feeds())[0]
    np.testing.assert_allclose(fresh, direct, rtol=1e-4, atol=1e-5)


def test_unwritable_cache_still_runs(tiny, tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder should be")
    e = OrtEngine(tiny, cache_dir=cache)
    assert e.run(feeds())[0].shape == (2, 3, 128, 128)


def test_model_bytes_are_not_cached(tmp_path):
    from vcam.stages.detections import embedded_weights

    cache = tmp_path / "cache"
    e = OrtEngine(embedded_weights(), name="retinaface", cache_dir=cache)
    assert e.inputs and not (cache / "ort").exists()


def test_a_short_lived_engine_neither_reads_nor_writes_the_cache_and_computes_the_same(tiny, tmp_path, opened):
    """A hand-over start's CPU swapper opens the model file with the basic optimisations: no
    optimised graph written (a fresh machine would spend seconds on it), none read, and the same
    outputs as the cached engine within float32 reordering."""
    cache = tmp_path / "cache"
    quick = OrtEngine(tiny, cache_dir=cache, short_lived=True)
    assert optimized_path(tiny, cache) is not None and not optimized_path(tiny, cache).is_file()
    full = OrtEngine(tiny, cache_dir=cache)  # writes the cache
    again = OrtEngine(tiny, cache_dir=cache, short_lived=True)  # and still does not read it
    assert opened == [str(tiny)] * 3
    want = full.run(feeds())
    for eng in (quick, again):
        got = eng.run(feeds())
        assert len(got) == len(want) and all(np.allclose(a, b, atol=1e-4) for a, b in zip(got, want))


def test_small_calls_run_on_one_thread_and_compute_the_same(tiny, tmp_path, monkeypatch):
    """``lean_below`` (the detector's one tracked region): calls of fewer input elements run on a
    second session of one thread, larger ones on onnxruntime's own threads; the same outputs. A
    thread count of the caller's, or one core, keeps one session."""
    import vcam.engines.ort as ort_mod

    monkeypatch.setattr(ort_mod, "usable_cores", lambda: 2)
    one = feeds()["target"][:1].size  # the first input's elements in a one-item call
    eng = OrtEngine(tiny, cache_dir=tmp_path / "cache", lean_below=one + 1)
    assert eng._lean is not None and eng._lean.get_session_options().intra_op_num_threads == 1
    ran: list[str] = []
    for name in ("session", "_lean"):
        real = getattr(eng, name)

        class Recorded:
            def __init__(self, real, name):
                self.real, self.name = real, name

            def run(self, *a, **k):
                ran.append(self.name)
                return self.real.run(*a, **k)

        setattr(eng, name, Recorded(real, name))
    both = feeds()
    small = eng.run({k: v[:1] for k, v in both.items()})
    whole = eng.run(both)
    assert ran == ["_lean", "session"]
    assert all(np.allclose(a, b[:1], atol=1e-4) for a, b in zip(small, whole))
    assert OrtEngine(tiny, cache_dir=tmp_path / "cache", lean_below=one + 1, threads=2)._lean is None
    monkeypatch.setattr(ort_mod, "usable_cores", lambda: 1)
    assert OrtEngine(tiny, cache_dir=tmp_path / "cache", lean_below=one + 1)._lean is None
