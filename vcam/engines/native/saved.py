"""Saved builds of the native modules: the converted weights on disk, loaded without reading ONNX.

Reading the inswapper's 550 MB ONNX file and copying its initializers into the native module takes
seconds at every start (about 1 s to parse, 2 s to fill on a busy CPU; 2.4 s on the H200's host).
After the first build the module's state (float32, as converted) is saved in the engine cache
(:func:`vcam.engines.cache.resolve_cache_dir`) under ``native/``, and later starts load it
memory-mapped (``torch.load(mmap=True)``): the module is built on the meta device and takes the
mapped tensors as its parameters, so nothing is read until the weights are copied to the GPU.

The file's name carries a digest of everything the saved state depends on: the ONNX file's
identity (name, size, modification time and a hash of its first and last 64 KiB; for ONNX bytes,
their SHA-256), the converter's own source (this package and :mod:`vcam.engines.onnx_graph`) and
:data:`FORMAT`. A changed model or converter is a new name and a rebuild; a save of the same model
under an older name is removed when the new one is written. A damaged file (not a torch archive,
missing or misshapen weights, unreadable metadata) is removed and rebuilt from the ONNX file with
one warning, never fatal. Saves are written to a temporary name and renamed, in a background
thread after a build (:func:`wait_saves` waits for them), so the first start does not wait for the
write.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vcam.engines.cache import model_identity
from vcam.engines.onnx_graph import ModelSource, OnnxGraph, recognise, source_name

log = logging.getLogger("vcam.engines.torch")

#: Bump when the meaning of a saved file changes (its fields, the state's layout).
FORMAT = 1
_SUFFIX = ".pt"

#: Module argument order and output order of each native architecture.
ORDERS: dict[str, tuple[list[str], list[str] | None]] = {
    "inswapper": (["target", "source"], None),  # outputs: the graph's own order
    "retinaface": (["input"], ["loc", "conf", "landmarks"]),
}


class SavedBuildError(Exception):
    """A saved build that cannot be used (the caller removes it and rebuilds)."""


@dataclass
class NativeBuild:
    """A native module and what the engine needs of its ONNX graph, from the graph or a saved build."""

    architecture: str
    module: Any  # torch.nn.Module
    inputs: list[tuple[str, tuple, np.dtype]]
    outputs: list[tuple[str, tuple, np.dtype]]
    call_order: list[str]
    out_order: list[str]
    spec: dict[str, Any] | None = None  # the architecture's free details (inswapper), JSON-ready
    saved: bool = False  # loaded from a saved build


@functools.lru_cache(maxsize=1)
def converter_digest() -> str:
    """SHA-256 of the converter's source files: a change in how ONNX becomes a module is a new key."""
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [here.parent / "onnx_graph.py"]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def key_digest(model: ModelSource) -> str:
    """16 hex digits that change with the model (see :func:`model_identity`), the converter or :data:`FORMAT`."""
    blob = json.dumps({"format": FORMAT, "converter": converter_digest(), "model": model_identity(model)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _stem(model: ModelSource, name: str | None) -> str:
    """The file's stem, the name given for bytes; unnamed bytes by their hash (so two of them never
    take each other's save for an older version of themselves)."""
    if isinstance(model, (bytes, bytearray)) and not name:
        return "bytes-" + hashlib.sha256(bytes(model)).hexdigest()[:12]
    raw = Path(source_name(model, name)).stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "model"


def saved_path(model: ModelSource, cache_dir: str | os.PathLike[str] | None, name: str | None = None) -> Path:
    """``<engine cache>/native/<model stem>.<digest>.pt``."""
    from vcam.engines.cache import resolve_cache_dir

    return resolve_cache_dir(cache_dir) / "native" / f"{_stem(model, name)}.{key_digest(model)}{_SUFFIX}"


# -- building from a graph -----------------------------------------------------------------------


def build_from_graph(graph: OnnxGraph) -> NativeBuild | None:
    """The native module of ``graph`` (weights copied and checked), or None when the graph is no
    native architecture."""
    arch = recognise(graph)
    if arch is None:
        return None
    spec: dict[str, Any] | None = None
    if arch == "inswapper":
        from vcam.engines.native.inswapper import load_inswapper_from_graph

        module: Any = load_inswapper_from_graph(graph)
        spec = dataclasses.asdict(module.spec)
    elif arch == "retinaface":
        from vcam.engines.native.retinaface import load_retinaface_from_graph

        module = load_retinaface_from_graph(graph)
    else:  # pragma: no cover - recognise() names only the architectures above
        return None
    call, outs = ORDERS[arch]
    return NativeBuild(arch, module, list(graph.inputs), list(graph.outputs), list(call), list(outs or graph.output_names), spec)


def _empty_module(arch: str, spec: dict[str, Any] | None) -> Any:
    """The architecture's module on the meta device (no storage, no initialisation)."""
    with torch.device("meta"):
        if arch == "inswapper":
            from vcam.engines.native.inswapper import ConvSpec, InSwapper, InSwapperSpec

            if not isinstance(spec, dict):
                raise SavedBuildError("no inswapper spec")
            s = dict(spec)
            s["encoder"] = tuple(ConvSpec(**c) for c in s["encoder"])
            s["decoder"] = tuple(ConvSpec(**c) for c in s["decoder"])
            return InSwapper(InSwapperSpec(**s))
        if arch == "retinaface":
            from vcam.engines.native.retinaface import RetinaFaceMobileNet

            return RetinaFaceMobileNet()
    raise SavedBuildError(f"unknown architecture {arch!r}")


# -- saving and loading --------------------------------------------------------------------------


def _tensors(info: list[tuple[str, tuple, np.dtype]]) -> list[list[Any]]:
    return [[n, list(s), np.dtype(d).str] for n, s, d in info]


def _untensors(rows: Any) -> list[tuple[str, tuple, np.dtype]]:
    return [(str(n), tuple(s), np.dtype(d)) for n, s, d in rows]


def save(path: Path, build: NativeBuild, state: dict[str, Any] | None = None) -> Path:
    """Write ``build`` (``state``: its module's CPU state, default the module's own) to ``path``
    atomically, then remove older saves of the same model stem."""
    meta = {
        "format": FORMAT,
        "architecture": build.architecture,
        "spec": build.spec,
        "inputs": _tensors(build.inputs),
        "outputs": _tensors(build.outputs),
        "call_order": build.call_order,
        "out_order": build.out_order,
    }
    state = state if state is not None else {k: v.detach().cpu() for k, v in build.module.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        torch.save({"meta": json.dumps(meta), "state": state}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    stem = path.name.rsplit(".", 2)[0]
    for old in path.parent.glob(f"{glob_escape(stem)}.*{_SUFFIX}"):
        if old != path and old.name.rsplit(".", 2)[0] == stem:
            try:
                old.unlink(missing_ok=True)
            except PermissionError:  # Windows: a running engine still maps it; a later save removes it
                pass
    return path


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def load(path: Path) -> NativeBuild:
    """The build saved at ``path``, its weights memory-mapped; :class:`SavedBuildError` when the
    file cannot be used."""
    try:
        blob = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception as exc:  # a truncated or foreign file: the reader's own error, summarised
        raise SavedBuildError(f"not a readable torch archive ({type(exc).__name__})") from None
    try:
        meta = json.loads(blob["meta"])
        state = blob["state"]
        if meta.get("format") != FORMAT:
            raise SavedBuildError(f"format {meta.get('format')} != {FORMAT}")
        arch = str(meta["architecture"])
        module = _empty_module(arch, meta.get("spec"))
        if not isinstance(state, dict) or any(
            not isinstance(t, torch.Tensor) or t.dtype != torch.float32 for t in state.values()
        ):
            raise SavedBuildError("the weights are not float32 tensors")
        module.load_state_dict(state, strict=True, assign=True)
        build = NativeBuild(
            architecture=arch,
            module=module.eval(),
            inputs=_untensors(meta["inputs"]),
            outputs=_untensors(meta["outputs"]),
            call_order=[str(n) for n in meta["call_order"]],
            out_order=[str(n) for n in meta["out_order"]],
            spec=meta.get("spec"),
            saved=True,
        )
    except SavedBuildError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: load_state_dict's mismatches
        raise SavedBuildError(
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        ) from None
    if any(p.is_meta for p in module.parameters()) or any(b.is_meta for b in module.buffers()):
        raise SavedBuildError("weights missing")
    return build


_saves: list[threading.Thread] = []
_saves_lock = threading.Lock()


def save_later(path: Path, build: NativeBuild) -> threading.Thread:
    """Save ``build`` in a background thread (the CPU state is taken now, before the module moves
    to the GPU); a failure is one log line. The thread is not a daemon: a start that ends at once
    still finishes the write (:func:`wait_saves` waits for it)."""
    state = {k: v.detach() for k, v in build.module.state_dict().items()}
    if any(t.device.type != "cpu" for t in state.values()):
        state = {k: v.cpu() for k, v in state.items()}

    def run() -> None:
        try:
            save(path, build, state)
            log.debug("native build saved to %s", path)
        except (OSError, RuntimeError) as exc:  # a read-only or full cache: the next start parses again
            log.info("the native build of %s was not saved (%s: %s)", path.name.split(".")[0], type(exc).__name__, exc)

    t = threading.Thread(target=run, name="vcam-save-native", daemon=False)
    with _saves_lock:
        _saves[:] = [s for s in _saves if s.is_alive()] + [t]
    t.start()
    return t


def wait_saves(timeout: float | None = None) -> bool:
    """Wait for the background saves; True when none is still running."""
    with _saves_lock:
        pending = list(_saves)
    for t in pending:
        t.join(timeout)
    return not any(t.is_alive() for t in pending)


def open_native(
    model: ModelSource, name: str | None = None, cache_dir: str | os.PathLike[str] | None = None, *, use_saved: bool = True
) -> tuple[NativeBuild | None, OnnxGraph | None]:
    """``(build, graph)``: the saved build of ``model`` when there is a good one (``graph`` None: the
    ONNX file was not read); else the graph parsed and, for a native architecture, its module built
    and saved in the background. ``build`` is None for a graph without a native module."""
    path: Path | None = None
    if use_saved:
        try:
            path = saved_path(model, cache_dir, name)
        except OSError:
            path = None  # the model file itself is missing: the parse below says so
        if path is not None and path.is_file():
            try:
                return load(path), None
            except SavedBuildError as exc:
                log.warning("%s: the saved native build %s is damaged (%s); rebuilding it", source_name(model, name), path, exc)
                path.unlink(missing_ok=True)
    graph = OnnxGraph.load(model, name)
    build = build_from_graph(graph)
    if build is not None and path is not None:
        save_later(path, build)
    return build, graph


def prepare(model: ModelSource, cache_dir: str | os.PathLike[str] | None = None) -> tuple[Path, bool] | None:
    """The saved build of the model file ``model`` in the engine cache, as the first GPU start of
    a run would leave it: ``(its path, whether it was written now)``; None for a graph without a
    native module. ``vcam models pull`` calls it, so that start reads no ONNX (issue 39: a fresh
    machine's first process spent 3.0 s building the inswapper from its graph, H100). A good save is
    kept; a damaged one is written again (:func:`open_native`, with its save waited for). Raises what
    reading the model raises, and :class:`SavedBuildError` when the save could not be written."""
    build, graph = open_native(model, cache_dir=cache_dir)
    if build is None:
        return None
    path = saved_path(model, cache_dir)
    if graph is None:  # the save was there, and good
        return path, False
    wait_saves()
    if not path.is_file():  # the save said why in its log line
        raise SavedBuildError(f"{path} was not written")
    return path, True


__all__ = [
    "FORMAT",
    "NativeBuild",
    "SavedBuildError",
    "build_from_graph",
    "converter_digest",
    "key_digest",
    "load",
    "model_identity",
    "open_native",
    "prepare",
    "save",
    "save_later",
    "saved_path",
    "wait_saves",
]
