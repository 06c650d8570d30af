"""Inference engines: every model of the product runs through one interface, several backends.

An :class:`Engine` is one loaded model. Its obligations:

- ``inputs`` / ``outputs``: :class:`TensorInfo` lists (with an ``epilogue``, ``outputs`` are the
  epilogue's).
- ``backend``, ``device`` (``"cuda"`` or ``"cpu"``: where it REALLY runs) and ``precision``.
- ``max_batch``: the most items one call takes.
- ``input_buffers(n, shapes=None)``: arrays the caller may write a batch of ``n`` into (on the
  engine's device: CuPy on CUDA, NumPy on the CPU). Passing them back to :meth:`run_device` costs no
  copy (on the torch backend they are the CUDA graph's own static inputs).
- ``run_device(feeds, stream=None)``: arrays on the engine's device in (CuPy/torch on CUDA, NumPy on
  the CPU), the same kind out, enqueued on ``stream`` without a host synchronisation; outputs are
  the engine's own buffers, valid until the next call.
- ``run(feeds)``: host arrays in, host arrays out (copies).
- ``describe()``: one line saying what runs where, for logs, ``vcam check`` and the run summary.

Backends are registered as lazy ``"module:Class"`` strings in :data:`BACKENDS`, so importing this
package never imports TensorRT, PyTorch or onnxruntime. :func:`create_engine` tries them in
:func:`backend_order` (``auto`` on CUDA: TensorRT, PyTorch, onnxruntime's CUDA provider; on the
CPU: onnxruntime, PyTorch) and raises :class:`~vcam.errors.EngineUnavailable` with every reason
when none works. ``directml`` and ``coreml`` are onnxruntime on those providers (:data:`ACCELERATORS`)
with host arrays in and out (``device`` "cpu"): the runtime picks one for ``--device auto`` without a
CUDA GPU where onnxruntime offers it (:func:`accelerator_here`).

The torch backend's compiled artifacts cross one seam, typed here: the engine is handed a
:class:`CompiledArtifacts` loader (built by :func:`vcam.engines.compiled.torch_engine`, the factory
registered in :data:`FACTORIES`) and serves it as its :class:`CompileHost`; neither module imports
the other's.

An :class:`Epilogue` is post-processing that belongs to a model's run (a detector's top-K
candidates): the torch backend fuses it into the CUDA graph, the others apply it after the call; its
NumPy form is the oracle of its torch form.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam.engines.onnx_graph import ModelSource, source_name
from vcam.errors import EngineUnavailable, ModelError

log = logging.getLogger(__name__)

BACKENDS: dict[str, str] = {
    "tensorrt": "vcam.engines.tensorrt:TensorRTEngine",
    "torch": "vcam.engines.torch:TorchEngine",
    "onnxruntime": "vcam.engines.ort:OrtEngine",
    "directml": "vcam.engines.ort:DirectMLEngine",
    "coreml": "vcam.engines.ort:CoreMLEngine",
}

#: Backends whose engines are made by a factory rather than their class (it builds what the engine
#: is handed: the torch engine's compiled-artifact loader); same lazy ``"module:function"`` form.
FACTORIES: dict[str, str] = {
    "torch": "vcam.engines.compiled:torch_engine",
}

#: Order tried by ``backend="auto"`` per device.
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "cuda": ("tensorrt", "torch", "onnxruntime"),
    "cpu": ("onnxruntime", "torch"),
}

#: Which optional extra (or package) makes a backend available; named in errors and `vcam check`.
INSTALL = {
    "tensorrt": "TensorRT 10 for your CUDA (pip install tensorrt-cu12)",
    "torch": "PyTorch for your CUDA from pytorch.org (CPU: pip install torch --index-url https://download.pytorch.org/whl/cpu)",
    "onnxruntime": "onnxruntime-gpu for CUDA (the CPU build is always installed)",
    "directml": (
        "onnxruntime-directml: pip uninstall onnxruntime, then pip install onnxruntime-directml "
        "(the two packages conflict: keep only one)"
    ),
    "coreml": "onnxruntime with its CoreML provider: pip install --force-reinstall onnxruntime (PyPI's macOS build has it)",
}


@dataclass(frozen=True)
class Accelerator:
    """An onnxruntime execution provider beyond CUDA that runs the models while the pixels stay on
    the CPU: ``backend`` (its engine backend, an :class:`~vcam.engines.ort.OrtEngine` asking for
    ``provider`` first), ``label`` (for messages), ``platform`` (the ``sys.platform`` it ships for)."""

    backend: str
    provider: str
    label: str
    platform: str

    @property
    def install(self) -> str:
        return INSTALL[self.backend]


#: Accelerators ``--device auto`` uses without a CUDA GPU (:func:`accelerator_here`), in order.
ACCELERATORS: dict[str, Accelerator] = {
    "directml": Accelerator("directml", "DmlExecutionProvider", "DirectML", "win32"),
    "coreml": Accelerator("coreml", "CoreMLExecutionProvider", "CoreML", "darwin"),
}


def available_providers() -> list[str]:
    """onnxruntime's execution providers here (``[]`` when onnxruntime does not import)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


def accelerator_here(providers: Sequence[str] | None = None) -> Accelerator | None:
    """The first accelerator whose provider is among ``providers`` (default: onnxruntime's own
    list, :func:`available_providers`), or None."""
    have = available_providers() if providers is None else list(providers)
    return next((a for a in ACCELERATORS.values() if a.provider in have), None)


def _as_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        # torch.float16 -> "float16"; onnxruntime "tensor(float)" -> "float32"
        text = str(dtype).replace("torch.", "")
        if text.startswith("tensor(") and text.endswith(")"):
            text = {"float": "float32", "double": "float64"}.get(text[7:-1], text[7:-1])
        return np.dtype(text)


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output. ``shape``: ints for fixed dims, a str (or None) for dynamic ones;
    ``dtype``: a NumPy dtype (strings and framework dtypes are converted)."""

    name: str
    shape: tuple
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))

    @property
    def fixed_batch(self) -> int | None:
        """The first dim if it is a fixed int, else None (dynamic batch)."""
        return self.shape[0] if self.shape and isinstance(self.shape[0], int) else None


class Epilogue(Protocol):
    """Post-processing run as part of a model call. ``outputs`` replace the model's outputs."""

    outputs: tuple[TensorInfo, ...]

    def torch(self, outputs: list[Any]) -> list[Any]:
        """The model's outputs (torch tensors, declared dtypes) -> the epilogue's outputs."""
        ...

    def numpy(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        """The same function on NumPy arrays (the reference)."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A loaded model (see the module docstring for each member's obligations)."""

    backend: str
    name: str
    device: str
    precision: str
    max_batch: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    skipped: list[str]

    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]: ...

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]: ...

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """An engine class (or factory) as the registry uses it."""

    @staticmethod
    def unavailable_reason(device: str = ...) -> str | None: ...

    def __call__(self, model: ModelSource, **options: Any) -> Engine: ...


#: Each input's shape without the batch axis, by input name.
Items = dict[str, tuple[int, ...]]
#: One compiled artifact, loaded and called once: (batch, item shapes, the callable, what the host
#: prepared for it in the loading thread: its CUDA graph, or None).
Loaded = tuple[int, Items, Callable[..., Any], Any]


class CompileHost(Protocol):
    """What a compiled-artifact loader uses of the torch engine it serves."""

    name: str
    module: Any  # a torch.nn.Module (torch is optional here)
    architecture: str | None
    device: str
    precision: str
    channels_last: bool
    inputs: list[TensorInfo]
    max_batch: int
    batch_sizes: tuple[int, ...]  # the batch sizes it captures
    model_path: Any  # the ONNX file (a background build makes the module from it), None for bytes
    last_batch: int  # the (padded) batch size of its last call, 0 before the first

    def call_args(self, b: int, items: Items) -> list[Any]:
        """The module's arguments for batch ``b`` from the engine's static buffers."""
        ...

    def backend_flags(self) -> AbstractContextManager[Any]:
        """The backend settings (cuDNN) every call of the module runs under."""
        ...

    def first_call(self, fn: Callable[..., Any], b: int, items: Items) -> Any:
        """Call a freshly loaded artifact once, where it cannot disturb a graph capture; returns what
        putting it into use needs (its CUDA graph, captured in the calling thread) or None."""
        ...


class CompiledArtifacts(Protocol):
    """What the torch engine asks of the compiled-artifact loader it is handed
    (:class:`vcam.engines.compiled.CompiledLoader`)."""

    def bind(self, host: CompileHost, logger: logging.Logger) -> str:
        """Serve ``host`` (its module exists); returns the compile mode in effect."""
        ...

    def build(
        self, sizes: Sequence[int], items: Items, progress: Callable[[str, str, Any], None] | None = None
    ) -> list[tuple[str, str, float]]:
        """Build what serves ``sizes`` where missing; ``(label, "built" | "cached", seconds)`` per entry."""
        ...

    @property
    def progress(self) -> str:
        """``compiling engines: 2/4, ~40 s left`` while artifacts are built in the background, else ''."""
        ...

    def load_now(self, sizes: Sequence[int], items: Items) -> list[Loaded]:
        """Load (building where missing) in the calling thread."""
        ...

    def plan(self, sizes: Sequence[int], items: Items) -> None:
        """Load the built ones of ``sizes`` in the background."""
        ...

    def resume(self) -> None:
        """Start a planned load unless one runs."""
        ...

    @property
    def started(self) -> bool: ...

    @property
    def loading(self) -> bool: ...

    @property
    def has_ready(self) -> bool: ...

    def take_ready(self) -> Iterator[Loaded]:
        """Hand over what the background load finished, one at a time."""
        ...

    def note_call(self, *, compiled: bool) -> None:
        """A call of the engine: counted when it ran uncompiled while a load was under way."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background load; True when none still runs."""
        ...

    def close(self) -> None: ...


def item_shapes(inputs: Sequence[TensorInfo], shapes: dict[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """Per input, the shape of one batch item: ``shapes[name]`` where given, else the model's fixed
    dims. ValueError for an input with dynamic dims and no shape given."""
    out = {}
    for info in inputs:
        dims = tuple(shapes[info.name]) if shapes and info.name in shapes else tuple(info.shape[1:])
        if not all(isinstance(d, int) for d in dims):
            raise ValueError(f"input '{info.name}' has dynamic dims {info.shape}: pass shapes={{'{info.name}': (...)}}")
        out[info.name] = tuple(int(d) for d in dims)
    return out


def reused_inputs(
    inputs: Sequence[TensorInfo],
    storage: dict[Any, Any],
    n: int,
    max_batch: int,
    shapes: dict[str, Sequence[int]] | None,
    xp: Any = np,
) -> dict[str, Any]:
    """Views ``[:n]`` of one ``(max_batch, *item)`` array per input and item shape, made once with
    ``xp.zeros`` in the input's dtype and kept in ``storage`` (an engine's ``input_buffers``)."""
    if n < 1 or n > max_batch:
        raise ValueError(f"batch of {n} is outside 1..{max_batch}")
    items = item_shapes(inputs, shapes)
    out = {}
    for info in inputs:
        key = (info.name, items[info.name])
        buf = storage.get(key)
        if buf is None:
            buf = storage[key] = xp.zeros((max_batch, *items[info.name]), dtype=info.dtype)
        out[info.name] = buf[:n]
    return out


def check_feeds(engine: Engine, feeds: dict[str, Any]) -> list[Any]:
    """The feeds in input order; ModelError for a missing input, ValueError for unequal batches."""
    names = [i.name for i in engine.inputs]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise ModelError(f"{engine.name}: missing input '{missing[0]}'", hint=f"the model takes {', '.join(names)}")
    arrs = [feeds[n] for n in names]
    n = int(arrs[0].shape[0])
    for name, a in zip(names, arrs):
        if int(a.shape[0]) != n:
            raise ValueError(f"{engine.name}: input '{name}' has batch {a.shape[0]} != {n}")
    return arrs


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _load_class(name: str) -> Backend:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise EngineUnavailable(
            f"unknown inference backend '{name}'", hint=f"choose one of: auto, {', '.join(BACKENDS)}"
        ) from None
    cls: Backend = _resolve(target)
    return cls


def _missing_module(exc: ImportError) -> str | None:
    """Name of the third-party module behind an ImportError, or None if it is our own code."""
    missing = getattr(exc, "name", None)
    if missing and not missing.startswith("vcam"):
        return missing
    return None


def backend_order(backend: str, device: str) -> tuple[str, ...]:
    """Backends tried for ``backend`` (``auto`` or one name) on ``device``."""
    if backend == "auto":
        return AUTO_ORDER.get(device, AUTO_ORDER["cpu"])
    if backend not in BACKENDS:
        raise EngineUnavailable(f"unknown inference backend '{backend}'", hint=f"choose one of: auto, {', '.join(BACKENDS)}")
    return (backend,)


def _try(
    name: str,
    model: ModelSource | None,
    *,
    label: str | None,
    device: str,
    fp16: bool,
    max_batch: int,
    cache_dir: str | os.PathLike[str] | None,
    epilogue: Epilogue | None,
    compile: bool | str,
    threads: int = 0,
    short_lived: bool = False,
    lean_below: int = 0,
) -> tuple[Engine | None, bool, str]:
    """Try one backend. Returns (engine or None, ok, reason)."""
    try:
        cls = _load_class(name)
    except ImportError as exc:
        missing = _missing_module(exc)
        return None, False, f"not installed (no module named '{missing}')" if missing else f"broken: {exc}"
    except EngineUnavailable:
        raise
    except Exception as exc:  # a backend module that fails at import time is broken, not absent
        return None, False, f"broken: {type(exc).__name__}: {exc}"
    reason = cls.unavailable_reason(device)
    if reason:
        return None, False, reason
    if model is None:
        return None, True, "available"
    make: Callable[..., Engine] = _resolve(FACTORIES[name]) if name in FACTORIES else cls
    extra: dict[str, Any] = {"compile": compile} if name in FACTORIES else {}
    onnxruntime = name == "onnxruntime" or name in ACCELERATORS
    if threads and onnxruntime:
        extra["threads"] = int(threads)
    if short_lived and onnxruntime:
        extra["short_lived"] = True
    if lean_below and name == "onnxruntime":
        extra["lean_below"] = int(lean_below)
    try:
        engine = make(
            model, name=label, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir, epilogue=epilogue, **extra
        )
    except EngineUnavailable as exc:
        return None, False, exc.message
    except ImportError as exc:
        missing = _missing_module(exc)
        return None, False, f"not installed (no module named '{missing}')" if missing else f"broken: {exc}"
    except ModelError:
        raise
    except Exception as exc:  # the backend failed on this model: say so, try the next one
        return None, False, f"broken: {type(exc).__name__}: {exc}"
    return engine, True, "selected"


def explain_backends(
    model: ModelSource | None = None,
    *,
    backend: str = "auto",
    device: str = "cpu",
    fp16: bool = False,
    max_batch: int = 8,
    cache_dir: str | os.PathLike | None = None,
    name: str | None = None,
    first: bool = False,
) -> list[tuple[str, bool, str]]:
    """Why each backend would be picked or skipped: ``[(name, ok, reason)]`` in the order tried.

    Without ``model`` only importability and the device are checked (every backend, or up to the
    first that can run with ``first``: the later ones are not even imported); with it each backend
    actually loads the model (slow for TensorRT). It stops at the first that works.
    """
    out: list[tuple[str, bool, str]] = []
    for b in backend_order(backend, device):
        _, ok, reason = _try(
            b, model, label=name, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir, epilogue=None, compile=False
        )
        out.append((b, ok, reason))
        if ok and (model is not None or first):
            break
    return out


def create_engine(
    model: ModelSource,
    *,
    name: str | None = None,
    backend: str = "auto",
    device: str = "cpu",
    fp16: bool = False,
    max_batch: int = 8,
    cache_dir: str | os.PathLike[str] | None = None,
    epilogue: Epilogue | None = None,
    compile: bool | str = False,
    threads: int = 0,
    short_lived: bool = False,
    lean_below: int = 0,
) -> Any:
    """Load ``model`` (a path, or ONNX bytes named ``name``) with ``backend`` (or the first that works
    for ``auto``) on ``device``. ``threads``: the CPU threads of one call on onnxruntime (0: its
    default, one per core; other backends ignore it). ``short_lived``: an engine used for seconds
    (an early swap's CPU frames), opened as quickly as it can be (onnxruntime: see
    :class:`~vcam.engines.ort.OrtEngine`). ``lean_below``: onnxruntime on the CPU with its own
    thread count runs calls of fewer input elements on one thread (a second session).

    The engine's ``skipped`` lists the backends tried before it and why. Raises
    :class:`EngineUnavailable` listing every backend tried and why it was skipped, with the fix.
    A model file that cannot be read raises :class:`~vcam.errors.ModelError` at once.
    """
    label = source_name(model, name)
    reasons: list[str] = []
    for b in backend_order(backend, device):
        engine, ok, reason = _try(
            b,
            model,
            label=name,
            device=device,
            fp16=fp16,
            max_batch=max_batch,
            cache_dir=cache_dir,
            epilogue=epilogue,
            compile=compile,
            threads=threads,
            short_lived=short_lived,
            lean_below=lean_below,
        )
        if ok and engine is not None:
            engine.skipped = list(reasons)
            return engine
        reasons.append(f"{b}: {reason}")
    if device == "cuda":
        hint = "install PyTorch with CUDA (pytorch.org) or TensorRT, or use --device cpu"
    elif backend == "auto":
        hint = "install onnxruntime (pip install onnxruntime)"
    elif backend in ACCELERATORS:
        hint = f"install {INSTALL[backend]}; or use --device cpu"
    else:
        hint = "pick another backend with --backend, or auto"
    raise EngineUnavailable(f"no inference backend can run {label} on {device}: " + "; ".join(reasons), hint=hint)


__all__ = [
    "ACCELERATORS",
    "AUTO_ORDER",
    "Accelerator",
    "BACKENDS",
    "Backend",
    "CompileHost",
    "CompiledArtifacts",
    "Engine",
    "Epilogue",
    "FACTORIES",
    "INSTALL",
    "Items",
    "Loaded",
    "TensorInfo",
    "accelerator_here",
    "available_providers",
    "backend_order",
    "check_feeds",
    "create_engine",
    "explain_backends",
    "item_shapes",
]
