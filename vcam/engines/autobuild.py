"""Compiled engines built in other processes: the daemon's background build on first use
(:class:`DaemonBuild`) and ``vcam engines build`` both run here.

A build job is a child process (``python -m vcam.engines.build_job SPEC``, :mod:`vcam.engines.build_job`) that makes the
swap module from its ONNX file, as the engine does, and builds what serves a list of batch sizes
(:meth:`vcam.engines.compiled.CompiledLoader.build`): the one artifact with a dynamic batch, or
where that fails, one per size, one after the other (one process, so its imports, its module,
Inductor's compile workers and its caches serve every size). A daemon runs one job. For static
builds several jobs may run side by side
(``jobs``: the sizes dealt out to them, batch 1 first): an Inductor build spends most of its time
compiling a few candidate kernels per layer and waiting for them, which leaves most of a many-core
host idle; their timing of those candidates on the GPU takes turns (a lock), so no job times its
kernels while another's run. Each job runs at a lower CPU priority (``nice``) so that a daemon's frame thread keeps
its core; its Python, memory and compile workers are its own, never the frame thread's.

Each entry is built under its lock (:func:`vcam.engines.artifacts.lock`), so a second daemon or
``vcam engines build`` waits for the entry rather than building it again; a build that fails is
remembered per entry (:func:`~vcam.engines.artifacts.mark_failed`) and not retried by a daemon.

Progress: a job writes ``<cache>/compiled/<name>.<precision>.<pid>.build.json`` after each step
(the entries by label, ``"1-8"`` for the dynamic one, ``"4"`` for one size's: all, done, failed,
the one in hand and since when); :class:`BackgroundBuild` and ``vcam check`` read those files into
one :class:`BuildProgress` ("compiling engines: 0/1, ~40 s left").
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vcam.engines.cache import resolve_cache_dir
from vcam.platform import process
from vcam.platform.cpu import usable_cores

log = logging.getLogger(__name__)

SUFFIX = ".build.json"
#: What one size is expected to take before any has finished here (no sidecar of this GPU yet).
FIRST_GUESS_S = {"cuda": 90.0, "cpu": 20.0}


@dataclass
class BuildProgress:
    """Where one or more build jobs stand (merged from their progress files). Entries by label:
    ``"1-8"`` (the dynamic artifact) or ``"4"`` (one batch size's)."""

    sizes: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    current: dict[str, float] = field(default_factory=dict)  # label -> when its build started (time.time)
    waiting: list[str] = field(default_factory=list)  # entries another process builds now (their locks)
    durations: list[float] = field(default_factory=list)
    guess_s: float = 90.0  # one entry, before any has finished
    jobs: int = 1
    fallback: str = ""  # why the dynamic artifact failed (the job builds each size's then)

    @property
    def total(self) -> int:
        return len(self.sizes)

    @property
    def finished(self) -> bool:
        return len(self.done) + len(self.failed) >= self.total

    def left_s(self, now: float | None = None) -> float:
        """Seconds until every entry is built, from those done so far (or the first guess)."""
        now = time.time() if now is None else now
        per = sum(self.durations) / len(self.durations) if self.durations else self.guess_s
        running = [max(per - (now - t), 0.05 * per) for t in self.current.values()]
        queued = self.total - len(self.done) - len(self.failed) - len(running)
        work = sum(running) + per * max(queued, 0)
        return work / max(1, min(self.jobs, max(1, len(running) + max(queued, 0))))

    def text(self, now: float | None = None) -> str:
        """``compiling engines: 2/4, ~40 s left`` (done of all), or '' when nothing is left."""
        if not self.sizes or self.finished:
            return ""
        left = self.left_s(now)
        eta = f"~{left:.0f} s left" if left < 120 else f"~{left / 60:.0f} min left"
        return f"compiling engines: {len(self.done)}/{self.total}, {eta}"


def progress_path(cache_dir: str | os.PathLike | None, name: str, precision: str, pid: int) -> Path:
    return resolve_cache_dir(cache_dir) / "compiled" / f"{Path(name).stem}.{precision}.{pid}{SUFFIX}"


def read_progress(paths: Sequence[Path], jobs: int | None = None) -> BuildProgress:
    """The progress files ``paths`` merged (a file not written yet or half-written is skipped)."""
    out = BuildProgress()
    for p in paths:
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        out.sizes += [str(b) for b in d.get("sizes", [])]
        out.done += [str(b) for b in d.get("done", [])]
        out.failed.update({str(b): str(r) for b, r in d.get("failed", {}).items()})
        out.current.update({str(b): float(t) for b, t in d.get("current", {}).items()})
        out.waiting += [str(b) for b in d.get("waiting", [])]
        out.durations += [float(s) for s in d.get("durations", [])]
        out.guess_s = float(d.get("guess_s", out.guess_s))
        out.fallback = out.fallback or str(d.get("fallback", ""))
    out.jobs = jobs if jobs is not None else max(1, len(paths))
    return out


def running_builds(cache_dir: str | os.PathLike | None = None) -> BuildProgress | None:
    """What the build jobs running now on this machine (any daemon's, or ``vcam engines build``'s)
    have done, or None when none runs (``vcam check``); files of jobs that died are removed."""
    root = resolve_cache_dir(cache_dir) / "compiled"
    live = []
    for p in sorted(root.glob(f"*{SUFFIX}")) if root.is_dir() else []:
        try:
            pid = int(p.name[: -len(SUFFIX)].rsplit(".", 1)[1])
        except (ValueError, IndexError):
            continue
        if process.alive(pid):
            live.append(p)
        else:
            p.unlink(missing_ok=True)
    return read_progress(live) if live else None


#: Free device memory one CUDA build job is given room for (its context, the module, the autotuning).
JOB_MEMORY = 6e9


def default_jobs(device: str, sizes: int) -> int:
    """Build jobs side by side: on CUDA one per four host cores and per :data:`JOB_MEMORY` of free
    device memory (at most one per size); on the CPU one (the build's kernels are benchmarked on
    the cores the frames need)."""
    if device != "cuda":
        return 1
    jobs = max(1, min(sizes, usable_cores() // 4))
    try:
        import torch

        jobs = min(jobs, max(1, int(torch.cuda.mem_get_info()[0] // JOB_MEMORY)))
    except Exception:  # no torch or no device here: the cores decide
        pass
    return jobs


def deal(sizes: Sequence[int], jobs: int) -> list[list[int]]:
    """``sizes`` (ascending) dealt out to ``jobs`` jobs: the first job starts with the smallest."""
    ordered = sorted(set(sizes))
    jobs = max(1, min(jobs, len(ordered)))
    return [ordered[i::jobs] for i in range(jobs)]


class BackgroundBuild:
    """Build jobs for the missing sizes of one engine, started now; read :meth:`progress`, poll
    :attr:`running`, :meth:`stop` them (an entry in hand is lost, the finished ones are kept).

    ``spec``: what a job needs to make the same module and keys as the engine (``model`` path,
    ``device``, ``fp16``, ``max_batch``, ``channels_last``, ``items``, ``cache_dir``, ``dynamic``:
    one artifact for every size, built by one job, else one per size, dealt out to the jobs).
    ``labels``: the entries the progress counts before a job has written its file. ``nice``:
    the jobs' CPU priority is lowered by that much; ``wait_locked``: a size another process builds
    is waited for (``vcam engines build``) rather than left to it; ``retry_failed``: sizes whose
    last build failed are built again (else skipped).
    """

    def __init__(
        self,
        spec: dict[str, Any],
        sizes: Sequence[int],
        *,
        labels: Sequence[str] | None = None,
        name: str,
        precision: str,
        jobs: int | None = None,
        nice: int = 10,
        wait_locked: bool = False,
        retry_failed: bool = False,
        guess_s: float | None = None,
    ) -> None:
        self.sizes = sorted(set(sizes))
        self.labels = list(labels) if labels else [str(b) for b in self.sizes]
        device = spec.get("device", "cuda")
        dynamic = bool(spec.get("dynamic"))
        self.jobs = [self.sizes] if dynamic else deal(self.sizes, jobs or default_jobs(device, len(self.sizes)))
        self.root = resolve_cache_dir(spec.get("cache_dir")) / "compiled"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / f"{Path(name).stem}.{precision}.build.log"
        self.name, self.precision = name, precision
        self._procs: list[subprocess.Popen] = []
        self._paths: list[Path] = []
        threads = max(1, usable_cores() // len(self.jobs)) if len(self.jobs) > 1 else None
        guess = self.guess_s = guess_s or FIRST_GUESS_S.get(device, 90.0)
        with open(self.log_path, "ab") as logf:
            for part in self.jobs:
                job = dict(spec, sizes=part, nice=nice, wait_locked=wait_locked, retry_failed=retry_failed, guess_s=guess)
                if threads is not None:
                    job["compile_threads"] = threads
                    job["serialise_benchmarks"] = device == "cuda"  # build_job.serialise_benchmarks
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vcam.engines.build_job", json.dumps(job)],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=logf,
                    env=env,
                    **process.own_group(),  # the terminal's Ctrl-C goes to the daemon, which stops them
                )
                self._procs.append(proc)
                self._paths.append(progress_path(spec.get("cache_dir"), name, precision, proc.pid))

    @property
    def running(self) -> bool:
        return any(p.poll() is None for p in self._procs)

    @property
    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self._procs]

    def progress(self) -> BuildProgress:
        out = read_progress(self._paths, jobs=sum(p.poll() is None for p in self._procs) or 1)
        if not out.sizes:  # the jobs are starting (importing torch): nothing written yet
            out.sizes, out.guess_s = list(self.labels), self.guess_s
        return out

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for p in self._procs:
            try:
                p.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self) -> None:
        """Stop the jobs still running (idempotent); their progress files are removed."""
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for path in self._paths:
            path.unlink(missing_ok=True)


#: A build job's exit statuses that mean it was stopped (SIGINT, SIGKILL, SIGTERM, SIGHUP), not that it failed.
STOPPED = (-2, -9, -15, -1)


class DaemonBuild:
    """A daemon's background build of what its engine lacks: one build job (:class:`BackgroundBuild`:
    the one dynamic artifact, or where that failed before, each size's own, one after the other)
    and a thread that loads what the job finishes into the engine's loader
    (:class:`~vcam.engines.compiled.CompiledLoader`) and keeps the progress line. Made by
    :meth:`start`."""

    def __init__(self, loader: Any, builder: BackgroundBuild, sizes: list[int], items: Any, dynamic: bool) -> None:
        self.loader, self.builder = loader, builder
        self.progress = builder.progress().text()
        self.thread = threading.Thread(
            target=self._watch, args=(sizes, items, dynamic), name=f"{loader.host.name}-autobuild", daemon=True
        )
        self.thread.start()

    @classmethod
    def start(cls, loader: Any, missing: list[int], items: Any, spec: dict[str, Any]) -> tuple[DaemonBuild | None, list[int]]:
        """Start the job for ``missing`` (``spec``: :func:`~vcam.engines.compiled.job_spec`); returns
        it (None when none started) and the sizes left uncompiled without a word more (those whose
        last build failed: one warning)."""
        from vcam.engines.artifacts import built_seconds, device_name, failure, inductor_cache

        host, log = loader.host, loader.log
        dyn = loader.dynamic_unit(items)
        dynamic = dyn is not None and failure(dyn.path) is None
        failed = {} if dynamic else {b: why for b in missing if (why := failure(loader.unit(b, items).path)) is not None}
        if failed:
            log.warning(
                "%s: compiling for batch %s failed before (%s); running uncompiled (`vcam engines build --batch %s` tries again)",
                host.name,
                ",".join(map(str, failed)),
                next(iter(failed.values())),
                ",".join(map(str, failed)),
            )
        todo = [b for b in missing if b not in failed]
        if not todo or getattr(host, "model_path", None) is None:  # a model given as bytes: no file for a job to read
            return None, todo
        units = loader.units(todo, items, dynamic=dynamic)
        inductor_cache(loader.cache_dir)  # the job's and this process's Inductor share one cache (the loads find their kernels)
        try:
            builder = BackgroundBuild(
                dict(spec, dynamic=dynamic),
                todo,
                labels=[u.label for u in units],
                name=host.architecture or host.name,
                precision=host.precision,
                jobs=1,  # one process: a build's autotuning takes the GPU; side by side they only wait for each other
                wait_locked=True,
                retry_failed=False,
                guess_s=built_seconds(loader.cache_dir, device_name(host.device)),
            )
        except OSError as exc:
            log.warning("%s: the background compile could not start (%s); running uncompiled", host.name, exc)
            return None, todo
        log.info(
            "%s: compiling %s in the background (frames run uncompiled until it is ready, log: %s)",
            host.name,
            f"one engine for batch {units[0].label}" if dynamic else f"batch {','.join(map(str, todo))}",
            builder.log_path,
        )
        return cls(loader, builder, todo, items, dynamic), []

    def _watch(self, sizes: list[int], items: Any, dynamic: bool) -> None:
        """While the job runs: load what it finishes (the dynamic artifact once, for every size) and
        keep the progress line; a size that failed, or that the job never built, gets one warning
        and stays uncompiled."""
        from vcam.engines.artifacts import good, locked

        loader, builder = self.loader, self.builder
        closing = loader.closing
        pending = list(sizes)
        dyn = loader.dynamic_unit(items) if dynamic else None
        statics = {b: loader.unit(b, items) for b in sizes}
        ready: list[str] = []
        try:
            while pending and not closing.is_set():
                running = builder.running
                prog = builder.progress()
                if dyn is not None:
                    if good(dyn.path) and not locked(dyn.path):
                        loader.load_built(pending, items)
                        ready.append(dyn.label)
                        pending = []
                    elif prog.fallback:  # the job builds each size now
                        loader.log.warning(
                            "%s: compiling one engine for batch %s failed (%s); compiling each batch size instead (log: %s)",
                            loader.host.name,
                            dyn.label,
                            prog.fallback,
                            builder.log_path,
                        )
                        dyn = None
                    elif not running:
                        self._ended(dyn, pending, prog)
                        pending = []
                for b in list(pending) if dyn is None else []:
                    u = statics[b]
                    if good(u.path) and not locked(u.path):
                        pending.remove(b)
                        loader.load_built([b], items)
                        ready.append(u.label)
                    elif u.label in prog.failed or not running:
                        pending.remove(b)
                        self._ended(u, [b], prog)
                prog.done = sorted(set(prog.done) | set(ready))
                self.progress = prog.text() if pending else ""
                if pending:
                    closing.wait(0.25)
        except Exception as exc:  # never take the daemon down
            loader.log.warning("%s: the background compile stopped (%s: %s)", loader.host.name, type(exc).__name__, exc)
        finally:
            self.progress = ""
            if not closing.is_set():
                builder.wait(60)  # the job closes its engine and exits once its last entry is built
            builder.stop()

    def _ended(self, u: Any, sizes: list[int], prog: BuildProgress) -> None:
        """``u`` failed in the job, or the job ended without it: one warning (and the failure
        remembered, unless the job was stopped from outside)."""
        from vcam.engines.artifacts import mark_failed

        log, name = self.loader.log, self.loader.host.name
        why = prog.failed.get(u.label)
        batches = ",".join(map(str, sizes))
        if why is None:
            codes = [c for c in self.builder.returncodes if c]
            code = codes[0] if codes else 0
            if code in STOPPED:  # stopped from outside: not the build's fault, the next start tries again
                log.warning(
                    "%s: the background compile of batch %s was stopped (signal %d); it runs uncompiled",
                    name,
                    batches,
                    -code,
                )
                return
            why = f"the build process ended (exit status {code})"
            if not self.loader.closing.is_set():
                mark_failed(u.path, why)
        log.warning(
            "%s: compiling for batch %s failed (%s); it runs uncompiled (`vcam engines build --batch %s` tries again; log: %s)",
            name,
            batches,
            why,
            batches,
            self.builder.log_path,
        )


__all__ = [
    "BackgroundBuild",
    "DaemonBuild",
    "STOPPED",
    "FIRST_GUESS_S",
    "BuildProgress",
    "default_jobs",
    "deal",
    "progress_path",
    "read_progress",
    "running_builds",
]
