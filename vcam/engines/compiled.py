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
On CUDA ``auto`` also builds the missing sizes, in build jobs of their own
(:mod:`vcam.engines.autobuild`, other processes), and a thread loads each one they finish and hands
it over the same way; ``"background"`` does so on the CPU too, ``"load"`` never builds.
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
    build_log,
    built_any,
    built_seconds,
    clear_failure,
    device_name,
    failure,
    good,
    inductor_cache,
    load,
    lock,
    locked,
    mark_failed,
    prepare_load,
    remove,
    structure_digest,
)
from vcam.engines.cache import EngineKey
from vcam.engines.threads import QUICK_SWITCHES

if TYPE_CHECKING:  # types only; the engine's module is imported where the factory runs
    from vcam.engines.onnx_graph import ModelSource
    from vcam.engines.torch import TorchEngine

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "background", "load", "build", "off")
#: The modes that load built artifacts in the background (the engine sees them all as ``auto``).
LOADING = ("auto", "background", "load")
#: Where ``auto`` builds the missing artifacts in the background (on the CPU a build would take the
#: cores the frames run on: ``background`` builds there too).
AUTO_BUILDS_ON = ("cuda",)
#: A build job's exit statuses that mean it was stopped (SIGINT, SIGKILL, SIGTERM, SIGHUP), not that it failed.
STOPPED = (-2, -9, -15, -1)
#: Set (to anything but 0) to make ``auto`` and ``background`` load only: benchmark sessions, whose
#: measurements a build in the background would disturb (``benchmarks/gpu_check.sh`` sets it).
NO_BUILDS_ENV = "VCAM_NO_BACKGROUND_COMPILE"


def compile_mode(value: bool | str | None) -> str:
    """``auto`` | ``background`` | ``load`` | ``build`` | ``off`` from a config value (``true`` is
    ``build``, ``false`` ``off``)."""
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
        self.builds = False  # whether missing artifacts are built in the background (bind)
        self._builder: Any = None  # the build jobs (vcam.engines.autobuild.BackgroundBuild)
        self._watch: threading.Thread | None = None  # loads each size the jobs finish
        self._progress = ""  # "compiling engines: 2/4, ~40 s left" while they run

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
        self.builds = (self.mode == "background" or (self.mode == "auto" and host.device in AUTO_BUILDS_ON)) and (
            os.environ.get(NO_BUILDS_ENV, "") in ("", "0")
        )
        if self.mode in LOADING and built_any(self.cache_dir, host.architecture or "", host.precision):
            self._prepared = threading.Thread(target=self._prepare, name=f"{host.name}-inductor", daemon=True)
            self._prepared.start()
        return "auto" if self.mode in LOADING else self.mode

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
        self,
        sizes: Sequence[int],
        items: Items,
        progress: Callable[[str, int, Any], None] | None = None,
        *,
        keep_going: bool = False,
        wait_locked: bool = True,
        retry_failed: bool = True,
    ) -> list[tuple[int, str, float]]:
        """Build each size's artifact unless the cache has a good one (a stale or corrupt entry is
        rebuilt, with one log line), each under its lock (:func:`~vcam.engines.artifacts.lock`: a
        size another process builds is waited for, then found built; without ``wait_locked`` it is
        left to that process, ``"busy"``). ``progress(event, batch, detail)``: events ``"wait"``
        (for the lock), ``"start"``, ``"built"`` (detail: seconds), ``"cached"``, ``"busy"``,
        ``"failed"`` (detail: the reason). A failed build is remembered per entry
        (:func:`~vcam.engines.artifacts.mark_failed`); a size whose last build failed is skipped
        unless ``retry_failed``. The first failure is raised, or with ``keep_going`` logged (one
        warning) and the next size built. Returns ``(batch, state, seconds)`` per size, the state
        one of ``built``, ``cached``, ``busy``, ``failed``."""
        host = self.host
        inductor_cache(self.cache_dir)
        tell = progress or _ignore
        done = []
        for i, b in enumerate(sizes):
            key, path = self.target(b, items)
            if good(path):
                tell("cached", b, None)
                done.append((b, "cached", 0.0))
                continue
            reason = failure(path)
            if reason is not None and not retry_failed:
                tell("failed", b, reason)
                done.append((b, "failed", 0.0))
                continue
            guard = lock(path)
            if locked(path):
                if not wait_locked:
                    tell("busy", b, None)
                    done.append((b, "busy", 0.0))
                    continue
                tell("wait", b, None)
                self._log.info("%s: batch %d is being compiled by another process; waiting for it", host.name, b)
            with guard:
                if good(path):  # built by the process that held the lock
                    tell("cached", b, None)
                    done.append((b, "cached", 0.0))
                    continue
                if path.is_file():
                    self._log.warning("%s: rebuilding the compiled engine for batch %d (unreadable entry)", host.name, b)
                    remove(path)
                tell("start", b, None)
                self._log.info(
                    "%s: compiling for batch %d (%d of %d; about a minute or two each on a GPU)", host.name, b, i + 1, len(sizes)
                )
                try:
                    with host.backend_flags():
                        seconds = build(host.module, host.call_args(b, items), path, key, device=host.device)
                except Exception as exc:  # Inductor fails in many ways: remembered, never retried by a daemon
                    why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
                    mark_failed(path, why)
                    tell("failed", b, why)
                    if not keep_going:
                        raise
                    self._log.warning(
                        "%s: compiling for batch %d failed (%s); it runs uncompiled (`vcam engines build --batch %d` "
                        "tries again, compiler report: %s)",
                        host.name,
                        b,
                        why,
                        b,
                        build_log(path),
                    )
                    done.append((b, "failed", 0.0))
                    continue
                clear_failure(path)
            self._log.info("%s: batch %d compiled in %.0f s into %s", host.name, b, seconds, path)
            tell("built", b, seconds)
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
        them ready (each first call waits for the other engines' graph captures, and they for it).
        The missing ones are built by jobs in other processes when this loader builds
        (:attr:`builds`), each loaded and handed over once built; else they run uncompiled, with
        one line."""
        host = self.host
        todo = [b for b in sorted(set(sizes)) if self.target(b, items)[1].is_file()]
        missing = sorted(set(sizes) - set(todo))
        if missing and self.builds:
            missing = self._build_in_background(missing, items)
        if missing:
            self._log.warning(
                "%s: no compiled engine for batch %s on this GPU and torch; running uncompiled "
                "(`vcam engines build` compiles them, about a minute or two each, or `vcam run` on a GPU in the background)",
                host.name,
                ",".join(map(str, missing)),
            )
        if todo:
            self._planned = (todo, items)
            self.resume()

    def _build_in_background(self, missing: list[int], items: Items) -> list[int]:
        """Start the build jobs for ``missing`` and the thread that loads what they build; returns
        the sizes left uncompiled without a word more (those whose last build failed: one warning)."""
        from vcam.engines.autobuild import BackgroundBuild

        host = self.host
        failed = {b: why for b in missing if (why := failure(self.target(b, items)[1])) is not None}
        if failed:
            self._log.warning(
                "%s: compiling for batch %s failed before (%s); running uncompiled (`vcam engines build --batch %s` tries again)",
                host.name,
                ",".join(map(str, failed)),
                next(iter(failed.values())),
                ",".join(map(str, failed)),
            )
        todo = [b for b in missing if b not in failed]
        model = getattr(host, "model_path", None)
        if not todo or model is None:  # a model given as bytes: no file for a job to read
            return todo
        spec = job_spec(host, self.cache_dir, items)
        inductor_cache(self.cache_dir)  # the jobs' and this process's Inductor share one cache (the loads find their kernels)
        try:
            self._builder = BackgroundBuild(
                spec,
                todo,
                name=host.architecture or host.name,
                precision=host.precision,
                wait_locked=True,
                retry_failed=False,
                guess_s=built_seconds(self.cache_dir, device_name(host.device)),
            )
        except OSError as exc:
            self._log.warning("%s: the background compile could not start (%s); running uncompiled", host.name, exc)
            return todo
        self._log.info(
            "%s: compiling batch %s in the background (%d job%s; frames run uncompiled until each is ready, log: %s)",
            host.name,
            ",".join(map(str, todo)),
            len(self._builder.jobs),
            "" if len(self._builder.jobs) == 1 else "s",
            self._builder.log_path,
        )
        self._progress = self._builder.progress().text()
        self._watch = threading.Thread(target=self._watch_builds, args=(todo, items), name=f"{host.name}-autobuild", daemon=True)
        self._watch.start()
        return []

    def _watch_builds(self, sizes: list[int], items: Items) -> None:
        """While the jobs run: load each size they finish (as :meth:`_load_sizes` does) and keep the
        progress line; a size that failed, or that no job built, gets one warning and stays uncompiled."""
        host, builder = self.host, self._builder
        pending = list(sizes)
        paths = {b: self.target(b, items)[1] for b in sizes}
        ready: list[int] = []
        try:
            while pending and not self._closing.is_set():
                running = builder.running
                prog = builder.progress()
                for b in list(pending):
                    path = paths[b]
                    if good(path) and not locked(path):
                        pending.remove(b)
                        if self._thread is not None:
                            self._thread.join()  # the load of the sizes built before (started at plan)
                        self._started = time.perf_counter()
                        with QUICK_SWITCHES.held():
                            self._load_sizes([b], items)
                        ready.append(b)
                    elif b in prog.failed or not running:
                        pending.remove(b)
                        why = prog.failed.get(b)
                        if why is None:
                            codes = [c for c in builder.returncodes if c]
                            code = codes[0] if codes else 0
                            if code in STOPPED:  # stopped from outside: not the build's fault, the next start tries again
                                self._log.warning(
                                    "%s: the background compile of batch %d was stopped (signal %d); it runs uncompiled",
                                    host.name,
                                    b,
                                    -code,
                                )
                                continue
                            why = f"the build process ended (exit status {code})"
                            if not self._closing.is_set():
                                mark_failed(path, why)
                        self._log.warning(
                            "%s: compiling for batch %d failed (%s); it runs uncompiled (`vcam engines build --batch %d` "
                            "tries again; log: %s)",
                            host.name,
                            b,
                            why,
                            b,
                            builder.log_path,
                        )
                prog.done = sorted(set(prog.done) | set(ready))
                self._progress = prog.text() if pending else ""
                if pending:
                    self._closing.wait(0.25)
        except Exception as exc:  # never take the daemon down
            self._log.warning("%s: the background compile stopped (%s: %s)", host.name, type(exc).__name__, exc)
        finally:
            self._progress = ""
            if not self._closing.is_set():
                builder.wait(60)  # the jobs close their engines and exit once their last size is built
            builder.stop()

    @property
    def progress(self) -> str:
        """``compiling engines: 2/4, ~40 s left`` while background builds run, else ''."""
        return self._progress

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
        """Whether a background load (or build) was ever started."""
        return self._thread is not None or self._watch is not None

    @property
    def loading(self) -> bool:
        """Whether a background load (or build) runs now."""
        return any(t is not None and t.is_alive() for t in (self._thread, self._watch))

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
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in (self._thread, self._watch):
            if t is not None:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.resume()  # a size the build finished while the first load ran
        if self._thread is not None:
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.loading

    def close(self) -> None:
        """Stop loading (between two sizes) and drop what was not taken (idempotent)."""
        self._closing.set()
        self._planned = None
        if self._builder is not None:
            self._builder.stop()  # a size in hand is lost; those built stay in the cache
        for t in (self._thread, self._watch):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=10)
        self._ready.clear()


def torch_engine(
    model: ModelSource, *, compile: bool | str | None = False, cache_dir: str | os.PathLike[str] | None = None, **options: Any
) -> TorchEngine:
    """A :class:`~vcam.engines.torch.TorchEngine` with its compiled artifacts (``compile``: see
    :func:`compile_mode`); ``options``: the engine's other keyword arguments."""
    from vcam.engines.torch import TorchEngine

    return TorchEngine(model, cache_dir=cache_dir, loader=CompiledLoader(compile, cache_dir), **options)


def _ignore(event: str, b: int, detail: Any = None) -> None:
    """No progress wanted."""


def job_spec(host: CompileHost, cache_dir: str | os.PathLike[str] | None, items: Items) -> dict[str, Any]:
    """What a build job (:mod:`vcam.engines.autobuild`) needs to make ``host``'s module and keys."""
    return {
        "model": str(host.model_path),
        "device": host.device,
        "fp16": host.precision == "fp16",
        "max_batch": int(host.max_batch),
        "channels_last": host.channels_last,
        "cache_dir": None if cache_dir is None else str(cache_dir),
        "items": {k: list(v) for k, v in items.items()},
    }


__all__ = ["COMPILE_MODES", "CompiledLoader", "compile_mode", "job_spec", "torch_engine"]
