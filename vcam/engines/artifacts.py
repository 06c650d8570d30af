"""Compiled artifacts on disk: a module compiled by TorchInductor once per GPU, library version and
precision, saved in the engine cache and loaded on later starts without compiling.

One artifact serves every batch size of an engine: its batch dimension traced as dynamic
(``1..max_batch``, tuned at the largest; :func:`trace`; checked at 1, :func:`rows_differ`); the
torch engine captures a CUDA graph per batch size from it. One artifact per size where that fails.

A build traces the module's forward with TorchDynamo (the parameters and buffers become inputs of
the graph, so the artifact holds code, not weights), compiles it with ``standalone_compile`` (on
CUDA the convolutions tuned at build time, see :func:`build_options`) and saves the artifact beside
a JSON sidecar that holds its :class:`~vcam.engines.cache.EngineKey` and the order of its inputs.
A load checks the sidecar, loads the artifact and binds the module's own tensors, so one artifact
serves every weights file of the same architecture and shapes.

Only the native architectures (:mod:`vcam.engines.native`: the inswapper generator) compile: a
generic ONNX graph reads shape tensors on the host, which TorchDynamo cannot trace into one graph.
The key's ``model_sha256`` is a digest of the structure, not of the weights: the architecture's
source code and every parameter's name, shape and dtype (no weights file is hashed at start).
``library`` names torch, Triton, the CUDA version of the driver and the build options, ``gpu``
the device. A changed fact means
another file name; a sidecar that does not match (a copied or edited file) or an artifact that fails
to load is an :class:`ArtifactError`, which the loader (:mod:`vcam.engines.compiled`) answers by
rebuilding or by running uncompiled, with one log line: never a crash.

Loading an artifact costs about 4 s on the H200 in a fresh process: 2.2-2.4 s of imports and
source keys (:func:`prepare_load`, which the loader runs in a thread while the module is built),
then 0.7-1.0 s of the artifact's own load, and its first call 0.2-0.4 s (cuDNN tunes the
convolutions left to it; no Triton kernel is tuned, see :func:`build_options`);
:class:`vcam.engines.compiled.CompiledLoader` does all of it off the frame loop.

This module knows nothing of engines: it turns a module and example arguments into a file, and a
file back into a callable.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vcam.engines.cache import (
    EngineKey,
    clear_failure,
    failed_path,
    failure,
    lock,
    locked,
    mark_failed,
    resolve_cache_dir,
    sidecar,
)

#: Bump when what a build does changes in a way the other key fields do not show.
BUILD_VERSION = 3  # 2: no runtime autotuning (build_options); 3: one artifact with a dynamic batch
SUFFIX = ".art"


class ArtifactError(Exception):
    """A compiled artifact that cannot be used: missing, stale (its key differs) or corrupt."""


def inductor_cache(cache_dir: str | os.PathLike | None) -> Path:
    """Point Inductor's own cache (Triton kernels, launch configurations) at ``<engine cache>/inductor``
    unless the user set ``TORCHINDUCTOR_CACHE_DIR``; returns the directory in use."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        path = resolve_cache_dir(cache_dir) / "inductor"
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def build_options(device: str) -> dict[str, Any]:
    """Inductor options of a build. On CUDA the convolutions' and products' kernels are chosen by
    benchmarking at build time (``max_autotune_gemm``: Triton templates against cuDNN/cuBLAS), and
    every other kernel gets one launch configuration. Full ``max-autotune`` also gives those other
    kernels several configurations, and benchmarks them again at the first call of every process
    that loads the artifact (their tuning is not cached for a loaded artifact): about 120 kernels,
    7-9 s of every start on the H200, for no faster network (``tools/load_probe.py``, deleted; at f81e72c). The CPU
    takes the defaults."""
    import torch

    if device == "cuda":
        opts: dict[str, Any] = {
            "max_autotune": False,
            "max_autotune_gemm": True,
            "coordinate_descent_tuning": False,
            "triton.cudagraphs": False,
        }
        if hasattr(torch._inductor.config, "autotune_num_choices_displayed"):
            opts["autotune_num_choices_displayed"] = 0  # no tables of every layer's candidates on stderr
        return opts
    return {}


def _triton_version() -> str:
    """Triton's version from its installed metadata, without importing it: the key of every
    artifact names it, and a start that finds no artifact never needs Triton (its import is 73 ms
    of Python in the load, H100). Triton's own ``__version__`` where the metadata is missing."""
    import importlib.metadata

    for dist in ("triton", "pytorch-triton"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import triton

    return str(triton.__version__)


def library_of(device: str, channels_last: bool) -> str:
    import torch

    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        parts.append(f"triton {_triton_version()}")
        driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        if driver is not None:  # the CUDA version the driver supports (12080: 12.8), which loads the kernels
            v = int(driver())
            parts.append(f"driver cuda {v // 1000}.{v % 1000 // 10}")
    parts.append(f"build {BUILD_VERSION}")
    if channels_last:
        parts.append("channels-last")
    return ", ".join(parts)


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
    return f"cpu {platform.machine()}"


def structure_digest(module: Any, architecture: str) -> str:
    """What the artifact's code depends on besides shapes and libraries (see the module docstring)."""
    h = hashlib.sha256(f"native {architecture}\n".encode())
    h.update(inspect.getsource(type(module)).encode())
    source = inspect.getmodule(type(module))
    if source is not None:
        h.update(inspect.getsource(source).encode())
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        h.update(f"{name} {tuple(t.shape)} {t.dtype}\n".encode())
    return h.hexdigest()


def batch_label(batch: int | tuple[int, int]) -> str:
    """``"4"`` for a static batch, ``"1-8"`` for a dynamic one (file names, progress lines)."""
    return f"{batch[0]}-{batch[1]}" if isinstance(batch, tuple) else str(batch)


def artifact_key(
    structure: str,
    *,
    device: str,
    precision: str,
    channels_last: bool,
    items: dict[str, tuple],
    batch: int | tuple[int, int],
    hint: int | None = None,
) -> EngineKey:
    """The key of one artifact (``items``: each input's shape without the batch). ``batch``: one
    size, or ``(lo, hi)`` for a dynamic batch dimension tuned at ``hint`` (default ``hi``); the
    key's profile is then ``(lo, hint, hi)`` per input."""
    if isinstance(batch, tuple):
        lo, hi = batch
        opt = hi if hint is None else hint
        profile = {n: ((lo, *s), (opt, *s), (hi, *s)) for n, s in items.items()}
    else:
        profile = {n: ((batch, *s),) * 3 for n, s in items.items()}
    return EngineKey.make(
        model_sha256=structure,
        gpu=device_name(device),
        library=library_of(device, channels_last),
        precision=precision,
        profile=profile,
    )


def key_batch(key: EngineKey) -> str:
    """What batch sizes an artifact of ``key`` serves: ``"4"``, or ``"dynamic 1-8"``."""
    profile = dict(key.profile)
    if not profile:
        return "-"
    lo, _, hi = (s[0] for s in next(iter(profile.values())))
    return str(lo) if lo == hi else f"dynamic {lo}-{hi}"


def build_version(key: EngineKey) -> int | None:
    """The :data:`BUILD_VERSION` an artifact of ``key`` was built by (None: unreadable)."""
    for part in key.library.split(", "):
        if part.startswith("build "):
            try:
                return int(part[6:])
            except ValueError:
                return None
    return None


def artifact_path(cache_dir: str | os.PathLike | None, name: str, key: EngineKey, batch: int | tuple[int, int]) -> Path:
    """``<cache>/compiled/<name>.<precision>.b<batch>.<digest>.art`` (``b1-8`` for a dynamic batch);
    ``name``: the native architecture (one artifact serves every file of it) or the model file's name."""
    return resolve_cache_dir(cache_dir) / "compiled" / f"{_stem(name, key.precision)}{batch_label(batch)}.{key.digest()}{SUFFIX}"


def _stem(name: str, precision: str) -> str:
    """What every artifact of ``name`` at ``precision`` is named with, up to its batch size."""
    return f"{Path(name).stem}.{precision}.b"


def trace(module: Any, args: Sequence[Any], dynamic_batch: tuple[int, int] | None = None) -> tuple[Any, list, list[str]]:
    """TorchDynamo's graph of ``module(*args)`` with parameters and buffers as inputs; returns the
    graph, its example inputs and their names (``@i`` for the i-th call argument, ``#i.d`` for
    the size of its dimension ``d``: a symbolic size the graph takes as an input).
    ``dynamic_batch=(lo, hi)``: every argument's first dimension is traced as one dynamic size in
    that range (the arguments' own batch is the size the build tunes for)."""
    import torch

    seen: dict[str, Any] = {}

    def grab(gm: Any, example_inputs: list) -> Any:
        seen["gm"], seen["inputs"] = gm, list(example_inputs)
        ctx = torch._guards.TracingContext.try_get()
        env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
        seen["ranges"] = dict(env.var_to_range) if env is not None else {}
        return gm.forward

    torch._dynamo.reset()
    if dynamic_batch is not None:
        for a in args:
            torch._dynamo.mark_dynamic(a, 0, min=dynamic_batch[0], max=dynamic_batch[1])
    with torch.inference_mode(), size_oblivious(dynamic_batch is not None):
        torch.compile(module, backend=grab, fullgraph=True, dynamic=None if dynamic_batch else False)(*args)
    torch._dynamo.reset()
    named = {id(t): n for n, t in list(module.named_parameters()) + list(module.named_buffers())}
    by_arg = {id(a): i for i, a in enumerate(args)}
    fakes = [n.meta.get("example_value") for n in seen["gm"].graph.nodes if n.op == "placeholder"]
    if dynamic_batch is not None:
        _check_dynamic(fakes, seen["inputs"], by_arg, seen["ranges"], dynamic_batch)
    names = []
    for j, t in enumerate(seen["inputs"]):
        if not isinstance(t, torch.Tensor):
            names.append(_size_name(fakes, j, args, by_arg, seen["inputs"]))
        elif id(t) in by_arg:
            names.append(f"@{by_arg[id(t)]}")
        elif id(t) in named:
            names.append(named[id(t)])
        else:
            raise ArtifactError("the traced graph takes a tensor that is neither an argument nor a module tensor")
    return seen["gm"], seen["inputs"], names


def size_oblivious(on: bool) -> Any:
    """Trace a dynamic batch as any size of its range, 1 included (torch otherwise assumes a traced
    size is not 1: a range of 2..8, and 1..2 collapses to 2), where the torch has the switch."""
    from torch.fx.experimental import _config

    if on and hasattr(_config, "backed_size_oblivious"):
        return _config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]  # installed by torch's config module
    return contextlib.nullcontext()


def _check_dynamic(fakes: list, inputs: list, by_arg: dict[int, int], ranges: dict, batch: tuple[int, int]) -> None:
    """Raise :class:`ArtifactError` unless every argument's batch is one symbol over ``batch``'s
    range (a module that fixes or branches on its batch keeps it static, or narrows it)."""
    for fake, real in zip(fakes, inputs):
        if id(real) not in by_arg:
            continue
        expr = getattr(getattr(fake.shape[0], "node", None), "expr", None)
        if expr is None:
            raise ArtifactError("the module fixes its batch size: a dynamic batch does not trace")
        r = ranges.get(expr)
        # Some torches trace the range from 2 (2.11, even with the size-oblivious switch): that graph serves
        # 1 where nothing in it branches on the batch, which build() checks against the traced first row.
        lower = 2 if batch[0] == 1 else batch[0]
        if r is not None and (int(r.lower) > lower or int(r.upper) < batch[1]):
            raise ArtifactError(f"the batch traced for {r.lower}..{r.upper}, not {batch[0]}..{batch[1]}")


def _feed(names: Sequence[str], fixed: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """The graph's inputs for the call arguments ``args``: ``@i`` the i-th, ``#i.d`` its size in
    dimension ``d``, any other name ``fixed`` at its place (a module tensor)."""
    out = list(fixed)
    for j, n in enumerate(names):
        if n[:1] in ("#", "@"):
            a, d = _arg_dim(n)
            out[j] = args[a] if n[0] == "@" else args[a].shape[d]
    return out


def _arg_dim(name: str) -> tuple[int, int]:
    """``#i.d`` -> ``(i, d)``, ``@i`` -> ``(i, 0)`` (``(0, 0)`` for any other name)."""
    if name[:1] not in ("#", "@"):
        return 0, 0
    i, _, d = name[1:].partition(".")
    return int(i), int(d or 0)


def _size_name(fakes: list, j: int, args: Sequence[Any], by_arg: dict[int, int], inputs: list) -> str:
    """``#i.d``: the argument dimension whose symbolic size is the graph's ``j``-th input."""
    sym = fakes[j] if j < len(fakes) else None
    expr = getattr(getattr(sym, "node", None), "expr", None)
    for fake, real in zip(fakes, inputs):
        if expr is None or id(real) not in by_arg:
            continue
        for d, size in enumerate(getattr(fake, "shape", ())):
            if getattr(getattr(size, "node", None), "expr", None) == expr:
                return f"#{by_arg[id(real)]}.{d}"
    raise ArtifactError(f"the traced graph takes a size ({sym}) that is no argument's dimension")


def build(
    module: Any,
    args: Sequence[Any],
    path: Path,
    key: EngineKey,
    *,
    device: str,
    dynamic_batch: tuple[int, int] | None = None,
) -> float:
    """Compile ``module`` for these ``args`` (``dynamic_batch``: see :func:`trace`) and save the
    artifact at ``path`` with its sidecar (both written to temporary names, then renamed: a crash
    leaves no half-written entry). Returns seconds."""
    import torch

    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    gm, inputs, names = trace(module, args, dynamic_batch)
    # Inductor writes its autotuning reports and warnings to stderr: into the entry's build log.
    with (
        open(build_log(path), "w") as report,
        contextlib.redirect_stderr(report),
        torch.inference_mode(),
        size_oblivious(dynamic_batch is not None),
    ):
        art = torch._inductor.standalone_compile(
            gm,
            inputs,
            dynamic_shapes="from_graph" if dynamic_batch else "from_example_inputs",
            options={"config_patches": build_options(device)},
        )
        # The artifact runs before it is saved (nothing is tuned at a call: build_options), at the
        # traced batch and, when dynamic, at the smallest, whose rows must be the traced batch's
        # first rows (a torch that fixed the batch, or assumed it is not 1, gives other numbers).
        full = art(*_feed(names, inputs, args))
        if dynamic_batch is not None:
            lo = dynamic_batch[0]
            try:
                small = art(*_feed(names, inputs, [a[:lo] for a in args]))
            except Exception as exc:
                raise ArtifactError(f"the dynamic batch fails at {lo} ({type(exc).__name__}: {str(exc)[:120]})") from exc
            off = rows_differ(small, full, lo)
            if off:
                raise ArtifactError(f"the dynamic batch gives other results at {lo} ({off})")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        art.save(path=str(tmp), format="binary")
        meta = {
            "key": key.to_json(),
            "inputs": names,
            "batch": key_batch(key),
            "built_s": round(time.perf_counter() - t0, 1),
            "built": time.time(),
        }
        tmp_meta = sidecar(tmp)
        tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=True))
        os.replace(tmp, path)
        os.replace(tmp_meta, sidecar(path))
    finally:
        for p in (tmp, sidecar(tmp)):
            if p.exists():
                p.unlink()
    return time.perf_counter() - t0


def rows_differ(small: Any, full: Any, rows: int, tolerance: float = 0.02) -> str:
    """'' when each output at ``rows`` is the first ``rows`` of that output at the traced batch
    (within ``tolerance`` of its range: tuned kernels may sum in another order), else what differs."""
    pairs = zip(*(x if isinstance(x, (list, tuple)) else [x] for x in (small, full)))
    for i, (a, b) in enumerate(pairs):
        ref = b[:rows].float()
        if a.shape != ref.shape:
            return f"output {i} has shape {tuple(a.shape)}, not {tuple(ref.shape)}"
        scale, err = float(ref.abs().max()) or 1.0, float((a.float() - ref).abs().max())
        if not err <= tolerance * scale:  # NaN fails too
            return f"output {i} off by {err:.3g} of {scale:.3g}"
    return ""


def build_log(path: Path) -> Path:
    """What the compiler reported while building ``path``."""
    return path.with_name(path.name + ".log")


def read_meta(path: Path) -> dict[str, Any]:
    """The sidecar of ``path``; raises :class:`ArtifactError` when absent or unreadable."""
    try:
        meta = json.loads(sidecar(path).read_text())
        EngineKey.from_json(meta["key"])
        if not isinstance(meta["inputs"], list):
            raise TypeError("inputs")
        return meta
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path.name} has no sidecar") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{sidecar(path).name} is unreadable ({type(exc).__name__}: {exc})") from exc


def load(path: Path, key: EngineKey, module: Any) -> Callable[..., Any]:
    """The artifact at ``path`` as ``fn(*args)`` calling the compiled code with ``module``'s tensors.
    Raises :class:`ArtifactError` when it is missing, stale or corrupt."""
    import torch

    if not path.is_file():
        raise ArtifactError(f"{path.name} is not built")
    meta = read_meta(path)
    if EngineKey.from_json(meta["key"]) != key:
        raise ArtifactError(f"{path.name} was built for other inputs, GPU or libraries")
    tensors = dict(list(module.named_parameters()) + list(module.named_buffers()))
    names: list[str] = meta["inputs"]
    try:
        bound = [None if n[:1] in "@#" else tensors[n] for n in names]
        for n in names:
            _arg_dim(n)  # a name it cannot read: a foreign sidecar
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(f"{path.name} names a tensor this module lacks ({exc})") from exc
    try:
        # One thread: every kernel is in the artifact, so a pool of compile workers (processes that
        # import torch, one per core, started by the first Triton kernel) would only take CPU.
        with torch._inductor.config.patch(compile_threads=1):
            fn = torch._inductor.CompiledArtifact.load(path=str(path), format="binary")
    except Exception as exc:  # a truncated or foreign file fails deep inside Inductor, in many ways
        raise ArtifactError(f"{path.name} does not load ({type(exc).__name__}: {str(exc)[:160]})") from exc

    def call(*args: Any) -> Any:
        return fn(*_feed(names, bound, args))

    return call


#: What :func:`load` imports on its first use in a process: Inductor's compiler front and caches,
#: AOTAutograd's cache, the runtime of Triton kernels. Seconds of Python on every start.
LOAD_IMPORTS = (
    "torch._inductor.standalone_compile",
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._inductor.async_compile",
    "torch._inductor.runtime.triton_heuristics",
)


def prepare_load() -> float:
    """Import what :func:`load` needs and compute the keys it checks (torch's and Triton's sources:
    kept for the process), so a later load costs only the artifact's own work. Nothing runs on a
    stream: a thread may run it while another captures CUDA graphs. Returns seconds."""
    import importlib

    import torch

    t0 = time.perf_counter()
    for name in LOAD_IMPORTS:
        importlib.import_module(name)
    from torch._inductor.codecache import torch_key

    torch_key()
    if torch.cuda.is_available():
        from torch.utils._triton import triton_hash_with_backend

        triton_hash_with_backend()  # Triton's sources hashed and ptxas asked its version: 0.4 s on the H200
    return time.perf_counter() - t0


def built_any(cache_dir: str | os.PathLike | None, name: str, precision: str) -> bool:
    """Whether the cache holds any artifact of ``name`` at this precision (for any batch, GPU or
    library: a cheap test made before the module exists, to start :func:`prepare_load` early)."""
    root = resolve_cache_dir(cache_dir) / "compiled"
    return root.is_dir() and any(root.glob(f"{_stem(name, precision)}*{SUFFIX}"))


def good(path: Path) -> bool:
    """Whether ``path`` is a built entry with a readable sidecar (not yet loaded: a load checks more)."""
    try:
        read_meta(path)
        return path.stat().st_size > 0
    except (ArtifactError, OSError):
        return False


def built_seconds(cache_dir: str | os.PathLike | None, gpu: str) -> float | None:
    """The median build time of the entries built for ``gpu`` (their sidecars), or None: what a
    progress line estimates a build takes before one has finished."""
    times = sorted(e.built_s for e in entries(cache_dir) if e.key is not None and e.key.gpu == gpu and e.built_s)
    return float(times[len(times) // 2]) if times else None


def remove(path: Path) -> None:
    """Delete an entry, its sidecar and its build log (a stale or corrupt one)."""
    for p in (path, sidecar(path), build_log(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def here() -> set[tuple[str, str]]:
    """``(gpu, "torch <version>")`` pairs this machine builds for (the CPU, and CUDA when torch sees it)."""
    try:
        import torch
    except ImportError:
        return set()
    lib = f"torch {torch.__version__}"
    out = {(device_name("cpu"), lib)}
    if torch.cuda.is_available():
        out.add((device_name("cuda"), lib))
    return out


@dataclass(frozen=True)
class Entry:
    """One artifact in the cache, for ``vcam engines list``."""

    path: Path
    size: int
    key: EngineKey | None
    built_s: float | None
    problem: str | None  # None when readable

    @property
    def superseded(self) -> bool:
        """Built by an older :data:`BUILD_VERSION` (one artifact per batch size, say): never loaded
        again, removed by the next build of its architecture on its GPU and torch."""
        version = None if self.key is None else build_version(self.key)
        return version is not None and version < BUILD_VERSION


def entries(cache_dir: str | os.PathLike | None) -> list[Entry]:
    """Every artifact under ``<cache>/compiled``, readable or not."""
    root = resolve_cache_dir(cache_dir) / "compiled"
    out = []
    for path in sorted(root.glob(f"*{SUFFIX}")) if root.is_dir() else []:
        try:
            meta = read_meta(path)
            out.append(Entry(path, path.stat().st_size, EngineKey.from_json(meta["key"]), meta.get("built_s"), None))
        except ArtifactError as exc:
            out.append(Entry(path, path.stat().st_size, None, None, str(exc)))
    return out


def prune_superseded(cache_dir: str | os.PathLike | None, name: str, key: EngineKey) -> list[Path]:
    """Remove the entries of ``name`` at ``key``'s precision built for its GPU and torch by an older
    build (:attr:`Entry.superseded`), once ``key``'s artifact is built; returns what was removed.
    Other GPUs' and torch versions' entries are left alone (another installation may use them)."""
    torch_version = key.library.split(", ")[0]
    stem = _stem(name, key.precision)
    gone = []
    for e in entries(cache_dir):
        if (
            e.superseded
            and e.key is not None
            and e.path.name.startswith(stem)
            and e.key.gpu == key.gpu
            and e.key.library.split(", ")[0] == torch_version
        ):
            remove(e.path)
            gone.append(e.path)
    return gone


__all__ = [
    "ArtifactError",
    "BUILD_VERSION",
    "Entry",
    "LOAD_IMPORTS",
    "SUFFIX",
    "artifact_key",
    "artifact_path",
    "batch_label",
    "build",
    "build_version",
    "build_log",
    "build_options",
    "built_any",
    "built_seconds",
    "clear_failure",
    "device_name",
    "entries",
    "failed_path",
    "failure",
    "good",
    "here",
    "inductor_cache",
    "key_batch",
    "library_of",
    "load",
    "lock",
    "locked",
    "mark_failed",
    "prepare_load",
    "prune_superseded",
    "read_meta",
    "remove",
    "structure_digest",
    "trace",
]
