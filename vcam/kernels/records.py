"""Parameter records: a frame's per-launch parameter structs in device memory, for CUDA graphs.

A kernel launched with its parameter struct by value (``const Paste p``, the default: no copy) keeps
the struct's bytes in the launch. A CUDA graph replays its launches with the bytes they were captured
with, so a frame whose faces moved cannot replay the last frame's graph (issue 43 item 1). With a
record, the structs of the kernels that change every frame (the faces' warp, their masks, the
paste-back) are written into one pinned host block, each queued to its place in a device twin by an
async copy on the launch's stream just before the kernel, and the kernel's ``_rec`` twin reads the
struct through a pointer (``const Paste* p``) on a grid that does not depend on the faces (the
paste-back strides over its largest box). A captured graph then holds the copies and the kernels with
fixed addresses: replayed, the copies read whatever the host wrote into the pinned block since.

Obligations of the user (the pipeline, one record per ring slot):

- :meth:`ParamRecord.clear` before a frame's first launch: it waits, if it must, until the device
  has read the slot's previous bytes (a host event after the last copy), then starts at offset 0;
- every launch of the frame in the same order under :func:`recording`, so each struct lands at the
  same offset frame after frame (the launch signature, :attr:`ParamRecord.signature`, says so);
- :meth:`ParamRecord.close` after the frame's last launch (records the host event).

The kernels' fronts opt in with ``fixed=`` (:func:`vcam.kernels.build.launch`); on the CPU there is
nothing to record (the NumPy references run). The ops build records (``ops.param_record()``) and
queue the copies (``ops.put_params``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

#: Bytes of one record: the structs of one frame's launches (a warp's ``Faces`` is 1.6 KB, the
#: masks' ``Landmarks`` 1.7 KB, the paste's ``Paste`` 2.1 KB for 32 faces; more faces are more launches).
RECORD_BYTES = 32 * 1024
#: Each struct starts on this boundary (the widest field a struct holds is a double).
ALIGN = 16


class RecordFull(ValueError):
    """A frame's structs do not fit its record (more launches than :data:`RECORD_BYTES` holds)."""


class ParamRecord:
    """One ring slot's parameter block: ``host`` (pinned on CUDA) and its ``device`` twin, both
    uint8 of :data:`RECORD_BYTES`; ``done`` a host event recorded after the frame's last copy (None
    where the ops have none, as in a trace)."""

    def __init__(self, host: np.ndarray, device: Any, done: Any = None) -> None:
        if host.dtype != np.uint8 or host.ndim != 1 or host.shape != tuple(device.shape):
            raise ValueError("a parameter record needs two uint8 blocks of one length (host and device)")
        self.host, self.device, self.done = host, device, done
        self.used = 0
        #: The frame's launches so far: (module, kernel, grid, offset) each; equal from frame to frame
        #: while the launches are (what a graph replay needs).
        self.signature: list[tuple] = []
        self._pending = False

    @classmethod
    def in_host_memory(cls, nbytes: int = RECORD_BYTES) -> ParamRecord:
        """A record whose "device" twin is host memory too (the CPU's ops, a trace, tests)."""
        return cls(np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8))

    def clear(self) -> None:
        """Start a frame: wait for the device to have read the last frame's bytes (a ring slot comes
        back after ``ring`` frames, so this rarely waits), then write from offset 0."""
        if self._pending and self.done is not None:
            self.done.synchronize()
        self._pending = False
        self.used = 0
        self.signature = []

    def put(self, struct: np.ndarray) -> tuple[np.ndarray, Any]:
        """Write one packed struct (a one-element structured array) at the next aligned offset;
        returns its host bytes and the device bytes a kernel reads."""
        raw = np.ascontiguousarray(struct).view(np.uint8).reshape(-1)
        start = -(-self.used // ALIGN) * ALIGN
        end = start + raw.size
        if end > self.host.size:
            raise RecordFull(f"a frame's kernel parameters need more than {self.host.size} bytes")
        self.host[start:end] = raw
        self.used = end
        return self.host[start:end], self.device[start:end]

    def note(self, module: str, kernel: str, grid: tuple) -> None:
        self.signature.append((module, kernel, tuple(grid), self.used))

    def close(self, ops: Any) -> None:
        """After the frame's last launch: mark when the device has read the bytes."""
        if self.done is not None:
            ops.record(self.done)
            self._pending = True


class _NoLaunch:
    """``ops.kernels`` of :class:`PackOnly`: launches do nothing; the kernel families' per-device
    objects (``cache``) are the real ops' own."""

    def __init__(self, kernels: Any) -> None:
        self.cache = kernels.cache

    def launch(self, *args: Any, **kwargs: Any) -> None:
        pass


class PackOnly:
    """The ops as the fronts see them while a frame is only packed for a graph's replay: every
    attribute is the real ops' (``xp``, ``stream``, ...), but kernels launch nothing and parameter
    copies are not queued (the replay's captured copies move the bytes). Run the frame's fronts
    against it under :func:`recording`: each struct lands at the offset the captured frame's did
    (compare :attr:`ParamRecord.signature`), then replay the graph."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.kernels = _NoLaunch(ops.kernels)
        self.params: ParamRecord | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def put_params(self, device: Any, host: np.ndarray) -> None:
        pass


#: What :func:`recording` gives when there is nothing to set (records off: the frame's default path).
_NOTHING = contextlib.nullcontext()


def recording(ops: Any, record: ParamRecord | None) -> contextlib.AbstractContextManager[Any]:
    """Inside: launches that opted in (``fixed=``) read their structs from ``record``; None: by value."""
    if record is None and getattr(ops, "params", None) is None:
        return _NOTHING
    return _recording(ops, record)


@contextlib.contextmanager
def _recording(ops: Any, record: ParamRecord | None) -> Iterator[ParamRecord | None]:
    before = getattr(ops, "params", None)
    ops.params = record
    try:
        yield record
    finally:
        ops.params = before


def by_reference(ops: Any, record: ParamRecord, module: str, kernel: str, grid: tuple, args: tuple) -> tuple:
    """``args`` with each packed struct written into ``record`` and replaced by its device bytes, the
    copy queued on the ops' current stream."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray) and a.dtype.names is not None:
            host, device = record.put(a)
            ops.put_params(device, host)
            a = device
        out.append(a)
    record.note(module, kernel, grid)
    return tuple(out)


__all__ = ["ALIGN", "RECORD_BYTES", "PackOnly", "ParamRecord", "RecordFull", "by_reference", "recording"]
