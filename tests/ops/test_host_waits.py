"""Issue 43 item 2: the host threads sleep while the GPU works. Every CUDA event a host thread waits
on (the output's download, the detection readback, a staging or device-ring buffer coming free, an
upload slot) is a blocking-sync event; markers only streams wait on stay plain. CuPy is replaced by a
recording fake (this runs on any machine); the H200 run measures what it does to latency
(``benchmarks/gpu_check.sh hostpath``, ``$VCAM_SPIN_WAITS=1`` for the spinning baseline)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from vcam.types import PixelFormat


class _Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.block = block

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _DeviceArray:
    """Enough of a CuPy array for the rings and readbacks built here."""

    def __init__(self, shape, dtype=np.uint8) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.data = types.SimpleNamespace(ptr=id(self))

    def get(self, stream=None, out=None, blocking=True):
        return out


class _Stream:
    def __init__(self, non_blocking: bool = False, priority: int = 0) -> None:
        pass


@pytest.fixture
def fake_cupy(monkeypatch):
    cuda = types.SimpleNamespace(
        Event=_Event,
        Stream=_Stream,
        alloc_pinned_memory=lambda n: bytearray(n),
        runtime=types.SimpleNamespace(deviceGetStreamPriorityRange=lambda: (0, -5)),
    )
    fake = types.ModuleType("cupy")
    fake.cuda = cuda
    fake.uint8 = np.uint8
    fake.zeros = fake.empty = lambda shape, dtype=np.uint8: _DeviceArray(shape, dtype)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


@pytest.mark.parametrize("sleep", [True, False])
def test_every_event_a_host_thread_waits_on_sleeps(fake_cupy, sleep):
    from vcam.ops.cuda import CudaOps

    ops = CudaOps(sleep_waits=sleep)
    io = ops.frame_io(PixelFormat.BGR, 8, 6, (6, 8, 3), ring=3)
    ring = ops.device_ring((6, 8, 3), count=2)
    staged = ops.staging((6, 8, 3), count=2)
    read = ops.readback_async([_DeviceArray((4, 15), np.float32)])
    read.release()
    again = ops.readback_async([_DeviceArray((4, 15), np.float32)])  # its event comes back from the pool
    waited = [ops._read_done, read.event, again.event, *io._down, *io._up, *ring.free, *staged.events]
    assert all(e.block is sleep for e in waited)
    # markers the streams alone wait on stay plain events
    assert not ops.event().block and not any(e.block for e in (*io._in_free, *io._out_ready, *ring.ready))


def test_make_ops_spins_only_when_asked(fake_cupy, monkeypatch):
    from vcam.ops import make_ops

    monkeypatch.delenv("VCAM_SPIN_WAITS", raising=False)
    assert make_ops("cuda").sleep_waits is True
    monkeypatch.setenv("VCAM_SPIN_WAITS", "1")
    assert make_ops("cuda").sleep_waits is False
