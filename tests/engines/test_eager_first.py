"""``TorchEngine(eager_first=True)`` (issue 39): the start-up captures no CUDA graph; every size goes
to the background captures, which wait for the first frame (vcam.engines.gate.BACKGROUND), and the
calls made before their size is captured run eagerly. The graph path runs here on the CPU with a
recording stand-in for the capture (its "replay" runs the module into the captured outputs), so the
order (eager call, then the capture once the gate opens, then replays) is asserted on any machine;
tests/engines/test_background_capture.py has the real captures on CUDA."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch

from vcam.models import standin


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return standin.write("inswapper_128", tmp_path_factory.mktemp("m") / "inswapper_128.onnx", tiny=True, seed=5)


def _feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((n, 512)).astype(np.float32)
    return {"target": rng.random((n, 3, 128, 128), dtype=np.float32), "source": src / np.linalg.norm(src, axis=1, keepdims=True)}


class _Replay:
    """A captured graph's stand-in: replaying runs the module on the static inputs into its outputs."""

    def __init__(self, engine, b, items, events):
        self.engine, self.b, self.events = engine, b, events
        self.static = [engine._storage_for(info, items[info.name])[:b] for info in engine.inputs]
        self.outputs = engine._forward(self.static)

    def replay(self):
        self.events.append(("replay", self.b))
        for dst, got in zip(self.outputs, self.engine._forward(self.static)):
            dst.copy_(got)


def _graph_path(engine, events, monkeypatch):
    """``engine`` (on the CPU) taking the GPU's graph path, its captures recorded."""
    from vcam.engines import torch as te

    engine.cuda_graphs = True

    def capture(b, items):
        events.append(("capture", b))
        fake = _Replay(engine, b, items, events)
        return te._Captured(fake, fake.outputs, b)

    monkeypatch.setattr(engine, "_capture", capture)
    eager = te._eager

    def recorded(eng, static, b, items):
        events.append(("eager", b))
        return eager(eng, static, b, items)

    monkeypatch.setattr(te, "_eager", recorded)


def _eager_first_engines(tiny, monkeypatch):
    """(a paced gate of no pauses in place of the process's, a reference engine, an ``eager_first``
    engine on the faked graph path, its recorded events)."""
    need_torch()
    from vcam.engines import threads
    from vcam.engines.gate import BackgroundGate
    from vcam.engines.torch import TorchEngine

    gate = BackgroundGate(patience=60, settle=0.0, rest=0.0)
    monkeypatch.setattr(threads, "BACKGROUND", gate)
    ref = TorchEngine(tiny, device="cpu", max_batch=4, warmup=False)
    e = TorchEngine(tiny, device="cpu", max_batch=4, warmup=False, eager_first=True)
    events: list[tuple[str, int]] = []
    _graph_path(e, events, monkeypatch)
    return gate, ref, e, events


def test_the_first_calls_run_eagerly_and_the_captures_wait_for_the_first_frame(tiny, monkeypatch, caplog):
    gate, ref, e, events = _eager_first_engines(tiny, monkeypatch)
    first_frame = gate.hold()  # the start-up's hold (vcam.runtime.startup.prepare), released at the first frame
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        e.warmup()
        assert events == [] and not e._graphs  # nothing captured at start-up
        for i in range(2):
            f = _feeds(1, i)
            # FP32 on the CPU: two engines' convolutions may sum in another order (1.9e-5 seen once in
            # about ten runs); a wrong path would be off by tenths.
            np.testing.assert_allclose(e.run(f)[0], ref.run(f)[0], rtol=1e-4, atol=1e-4)
        assert events == [("eager", 1), ("eager", 1)]
        first_frame()
        assert e.wait_graphs(120)
        f = _feeds(1, 7)
        np.testing.assert_allclose(e.run(f)[0], ref.run(f)[0], rtol=1e-4, atol=1e-4)
    assert events == [("eager", 1), ("eager", 1), ("capture", 1), ("capture", 2), ("capture", 3), ("capture", 4), ("replay", 1)]
    lines = [r.getMessage() for r in caplog.records]
    assert not any("captured at start-up" in ln for ln in lines)
    assert any("batch 1,2,3,4 captured in the background" in ln for ln in lines)
    e.close()
    ref.close()


def test_a_size_not_yet_captured_replays_a_larger_captured_graph_instead_of_waiting(tiny, monkeypatch):
    """While the background has not captured a call's size, a larger size's graph already captured
    runs it (its first rows are the call's; no capture lock, where an eager call waits out any
    capture under way), and the size is asked for next, not urgently (its capture is paced as the
    others are); once captured, its own graph runs. Issue 39: four streams' eager calls waited
    105-116 ms five times in one run as the face count changed."""
    gate, ref, e, events = _eager_first_engines(tiny, monkeypatch)
    release = gate.hold()
    e.warmup()  # every size queued, held
    items = {"target": (3, 128, 128), "source": (512,)}
    e._graphs[e._graph_key(4, items)] = e._capture(4, items)  # batch 4 captured first (as a want does)
    events.clear()
    for n, seed in ((3, 1), (1, 2), (4, 3)):
        f = _feeds(n, seed)
        got = e.run(f)[0]
        assert got.shape[0] == n
        np.testing.assert_allclose(got, ref.run(f)[0], rtol=1e-4, atol=1e-4)
    assert events == [("replay", 4), ("replay", 4), ("replay", 4)]  # never eager: no lock waited for
    # 3, then 1, asked for first in this queue, but not urgently (a graph ran them): paced as the others
    assert e._later._todo[0][0] == 1 and e._later._todo[1][0] == 3 and not e._later.urgent()
    release()
    assert e.wait_graphs(120)
    assert [b for kind, b in events if kind == "capture"][:2] == [1, 3]  # the last size asked first, then the one before
    events.clear()
    f = _feeds(3, 4)
    np.testing.assert_allclose(e.run(f)[0], ref.run(f)[0], rtol=1e-4, atol=1e-4)
    assert events == [("replay", 3)]
    e.close()
    ref.close()


def test_without_eager_first_the_start_up_captures_the_first_size(tiny, monkeypatch):
    need_torch()
    from vcam.engines import threads
    from vcam.engines.gate import BackgroundGate
    from vcam.engines.torch import TorchEngine

    gate = BackgroundGate(patience=60, settle=0.0, rest=0.0)
    monkeypatch.setattr(threads, "BACKGROUND", gate)
    e = TorchEngine(tiny, device="cpu", max_batch=4, warmup=False, eager_first=False)
    events: list[tuple[str, int]] = []
    _graph_path(e, events, monkeypatch)
    release = gate.hold()
    e.warmup()
    assert events == [("capture", 1)]
    e.run(_feeds(1, 0))
    assert events == [("capture", 1), ("replay", 1)]
    release()
    assert e.wait_graphs(120) and [k[0] for k in e._graphs] == [1, 2, 3, 4]
    e.close()


def test_eager_first_is_on_for_the_networks_that_autotune_unless_turned_off(tiny, monkeypatch):
    need_torch()
    from vcam.engines.torch import EAGER_FIRST_ENV, TorchEngine

    monkeypatch.setenv(EAGER_FIRST_ENV, "0")
    assert not TorchEngine(tiny, device="cpu", warmup=False, autotune=True).eager_first
    monkeypatch.delenv(EAGER_FIRST_ENV, raising=False)
    small = TorchEngine(tiny, device="cpu", warmup=False)
    assert not small.autotune and not small.eager_first
    big = TorchEngine(tiny, device="cpu", warmup=False, autotune=True)
    assert big.eager_first
    assert not TorchEngine(tiny, device="cpu", warmup=False, autotune=True, background_capture=False).eager_first


def test_taking_the_input_buffers_asks_for_no_capture_while_a_call_does(tiny, monkeypatch):
    """``input_buffers(n)`` is not a call: while the background has not captured n it neither asks
    for n (the swapper takes the buffers of its largest batch for its source rows; issue 39: batch
    32, which no round ran, became an urgent capture after the takeover) nor picks a larger graph;
    the call that follows asks for its size."""
    gate, ref, e, events = _eager_first_engines(tiny, monkeypatch)
    release = gate.hold()
    e.warmup()  # every size queued, held
    bufs = e.input_buffers(4)
    assert bufs["target"].shape[0] == 4 and not e._later.urgent() and events == [] and not e._fast
    f = _feeds(2, 3)
    np.testing.assert_allclose(e.run(f)[0], ref.run(f)[0], rtol=1e-4, atol=1e-4)
    assert e._later.urgent() and events == [("eager", 2)]  # the call asked for its size
    release()
    assert e.wait_graphs(120)
    e.close()
    ref.close()


def test_the_load_captures_the_first_frames_batch_on_the_heuristics_and_the_frames_replay_it(tiny, monkeypatch, caplog):
    """``capture_first(n)``: the load captures the first rounds' batch (one face a stream) while the
    gate holds the background back, with cuDNN's heuristics as a background capture has (issue 39:
    four streams ran batch 4 eagerly from the GPU's first frame, then waited out its capture); the
    first frames replay it, and the background skips it."""
    from vcam.engines import threads
    from vcam.engines.torch import TorchEngine

    gate, ref, e, events = _eager_first_engines(tiny, monkeypatch)
    tuned: list[bool] = []
    capture = e._capture

    def seen(b, items):
        tuned.append(threads.tuning_allowed())
        return capture(b, items)

    monkeypatch.setattr(e, "_capture", seen)
    release = gate.hold()
    e.warmup()  # every size queued, held
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        assert e.capture_first(3) and e.capture_first(9)  # 9: more than the engine's batch, its largest
    assert events == [("capture", 3), ("capture", 4)] and tuned == [False, False]
    assert threads.tuning_allowed()  # the load's thread autotunes again afterwards
    assert any("batch 3 captured for the first frames" in r.getMessage() for r in caplog.records)
    events.clear()
    f = _feeds(3, 2)
    np.testing.assert_allclose(e.run(f)[0], ref.run(f)[0], rtol=1e-4, atol=1e-4)
    assert events == [("replay", 3)] and not e._later.urgent()  # no eager call, nothing asked for
    release()
    assert e.wait_graphs(120)
    assert sorted(b for kind, b in events if kind == "capture") == [1, 2]  # 3 and 4 were there
    e.close()
    ref.close()
    plain = TorchEngine(tiny, device="cpu", max_batch=4, warmup=False)
    assert not plain.capture_first(1)  # no CUDA graphs here: the caller warms it with a call
    plain.close()
