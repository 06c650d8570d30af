"""PyTorch backend: ONNX models as PyTorch modules, on CUDA (FP16, CUDA graphs) or the CPU.

The architectures we ship or expect (the inswapper generator, the embedded RetinaFace) are rebuilt
as native modules (:mod:`vcam.engines.native`) whose weights are read from the ONNX initializers;
every other graph runs through :class:`~vcam.engines.native.graph.GraphModule`, which executes its
nodes with torch operators (an operator it lacks makes the backend unavailable for that file).

Buffers: every input has one static, contiguous (NCHW) buffer of ``max_batch`` items per item
shape, in the compute dtype. :meth:`TorchEngine.input_buffers` hands out views of it (CuPy on CUDA,
NumPy on the CPU) so a producer kernel writes the model input in place; a face's latent written
once stays valid for every batch size. On CUDA each batch runs at a captured size (every size up
to 8, then 16, 24, 32, 64, ... ``max_batch``: :func:`batch_buckets`; see :meth:`TorchEngine._padded`) by
replaying the CUDA graph captured for that size and those item shapes; every graph reads the same
static buffers. Conversions to channels-last and to the declared output dtypes, and the epilogue,
are inside the graph. A model with a fixed batch (files exported for one image) runs item by item into a staging buffer.

Compiled artifacts (TorchInductor) are :mod:`vcam.engines.compiled`'s business: whoever creates the
engine hands it a loader (:class:`~vcam.engines.CompiledArtifacts`, built by
:func:`vcam.engines.compiled.torch_engine`); this module never imports that one.

This module imports without PyTorch (so the package and its tests import everywhere); constructing
:class:`TorchEngine` without it raises :class:`~vcam.errors.EngineUnavailable`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from vcam.engines import CompiledArtifacts, Epilogue, Items, TensorInfo, check_feeds, item_shapes
from vcam.engines.arrays import array_kind, from_torch, to_torch, torch_dtype
from vcam.engines.gate import ROUND_TURNS
from vcam.engines.held import NO_COLLECTION
from vcam.engines.onnx_graph import ModelSource, OnnxGraph, source_name
from vcam.engines.threads import CAPTURE_LOCK, CaptureQueue, StreamMap, heuristics, private_stream, tuning_allowed
from vcam.errors import EngineUnavailable

try:  # absolute import: the top-level PyTorch package, not this module
    import torch as _torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    _torch = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


#: PyTorch's CPU build (a bare `pip install torch` on Linux is the CUDA build, several GB).
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_HINT = f"install PyTorch for your CUDA from pytorch.org (CPU: {CPU_TORCH}), or use --backend onnxruntime"


def batch_buckets(max_batch: int, every_up_to: int = 8) -> tuple[int, ...]:
    """Captured batch sizes: every size up to ``every_up_to``, then its multiples up to four times
    it, powers of two above that below ``max_batch``, and ``max_batch`` itself (``every_up_to=1``:
    powers of two only). The multiples: a daemon of four streams of six faces swaps 24 faces a round,
    which ran padded to 32 (a third more network time: H100, uncompiled, 39.8 ms a call at 32 where
    24 faces took 28.9 ms)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        if b < every_up_to:
            b += 1
        elif every_up_to > 1 and b < 4 * every_up_to:
            b += every_up_to
        else:
            b *= 2
    sizes.append(int(max_batch))
    return tuple(sizes)


class _Captured:
    __slots__ = ("batch", "graph", "outputs")

    def __init__(self, graph: Any, outputs: list[Any], batch: int = 0) -> None:
        self.graph, self.outputs, self.batch = graph, outputs, batch  # batch: the rows captured (0: not said)


#: Weights from which cuDNN autotuning is worth its cost per input shape (see ``TorchEngine(autotune=)``).
AUTOTUNE_WEIGHTS = 5_000_000
EAGER_FIRST_ENV = "VCAM_EAGER_FIRST"  # "0": no eager_first (the start-up captures the first size)


def _eager_first(asked: bool | None, autotune: bool, background_capture: bool) -> bool:
    """``TorchEngine(eager_first=)`` resolved: None is on where cuDNN autotunes unless
    ``$VCAM_EAGER_FIRST=0``; never without background captures."""
    if asked is None:
        asked = autotune and os.environ.get(EAGER_FIRST_ENV, "") != "0"
    return bool(asked) and background_capture


def _capture_now(capture: Callable[[int, Items], Any], sizes: list[int], items: Items, name: str) -> None:
    """The graphs of ``sizes`` captured now (the start-up's), with a ``-v`` line of how long they took."""
    if not sizes:
        return
    t0 = time.perf_counter()
    for b in sizes:
        capture(b, items)
    log.info("%s: batch %s captured at start-up in %.2f s", name, ",".join(map(str, sizes)), time.perf_counter() - t0)


class TorchEngine:
    """An ONNX model run by PyTorch (see the module docstring and :class:`vcam.engines.Engine`).

    ``device``: ``"cuda"`` or ``"cpu"``. ``fp16``: half precision (CUDA only; ignored with a log line
    on the CPU). ``max_batch``: most items per call. ``cache_dir``: the engine cache (compiled
    artifacts, Inductor's own cache). ``epilogue``: post-processing fused into the graph.
    ``cuda_graphs``: replay captured CUDA graphs (default on CUDA). ``channels_last``: NHWC for the
    convolutions (None: on for the native modules in FP16 on CUDA, where it measured faster).
    ``loader``: see below. ``warmup``: capture every batch size (and with a loader, build or load
    its artifact) at construction when all input dims are fixed. ``tf32``: allow TF32 convolutions.
    ``autotune``: cuDNN benchmarks the convolution algorithms of every new input shape (about half a
    second each); None: only for models of :data:`AUTOTUNE_WEIGHTS` weights or more, where the
    chosen algorithm pays (the swappers), not for small networks run at many shapes (the detector's
    scan and region sizes times its batch sizes took ~17 s of every GPU start). ``saved_build``: take
    a native module from its saved build in the engine cache (:mod:`vcam.engines.native.saved`),
    without reading the ONNX file, and save one after a build. ``background_capture``: the warm-up
    captures the first batch size and leaves the others to a background thread (see :meth:`warmup`),
    whose captures take cuDNN's heuristic algorithms rather than autotuning them beside the frames
    (:func:`vcam.engines.threads.tuning_allowed`).
    ``eager_first``: with ``background_capture``, the first size goes to that thread too, and the
    calls made before their size is captured run eagerly (cuDNN's heuristic algorithms, no
    autotuning): the start-up captures nothing, and the first frames on the GPU do not wait for a
    capture (about a second for the inswapper in FP16 on the H200). None: on where cuDNN autotunes
    (the large networks, whose captures cost that second), unless ``$VCAM_EAGER_FIRST=0``. Measured
    on the H200 (warm, one stream, 33 ms budget): the first GPU frame 3.9-4.2 s against 4.8-4.9 s,
    p99 25-33 ms against 28-31 ms: the capture after the takeover did not stall the camera.

    ``loader``: the compiled artifacts (:class:`~vcam.engines.CompiledArtifacts`; None: never
    compiled), for models whose inputs have fixed item shapes; handed in by whoever creates the
    engine (:func:`vcam.engines.compiled.torch_engine` builds one for a ``compile`` mode). Its mode
    ``"auto"``: the artifact in the engine cache (one with a dynamic batch serves every size; each
    size still gets its own CUDA graph) is loaded in a background thread from the end of the
    warm-up on (Inductor's imports from the construction on) and replaces each size's uncompiled
    graph between two calls (a call before that runs uncompiled); a missing one is built by the
    loader in another process (on CUDA; see :mod:`vcam.engines.autobuild`) and replaces the graphs
    the same way once built, or the sizes stay uncompiled with one log line (``compile="load"``,
    or on the CPU); ``"build"``: missing artifacts are built now (a minute or two on CUDA), and
    every size is captured compiled; ``"off"``: never compiled.
    """

    backend = "torch"
    #: The padded batch size of the last call (0 before the first): a compiled load puts that size
    #: in use first (:func:`vcam.engines.compiled.frames_first`).
    last_batch = 0

    @staticmethod
    def unavailable_reason(device: str = "cuda") -> str | None:
        """Why this backend cannot run on ``device`` here, or None if it can."""
        if _torch is None:
            return "torch not installed"
        if device == "cuda":
            return None if _torch.cuda.is_available() else "torch sees no CUDA device (a CPU-only build, or no driver)"
        if device == "cpu":
            return None
        return f"unknown device '{device}' (use cuda or cpu)"

    def __init__(
        self,
        model: ModelSource,
        *,
        name: str | None = None,
        device: str = "cuda",
        fp16: bool = False,
        max_batch: int = 8,
        cache_dir: str | os.PathLike[str] | None = None,
        epilogue: Epilogue | None = None,
        cuda_graphs: bool = True,
        channels_last: bool | None = None,
        loader: CompiledArtifacts | None = None,
        warmup: bool = True,
        tf32: bool = False,
        autotune: bool | None = None,
        saved_build: bool = True,
        background_capture: bool = True,
        eager_first: bool | None = None,
    ) -> None:
        reason = self.unavailable_reason(device)
        if reason:
            raise EngineUnavailable(reason, hint=TORCH_HINT if "torch" in reason else "use --device cpu")
        torch = _torch
        self.name = source_name(model, name)
        self.model_path = None if isinstance(model, (bytes, bytearray)) else Path(model)
        self.device = device
        self._dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        if fp16 and device != "cuda":
            log.info("fp16 requested on the CPU: running %s in float32", self.name)
            fp16 = False
        self.fp16 = bool(fp16)
        self.precision = "fp16" if self.fp16 else "fp32"
        self.dtype = torch.float16 if self.fp16 else torch.float32
        self.tf32 = bool(tf32)
        self.cache_dir = cache_dir
        self.skipped: list[str] = []

        # A native architecture's module comes from its saved build when the engine cache has a good
        # one (the ONNX file is not read then), else from the graph (and is saved for the next start).
        from vcam.engines.native.saved import open_native

        native, graph = open_native(model, name, cache_dir, use_saved=saved_build)
        self.architecture = native.architecture if native is not None else None
        #: Whether the module came from a saved build (:mod:`vcam.engines.native.saved`).
        self.from_saved = bool(native is not None and native.saved)
        # With "auto" and an artifact of the architecture in the cache, the loader starts Inductor's
        # imports in a thread now, while this thread builds the module and captures its graphs.
        self.loader = loader
        self.compile_mode = loader.bind(self, log) if loader is not None else "off"
        source = native if native is not None else graph
        assert source is not None
        self.inputs = [TensorInfo(n, s, d) for n, s, d in source.inputs]
        raw_outputs = [TensorInfo(n, s, d) for n, s, d in source.outputs]
        self._in_names = [i.name for i in self.inputs]
        self._out_dtypes = [torch_dtype(o.dtype) for o in raw_outputs]
        self.epilogue = epilogue
        self.outputs: list[TensorInfo] = list(epilogue.outputs) if epilogue is not None else raw_outputs

        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.item_batch = self.inputs[0].fixed_batch if self.inputs else None
        self.batch_sizes = (self.item_batch,) if self.item_batch else batch_buckets(self.max_batch)
        self._cap = max(self.batch_sizes + (self.max_batch,))
        self.compile_sizes = (self.item_batch,) if self.item_batch else batch_buckets(self.max_batch, 1)

        if native is not None:
            module, call_order, out_order = native.module, native.call_order, native.out_order
        else:
            assert graph is not None
            module, call_order, out_order = self._build_module(graph)
        self._call_order = call_order
        self._out_index = [out_order.index(o.name) for o in raw_outputs]
        if channels_last is None:
            channels_last = device == "cuda" and self.fp16 and self.architecture is not None
        self.channels_last = bool(channels_last)
        weights = sum(t.numel() for t in module.parameters()) + sum(t.numel() for t in module.buffers())
        self.autotune = bool(autotune) if autotune is not None else weights >= AUTOTUNE_WEIGHTS
        module = module.eval().requires_grad_(False).to(self._dev, self.dtype)
        module = module.to(memory_format=torch.channels_last) if self.channels_last else module
        self.module = self._fn = module
        self._compiled_fns: dict[tuple, Any] = {}  # capture key -> loaded artifact, in use
        self.cuda_graphs = bool(cuda_graphs) and device == "cuda"
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._storage: dict[tuple, Any] = {}
        self._stage: dict[tuple, Any] = {}
        self._views: dict[tuple, Any] = {}
        self._fast: dict[tuple, tuple] = {}
        self._streams = StreamMap(self._dev)  # CuPy/raw streams as torch streams, and replay contexts
        self.background_capture = bool(background_capture)
        self.eager_first = _eager_first(eager_first, self.autotune, self.background_capture)
        self._later = CaptureQueue(self._captured_for, self._dev, self.name)  # sizes captured in the background
        fixed = all(all(isinstance(d, int) for d in i.shape[1:]) for i in self.inputs)
        if warmup and fixed and (self.cuda_graphs or self.compile_mode != "off"):
            self.warmup()

    # -- construction helpers -----------------------------------------------------------------------

    def _build_module(self, graph: OnnxGraph) -> tuple[Any, list[str], list[str]]:
        """A graph without a native module, run node by node (the native ones: see ``__init__``)."""
        from vcam.engines.native.graph import GraphModule

        module = GraphModule(graph)
        return module, list(self._in_names), list(graph.output_names)

    def backend_flags(self) -> AbstractContextManager[Any]:
        """The cuDNN settings every call of the module runs under (nothing on the CPU)."""
        if self.device != "cuda":
            return contextlib.nullcontext()
        tune = self.autotune and tuning_allowed()
        return _torch.backends.cudnn.flags(enabled=True, benchmark=tune, deterministic=False, allow_tf32=self.tf32)

    def describe(self) -> str:
        how = f"native {self.architecture}" if self.architecture else "generic graph"
        extras = [how] + (["CUDA graphs"] if self.cuda_graphs else [])
        done = self.compiled_batches
        if done:
            extras.append("compiled batch " + ",".join(str(b) for b in done))
        elif self.loader is not None and self.loader.loading:
            extras.append("loading compiled")
        return f"torch {self.precision} on {self.device} ({', '.join(extras)})"

    @property
    def compile_progress(self) -> str:
        """``compiling engines: 2/4, ~40 s left`` while the loader builds in the background, else ''."""
        return self.loader.progress if self.loader is not None else ""

    @property
    def compiled(self) -> bool:
        """Whether any batch size runs a compiled artifact."""
        return bool(self._compiled_fns)

    def compiled_for(self, n: int) -> bool:
        """Whether a call of ``n`` items runs compiled now."""
        try:
            return self._padded(n) in self.compiled_batches
        except ValueError:
            return False

    @property
    def compiled_batches(self) -> tuple[int, ...]:
        """The batch sizes that run compiled now."""
        return tuple(sorted({k[0] for k in self._compiled_fns}))

    # -- buffers --------------------------------------------------------------------------------

    def _storage_for(self, info: TensorInfo, item: tuple[int, ...]) -> Any:
        key = (info.name, item)
        t = self._storage.get(key)
        if t is None:
            dtype = self.dtype if np.issubdtype(info.dtype, np.floating) else torch_dtype(info.dtype)
            # A normal tensor even when made inside a capture's inference mode: calls outside it copy
            # into it. setdefault: a background capture and a call creating it at once get one buffer.
            with _torch.inference_mode(False):
                fresh = _torch.zeros((self._cap, *item), dtype=dtype, device=self._dev)
            t = self._storage.setdefault(key, fresh)
        return t

    def _padded(self, n: int) -> int:
        """The smallest captured size from ``n`` up, or, where that one runs uncompiled, one below
        ``2 n`` that runs compiled (about twice as fast a face: compiled 8 beats uncompiled 6)."""
        if not self.cuda_graphs and self.item_batch is None and self.compile_mode == "off":
            return n
        fits = [b for b in self.batch_sizes if b >= n]
        if not fits:
            raise ValueError(f"batch of {n} is larger than the engine's {self.batch_sizes[-1]}")
        if self._compiled_fns and fits[0] not in (done := self.compiled_batches):
            return next((b for b in fits if b in done and b < 2 * n), fits[0])
        return fits[0]

    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """Views ``[:n]`` of the static input buffers (CuPy on CUDA, NumPy on the CPU); see the module
        docstring. With CUDA graphs the graph for this batch size and these shapes is captured now."""
        if n > min(self.max_batch, self._cap) or n < 1:
            raise ValueError(f"batch of {n} is outside 1..{self.max_batch}")
        self._take_loaded(wait=False)
        items = item_shapes(self.inputs, shapes)
        step = min(n, self.item_batch or n)
        cap = _exact_graph(self, self._padded(step), items) if self.cuda_graphs else None
        out = {}
        for info in self.inputs:
            key = (info.name, items[info.name], n)
            view = self._views.get(key)
            if view is None:
                t = self._storage_for(info, items[info.name])[:n]
                view = self._views[key] = from_torch(t, "cupy" if self.device == "cuda" else "numpy")
            out[info.name] = view
        if cap is not None and self.item_batch is None:
            # The hot path: these very arrays passed back to run_device replay this graph, with no
            # DLPack conversion either way (its outputs are converted once, here).
            ptrs = tuple((out[i.name].data.ptr, out[i.name].shape) for i in self.inputs)
            if ptrs not in self._fast:
                b = self._padded(n)
                outs = cap.outputs if b == n else [o[:n] for o in cap.outputs]
                self._fast[ptrs] = (cap, [from_torch(o, "cupy") for o in outs])
        return out

    def warmup(
        self,
        shapes: dict[str, Sequence[int]] | None = None,
        batches: Sequence[int] | None = None,
        *,
        background: bool | None = None,
    ) -> None:
        """Capture the CUDA graphs (so no live frame pays for them): every batch size, or
        ``batches``, for the item ``shapes`` (default: the model's fixed dims). ``background`` (None:
        the engine's ``background_capture``): the first size is captured now, the others by a
        background thread while the frames run (a frame that needs one before captures it itself;
        :meth:`wait_graphs` waits for them)."""
        items = item_shapes(self.inputs, shapes)
        sizes = list(dict.fromkeys(self._padded(b) for b in batches or self.batch_sizes))
        compile_sizes = list(dict.fromkeys(self._compile_size(b) for b in sizes))
        if self.compile_mode == "build" and self.loader is not None:
            self.build_compiled(compile_sizes, shapes)
            for b, its, fn, _ in self.loader.load_now(compile_sizes, items):
                self._compiled_fns[self._graph_key(b, its)] = fn
        if self.cuda_graphs:
            later = self.background_capture if background is None else background
            now = [] if later and self.eager_first else sizes[:1] if later else sizes
            _capture_now(self._captured_for, now, items, self.name)
            if later and len(sizes) > len(now):
                self._later.put(sizes[len(now) :], items)
        if self.compile_mode == "auto" and self.loader is not None:
            self.loader.plan(compile_sizes, items)

    def capture_first(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> bool:
        """The graph of the first frames' batch (``n`` items, padded to a captured size) captured
        now, in the load, on cuDNN's heuristic algorithms as the background captures are
        (:func:`~vcam.engines.threads.heuristics`): with ``eager_first`` the frames would run that
        size eagerly from the GPU's first frame until the background captured it beside them (issue
        39, H200, four streams, compiled cache: rounds of batch 4 waited out its 41-299 ms capture
        right after the takeover). The call's warm-up passes do what a first eager call did (the
        kernels loaded, memory taken). True when the graph is there; False where this engine
        captures none (no CUDA graphs, a file of a fixed batch), for the caller to warm it otherwise."""
        return _capture_first(self, n, item_shapes(self.inputs, shapes))

    # -- compiled artifacts ---------------------------------------------------------------------

    def call_args(self, b: int, items: Items) -> list[Any]:
        """The module's arguments for batch ``b`` from the static buffers, as ``_forward`` passes them."""
        return self._module_args([self._storage_for(info, items[info.name])[:b] for info in self.inputs])

    def _module_args(self, args: Sequence[Any]) -> list[Any]:
        """Engine inputs (in ``self.inputs`` order) as the module takes them: its order, its layout."""
        by_name = dict(zip(self._in_names, args))
        call = [by_name[n] for n in self._call_order]
        if not self.channels_last:
            return call
        return [a.contiguous(memory_format=_torch.channels_last) if a.dim() == 4 and a.is_floating_point() else a for a in call]

    def build_compiled(
        self,
        batches: Sequence[int] | None = None,
        shapes: dict[str, Sequence[int]] | None = None,
        progress: Callable[[str, str, Any], None] | None = None,
    ) -> list[tuple[str, str, float]]:
        """Build what serves these batch sizes (default: every captured size) unless the cache has
        it: one artifact with a dynamic batch, else one per size; a stale or corrupt entry is rebuilt
        with one log line. ``progress``: called as ``progress(event, label, detail)``
        (:meth:`CompiledLoader.build <vcam.engines.compiled.CompiledLoader.build>`). Returns
        ``(label, "built" | "cached" | "failed", seconds)`` per entry tried (label ``"1-8"``: the
        dynamic one). Needs a loader (see the class docstring)."""
        if self.loader is None:
            raise RuntimeError(f"{self.name}: no compiled-artifact loader (create it with vcam.engines.compiled.torch_engine)")
        items = item_shapes(self.inputs, shapes)
        return self.loader.build(sorted({self._compile_size(b) for b in batches or self.compile_sizes}), items, progress)

    def _compile_size(self, n: int) -> int:  # the artifact a batch of n uses (compile_sizes: powers of two)
        return next((b for b in self.compile_sizes if b >= n), self.compile_sizes[-1])

    def first_call(self, fn: Callable[..., Any], b: int, items: Items) -> _Captured | None:
        """The first call of an artifact the loader's thread loaded: it tunes cuDNN's convolutions
        and may synchronise the device, so it runs on a stream of that thread's own, while no graph
        is being captured. With CUDA graphs, batch ``b``'s graph through ``fn`` is then captured
        here too (returned): putting the artifact into use at a call (:meth:`_adopt`) costs the
        frame loop no capture. Issue 39: the frame thread captured each size's graph when it took
        the artifacts, and the camera stood still for up to 980 ms (H100, one stream, 2026-12-06)."""
        with CAPTURE_LOCK, ROUND_TURNS.staying(), _torch.inference_mode(), self.backend_flags(), private_stream(self._dev):
            fn(*self.call_args(b, items))
        return self._capture(b, items, fn) if self.cuda_graphs else None

    def _take_loaded(self, wait: bool) -> None:
        """At a call: put what the loader finished into use (see :meth:`_adopt`), or start a load
        still planned; tells the loader of the call (it counts those made uncompiled during a load)."""
        if (loader := self.loader) is None:
            return
        if loader.has_ready:
            self._adopt(wait=wait)
        else:
            loader.resume()
        loader.note_call(compiled=bool(self._compiled_fns))

    def _adopt(self, wait: bool = True) -> None:
        """Put the artifacts the background thread loaded into use (the frame loop, between two
        calls): a size whose graph the loader captured (:meth:`first_call`) is a swap of two
        references; one without a graph is captured here. Without ``wait`` nothing happens while the
        loader holds the capture lock (the next call tries again)."""
        if self.loader is None or (self.cuda_graphs and not CAPTURE_LOCK.acquire(blocking=wait)):
            return
        try:
            for b, items, fn, graph in self.loader.take_ready():
                key = self._graph_key(b, items)
                self._compiled_fns[key] = fn
                if graph is not None:
                    self._graphs[key] = graph
                elif self.cuda_graphs and key in self._graphs:
                    self._graphs[key] = self._capture(b, items)
            self._fast.clear()
        finally:
            if self.cuda_graphs:
                CAPTURE_LOCK.release()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the background loads and put what they loaded into use now (benchmarks: call it
        from the thread that runs the engine). True when no load is still running."""
        self.wait_graphs(timeout)
        if self.loader is None:
            return True
        done = self.loader.wait(timeout)
        if self.loader.has_ready:
            self._adopt()
        return done

    # -- calling --------------------------------------------------------------------------------

    def _forward(self, args: Sequence[Any], fn: Callable[..., Any] | None = None) -> list[Any]:
        res = (fn or self._fn)(*self._module_args(args))
        if not isinstance(res, (tuple, list)):
            res = (res,)
        outs = [res[i].to(dtype=dt).contiguous() for i, dt in zip(self._out_index, self._out_dtypes)]
        return self.epilogue.torch(outs) if self.epilogue is not None else outs

    def _capture(self, b: int, items: Items, fn: Callable[..., Any] | None = None) -> _Captured:
        """Warm up and capture batch ``b`` (through ``fn``, default the compiled artifact in use for
        it, else the module) on a side stream of its own. Nothing here waits for, or
        frees memory under, the other threads' streams (``torch.cuda.graph`` would synchronise the
        device and empty the allocator's cache first), so a capture in the background thread does
        not stall the frames meanwhile."""
        torch = _torch
        with CAPTURE_LOCK, ROUND_TURNS.staying(), torch.inference_mode(), self.backend_flags():
            static = [self._storage_for(info, items[info.name])[:b] for info in self.inputs]
            fn = fn if fn is not None else self._compiled_fns.get(self._graph_key(b, items))
            side = torch.cuda.Stream(self._dev)
            side.wait_stream(torch.cuda.current_stream(self._dev))  # the static buffers' zeroing
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side):
                for _ in range(2):  # cuDNN autotune, lazy init, a compiled artifact's kernels loaded
                    self._forward(static, fn)
                outputs = _captured(graph, self._pool, lambda: self._forward(static, fn))
            side.synchronize()
        return _Captured(graph, outputs, b)

    def _graph_key(self, b: int, items: Items) -> tuple[Any, ...]:
        return (b,) + tuple(tuple(items[i.name]) for i in self.inputs)

    def _captured_for(self, b: int, items: Items) -> _Captured:
        """The graph of batch ``b`` (captured now when missing). A graph already there is found
        without a lock; a missing one is captured under :data:`CAPTURE_LOCK`, after the background
        capture (:meth:`warmup`) that may hold it, unless that one captured it meanwhile."""
        key = self._graph_key(b, items)
        cap = self._graphs.get(key)
        if cap is None:
            with CAPTURE_LOCK:
                cap = self._graphs.get(key)
                if cap is None:
                    cap = self._graphs[key] = self._capture(b, items)
                    while len(self._graphs) > 32:  # dynamic-shape models: keep the most recent shapes
                        self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return cap

    def wait_graphs(self, timeout: float | None = None) -> bool:
        """Wait for the background captures (:meth:`warmup`); True when none is still running."""
        return self._later.wait(timeout)

    def _run_once(self, tensors: list[Any], n: int) -> list[Any]:
        """One call of at most one padded batch; tensors on the engine's device."""
        items = {info.name: tuple(t.shape[1:]) for info, t in zip(self.inputs, tensors)}
        b = self.last_batch = self._padded(n)
        static = [self._storage_for(info, items[info.name]) for info in self.inputs]
        for dst, src in zip(static, tensors):
            view = dst[:n]
            if src.data_ptr() != view.data_ptr() or src.stride() != view.stride() or src.dtype != view.dtype:
                view.copy_(src)
        if self.cuda_graphs:
            outs = _replay_or_eager(self, [s[:b] for s in static], b, items)
        else:
            with _torch.inference_mode(), self.backend_flags():
                self._take_loaded(wait=True)
                outs = self._forward([s[:b] for s in static], self._compiled_fns.get(self._graph_key(b, items)))
        return outs if b == n else [o[:n] for o in outs]  # a batch-1 file's outputs may have no batch axis

    def _run_tensors(self, tensors: list[Any], n: int) -> list[Any]:
        """A file with a fixed batch runs chunk by chunk; each output is the chunks' outputs
        concatenated along their first axis (the batch axis, or the rows of a batch-1 file's
        outputs), in a staging buffer."""
        step = self.item_batch or n
        if step >= n:
            return self._run_once(tensors, n)
        parts: list = []
        chunks = -(-n // step)
        for c, s in enumerate(range(0, n, step)):
            m = min(step, n - s)
            outs = self._run_once([t[s : s + m] for t in tensors], m)
            if not parts:
                parts = [self._staging(i, o, chunks) for i, o in enumerate(outs)]
            for p, o in zip(parts, outs):
                rows = o.shape[0]
                p[c * rows : (c + 1) * rows].copy_(o)
        return [p[: chunks * (p.shape[0] // (-(-self.max_batch // step)))] for p in parts]

    def _staging(self, index: int, like: Any, chunks: int) -> Any:
        per_call = -(-self.max_batch // (self.item_batch or 1))
        key = (index, tuple(like.shape), like.dtype)
        t = self._stage.get(key)
        if t is None:
            shape = (like.shape[0] * per_call, *like.shape[1:])
            t = self._stage[key] = _torch.empty(shape, dtype=like.dtype, device=self._dev)
        return t

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        """Device arrays in (CuPy or torch on CUDA; NumPy or torch on the CPU), the same kind out, on
        ``stream`` (CuPy/torch stream, raw handle, or None: current) without host sync. Outputs are
        views of engine buffers valid until the next call."""
        torch = _torch
        arrs = check_feeds(self, feeds)
        kind = array_kind(arrs[0])
        if kind == "cupy" and self._fast:
            hit = self._fast.get(tuple((a.data.ptr, a.shape) for a in arrs))
            if hit is not None:
                cap, outs = hit
                with self._streams.replay_context(stream):  # the hot path: one replay, nothing allocated
                    cap.graph.replay()
                return outs
        n = int(arrs[0].shape[0])
        if n > self.max_batch:
            raise ValueError(f"batch of {n} is larger than max_batch={self.max_batch}")
        if self.device != "cuda":
            if kind == "cupy":
                raise TypeError(f"{self.name} runs on the CPU: pass NumPy arrays or CPU tensors")
            with torch.inference_mode():
                outs = self._run_tensors([to_torch(a, kind) for a in arrs], n)
            return [from_torch(o, kind) for o in outs]
        if kind == "numpy":
            raise TypeError(f"{self.name} runs on CUDA: pass CuPy arrays or torch CUDA tensors (use run() for NumPy)")
        with torch.cuda.stream(self._streams.torch_stream(stream, kind)):
            tensors = [to_torch(a, kind) for a in arrs]
            for name, t in zip(self._in_names, tensors):
                if t.device != self._dev:
                    raise ValueError(f"input '{name}' is on {t.device}, the engine runs on {self._dev}")
            outs = self._run_tensors(tensors, n)
            return [from_torch(o, kind) for o in outs]

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        """Host arrays in, host arrays out (copies, in the declared dtypes)."""
        torch = _torch
        arrs = [np.ascontiguousarray(np.asarray(a), dtype=i.dtype) for a, i in zip(check_feeds(self, feeds), self.inputs)]
        n = arrs[0].shape[0]
        results: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for start in range(0, max(n, 1), self.max_batch):
            chunk = [torch.from_numpy(a[start : start + self.max_batch]).to(self._dev) for a in arrs]
            with torch.inference_mode():
                outs = self._run_tensors(chunk, chunk[0].shape[0])
                for acc, o in zip(results, outs):
                    acc.append(o.detach().cpu().numpy().copy())
        return [np.concatenate(r, axis=0) if len(r) > 1 else r[0] for r in results]

    def close(self) -> None:
        """Drop the captured graphs and buffers (idempotent); stops the compiled engines' loader."""
        self._later.close()  # it stops between two sizes
        if self.loader is not None:
            self.loader.close()  # it stops between two sizes
        self._compiled_fns.clear()
        self._graphs.clear()
        self._views.clear()
        self._fast.clear()
        self._storage.clear()
        self._stage.clear()
        self._streams.clear()

    def __repr__(self) -> str:
        return f"TorchEngine({self.name!r}, {self.describe()})"


def _graph_or_none(engine: TorchEngine, b: int, items: Items) -> _Captured | None:
    """The graph of batch ``b`` (captured now when missing: ``TorchEngine._captured_for``); while
    ``eager_first`` leaves it to the background captures still under way (asked to take this size
    next: :meth:`CaptureQueue.want`, urgently when no larger graph runs the call), the graph of the
    smallest larger batch already captured (:func:`_larger_graph`), else None (the call runs eagerly)."""
    if _left_to_background(engine, b, items):
        larger = _larger_graph(engine, b, items)
        engine._later.want(b, items, urgent=larger is None)  # captured next; at once if the call runs eagerly
        return larger
    return engine._captured_for(b, items)


def _capture_first(engine: TorchEngine, n: int, items: Items) -> bool:
    """:meth:`TorchEngine.capture_first`'s work: batch ``n`` (padded) captured on the heuristics."""
    if not engine.cuda_graphs or engine.item_batch is not None:
        return False
    b = engine._padded(max(1, min(int(n), engine.max_batch)))
    t0 = time.perf_counter()
    with heuristics():
        engine._captured_for(b, items)
    log.info("%s: batch %d captured for the first frames in %.2f s", engine.name, b, time.perf_counter() - t0)
    return True


def _exact_graph(engine: TorchEngine, b: int, items: Items) -> _Captured | None:
    """For :meth:`TorchEngine.input_buffers`: the graph of batch ``b`` (captured now when missing),
    or None while ``eager_first`` leaves it to the background captures. A buffer lookup is not a
    call: it neither asks for the size (the swapper's source rows take the buffers of its largest
    batch; issue 39, H200, four streams: that made batch 32, which no round ran, an urgent capture
    of 120-180 ms right after the takeover) nor takes a larger batch's graph, whose outputs the hot
    path would return unsliced, and keep, once the size's own graph is there. The call that follows
    (:func:`_replay_or_eager`) does both."""
    return None if _left_to_background(engine, b, items) else engine._captured_for(b, items)


def _left_to_background(engine: TorchEngine, b: int, items: Items) -> bool:
    """Whether batch ``b`` is not captured yet and ``eager_first`` leaves it to the background
    captures still under way (rather than capturing it now)."""
    return engine.eager_first and engine._graph_key(b, items) not in engine._graphs and engine._later.running


def _larger_graph(engine: TorchEngine, b: int, items: Items) -> _Captured | None:
    """The captured graph of the smallest batch above ``b`` for these items, or None. Its first
    ``b`` rows are this call's: every input row is its own item (the rows above ``b`` hold what an
    earlier call left, as a padded batch's do), and it replays without the capture lock, where an
    eager call waits out any capture under way. Issue 39 (H100, four streams, compiled cache,
    2026-12-06): the frames' eager calls waited 105-116 ms five times in one run, while the
    background captured other sizes and the rounds' face count changed from one round to the next."""
    for bigger in engine.batch_sizes:  # the sizes graphs are captured for, ascending
        if bigger > b and (cap := engine._graphs.get(engine._graph_key(bigger, items))) is not None:
            return cap  # lookups only: the capture thread adds entries meanwhile
    return None


def _captured(graph: Any, pool: Any, run: Callable[[], Any]) -> Any:
    """``run()`` captured into ``graph`` (its memory from ``pool``); returns what it returned. Thread-local
    mode: other threads (the frames, the capture thread's nvJPEG) may call the driver meanwhile, only
    this thread's calls would break the capture; and no garbage collection runs meanwhile
    (:data:`~vcam.engines.held.NO_COLLECTION`: a collected engine's graph destroyed in it voids it)."""
    with NO_COLLECTION.held():
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            return run()
        finally:
            graph.capture_end()


def _replay_or_eager(engine: TorchEngine, static: list[Any], b: int, items: Items) -> list[Any]:
    """One call of batch ``b`` on the static buffers' views ``static``: its graph replayed, or run
    eagerly while the background captures have not reached its size (:func:`_eager`)."""
    cap = _graph_or_none(engine, b, items)
    if cap is None:
        return _eager(engine, static, b, items)
    cap.graph.replay()
    return list(cap.outputs) if cap.batch <= b else [o[:b] for o in cap.outputs]  # a larger batch's graph: its first rows


def _eager(engine: TorchEngine, static: list[Any], b: int, items: Items) -> list[Any]:
    """One call without its graph (``eager_first``, before the background thread captured its size),
    on the caller's stream, with cuDNN's heuristic algorithms (autotuning a new shape takes about half
    a second). Under :data:`~vcam.engines.threads.CAPTURE_LOCK`: never beside a capture (one under
    way is waited for, once; if it was this size's, its graph is replayed instead)."""
    torch = _torch
    key = engine._graph_key(b, items)
    with CAPTURE_LOCK:
        cap = engine._graphs.get(key)
        if cap is not None:
            cap.graph.replay()
            return list(cap.outputs)
        flags: AbstractContextManager[Any] = contextlib.nullcontext()
        if engine.device == "cuda":
            flags = torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=engine.tf32)
        with torch.inference_mode(), flags:
            return engine._forward(static, engine._compiled_fns.get(key))


__all__ = ["TorchEngine", "batch_buckets"]
