"""What the GPU frame asks of the host, traced on the CPU: every launch, copy, event and allocation
of one frame of the CUDA path, in order, and the host time of the pipeline's own Python (issue 43).

:class:`TraceOps` is the CUDA ops' twin in host memory: ``device = "cuda"``, so every kernel front
takes its CUDA branch (its parameter packing, its grid) and the pipeline its concurrent path
(streams, events, a predicted frame's detection queued after its swap); the launches are recorded,
not run. The engines are :class:`TraceEngine` (one launch per call, as a CUDA graph replay is; the
outputs are the inner CPU engine's answer to the first call of each shape, kept, so the detector
finds the faces it would find) and the array library a :class:`TraceXP` that records the CuPy calls
a front makes beside its kernels (copies, element-wise ops, allocations).

Two things come out per frame:

- **the launch list**: kernels, engine calls, copies, event records/waits, allocations; and what a
  per-frame CUDA graph (issue 43 item 1) must take from device buffers instead: every launch whose
  by-value arguments or grid change from one frame to the next with the same face count (a graph
  replays its launches with the arguments they were captured with), and every allocation;
- **the host time**: the frame's wall time on the host minus the time spent in the NumPy calls that
  stand in for device work, i.e. the pipeline's Python (tracking, planning, alignment, packing),
  the part of the frame thread's host CPU that no graph removes by itself. CuPy's and the driver's
  own cost per launch is not in it (count the launches).

    python -m benchmarks.launch_trace [--faces 1] [--size 1080p] [--frames 60] [--tracker real|fixed]
        [--no-band] [--records] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vcam.ops.base import Clock, HostClock, Transfers
from vcam.ops.numpy import _Done
from vcam.types import Frame, PixelFormat

#: CuPy functions that allocate device memory (a graph cannot allocate per replay).
ALLOCATING = frozenset({"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "array"})
#: CuPy attributes that are no device work (types, constants, the array class).
PLAIN = frozenset({"ndarray", "dtype", "float16", "float32", "float64", "uint8", "int32", "int64", "bool_", "newaxis", "pi"})


@dataclass
class Entry:
    """One thing the host asked of the device: ``kind`` (kernel, engine, xp, h2d, d2h, record, wait,
    host_wait, alloc), ``name``, ``stream`` and ``key``: what a graph would capture of it (grid,
    block, by-value arguments, buffer addresses)."""

    kind: str
    name: str
    stream: str
    key: tuple = ()


@dataclass
class TraceLog:
    """The entries of each frame (``frames[i]``) and the host seconds spent standing in for the
    device (``device_s``), which the host time leaves out."""

    frames: list[list[Entry]] = field(default_factory=lambda: [[]])
    device_s: float = 0.0
    _depth: int = 0  # device_work blocks open: only the outermost one counts its time

    def add(self, kind: str, name: str, stream: str, key: tuple = ()) -> None:
        t0 = time.perf_counter()
        self.frames[-1].append(Entry(kind, name, stream, key))
        if not self._depth:  # inside a device_work block, that block counts it
            self.device_s += time.perf_counter() - t0

    def next_frame(self) -> None:
        self.frames.append([])

    @contextlib.contextmanager
    def device_work(self) -> Iterator[None]:
        """Time that is device work (or the trace's own bookkeeping), left out of the host time. A
        block inside another is counted once, by the outer one: an ``add`` inside a kernel's launch
        had been counted twice, and a busy machine that preempted it there made a frame's host time
        negative (once in this stop's three busy suites)."""
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.device_s += time.perf_counter() - t0


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def arg_key(a: Any) -> Any:
    """What a captured launch keeps of argument ``a``: an array's address, shape and strides (its
    contents are read at replay), a by-value scalar or parameter struct's bytes."""
    if isinstance(a, np.ndarray) and a.dtype.names is None and a.ndim > 0:
        return ("buf", _address(a), a.shape, a.strides, a.dtype.str)
    if isinstance(a, np.ndarray):  # a packed parameter struct (passed by value)
        return ("val", a.tobytes())
    if isinstance(a, np.generic | int | float | bool):
        return ("val", np.asarray(a).tobytes(), np.asarray(a).dtype.str)
    return ("obj", type(a).__name__)


class TraceKernels:
    """``ops.kernels`` of :class:`TraceOps`: launches recorded, never run."""

    def __init__(self, log: TraceLog, ops: TraceOps) -> None:
        self.log, self.ops = log, ops
        self.cache: dict[str, Any] = {}
        #: ``module.kernel`` -> ``fn(args)`` that does the kernel's work in NumPy (device time): for
        #: the kernels whose output reaches the host (a detector's input, so its answers are real).
        self.emulate: dict[str, Any] = {}

    def module(self, name: str) -> None:
        return None

    def launch(self, name: str, kernel: str, grid: tuple, block: tuple, args: tuple, stream: Any = None) -> None:
        with self.log.device_work():  # the trace's own bookkeeping is no host time of the pipeline
            key = (tuple(grid), tuple(block), tuple(arg_key(a) for a in args))
            self.log.add("kernel", f"{name}.{kernel}", self.ops.stream, key)
            fn = self.emulate.get(f"{name}.{kernel}")
            if fn is not None:
                fn(args)


class TraceXP:
    """CuPy's place in :class:`TraceOps`: NumPy underneath; each call that is device work on CUDA
    is recorded (``xp.NAME``; an allocation as ``alloc``) and its NumPy time counted as device time."""

    def __init__(self, log: TraceLog, ops: TraceOps) -> None:
        self._log, self._ops = log, ops

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        if name in PLAIN or not callable(value) or isinstance(value, type):
            setattr(self, name, value)  # asked again without __getattr__
            return value
        log, ops = self._log, self._ops

        def call(*args: Any, **kwargs: Any) -> Any:
            with log.device_work():
                out = value(*args, **kwargs)
                if name == "ascontiguousarray" and args and out is args[0]:
                    return out  # already contiguous: CuPy returns it, no copy
                kind = "alloc" if name in ALLOCATING else "xp"
                keys = tuple(arg_key(a) for a in (*args, *kwargs.values()))
                log.add(kind, f"xp.{name}", ops.stream, keys)
            return out

        setattr(self, name, call)
        return call


class TraceIO:
    """The frame ring of :class:`TraceOps`: uploads and downloads recorded with the rows they move."""

    def __init__(self, ops: TraceOps, in_fmt: PixelFormat, width: int, height: int, out_shape: tuple, ring: int) -> None:
        from vcam.kernels.convert import frame_shape

        self.ops, self.ring = ops, int(ring)
        shape = frame_shape(PixelFormat(in_fmt), width, height)
        self._host_in = [np.zeros(shape, np.uint8) for _ in range(self.ring)]
        self._dev_in = [np.zeros(shape, np.uint8) for _ in range(self.ring)]
        self._out = [np.zeros(out_shape, np.uint8) for _ in range(self.ring)]
        self._rest: list[tuple[int, int] | None] = [None] * self.ring
        self.height = int(height)
        self._next = 0

    def host_slot(self) -> np.ndarray:
        return self._host_in[self._next]

    def upload(self, frame: Frame, slot: int, rows: tuple[int, int] | None = None) -> Any:
        log, ops = self.ops.log, self.ops
        self._next = (slot + 1) % self.ring
        with log.device_work():
            np.copyto(self._dev_in[slot], np.asarray(frame.data).reshape(self._dev_in[slot].shape))
        ops.transfers.h2d += 1
        band = (0, self.height) if rows is None else (int(rows[0]), int(rows[1]))
        log.add("h2d", "upload", "copy_in", (band,))
        log.add("record", "uploaded", "copy_in")
        log.add("wait", "uploaded", ops.stream)
        self._rest[slot] = None if band == (0, self.height) else band
        return self._dev_in[slot]

    def upload_rest(self, slot: int) -> None:
        rows, self._rest[slot] = self._rest[slot], None
        if rows is not None:
            self.ops.log.add("h2d", "upload_rest", "copy_in", (rows,))
            self.ops.log.add("record", "uploaded", "copy_in")
            self.ops.log.add("wait", "uploaded", self.ops.stream)

    def output(self, slot: int) -> Any:
        self.ops.log.add("wait", "downloaded", self.ops.stream)
        return self._out[slot]

    def download(self, slot: int, parts: Sequence[tuple[int, int]] | None = None, *, last: bool = True) -> None:
        log = self.ops.log
        log.add("record", "output_ready", self.ops.stream)
        log.add("wait", "output_ready", "copy")
        log.add("d2h", "download", "copy", (tuple(parts) if parts is not None else None,))
        if last:
            self.ops.transfers.d2h += 1
            log.add("record", "downloaded", "copy")

    def result(self, slot: int) -> np.ndarray:
        self.ops.log.add("host_wait", "download", "host")
        return self._out[slot]

    def release(self, slot: int) -> None:
        self.ops.log.add("record", "input_free", self.ops.stream)


class TraceOps:
    """The CUDA ops' twin in host memory (see the module docstring)."""

    device = "cuda"
    concurrent = True

    def __init__(self, log: TraceLog | None = None) -> None:
        self.log = log or TraceLog()
        self.xp = TraceXP(self.log, self)
        self.kernels = TraceKernels(self.log, self)
        self.transfers = Transfers()
        self.stream = "compute"

        #: The parameter record launches read their structs from now (see vcam.kernels.records).
        self.params: Any = None

    def activate(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def param_record(self) -> Any:
        from vcam.kernels.records import ParamRecord

        return ParamRecord.in_host_memory()

    def put_params(self, device: np.ndarray, host: np.ndarray) -> None:
        with self.log.device_work():
            np.copyto(device, host)
        self.log.add("h2d", "params", self.stream, (_address(device), host.nbytes))

    @contextlib.contextmanager
    def _on(self, name: str) -> Iterator[str]:
        before, self.stream = self.stream, name
        try:
            yield name
        finally:
            self.stream = before

    def front_stream(self) -> Any:
        return self._on("front")

    def back_stream(self) -> Any:
        return self._on("back")

    def event(self) -> object:
        return object()

    def host_event(self) -> object:
        return object()

    def record(self, event: Any) -> None:
        self.log.add("record", "event", self.stream)

    def wait(self, event: Any) -> None:
        self.log.add("wait", "event", self.stream)

    def synchronize(self) -> None:
        pass

    def warmup(self) -> None:
        pass

    def empty(self, shape: tuple, dtype: Any = np.uint8) -> np.ndarray:
        self.log.add("alloc", "empty", self.stream, (tuple(shape),))
        return np.zeros(shape, dtype=dtype)

    def asarray(self, host: np.ndarray) -> np.ndarray:
        self.log.add("h2d", "asarray", self.stream, (np.shape(host),))
        return np.array(host, copy=True)

    def to_host(self, array: Any) -> np.ndarray:
        self.log.add("d2h", "to_host", self.stream)
        self.log.add("host_wait", "to_host", "host")
        return np.array(array, copy=True)

    def readback(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        self.log.add("d2h", "readback", self.stream, (len(arrays),))
        self.log.add("host_wait", "readback", "host")
        return [np.array(a, copy=True) for a in arrays]

    def readback_async(self, arrays: Sequence[Any]) -> _Done:
        self.log.add("d2h", "readback_async", self.stream, (len(arrays),))
        return _Done([np.array(a, copy=True) for a in arrays])

    def staging(self, shape: tuple, count: int = 8) -> None:
        return None

    def frame_io(
        self, in_fmt: PixelFormat, width: int, height: int, out_shape: tuple, ring: int, out_fmt: PixelFormat | None = None
    ) -> TraceIO:
        return TraceIO(self, in_fmt, width, height, out_shape, ring)

    def clocks(self, names: Sequence[str], ring: int, timing: bool) -> list[Clock]:
        return [HostClock() for _ in range(ring)]


class TraceEngine:
    """An engine whose calls are recorded as one launch each (a CUDA graph replay), answered by the
    inner CPU engine on the same input buffers (device time)."""

    def __init__(self, inner: Any, log: TraceLog, ops: TraceOps, name: str) -> None:
        self.inner, self.log, self.ops, self.name = inner, log, ops, name
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.max_batch = getattr(inner, "max_batch", 1)
        self.device = "cuda"

    def describe(self) -> str:
        return f"trace of {self.inner.describe()}"

    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
        return self.inner.input_buffers(n, shapes=shapes) if shapes else self.inner.input_buffers(n)

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        with self.log.device_work():
            outs = self.inner.run_device(feeds)
            key = tuple((k, tuple(v.shape)) for k, v in sorted(feeds.items()))
            self.log.add("engine", self.name, self.ops.stream, key)
        return list(outs)


class StaticEngine:
    """A network's inputs and outputs with no network (zeros out): the swap model's place in a trace,
    where its numbers never reach the host. ``inputs``/``outputs``: (name, shape with -1 for the
    batch, dtype)."""

    @dataclass
    class Tensor:
        name: str
        shape: tuple
        dtype: Any

    def __init__(
        self, inputs: Sequence[tuple[str, tuple, Any]], outputs: Sequence[tuple[str, tuple, Any]], max_batch: int
    ) -> None:
        self.inputs = [self.Tensor(*t) for t in inputs]
        self.outputs = [self.Tensor(*t) for t in outputs]
        self.max_batch = int(max_batch)
        self.device = "cpu"
        self._in = {t.name: np.zeros((self.max_batch, *t.shape[1:]), t.dtype) for t in self.inputs}
        self._out = [np.zeros((self.max_batch, *t.shape[1:]), t.dtype) for t in self.outputs]

    def describe(self) -> str:
        return "static"

    def input_buffers(self, n: int, shapes: Any = None) -> dict[str, Any]:
        return {k: v[:n] for k, v in self._in.items()}

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        n = next(iter(feeds.values())).shape[0]
        return [o[:n] for o in self._out]


def _detector_input(args: tuple) -> None:
    """``convert.detector_input_*`` done by its CPU twin, from the launch's own arguments."""
    from vcam.kernels.detect import detector_input_cv

    frame, _w, _h, p, size, _oh, _ow, out = args
    n = int(p["count"][0])
    detector_input_cv(
        frame, p["rect"][0, :n], int(size), tuple(p["mean"][0]), out=out, scale=p["scale"][0], rgb=bool(p["rgb"][0])
    )


# -- the rig: `vcam bench`'s GPU pipeline, on the trace ---------------------------------------------
@dataclass
class Rig:
    pipe: Any  # the first stream's pipeline
    frame: Any  # seq -> Frame
    snap: Any
    log: TraceLog
    ops: TraceOps
    #: Every stream's pipeline (one daemon's streams: the models and the ops shared, a tracker each).
    pipes: list[Any] = field(default_factory=list)


def build_rig(
    faces: int = 1,
    size: tuple[int, int] = (1920, 1080),
    tracker: str = "real",
    band: bool = True,
    streams: int = 1,
    records: bool = False,
) -> Rig:
    """The pipeline ``vcam run`` builds on CUDA (RetinaFace on the trace, the inswapper's inputs and
    outputs on a :class:`StaticEngine`, box and face masks, NV12 in, I420 out, predicted frames in
    bands) over a still of ``faces`` real portraits; ``tracker``: ``real`` (the tracker ``vcam run``
    uses, its detector's answers the CPU engine's) or ``fixed`` (the bench's: the same tracks, one
    region call per face). ``streams``: that many pipelines of one daemon (each its own tracker and
    buffers, the models shared), run round by round as :mod:`vcam.runtime.rounds` does. ``records``:
    the warps', masks' and paste-back's structs from parameter records (:mod:`vcam.kernels.records`)."""
    from vcam.kernels import paste as blend
    from vcam.kernels.convert import from_bgr_ref
    from vcam.ops.numpy import NumpyOps
    from vcam.pipeline.pipeline import Pipeline
    from vcam.runtime.bench_rig import FixedTracker, bench_snapshot
    from vcam.runtime.roles import MAX_BATCH
    from vcam.stages.demo import gradient, group_frame
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.detections import DetectParams
    from vcam.stages.mask import create_masker
    from vcam.stages.swap_neural import NeuralSwapper
    from vcam.stages.track import Tracker, TrackParams
    from vcam.types import SourceFace

    width, height = size
    bgr = group_frame(width, height, faces, 0, 60, gradient(width, height))
    raw = from_bgr_ref(bgr, PixelFormat.NV12)
    from vcam.config import Config

    params, roi = DetectParams(), Config().track.roi_size
    cpu = RetinaFaceDetector(params, roi, ops=NumpyOps(), max_regions=8, threads=1)
    log = TraceLog()
    ops = TraceOps(log)
    det = RetinaFaceDetector(params, roi, engine=TraceEngine(cpu.engine, log, ops, "detector"), ops=ops)
    for kernel in ("detector_input_f32", "detector_input_f16"):  # the detector reads real regions
        ops.kernels.emulate[f"convert.{kernel}"] = _detector_input
    crop = 128
    batch = min(8 * max(1, int(streams)), MAX_BATCH)  # the daemon's swapper: every stream's faces in one call
    swap_engine = StaticEngine(
        [("target", (-1, 3, crop, crop), np.float16), ("source", (-1, 512), np.float32)],
        [("output", (-1, 3, crop, crop), np.float16)],
        max_batch=batch,
    )
    mask = ops.asarray(blend.box_mask(crop, 0.3))
    emap = np.eye(512, dtype=np.float32)
    swapper = NeuralSwapper(
        "inswapper_128",
        TraceEngine(swap_engine, log, ops, "swapper"),
        ops=ops,
        mask=mask,
        max_faces=batch,
        emap=emap,
        param_records=records,
    )
    masker = create_masker(("box", "face"), swapper.crop_size, ops=ops, max_faces=8)
    landmarks: list[np.ndarray] = []
    if tracker == "fixed":
        found = Tracker(cpu, TrackParams(), max_faces=8)
        for seq in range(3):
            landmarks = [t.landmarks for t in found.update(bgr, seq)]
    pipes = []
    for _ in range(max(1, int(streams))):
        trk: Any = FixedTracker(det, landmarks) if tracker == "fixed" else Tracker(det, TrackParams(), max_faces=8)
        pipe = Pipeline(
            ops=ops,
            tracker=trk,
            swapper=swapper,
            masker=masker,
            out_fmt=PixelFormat.I420,
            predict=True,
            band=band,
            max_faces=8,
            param_records=records,
        )
        pipe.configure(width, height, PixelFormat.NV12)
        for img in pipe._bgr:  # what the conversion kernels (recorded, not run) would have written
            img[...] = bgr
        pipes.append(pipe)
    face = SourceFace(
        name="trace", image=np.zeros((crop, crop, 3), np.uint8), embeddings={str(swapper.recogniser): np.ones(512, np.float32)}
    )
    face = swapper.prepare(face)

    def frame(seq: int) -> Frame:
        return Frame(data=raw, width=width, height=height, fmt=PixelFormat.NV12, t_capture=time.perf_counter(), seq=seq)

    return Rig(pipe=pipes[0], frame=frame, snap=bench_snapshot(face), log=log, ops=ops, pipes=pipes)


#: The round's steps, in the order the daemon takes them (:func:`run`).
STEPS = ("settle", "begin", "swap", "finish", "collect", "detection")


@dataclass
class Trace:
    """The frames of one run: their entries, host seconds (in all and per step of :data:`STEPS`) and
    swapped faces."""

    frames: list[list[Entry]]
    host_s: list[float]
    faces: list[int]
    steps_s: dict[str, list[float]] = field(default_factory=dict)


def run(rig: Rig, frames: int) -> Trace:
    """``frames`` rounds through the rig as the daemon takes them (:mod:`vcam.runtime.rounds`): every
    stream settled while waiting, begun, all their faces swapped in one call, each finished and
    collected, then each stream's deferred detection launched after the publish. One entry list,
    host time and face count per round."""
    from vcam.runtime.rounds import _row_sources

    pipes, log = rig.pipes or [rig.pipe], rig.log
    host: list[float] = []
    faces: list[int] = []
    steps: dict[str, list[float]] = {k: [] for k in STEPS}
    state: dict[str, Any] = {}

    def step(name: str, fn: Any) -> None:
        d0, t0 = log.device_s, time.perf_counter()
        state[name] = fn()
        steps[name].append(time.perf_counter() - t0 - (log.device_s - d0))

    def swap() -> Any:
        faced = [w for w in state["begin"] if w.n]
        return rig.pipe.swapper.swap_batch([(w.img, w.mats) for w in faced], _row_sources(faced)) if faced else (None, None)

    def finish() -> list[int]:
        crops, mask = state["swap"]
        slots, lo = [], 0
        for p, w in zip(pipes, state["begin"]):
            rows = mask[lo : lo + w.n] if getattr(mask, "ndim", 2) == 3 else mask
            slots.append(p.finish(w, crops[lo : lo + w.n] if w.n else None, rows, detect_now=False))
            lo += w.n
        return slots

    for seq in range(frames):
        # The trace's own records grow with every frame: kept out of the collector's way, so its
        # passes over them are not charged to the pipeline's steps.
        gc.freeze()
        log.next_frame()
        step("settle", lambda: [p.settle() for p in pipes])
        step("begin", lambda seq=seq: [p.begin(rig.frame(seq), rig.snap) for p in pipes])
        step("swap", swap)
        step("finish", finish)
        step("collect", lambda: [p.collect(slot) for p, slot in zip(pipes, state["finish"])])
        step("detection", lambda: [p.launch_detection() for p in pipes])
        host.append(sum(steps[k][-1] for k in STEPS))
        faces.append(sum(int(stats.swapped) for _, stats in state["collect"]))
    return Trace(frames=log.frames[1:], host_s=host, faces=faces, steps_s=steps)


def changing(a: list[Entry], b: list[Entry]) -> list[str]:
    """What a graph captured on frame ``a`` would replay wrongly on frame ``b`` (same face count):
    the launches whose name, grid or by-value arguments differ, or a different launch sequence."""
    la = [e for e in a if e.kind in ("kernel", "engine", "xp", "h2d", "d2h")]
    lb = [e for e in b if e.kind in ("kernel", "engine", "xp", "h2d", "d2h")]
    if [e.name for e in la] != [e.name for e in lb]:
        return ["the launch sequence itself"]
    return [x.name for x, y in zip(la, lb, strict=True) if x.key != y.key]


def summary(trace: Trace, skip: int = 10, ring: int = 2) -> dict[str, Any]:
    """Per-frame counts (medians over the frames after ``skip``) and the graph blockers: each frame
    against the last one through the same ring slot (``ring`` frames before: one graph per slot)."""
    frames = trace.frames[skip:]
    kinds = [Counter(e.kind for e in f) for f in frames]
    med = {
        k: float(np.median([c.get(k, 0) for c in kinds]))
        for k in ("kernel", "engine", "xp", "h2d", "d2h", "record", "wait", "host_wait", "alloc")
    }
    launches = [sum(c.get(k, 0) for k in ("kernel", "engine", "xp", "h2d", "d2h")) for c in kinds]
    blockers: Counter[str] = Counter()
    pairs = 0
    for i in range(ring, len(frames)):
        if trace.faces[skip + i] == trace.faces[skip + i - ring]:
            pairs += 1
            blockers.update(set(changing(frames[i - ring], frames[i])))
    allocs: Counter[str] = Counter(e.name for f in frames for e in f if e.kind == "alloc")
    by_name: Counter[str] = Counter(e.name for f in frames for e in f if e.kind in ("kernel", "engine", "xp"))
    host = np.asarray(trace.host_s[skip:]) * 1e3
    return {
        "frames": len(frames),
        "faces": float(np.median(trace.faces[skip:])) if frames else 0.0,
        "launches per frame": float(np.median(launches)) if launches else 0.0,
        "per frame": med,
        "by name per frame": {k: v / max(1, len(frames)) for k, v in by_name.most_common()},
        "allocations per frame": {k: v / max(1, len(frames)) for k, v in allocs.most_common()},
        "graph blockers (share of frame pairs)": {k: v / max(1, pairs) for k, v in blockers.most_common()},
        "host ms p50": float(np.median(host)) if host.size else 0.0,
        "host ms p50 by step": {k: float(np.median(v[skip:])) * 1e3 for k, v in trace.steps_s.items() if v[skip:]},
        "host ms mean by step": {k: float(np.mean(v[skip:])) * 1e3 for k, v in trace.steps_s.items() if v[skip:]},
        "host ms p90": float(np.percentile(host, 90)) if host.size else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks import write_report
    from benchmarks.streams import _size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faces", type=int, default=1)
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--tracker", choices=("real", "fixed"), default="real")
    ap.add_argument("--no-band", action="store_true")
    ap.add_argument("--records", action="store_true", help="the per-frame structs from parameter records (vcam.kernels.records)")
    ap.add_argument("--streams", type=int, default=1, help="pipelines of one daemon, run round by round")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rig = build_rig(a.faces, _size(a.size), a.tracker, band=not a.no_band, streams=a.streams, records=a.records)
    s = summary(run(rig, a.frames), ring=rig.pipe.ring)
    unit = "frame" if a.streams == 1 else f"round of {a.streams} streams"
    print(
        f"{a.size}, {a.faces} face(s) in the still, {a.streams} stream(s), tracker {a.tracker}, {s['frames']} rounds traced,"
        f" {s['faces']:.0f} faces swapped a round"
    )
    print(f"{'per ' + unit + ' (median)':<34} {'count':>8}")
    print(f"{'launches (kernels, engines, xp, copies)':<34} {s['launches per frame']:>8.0f}")
    for k, v in s["per frame"].items():
        print(f"  {k:<32} {v:>8.0f}")
    print(f"launches by name, per {unit}:")
    for k, v in s["by name per frame"].items():
        print(f"  {k:<40} {v:>6.2f}")
    print(f"allocations per {unit}:", s["allocations per frame"] or "none")
    print("graph blockers (launches whose arguments change between two frames of the same faces):")
    for k, v in s["graph blockers (share of frame pairs)"].items():
        print(f"  {k:<40} {v:>6.0%} of frame pairs")
    print(f"host time of the pipelines' Python a {unit}: p50 {s['host ms p50']:.3f} ms, p90 {s['host ms p90']:.3f} ms")
    for stat in ("p50", "mean"):
        print(f"  by step, {stat} ms: " + ", ".join(f"{k} {v:.3f}" for k, v in s[f"host ms {stat} by step"].items()))
    if a.json:
        write_report(str(a.json), {"args": vars(a) | {"json": str(a.json)}, "summary": s})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
