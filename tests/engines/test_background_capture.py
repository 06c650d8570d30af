"""Batch sizes captured in the background (TorchEngine.warmup, vcam.engines.threads.CaptureQueue):
the first size is captured at construction and the others by a thread while calls run; a call
that needs a size first captures it itself; close() stops the thread. The queue's own logic runs
on the CPU; the captures need CUDA (marked gpu)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch, require

from vcam.models import standin


def test_queue_captures_in_order_and_survives_a_failure(caplog):
    need_torch()
    from vcam.engines.threads import CaptureQueue

    seen: list[tuple[int, str]] = []

    def capture(b, items):
        if b == 4:
            raise RuntimeError("boom")
        seen.append((b, items))

    q = CaptureQueue(capture, "cpu", "model")
    with caplog.at_level(logging.INFO, logger="vcam.engines.torch"):
        q.put([2, 4, 8], "a")
        q.put([16], "b")
        assert q.wait(10)
    assert seen == [(2, "a"), (8, "a"), (16, "b")]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "batch 4" in warned[0] and "boom" in warned[0]
    each = [r.getMessage() for r in caplog.records if "captured in the background," in r.getMessage()]
    assert [m.split(": batch ")[1].split(" ")[0] for m in each] == ["2", "8", "16"]  # one line a size, with when
    assert all(" ms from " in m and " s after the start" in m for m in each)
    q.put([32], "c")  # a new thread after the first ended
    assert q.wait(10) and seen[-1] == (32, "c")


def test_a_size_a_call_runs_without_its_graph_is_captured_next():
    """CaptureQueue.want: a size the frames run eagerly (its graph not there yet) moves to the front
    of the queue; a size not queued (being captured, or of other items) changes nothing. Issue 39:
    four streams ran batch 4 eagerly while the queue captured 2 and 3 first, each eager call waiting
    out a capture."""
    need_torch()
    from types import SimpleNamespace

    from vcam.engines.threads import CaptureQueue
    from vcam.engines.torch import _graph_or_none

    seen: list[tuple[int, str]] = []
    first = threading.Event()
    go = threading.Event()

    def capture(b, items):
        seen.append((b, items))
        if len(seen) == 1:
            first.set()
            assert go.wait(10)

    q = CaptureQueue(capture, "cpu", "model")
    q.put([2, 3, 4, 5], "a")
    assert first.wait(10)  # 2 is being captured
    q.want(5, "a")
    q.want(2, "a")  # being captured now: nothing
    q.want(9, "a")  # never queued: nothing
    q.want(4, "b")  # other items: nothing
    # the engine's side: a call of batch 4 without its graph runs eagerly and asks for it first
    engine = SimpleNamespace(
        eager_first=True, _graph_key=lambda b, items: (b, items), _graphs={}, _later=q, batch_sizes=(1, 2, 3, 4, 5)
    )
    assert _graph_or_none(engine, 4, "a") is None
    go.set()
    assert q.wait(10)
    assert seen == [(2, "a"), (4, "a"), (5, "a"), (3, "a")]


def test_background_captures_take_cudnn_s_heuristics_unless_asked_and_other_threads_autotune(monkeypatch):
    """By default a capture in the queue's thread runs cuDNN's heuristic choice (autotuning beside the
    frames paused them 300-550 ms a size on the H200); $VCAM_TUNE_BACKGROUND=1 lets it autotune;
    every other thread may autotune either way."""
    need_torch()
    from vcam.engines import threads

    seen: list[bool] = []
    monkeypatch.delenv(threads.TUNE_BACKGROUND_ENV, raising=False)
    q = threads.CaptureQueue(lambda b, items: seen.append(threads.tuning_allowed()), "cpu", "model")
    q.put([1], None)
    assert q.wait(10)
    assert seen == [False] and threads.tuning_allowed()  # the queue's thread not, this one yes
    monkeypatch.setenv(threads.TUNE_BACKGROUND_ENV, "1")
    q.put([2], None)
    assert q.wait(10) and seen == [False, True]


def test_queue_close_stops_between_sizes():
    need_torch()
    from vcam.engines.threads import CaptureQueue

    started, release, seen = threading.Event(), threading.Event(), []

    def capture(b, items):
        started.set()
        release.wait(10)
        seen.append(b)

    q = CaptureQueue(capture, "cpu", "model")
    q.put([2, 4, 8], None)
    assert started.wait(10)
    closer = threading.Thread(target=q.close)
    closer.start()
    time.sleep(0.05)
    release.set()
    closer.join(10)
    assert seen == [2] and not q.running
    q.put([16], None)  # closed: nothing more runs
    assert q.wait(1) and seen == [2]


# -- on the GPU ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return standin.write("inswapper_128", tmp_path_factory.mktemp("m") / "inswapper_128.onnx", tiny=True, seed=3)


def need_cuda():
    torch = need_torch()
    if not torch.cuda.is_available():
        require("cuda", "no CUDA device")
    try:
        import cupy  # noqa: F401
    except ImportError:
        require("gpu", "CuPy is not installed")
    return torch


def feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((n, 512)).astype(np.float32)
    return {"target": rng.random((n, 3, 128, 128), dtype=np.float32), "source": src / np.linalg.norm(src, axis=1, keepdims=True)}


def keys(engine) -> set[int]:
    return {k[0] for k in engine._graphs}


@pytest.mark.gpu
def test_first_size_now_the_others_in_the_background(tiny):
    need_cuda()
    from vcam.engines.torch import TorchEngine

    ref = TorchEngine(tiny, device="cuda", max_batch=8, background_capture=False)
    assert keys(ref) == set(ref.batch_sizes) == set(range(1, 9))  # every size up to 8 (issue 28)
    e = TorchEngine(tiny, device="cuda", max_batch=8)
    assert 1 in keys(e)
    assert e.wait_graphs(120)
    assert keys(e) == set(e.batch_sizes)
    for n in (1, 3, 8):
        for got, want in zip(e.run(feeds(n)), ref.run(feeds(n))):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    e.close()
    ref.close()


@pytest.mark.gpu
def test_calls_run_while_the_background_captures(tiny):
    """Batch-1 calls replay their graph while the thread captures the rest; a call of 5 faces
    before its size is there captures it itself; every result matches the eager module."""
    torch = need_cuda()
    import cupy as cp

    from vcam.engines.torch import TorchEngine

    e = TorchEngine(tiny, device="cuda", max_batch=8)
    eager = TorchEngine(tiny, device="cuda", max_batch=8, cuda_graphs=False)
    stream = cp.cuda.Stream(non_blocking=True)
    calls = 0
    with stream:
        while e._later.running or calls < 3:
            f = feeds(1, calls)
            bufs = e.input_buffers(1)
            for k, v in f.items():
                bufs[k][...] = cp.asarray(v)
            out = e.run_device(bufs, stream=stream)
            stream.synchronize()
            want = eager.run(f)[0]  # graph against eager in FP32: cuDNN may pick other algorithms (2e-4 seen)
            np.testing.assert_allclose(cp.asnumpy(out[0]), want, rtol=1e-3, atol=1e-3)
            calls += 1
        big = feeds(5, 99)
        np.testing.assert_allclose(e.run(big)[0], eager.run(big)[0], rtol=1e-3, atol=1e-3)
    assert e.wait_graphs(120) and keys(e) == set(e.batch_sizes)
    torch.cuda.synchronize()
    e.close()
    eager.close()


@pytest.mark.gpu
def test_a_size_needed_first_is_captured_by_the_caller(tiny):
    need_cuda()
    from vcam.engines.torch import TorchEngine

    e = TorchEngine(tiny, device="cuda", max_batch=8, warmup=False)
    e.warmup(background=True)
    e.input_buffers(8)  # captures batch 8 here unless the thread got there first; never twice
    assert 8 in keys(e)
    assert e.wait_graphs(120) and keys(e) == set(e.batch_sizes)
    e.close()
    assert not e._later.running


@pytest.mark.gpu
def test_close_while_capturing_in_the_background(tiny):
    need_cuda()
    from vcam.engines.torch import TorchEngine

    e = TorchEngine(tiny, device="cuda", max_batch=32)
    e.close()
    assert not e._later.running


def test_gate_hold_release_is_idempotent_and_counted():
    from vcam.engines.gate import BackgroundGate

    g = BackgroundGate(patience=5)
    a, b = g.hold(), g.hold()
    a()
    a()  # twice: still one release
    assert not g._open.is_set()  # b still holds it
    t0 = time.perf_counter()
    threading.Timer(0.1, b).start()
    g.wait()
    assert g._open.is_set() and time.perf_counter() - t0 < 4
    with g.held():
        assert not g._open.is_set()
    assert g._open.is_set()


def _start_then_release(threads: list[threading.Thread], release) -> float:
    """Start ``threads`` (each waits for a held gate), release the gate; returns when it opened."""
    for t in threads:
        t.start()
    time.sleep(0.05)
    opened = time.perf_counter()
    release()
    return opened


def test_the_gate_paces_the_background_work_one_unit_at_a_time_after_a_settle():
    """Once the start-up's hold is released the background captures wait ``settle``, then run one
    at a time in the process, each starting ``rest`` times its predecessor's duration after it ended
    (on the H200 the captures back to back dropped camera frames for 3 s after the GPU took over)."""
    from vcam.engines.gate import BackgroundGate

    g = BackgroundGate(patience=10, settle=0.3, rest=1.0)
    release = g.hold()
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def work(seconds):
        with g.turn():
            t0 = time.perf_counter()
            time.sleep(seconds)
            with lock:
                spans.append((t0, time.perf_counter()))

    threads = [threading.Thread(target=work, args=(0.1 * (i + 1),)) for i in range(3)]
    opened = _start_then_release(threads, release)
    for t in threads:
        t.join(20)
    spans.sort()
    assert len(spans) == 3
    assert spans[0][0] - opened >= 0.3 * 0.95, "the first unit did not wait for the settle"
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        assert b0 >= a1 + (a1 - a0) * 0.95, "a unit began before the rest after the last one"
    # without a hold, no settle: a unit runs at once (then only the rest after it)
    free = BackgroundGate(settle=5.0, rest=0.0)
    t0 = time.perf_counter()
    with free.turn():
        pass
    with free.turn():
        pass
    assert time.perf_counter() - t0 < 2.5


def test_an_urgent_unit_waits_for_neither_the_settle_nor_the_rest():
    """A unit the frames wait for (``turn(urgent=...)`` true: a size they run eagerly) begins as
    soon as the gate opens and no other unit runs: the settle and the rest after the last unit are
    for the other units only, which still wait for both. Issue 39 (H100, four streams): the
    swapper's batch 4 ran eagerly for the whole 2 s settle after the takeover."""
    from vcam.engines.gate import BackgroundGate

    g = BackgroundGate(patience=30, settle=3.0, rest=20.0)
    release = g.hold()
    began: dict[str, float] = {}
    lock = threading.Lock()

    def work(name, urgent, seconds=0.05):
        with g.turn(urgent=(lambda: True) if urgent else None):
            with lock:
                began[name] = time.perf_counter()
            time.sleep(seconds)

    urgent = [threading.Thread(target=work, args=(f"urgent{i}", True)) for i in range(2)]
    calm = threading.Thread(target=work, args=("calm", False))
    opened = _start_then_release([*urgent, calm], release)
    for t in urgent:
        t.join(10)
    assert len(began) == 2 and "calm" not in began, began
    first, second = sorted(began[f"urgent{i}"] for i in range(2))
    assert first - opened < 1.0, "an urgent unit waited for the settle"
    assert second - first < 1.5, "an urgent unit waited for the rest after the last one (20 times its 50 ms)"
    calm.join(10)
    assert began["calm"] - opened >= 3.0 * 0.95, "the other unit did not wait for the settle"


def test_a_size_the_frames_run_without_its_graph_goes_before_the_other_engines_captures(monkeypatch):
    """The gate's turns: a queue whose next size a call wants (CaptureQueue.want) takes the next
    turn before the other engines' queues waiting for theirs (three of them here, twice over);
    without a want the queues take turns as they come. Issue 39 (H100, one stream): the frames ran
    the swapper's batch 1 eagerly while the detector's batch 2 took the first turn (129 ms), and
    every eager call waited it out."""
    need_torch()
    from vcam.engines import threads
    from vcam.engines.gate import BackgroundGate

    for _ in range(2):
        gate = BackgroundGate(patience=30, settle=0.0, rest=0.0)
        monkeypatch.setattr(threads, "BACKGROUND", gate)
        order: list[str] = []
        first = threading.Event()
        go = threading.Event()

        def capture_as(name, order=order, first=first, go=go):
            def capture(b, items):
                order.append(f"{name}{b}")
                if len(order) == 1:
                    first.set()
                    assert go.wait(10)

            return capture

        blocker = threads.CaptureQueue(capture_as("x"), "cpu", "blocker")
        others = [threads.CaptureQueue(capture_as(n), "cpu", n) for n in ("d", "e", "f")]
        swapper = threads.CaptureQueue(capture_as("s"), "cpu", "swapper")
        blocker.put([1], "a")
        assert first.wait(10)  # a capture holds the turn; the others queue behind it
        for q in others:
            q.put([2, 3], "a")
        swapper.put([2, 1], "a")
        deadline = time.monotonic() + 20
        while len(gate._waiting) < 4 and time.monotonic() < deadline:  # every queue waits for its turn
            time.sleep(0.01)
        assert len(gate._waiting) == 4
        assert not any(q.urgent() for q in [*others, swapper])
        swapper.want(1, "a")  # the frames run the swapper's batch 1 without its graph
        assert swapper.urgent() and not any(q.urgent() for q in others)
        go.set()
        for q in (blocker, *others, swapper):
            assert q.wait(10)
        assert order[:2] == ["x1", "s1"], order
        assert sorted(order[2:]) == ["d2", "d3", "e2", "e3", "f2", "f3", "s2"], order
        assert not swapper.urgent()


def test_the_pacing_can_be_set_from_the_environment(monkeypatch):
    from vcam.engines.gate import PACE_ENV, BackgroundGate

    monkeypatch.setenv(PACE_ENV, "0,0.5")
    g = BackgroundGate.from_env()
    assert (g.settle, g.rest) == (0.0, 0.5)
    monkeypatch.setenv(PACE_ENV, "nonsense")
    assert (BackgroundGate.from_env().settle, BackgroundGate.from_env().rest) == (BackgroundGate().settle, BackgroundGate().rest)


def test_a_closing_queue_is_not_kept_waiting_by_the_pace():
    from vcam.engines.gate import BackgroundGate

    g = BackgroundGate(settle=30.0)
    g.hold()()  # released: the next unit would wait 30 s
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.perf_counter()
    with g.turn(stop):
        assert stop.is_set()
    assert time.perf_counter() - t0 < 15.0


def test_no_collection_while_any_capture_runs_then_the_collector_as_it_was():
    """NO_COLLECTION (around each CUDA graph capture): the collector is off while one or more
    holders run, back on after the last; a collector the user had off stays off."""
    import gc

    from vcam.engines.held import NoCollection

    guard = NoCollection()
    assert gc.isenabled()
    try:
        with guard.held():
            assert not gc.isenabled()
            with guard.held():  # nested (or another thread's capture)
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            with guard.held():
                raise RuntimeError("capture failed")
        assert gc.isenabled()
        gc.disable()
        with guard.held():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_quiet_load_holds_the_collector_off_and_the_switches_short_then_freezes_what_it_left():
    """quiet_load (Inductor's imports, a compiled artifact's load beside the frames): the collector
    off and the switch interval short while it runs, nested with a capture's hold (counted: off until
    both ended); at its end what it left alive is out of the collector's reach (gc.freeze), even when
    it failed, and the interval and the collector are as they were."""
    import gc
    import sys

    from vcam.engines.held import NO_COLLECTION, QUICK_SWITCHES, quiet_load

    before_interval = sys.getswitchinterval()
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with quiet_load():
            kept = [[] for _ in range(1000)]  # what a load leaves alive
            assert not gc.isenabled()
            assert sys.getswitchinterval() == pytest.approx(min(before_interval, QUICK_SWITCHES.seconds))
            with NO_COLLECTION.held():  # a capture inside the load
                pass
            assert not gc.isenabled()
        assert gc.isenabled()
        assert sys.getswitchinterval() == pytest.approx(before_interval)
        assert gc.get_freeze_count() >= frozen + len(kept)
        with pytest.raises(RuntimeError):
            with quiet_load():
                raise RuntimeError("the artifact is corrupt")
        assert gc.isenabled()
        assert sys.getswitchinterval() == pytest.approx(before_interval)
    finally:
        gc.unfreeze()  # the test process's collector as it was
        gc.enable()
