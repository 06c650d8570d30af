"""Compiled networks for the torch engine: the compile modes, the loader that builds artifacts or
loads them in a background thread and hands them over to the engine, and the engine's factory.

What an artifact is (its key, its file, building and loading one) is :mod:`vcam.engines.artifacts`;
its names are re-exported here. Only the native architectures (:mod:`vcam.engines.native`) compile.

The torch engine never imports this module: :func:`torch_engine` (and
:func:`vcam.engines.create_engine` through it) builds a :class:`CompiledLoader` and hands it to
:class:`~vcam.engines.torch.TorchEngine`, which calls it through a small protocol of its own
(:class:`~vcam.engines.CompiledArtifacts`); the loader calls the engine back through
:class:`~vcam.engines.CompileHost`.

One artifact serves every batch size (its batch dimension dynamic, ``1..max_batch``; a
:class:`Unit`); where a torch cannot build that one, each size gets its own, built one after the
other in the same process (:meth:`CompiledLoader.build`, one log line), and the failure is
remembered so later starts go straight to those.

``compile="auto"``: Inductor's imports start in a thread at the engine's construction (only when
the cache holds an artifact of the architecture), what is built loads in another from the end of
the warm-up (the dynamic artifact once), each size is called once there, and the engine puts it
into use (its own CUDA graph per size) between two calls. On CUDA ``auto`` also builds what is
missing, in one build job (:mod:`vcam.engines.autobuild`, another process), and a thread loads
what it finishes and hands it over the same way; ``"background"`` does so on the CPU too,
``"load"`` never builds. ``"build"``: missing artifacts are built now and everything is loaded
before the first call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcam.engines import CompileHost, Items, Loaded
from vcam.engines.artifacts import (
    ArtifactError,
    artifact_key,
    artifact_path,
    batch_label,
    build,
    build_log,
    built_any,
    clear_failure,
    failure,
    good,
    inductor_cache,
    load,
    lock,
    locked,
    mark_failed,
    prepare_load,
    prune_superseded,
    remove,
    structure_digest,
)
from vcam.engines.cache import EngineKey
from vcam.engines.gate import BACKGROUND
from vcam.engines.held import quiet_load

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
#: Set (to anything but 0) to make ``auto`` and ``background`` load only: benchmark sessions, whose
#: measurements a build in the background would disturb (``benchmarks/gpu_check.sh`` sets it).
NO_BUILDS_ENV = "VCAM_NO_BACKGROUND_COMPILE"
#: The batch a dynamic artifact is traced and tuned at (default: its largest), for measurements:
#: another hint is another key, so another entry.
HINT_ENV = "VCAM_COMPILE_HINT"
#: ``1``: Inductor's imports for a compiled load start at the engine's construction, beside the rest
#: of the start-up's load, instead of after the first GPU frame (an experiment, off by default, for
#: the A/B: issue 39's four streams of six faces need the compiled artifact in use within about 2 s
#: of the takeover, and the import alone took 10.8 s beside those frames; H100, 2026-12-07).
EARLY_IMPORT_ENV = "VCAM_INDUCTOR_EARLY"


def frames_first(sizes: Sequence[int], running: Callable[[], int]) -> Iterator[int]:
    """``sizes``, each next one the size the engine's calls run now (``running()``, its
    :attr:`~vcam.engines.CompileHost.last_batch`) while that one is still to do, else the smallest
    left: the order a compiled load puts sizes in use. Issue 39 (H200, four streams of the six-face
    clip, compiled cache, 2026-12-07): the rounds swap 24 faces, the tenth of the eleven sizes in
    ascending order, and each size's first call and capture is a paced unit of background work: the
    frames would run uncompiled until the nine smaller sizes, which they never call, were ready."""
    left = list(sizes)
    while left:
        now = running()
        b = now if now in left else left[0]
        left.remove(b)
        yield b


def size_hint(lo: int, hi: int) -> int:
    """The batch a dynamic artifact of ``lo..hi`` is tuned at: ``$VCAM_COMPILE_HINT`` within the
    range, else ``hi``."""
    try:
        return min(hi, max(lo, int(os.environ.get(HINT_ENV, "") or hi)))
    except ValueError:
        return hi


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


@dataclass(frozen=True)
class Unit:
    """One artifact to build or load: the dynamic one (``batch=(1, max_batch)``, label ``"1-8"``)
    or one batch size's (label ``"4"``), and the batch sizes it serves."""

    label: str
    batch: int | tuple[int, int]
    covers: tuple[int, ...]
    key: EngineKey
    path: Path


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
        self._auto: Any = None  # the background build (vcam.engines.autobuild.DaemonBuild)
        self._builder: Any = None  # its build job (vcam.engines.autobuild.BackgroundBuild)
        self._watch: threading.Thread | None = None  # loads what the job finishes

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
        if os.environ.get(EARLY_IMPORT_ENV) != "1":
            BACKGROUND.wait()  # never beside the load of the first frame: after it (the GIL, the cores)
        try:
            with quiet_load():  # Inductor's imports: seconds of Python, a million objects
                seconds = prepare_load()
        except Exception as exc:  # the load itself will say what is wrong
            self._log.debug("%s: preparing the compiled engines' load failed (%s: %s)", host.name, type(exc).__name__, exc)
            return
        self._log.info("%s: Inductor imported for the compiled engines in %.1f s", host.name, seconds)

    def target(self, b: int, items: Items) -> tuple[EngineKey, Path]:
        """(key, path) of the static artifact for batch ``b`` and these item shapes (the fallback)."""
        u = self.unit(b, items)
        return u.key, u.path

    def unit(self, batch: int | tuple[int, int], items: Items) -> Unit:
        """The artifact for one batch size, or ``(lo, hi)``: a dynamic batch dimension tuned at ``hi``."""
        host = self.host
        if self._structure is None:
            self._structure = structure_digest(host.module, host.architecture or "")
        key = artifact_key(
            self._structure,
            device=host.device,
            precision=host.precision,
            channels_last=host.channels_last,
            items={i.name: items[i.name] for i in host.inputs},
            batch=batch,
            hint=size_hint(*batch) if isinstance(batch, tuple) else None,
        )
        covers = tuple(range(batch[0], batch[1] + 1)) if isinstance(batch, tuple) else (batch,)
        path = artifact_path(self.cache_dir, host.architecture or host.name, key, batch)
        return Unit(batch_label(batch), batch, covers, key, path)

    def dynamic_unit(self, items: Items) -> Unit | None:
        """The one artifact of every batch size ``1..max_batch``; None below 3, where each size gets its
        own (torch traces a batch of 1..2 as a fixed 2)."""
        top = int(self.host.max_batch)
        return self.unit((1, top), items) if top >= 3 else None

    def cached_dynamic(self, items: Items) -> Unit | None:
        """The dynamic artifact to load: :meth:`dynamic_unit` where the cache has it, else the widest
        one built for fewer sizes (``1..k``, ``k`` one of the engine's sizes, from 3 up), which serves
        the sizes it covers; None when neither is built. A cache built for one stream (``1..8``)
        then serves a daemon of four streams (``1..32``) at the sizes most rounds have; the rest run
        uncompiled (or compiled once built). Issue 39: the four-stream runs "with compiled engines"
        ran uncompiled (H100, 2026-12-06: "no compiled engine for batch 1,2,4,8,16,32")."""
        full = self.dynamic_unit(items)
        if full is None:
            return None
        if full.path.is_file():
            return full
        for k in sorted((b for b in self.host.batch_sizes if 3 <= b < full.covers[-1]), reverse=True):
            unit = self.unit((1, k), items)
            if unit.path.is_file():
                return unit
        return None

    def units(self, sizes: Sequence[int], items: Items, *, dynamic: bool = True) -> list[Unit]:
        """What serves ``sizes``: the dynamic artifact (when ``dynamic`` and the engine has more than
        one size), else one static artifact per size."""
        dyn = self.dynamic_unit(items) if dynamic else None
        return [dyn] if dyn is not None else [self.unit(b, items) for b in sorted(set(sizes))]

    # -- building and loading now ------------------------------------------------------------------

    def build(
        self,
        sizes: Sequence[int],
        items: Items,
        progress: Callable[[str, str, Any], None] | None = None,
        *,
        keep_going: bool = False,
        wait_locked: bool = True,
        retry_failed: bool = True,
        dynamic: bool = True,
    ) -> list[tuple[str, str, float]]:
        """Build what serves ``sizes`` unless the cache has it: the one artifact with a dynamic batch
        (``dynamic``), or, where that fails (or failed before and not ``retry_failed``), one
        static artifact per size, one after the other in this process (one log line says so).

        A stale or corrupt entry is rebuilt, with one log line; each entry is built under its lock
        (:func:`~vcam.engines.artifacts.lock`: an entry another process builds is waited for, then
        found built; without ``wait_locked`` it is left to that process, ``"busy"``).
        ``progress(event, label, detail)`` (label: ``"1-8"`` or ``"4"``): events ``"wait"`` (for the
        lock), ``"start"``, ``"built"`` (detail: seconds), ``"cached"``, ``"busy"``, ``"failed"``
        (detail: the reason), ``"fallback"`` (detail: the reason, and the static labels that
        replace the dynamic one). A failed build is remembered per entry
        (:func:`~vcam.engines.artifacts.mark_failed`); a static size whose last build failed is
        skipped unless ``retry_failed``. The first static failure is raised, or with ``keep_going``
        logged (one warning) and the next size built. Returns ``(label, state, seconds)`` per entry
        tried, the state one of ``built``, ``cached``, ``busy``, ``failed``."""
        host = self.host
        inductor_cache(self.cache_dir)
        tell = progress or _ignore
        sizes = sorted(set(sizes))
        done: list[tuple[str, str, float]] = []
        dyn = self.dynamic_unit(items) if dynamic else None
        if dyn is not None and (retry_failed or failure(dyn.path) is None or good(dyn.path)):
            state, seconds, exc = self._build_unit(dyn, items, "one engine for every batch size", tell, wait_locked, True)
            if state != "failed":
                return [(dyn.label, state, seconds)]
            done.append((dyn.label, state, seconds))
            statics = [str(b) for b in sizes]
            self._log.warning(
                "%s: compiling one engine for batch %s failed (%s); compiling batch %s instead, one after the other "
                "(compiler report: %s)",
                host.name,
                dyn.label,
                _why(exc),
                ",".join(statics),
                build_log(dyn.path),
            )
            tell("fallback", dyn.label, (_why(exc), statics))
        for i, b in enumerate(sizes):
            u = self.unit(b, items)
            state, seconds, exc = self._build_unit(u, items, f"{i + 1} of {len(sizes)}", tell, wait_locked, retry_failed)
            done.append((u.label, state, seconds))
            if state == "failed" and exc is not None:
                if not keep_going:
                    raise exc
                self._log.warning(
                    "%s: compiling for batch %d failed (%s); it runs uncompiled (`vcam engines build --batch %d` "
                    "tries again, compiler report: %s)",
                    host.name,
                    b,
                    _why(exc),
                    b,
                    build_log(u.path),
                )
        return done

    def _build_unit(
        self, u: Unit, items: Items, which: str, tell: Callable[[str, str, Any], None], wait_locked: bool, retry_failed: bool
    ) -> tuple[str, float, Exception | None]:
        """Build one entry (see :meth:`build`): ``(state, seconds, the exception of a failed build)``."""
        host = self.host
        if good(u.path):
            tell("cached", u.label, None)
            return "cached", 0.0, None
        reason = failure(u.path)
        if reason is not None and not retry_failed:
            tell("failed", u.label, reason)
            return "failed", 0.0, None
        guard = lock(u.path)
        if locked(u.path):
            if not wait_locked:
                tell("busy", u.label, None)
                return "busy", 0.0, None
            tell("wait", u.label, None)
            self._log.info("%s: batch %s is being compiled by another process; waiting for it", host.name, u.label)
        with guard:
            if good(u.path):  # built by the process that held the lock
                tell("cached", u.label, None)
                return "cached", 0.0, None
            if u.path.is_file():
                self._log.warning("%s: rebuilding the compiled engine for batch %s (unreadable entry)", host.name, u.label)
                remove(u.path)
            tell("start", u.label, None)
            self._log.info("%s: compiling for batch %s (%s; a minute or two on a GPU)", host.name, u.label, which)
            dynamic = u.batch if isinstance(u.batch, tuple) else None
            top = size_hint(*u.batch) if isinstance(u.batch, tuple) else u.batch  # the size the build tunes for
            try:
                with host.backend_flags():
                    args = host.call_args(top, items)
                    seconds = build(host.module, args, u.path, u.key, device=host.device, dynamic_batch=dynamic)
            except Exception as exc:  # Inductor fails in many ways: remembered, never retried by a daemon
                mark_failed(u.path, _why(exc))
                tell("failed", u.label, _why(exc))
                return "failed", 0.0, exc
            clear_failure(u.path)
        gone = prune_superseded(self.cache_dir, host.architecture or host.name, u.key)
        self._log.info(
            "%s: batch %s compiled in %.0f s into %s%s",
            host.name,
            u.label,
            seconds,
            u.path,
            f" (removed {len(gone)} entries of an older build)" if gone else "",
        )
        tell("built", u.label, seconds)
        return "built", seconds, None

    def load_unit(self, u: Unit, items: Items, *, rebuild: bool) -> Callable[..., Any] | None:
        """The loaded artifact ``u`` or None (not built; stale or corrupt: removed, and rebuilt when
        ``rebuild``), with one log line for a bad entry."""
        host = self.host
        if not u.path.is_file():
            return None
        try:
            return load(u.path, u.key, host.module)
        except ArtifactError as exc:
            remove(u.path)
            if not rebuild:
                self._log.warning(
                    "%s: compiled engine for batch %s removed (%s); `vcam engines build` rebuilds it", host.name, u.label, exc
                )
                return None
            self._log.warning("%s: rebuilding the compiled engine for batch %s (%s)", host.name, u.label, exc)
            self.build(u.covers, items, dynamic=isinstance(u.batch, tuple))
            return load(u.path, u.key, host.module) if u.path.is_file() else None

    def load_now(self, sizes: Sequence[int], items: Items) -> list[Loaded]:
        """``compile="build"``: the artifacts of ``sizes`` loaded in this thread (rebuilt where bad):
        the dynamic one for every size when it is there, else each size's own."""
        inductor_cache(self.cache_dir)
        dyn = self.dynamic_unit(items)
        shared = self.load_unit(dyn, items, rebuild=True) if dyn is not None else None
        out: list[Loaded] = []
        for b in self.served(sizes, dyn if shared is not None else None):
            fn = shared or self.load_unit(self.unit(b, items), items, rebuild=True)
            if fn is not None:
                out.append((b, items, fn, None))
        return out

    def served(self, sizes: Sequence[int], dyn: Unit | None) -> list[int]:
        """The sizes to put the loaded artifacts in use for: ``sizes`` (the engine plans and builds
        powers of two, one artifact each where there is no dynamic one), and with the dynamic
        artifact ``dyn`` every size the engine captures that it covers: six faces then run compiled
        at 6, not padded to 8."""
        if dyn is None:
            return list(sizes)
        return sorted(set(sizes) | {b for b in self.host.batch_sizes if b in dyn.covers})

    # -- loading in the background -----------------------------------------------------------------

    def plan(self, sizes: Sequence[int], items: Items) -> None:
        """``compile="auto"``: what is built of ``sizes`` is loaded in a background thread, started
        now, at the end of the warm-up: while the rest of the pipeline loads, so the first frames
        usually find it ready (each first call waits for the other engines' graph captures, and they
        for it): the one dynamic artifact for every size when it is there, else each size's own.
        What is missing is built by one job in another process when this loader builds
        (:attr:`builds`) and loaded once built; else it runs uncompiled, with one line."""
        host = self.host
        sizes = sorted(set(sizes))
        dyn = self.cached_dynamic(items)
        covered = dyn.covers if dyn is not None else ()
        todo = [b for b in sizes if b in covered or self.unit(b, items).path.is_file()]
        missing = sorted(set(sizes) - set(todo))
        if missing and self.builds:
            missing = self._build_in_background(missing, items)
        if missing:
            self._log.warning(
                "%s: no compiled engine for batch %s on this GPU and torch; running uncompiled "
                "(`vcam engines build` compiles one for every batch size, or `vcam run` on a GPU in the background)",
                host.name,
                ",".join(map(str, missing)),
            )
        if todo:
            self._planned = (todo, items)
            self.resume()

    def _build_in_background(self, missing: list[int], items: Items) -> list[int]:
        """Start the build job for ``missing`` and the thread that loads what it builds
        (:class:`vcam.engines.autobuild.DaemonBuild`); returns the sizes left uncompiled."""
        from vcam.engines.autobuild import DaemonBuild

        self._auto, left = DaemonBuild.start(self, missing, items, job_spec(self.host, self.cache_dir, items))
        if self._auto is not None:
            self._builder, self._watch = self._auto.builder, self._auto.thread
        return left

    def load_built(self, sizes: Sequence[int], items: Items) -> None:
        """Load what a background build finished for ``sizes`` (in the calling thread, after the
        load started at the warm-up); the engine takes it at a call."""
        if self._thread is not None:
            self._thread.join()
        self._started = time.perf_counter()
        with quiet_load():
            self._load_sizes(sizes, items)

    @property
    def log(self) -> logging.Logger:
        """The engine's logger (after :meth:`bind`)."""
        return self._log

    @property
    def closing(self) -> threading.Event:
        """Set once :meth:`close` was called."""
        return self._closing

    @property
    def progress(self) -> str:
        """``compiling engines: 0/1, ~40 s left`` while a background build runs, else ''."""
        return self._auto.progress if self._auto is not None else ""

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
        # A compiled cache never delays the first frame: the load waits until the start-up's first
        # frame went out uncompiled (the daemon holds the gate until then: after an early swap, the
        # first GPU frame); the sizes are then put in use between two calls (:meth:`take_ready`).
        BACKGROUND.wait()
        with quiet_load():  # a second of Python, beside the warm-ups or the first frames
            self._load_sizes(sizes, items)

    def _load_sizes(self, sizes: Sequence[int], items: Items) -> None:
        host = self.host
        if self._prepared is not None:
            self._prepared.join()
        shared = None
        dyn = self.cached_dynamic(items)
        if dyn is not None:
            t0 = time.perf_counter()
            try:
                shared = self.load_unit(dyn, items, rebuild=False)
            except Exception as exc:  # never take the daemon down: each size's own artifact, else uncompiled
                why = f"{type(exc).__name__}: {exc}"
                self._log.warning("%s: the compiled engine for batch %s is not used (%s)", host.name, dyn.label, why)
            if shared is not None:
                seconds = time.perf_counter() - t0
                self._log.info("%s: compiled engine for batch %s loaded in %.1f s", host.name, dyn.label, seconds)
        for b in frames_first(self.served(sizes, dyn if shared is not None else None), lambda: host.last_batch):
            if self._closing.is_set():
                return
            t0 = time.perf_counter()
            try:
                # Python, file reads and the kernels' modules: nothing on a stream, so no lock (other
                # threads' captures are thread-local).
                ok = shared is not None and dyn is not None and b in dyn.covers
                fn = shared if ok else self.load_unit(self.unit(b, items), items, rebuild=False)
                if fn is None:
                    continue
                # On a GPU, paced like the engines' background captures: a first call and a capture
                # are one unit of background work beside the frames.
                with BACKGROUND.turn(self._closing) if host.device == "cuda" else contextlib.nullcontext():
                    prepared = host.first_call(fn, b, items)
            except Exception as exc:  # never take the daemon down: that size stays uncompiled
                self._log.warning(
                    "%s: the compiled engine for batch %d is not used (%s: %s)", host.name, b, type(exc).__name__, exc
                )
                continue
            self._ready.append((b, items, fn, prepared))
            self._log.info(
                "%s: compiled engine for batch %d %s in %.1f s",
                host.name,
                b,
                "ready" if shared else "loaded",
                time.perf_counter() - t0,
            )

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

    def note_call(self, *, compiled: bool) -> None:
        """A call of the engine; one that ran uncompiled after a load had started is counted
        (reported with the first size in use)."""
        self._uncompiled_calls += int(self.started and not compiled)

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


def _ignore(event: str, label: str, detail: Any = None) -> None:
    """No progress wanted."""


def _why(exc: BaseException | None) -> str:
    """One line of a failed build's exception."""
    if exc is None:
        return "unknown reason"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


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


__all__ = [
    "COMPILE_MODES",
    "EARLY_IMPORT_ENV",
    "CompiledLoader",
    "Unit",
    "compile_mode",
    "frames_first",
    "job_spec",
    "torch_engine",
]
