"""Compiled networks for the torch engine: the compile modes, the loader that builds artifacts or
loads them in a background thread and hands them over to the engine, and the engine's factory.

What an artifact is (its key, its file, building and loading one) is :mod:`vcam.engines.artifacts`;
its names are re-exported here. Only the native architectures (:mod:`vcam.engines.native`) compile.

The torch engine never imports this module: :func:`torch_engine` (and
:func:`vcam.engines.create_engine` through it) builds a :class:`CompiledLoader` and hands it to
:class:`~vcam.engines.torch.TorchEngine`, which calls it through a small protocol of its own
(:class:`~vcam.engines.CompiledArtifacts`); the loader calls the engine back through
:class:`~vcam.engines.CompileHost`.

``compile="auto"``: Inductor's imports start in a thread at the engine's construction (only when
the cache holds an artifact of the architecture), the built sizes load in another from the end of
the warm-up, each is called once there, and the engine puts it into use between two calls.
``"build"``: missing artifacts are built now and everything is loaded before the first call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcam.engines import CompileHost, Items, Loaded
from vcam.engines.artifacts import (
    ArtifactError,
    artifact_key,
    artifact_path,
    build,
    built_any,
    inductor_cache,
    load,
    prepare_load,
    read_meta,
    remove,
    structure_digest,
)
from vcam.engines.cache import EngineKey
from vcam.engines.threads import QUICK_SWITCHES
from vcam.errors import EngineUnavailable

if TYPE_CHECKING:  # types only; the engine's module is imported where the factory runs
    from vcam.engines.onnx_graph import ModelSource
    from vcam.engines.torch import TorchEngine

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "build", "off")


def compile_mode(value: bool | str | None) -> str:
    """``auto`` | ``build`` | ``off`` from a config value (``true`` is ``build``, ``false`` ``off``)."""
    if value is True:
        return "build"
    if value is False or value is None:
        return "off"
    v = str(value).strip().lower()
    if v in ("true", "on", "yes"):
        return "build"
    if v in ("false", "no"):
        return "off"
    if v not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)} (got {value!r})")
    return v


class CompiledLoader:
    """The compiled artifacts of one torch engine: built now (``compile="build"``), or loaded in a
    background thread and handed over between two calls (``compile="auto"``).

    Built by whoever creates the engine (:func:`torch_engine`) and handed to it; the engine calls
    :meth:`bind` once its module exists, then :meth:`plan` at the end of its warm-up, :meth:`resume`
    and :meth:`take_ready` at its calls, :meth:`close` when it closes. Log lines go to the engine's
    logger, named after the engine.
    """

    def __init__(self, compile: bool | str | None, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.mode = compile_mode(compile)
        self.cache_dir = cache_dir
        self._host: CompileHost | None = None
        self._log = log
        self._structure: str | None = None
        self._prepared: threading.Thread | None = None  # Inductor's imports, from the construction on
        self._thread: threading.Thread | None = None  # the loads planned at the warm-up
        self._ready: list[Loaded] = []  # loaded by the thread, not yet taken by the engine
        self._planned: tuple[list[int], Items] | None = None  # planned while a load ran: resume() starts it
        self._started = 0.0  # when the last load started (perf_counter)
        self._uncompiled_calls = 0  # calls made while a load was under way, before any size ran compiled
        self._closing = threading.Event()

    # -- set-up ------------------------------------------------------------------------------------

    def bind(self, host: CompileHost, logger: logging.Logger) -> str:
        """Serve ``host`` (once its architecture is known); returns the mode in effect. A generic
        graph runs uncompiled; with ``auto`` and an artifact of the architecture in the cache,
        Inductor's imports start now in a thread, while the engine builds its module and graphs."""
        self._host, self._log = host, logger
        if self.mode != "off" and host.architecture is None:
            # Only the native modules trace into one graph (a generic graph reads shapes on the host).
            (logger.warning if self.mode == "build" else logger.debug)(
                "%s: compiled engines are for the native architectures (inswapper); running uncompiled", host.name
            )
            self.mode = "off"
        if self.mode == "auto" and built_any(self.cache_dir, host.architecture or "", host.precision):
            self._prepared = threading.Thread(target=self._prepare, name=f"{host.name}-inductor", daemon=True)
            self._prepared.start()
        return self.mode

    @property
    def host(self) -> CompileHost:
        if self._host is None:
            raise RuntimeError("CompiledLoader.bind() was not called")
        return self._host

    def _prepare(self) -> None:
        host = self.host
        try:
            with QUICK_SWITCHES.held():
                seconds = prepare_load()
        except Exception as exc:  # the load itself will say what is wrong
            self._log.debug("%s: preparing the compiled engines' load failed (%s: %s)", host.name, type(exc).__name__, exc)
            return
        self._log.info("%s: Inductor imported for the compiled engines in %.1f s", host.name, seconds)

    def target(self, b: int, items: Items) -> tuple[EngineKey, Path]:
        """(key, path) of the artifact for batch ``b`` and these item shapes."""
        host = self.host
        if self._structure is None:
            self._structure = structure_digest(host.module, host.architecture or "")
        key = artifact_key(
            self._structure,
            device=host.device,
            precision=host.precision,
            channels_last=host.channels_last,
            items={i.name: items[i.name] for i in host.inputs},
            batch=b,
        )
        return key, artifact_path(self.cache_dir, host.architecture or host.name, key, b)

    # -- building and loading now ------------------------------------------------------------------

    def build(
        self, sizes: Sequence[int], items: Items, progress: Callable[[int, int, int], None] | None = None
    ) -> list[tuple[int, str, float]]:
        """Build each size's artifact unless the cache has a good one (a stale or corrupt entry is
        rebuilt, with one log line); ``progress(batch, index, count)`` before each build. Returns
        ``(batch, "built" | "cached", seconds)`` per size."""
        host = self.host
        inductor_cache(self.cache_dir)
        done = []
        for i, b in enumerate(sizes):
            key, path = self.target(b, items)
            if path.is_file():
                try:
                    read_meta(path)
                    if path.stat().st_size > 0:
                        done.append((b, "cached", 0.0))
                        continue
                except ArtifactError as exc:
                    self._log.warning("%s: rebuilding the compiled engine for batch %d (%s)", host.name, b, exc)
                    remove(path)
            if progress is not None:
                progress(b, i, len(sizes))
            self._log.info(
                "%s: compiling for batch %d (%d of %d; about two minutes each on a GPU)", host.name, b, i + 1, len(sizes)
            )
            with host.backend_flags():
                seconds = build(host.module, host.call_args(b, items), path, key, device=host.device)
            self._log.info("%s: batch %d compiled in %.0f s into %s", host.name, b, seconds, path)
            done.append((b, "built", seconds))
        return done

    def load_one(self, b: int, items: Items, *, rebuild: bool) -> Callable[..., Any] | None:
        """The loaded artifact for batch ``b`` or None (not built; stale or corrupt: removed, and
        rebuilt when ``rebuild``), with one log line for a bad entry."""
        host = self.host
        key, path = self.target(b, items)
        if not path.is_file():
            return None
        try:
            return load(path, key, host.module)
        except ArtifactError as exc:
            remove(path)
            if not rebuild:
                self._log.warning(
                    "%s: compiled engine for batch %d removed (%s); `vcam engines build` rebuilds it", host.name, b, exc
                )
                return None
            self._log.warning("%s: rebuilding the compiled engine for batch %d (%s)", host.name, b, exc)
            self.build([b], items)
            return load(path, key, host.module)

    def load_now(self, sizes: Sequence[int], items: Items) -> list[Loaded]:
        """``compile="build"``: every size's artifact loaded in this thread (built where missing)."""
        inductor_cache(self.cache_dir)
        out: list[Loaded] = []
        for b in sizes:
            fn = self.load_one(b, items, rebuild=True)
            if fn is not None:
                out.append((b, items, fn))
        return out

    # -- loading in the background -----------------------------------------------------------------

    def plan(self, sizes: Sequence[int], items: Items) -> None:
        """``compile="auto"``: the built sizes are loaded in a background thread, started now, at the
        end of the warm-up: while the rest of the pipeline loads, so the first frames usually find
        them ready (each first call waits for the other engines' graph captures, and they for it)."""
        host = self.host
        todo = [b for b in sorted(set(sizes)) if self.target(b, items)[1].is_file()]
        missing = sorted(set(sizes) - set(todo))
        if missing:
            self._log.warning(
                "%s: no compiled engine for batch %s on this GPU and torch; running uncompiled "
                "(`vcam engines build` compiles them, about two minutes each)",
                host.name,
                ",".join(map(str, missing)),
            )
        if todo:
            self._planned = (todo, items)
            self.resume()

    def resume(self) -> None:
        """Start the planned load unless one runs (then a later call starts it)."""
        if self._planned is None or self.loading:
            return
        todo, items = self._planned
        self._planned = None
        self._started = time.perf_counter()
        inductor_cache(self.cache_dir)
        self._thread = threading.Thread(
            target=self._load_in_background, args=(todo, items), name=f"{self.host.name}-compiled", daemon=True
        )
        self._thread.start()

    @property
    def started(self) -> bool:
        """Whether a background load was ever started."""
        return self._thread is not None

    @property
    def loading(self) -> bool:
        """Whether a background load runs now."""
        return self._thread is not None and self._thread.is_alive()

    def _load_in_background(self, sizes: Sequence[int], items: Items) -> None:
        with QUICK_SWITCHES.held():  # a second of Python, beside the warm-ups or the first frames
            self._load_sizes(sizes, items)

    def _load_sizes(self, sizes: Sequence[int], items: Items) -> None:
        host = self.host
        if self._prepared is not None:
            self._prepared.join()
        for b in sizes:
            if self._closing.is_set():
                return
            t0 = time.perf_counter()
            try:
                # Python, file reads and the kernels' modules: nothing on a stream, so no lock (other
                # threads' captures are thread-local).
                fn = self.load_one(b, items, rebuild=False)
                if fn is None:
                    continue
                host.first_call(fn, b, items)
            except Exception as exc:  # never take the daemon down: that size stays uncompiled
                self._log.warning(
                    "%s: the compiled engine for batch %d is not used (%s: %s)", host.name, b, type(exc).__name__, exc
                )
                continue
            self._ready.append((b, items, fn))
            self._log.info("%s: compiled engine for batch %d loaded in %.1f s", host.name, b, time.perf_counter() - t0)

    # -- handing over --------------------------------------------------------------------------------

    @property
    def has_ready(self) -> bool:
        """Whether loaded artifacts wait for :meth:`take_ready`."""
        return bool(self._ready)

    def take_ready(self) -> Iterator[Loaded]:
        """The loaded artifacts, each once; the engine puts each into use before asking for the
        next, and the line that says so is logged then."""
        while self._ready:
            item = self._ready.pop()
            yield item
            self._log.info(
                "%s: compiled engine for batch %d in use %.2f s after its load started; %d earlier calls ran uncompiled",
                self.host.name,
                item[0],
                time.perf_counter() - self._started,
                self._uncompiled_calls,
            )

    def note_uncompiled_call(self) -> None:
        """A call ran uncompiled after a load had started (reported with the first size in use)."""
        self._uncompiled_calls += 1

    def wait(self, timeout: float | None = None) -> bool:
        """Start a planned load, wait for the running one; True when none is still running."""
        self.resume()
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.loading

    def close(self) -> None:
        """Stop loading (between two sizes) and drop what was not taken (idempotent)."""
        self._closing.set()
        self._planned = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._ready.clear()


def torch_engine(
    model: ModelSource, *, compile: bool | str | None = False, cache_dir: str | os.PathLike[str] | None = None, **options: Any
) -> TorchEngine:
    """A :class:`~vcam.engines.torch.TorchEngine` with its compiled artifacts (``compile``: see
    :func:`compile_mode`); ``options``: the engine's other keyword arguments."""
    from vcam.engines.torch import TorchEngine

    return TorchEngine(model, cache_dir=cache_dir, loader=CompiledLoader(compile, cache_dir), **options)


def prebuild(
    model: str | os.PathLike[str],
    *,
    device: str = "cuda",
    fp16: bool = True,
    max_batch: int = 8,
    batches: Sequence[int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> tuple[str, list[tuple[int, str, float]]]:
    """``vcam engines build``: the compiled artifacts of ``model`` for ``batches`` (default: every
    batch size of ``max_batch``). Returns the engine's description and ``(batch, "built" | "cached",
    seconds)`` per size."""
    engine = torch_engine(model, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir, compile="auto", warmup=False)
    try:
        done = engine.build_compiled(batches, progress=progress)
    except (ArtifactError, RuntimeError, AssertionError, TypeError, ValueError) as exc:  # Inductor's failures
        raise EngineUnavailable(
            f"compiling {engine.name} failed ({type(exc).__name__}: {str(exc)[:300]})",
            hint='run without compiled engines ([pipeline] compile = "off") and report the error',
        ) from exc
    finally:
        engine.close()
    return engine.describe(), done


__all__ = ["COMPILE_MODES", "CompiledLoader", "compile_mode", "prebuild", "torch_engine"]
