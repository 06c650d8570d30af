"""The torch engine's batch sizes (issue 28): every size up to 8 is captured, so a batch of six
faces runs at six, not padded to eight, then 16, 24 and 32 (four streams of six faces run at 24);
compiled artifacts stay at powers of two, and a batch whose own size runs uncompiled pads up to a
compiled size below twice its own. The rule runs on the CPU;
the captures and the outputs at every size need CUDA (marked gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch, require

from vcam.engines.torch import batch_buckets
from vcam.models import standin


def test_every_size_up_to_eight_then_multiples_of_eight_then_powers_of_two():
    assert batch_buckets(8) == (1, 2, 3, 4, 5, 6, 7, 8)
    assert batch_buckets(5) == (1, 2, 3, 4, 5)
    assert batch_buckets(1) == (1,)
    assert batch_buckets(16) == (1, 2, 3, 4, 5, 6, 7, 8, 16)
    # four streams of six faces: 24 a round, run at 24, not padded to 32
    assert batch_buckets(32) == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32)
    assert batch_buckets(20) == (1, 2, 3, 4, 5, 6, 7, 8, 16, 20)
    assert batch_buckets(40) == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40)
    assert batch_buckets(100) == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 64, 100)
    # powers of two only (the compiled artifacts' sizes), as every size was before
    assert batch_buckets(8, 1) == (1, 2, 4, 8)
    assert batch_buckets(6, 1) == (1, 2, 4, 6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return standin.write("inswapper_128", tmp_path_factory.mktemp("m") / "inswapper_128.onnx", tiny=True, seed=3)


def test_a_batch_pads_up_to_a_compiled_size_only_when_that_pays(tiny):
    """Without compiled artifacts each batch runs at its own size; with batch 8 compiled, 5 to 7
    faces pad up to it (about twice as fast a face), fewer than 5 do not, and the artifacts built
    or planned are the powers of two."""
    need_torch()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(tiny, device="cpu", max_batch=8, warmup=False)
    assert engine.batch_sizes == tuple(range(1, 9)) and engine.compile_sizes == (1, 2, 4, 8)
    engine.compile_mode = "auto"  # the CPU runs uncompiled: pretend artifacts exist to test the rule
    assert [engine._padded(n) for n in range(1, 9)] == list(range(1, 9))
    items = {i.name: tuple(i.shape[1:]) for i in engine.inputs}
    engine._compiled_fns[engine._graph_key(8, items)] = object()
    assert [engine._padded(n) for n in range(1, 9)] == [1, 2, 3, 4, 8, 8, 8, 8]
    assert engine.compiled_for(6) and not engine.compiled_for(3)
    engine._compiled_fns[engine._graph_key(4, items)] = object()
    assert [engine._padded(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [engine._compile_size(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_four_streams_of_six_faces_run_at_24_uncompiled_and_at_a_compiled_32(tiny):
    """A daemon of four streams (the swapper's largest batch 32): 17-24 faces run at 24, not 32;
    with a static compiled artifact of 32 and none of 24, 24 faces pad up to the compiled 32 (below
    twice 24: faster a face); a dynamic artifact serves 24 itself (vcam.engines.compiled.served)."""
    need_torch()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(tiny, device="cpu", max_batch=32, warmup=False)
    assert engine.batch_sizes == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32)
    assert engine.compile_sizes == (1, 2, 4, 8, 16, 32)
    engine.compile_mode = "auto"  # as above: the rule, not the CPU's own choice
    assert [engine._padded(n) for n in (9, 16, 17, 24, 25, 32)] == [16, 16, 24, 24, 32, 32]
    items = {i.name: tuple(i.shape[1:]) for i in engine.inputs}
    engine._compiled_fns[engine._graph_key(32, items)] = object()
    assert [engine._padded(n) for n in (17, 24, 25)] == [32, 32, 32]
    assert engine._padded(9) == 16  # 32 is not below twice 9: its own uncompiled size
    engine._compiled_fns[engine._graph_key(24, items)] = object()
    assert [engine._padded(n) for n in (17, 24, 25)] == [24, 24, 32]


def need_cuda():
    torch = need_torch()
    if not torch.cuda.is_available():
        require("cuda", "no CUDA device")
    return torch


@pytest.mark.gpu
def test_six_faces_run_at_six_on_cuda(tiny):
    """On CUDA the first size is captured at construction, the others in the background; a batch of
    six replays the batch-6 graph (none of batch 8 is needed) and equals the same rows run at 8."""
    need_cuda()
    from vcam.engines.torch import TorchEngine

    engine = TorchEngine(tiny, device="cuda", max_batch=8)
    try:
        assert engine.wait_graphs(120)
        sizes = sorted(k[0] for k in engine._graphs)
        assert sizes == list(range(1, 9)), sizes
        rng = np.random.default_rng(1)
        src = rng.standard_normal((8, 512)).astype(np.float32)
        src /= np.linalg.norm(src, axis=1, keepdims=True)
        feeds8 = {"target": rng.random((8, 3, 128, 128), dtype=np.float32), "source": src}
        (out8,) = engine.run(feeds8)
        assert engine._padded(6) == 6
        (out6,) = engine.run({k: v[:6] for k, v in feeds8.items()})
        assert out6.shape[0] == 6
        np.testing.assert_allclose(out6, out8[:6], rtol=1e-4, atol=1e-4)
    finally:
        engine.close()
