"""Builds outside the daemon: one build job of :mod:`vcam.engines.autobuild`, run as ``python -m
vcam.engines.build_job SPEC`` (SPEC: JSON, see :class:`~vcam.engines.autobuild.BackgroundBuild`):
the engine's module made from its ONNX file as the engine makes it, then :meth:`CompiledLoader.build
<vcam.engines.compiled.CompiledLoader.build>` for the job's sizes (the one dynamic artifact, or each
size's, one after the other), with a progress file the parent reads; and :func:`prebuild`, ``vcam
engines build``, which runs such jobs and waits for them."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vcam.engines.artifacts import built_seconds, device_name, failure, good, inductor_cache, read_meta
from vcam.engines.autobuild import BackgroundBuild, BuildProgress, progress_path
from vcam.engines.cache import resolve_cache_dir
from vcam.engines.compiled import CompiledLoader, job_spec, torch_engine
from vcam.errors import EngineUnavailable


class _Progress:
    """A job's progress file, rewritten (atomically) after each step."""

    def __init__(self, path: Path, sizes: list[str], guess_s: float) -> None:
        self.path = path
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "sizes": sizes,
            "done": [],
            "failed": {},
            "current": {},
            "waiting": [],
            "durations": [],
            "guess_s": guess_s,
            "fallback": "",
        }
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    def __call__(self, event: str, b: str, detail: Any = None) -> None:
        s = self.state
        if event == "fallback":  # the dynamic artifact failed: each size's replaces it
            why, labels = detail
            s.update(fallback=why, sizes=list(labels), current={}, waiting=[])
        elif event == "start":
            s["current"] = {str(b): time.time()}
            s["waiting"] = [x for x in s["waiting"] if x != b]
        elif event == "wait":
            s["waiting"].append(b)
        else:
            s["current"].pop(str(b), None)
            s["waiting"] = [x for x in s["waiting"] if x != b]
            if event == "failed":
                s["failed"][str(b)] = str(detail)
            else:
                s["done"].append(b)
                if event == "built" and detail:
                    s["durations"].append(float(detail))
        self.write()


def serialise_benchmarks(lock_path: Path) -> bool:
    """Make Inductor's kernel benchmarks of this process take a lock that the other build jobs take
    too, so that jobs side by side overlap their compiling (CPU) but never time their candidate
    kernels while another job's run on the GPU (that would favour the wrong candidate). Returns
    whether Inductor's benchmarker had the methods to wrap (it does from torch 2.5 on)."""
    from filelock import FileLock

    try:
        from torch._inductor.runtime.benchmarking import benchmarker
    except ImportError:
        return False
    lock = FileLock(lock_path, poll_interval=0.002)
    wrapped = False
    for name in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
        fn = getattr(benchmarker, name, None)
        if fn is None:
            continue

        def locked(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            with lock:
                return _fn(*args, **kwargs)

        setattr(benchmarker, name, locked)  # an instance attribute: every module holds this instance
        wrapped = True
    return wrapped


def exit_with_parent(poll: float = 1.0) -> None:
    """End this job when the process that started it ends (a daemon stopped, or killed outright):
    a job is for that daemon's engine, and a later start starts its own (an entry half built is
    lost, its temporary file is named after this process and never used). POSIX gives an orphan a
    new parent; Windows keeps the old PID, so there the parent's own end is asked for."""
    from vcam.platform import process

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll)
            if os.getppid() != parent or not process.alive(parent):
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def job(spec: dict[str, Any]) -> int:
    """One build job (the child process): returns its exit status (0: no size failed)."""
    exit_with_parent()
    if spec.get("nice") and hasattr(os, "nice"):
        os.nice(int(spec["nice"]))
    if spec.get("compile_threads"):
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(spec["compile_threads"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s: %(message)s")
    engine = torch_engine(
        spec["model"],
        device=spec["device"],
        fp16=bool(spec["fp16"]),
        max_batch=int(spec["max_batch"]),
        channels_last=spec.get("channels_last"),
        cache_dir=spec.get("cache_dir"),
        compile="load",
        warmup=False,
    )
    try:
        loader = engine.loader
        assert isinstance(loader, CompiledLoader)
        if spec.get("serialise_benchmarks"):
            lock_path = resolve_cache_dir(spec.get("cache_dir")) / "compiled" / ".benchmark.lock"
            if not serialise_benchmarks(lock_path):
                logging.getLogger(__name__).info("Inductor's benchmarker not found: benchmarks run side by side")
        items = {k: tuple(v) for k, v in spec["items"].items()}
        sizes = [int(b) for b in spec["sizes"]]
        dynamic = bool(spec.get("dynamic"))
        path = progress_path(spec.get("cache_dir"), engine.architecture or engine.name, engine.precision, os.getpid())
        labels = [u.label for u in loader.units(sizes, items, dynamic=dynamic)]
        progress = _Progress(path, labels, float(spec.get("guess_s", 90.0)))
        done = loader.build(
            sizes,
            items,
            progress,
            keep_going=True,
            wait_locked=bool(spec.get("wait_locked")),
            retry_failed=bool(spec.get("retry_failed")),
            dynamic=dynamic,
        )
        if dynamic and done[0][1] == "failed":  # fell back: what counts is whether every size got its own
            done = done[1:]
    finally:
        engine.close()
    return 1 if any(state == "failed" for _, state, _ in done) else 0


def prebuild(
    model: str | os.PathLike[str],
    *,
    device: str = "cuda",
    fp16: bool = True,
    max_batch: int = 8,
    batches: Sequence[int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: Callable[[BuildProgress], None] | None = None,
    dynamic: bool = True,
) -> tuple[str, list[tuple[str, str, float]]]:
    """``vcam engines build``: the compiled artifacts of ``model`` that serve ``batches`` (default:
    every batch size of ``max_batch``), built by the job a daemon's background build runs
    (:class:`~vcam.engines.autobuild.BackgroundBuild`): the one artifact with a dynamic batch
    ``1..max_batch`` (tried again when it failed before, unless each of ``batches`` has its own),
    or with ``dynamic=False``, or where the dynamic one fails, one per size (``jobs`` side by side
    for ``dynamic=False``; a size whose last build failed is built again). ``progress(state)``
    about four times a second while they run. Returns the engine's description and ``(label,
    "built" | "cached", seconds)`` per entry that serves them (label ``"1-8"``: the dynamic one); a
    size that failed raises :class:`~vcam.errors.EngineUnavailable` once the others are done."""
    from vcam.engines import item_shapes

    _require_torch(device)
    engine = torch_engine(model, device=device, fp16=fp16, max_batch=max_batch, cache_dir=cache_dir, compile="load", warmup=False)
    builder: BackgroundBuild | None = None
    try:
        loader = engine.loader
        if engine.compile_mode == "off" or not isinstance(loader, CompiledLoader):
            raise EngineUnavailable(
                f"{engine.name} does not compile: only the native architectures (inswapper) do",
                hint="it runs uncompiled; nothing to build",
            )
        items = item_shapes(engine.inputs, None)
        sizes = sorted({engine._padded(b) for b in batches or engine.batch_sizes})
        statics = {b: loader.unit(b, items) for b in sizes}
        dyn = loader.dynamic_unit(items) if dynamic else None
        if dyn is not None and not good(dyn.path) and failure(dyn.path) and all(good(u.path) for u in statics.values()):
            dyn = None  # failed on this torch before, and each size has its own: nothing to build
        units = [dyn] if dyn is not None else list(statics.values())
        before = {u.path for u in [*units, *statics.values()] if good(u.path)}
        todo = [u for u in units if u.path not in before]
        state: BuildProgress | None = None
        if todo:
            inductor_cache(cache_dir)
            builder = BackgroundBuild(
                dict(job_spec(engine, cache_dir, items), dynamic=dyn is not None),
                sizes if dyn is not None else [u.covers[0] for u in todo],
                labels=[u.label for u in todo],
                name=engine.architecture or engine.name,
                precision=engine.precision,
                jobs=jobs,
                nice=0,
                wait_locked=True,
                retry_failed=True,
                guess_s=built_seconds(cache_dir, device_name(device)),
            )
            state = _follow(builder, progress)
        if dyn is not None and (good(dyn.path) or not todo):
            units = [dyn]
        else:  # static, or the dynamic build fell back to each size's
            units = list(statics.values())
        done, failed = [], []
        for u in units:
            if u.path in before:
                done.append((u.label, "cached", 0.0))
            elif good(u.path):
                done.append((u.label, "built", float(read_meta(u.path).get("built_s") or 0.0)))
            else:
                why = (state.failed.get(u.label) if state else None) or failure(u.path) or "the build process ended early"
                failed.append(f"batch {u.label}: {why}")
        if failed:
            where = builder.log_path if builder is not None else "the build logs beside the engines"
            raise EngineUnavailable(
                f"compiling {engine.name} failed ({'; '.join(failed)[:400]})",
                hint=f'see {where}; run without compiled engines ([pipeline] compile = "off") and report the error',
            )
    finally:
        engine.close()
    return engine.describe(), done


def _require_torch(device: str) -> None:
    """EngineUnavailable, with the build's own fixes, where PyTorch cannot compile for ``device``
    (the build has no --backend: only PyTorch compiles)."""
    from vcam.engines.torch import CPU_TORCH, TorchEngine

    reason = TorchEngine.unavailable_reason(device)
    if not reason:
        return
    fix = (
        f"install PyTorch: for CUDA the build matching your driver from pytorch.org, for the CPU {CPU_TORCH}"
        if "not installed" in reason
        else "install PyTorch with CUDA from pytorch.org, or build for the CPU with --device cpu"
    )
    raise EngineUnavailable(
        f"compiling engines needs PyTorch: {reason}", hint=f"{fix}; `vcam run --backend onnxruntime` needs no compiled engine"
    )


def _follow(builder: BackgroundBuild, progress: Callable[[BuildProgress], None] | None) -> BuildProgress:
    """Wait for ``builder``'s jobs, telling ``progress`` about four times a second and once at the
    end; the builder is stopped however the wait ends (Ctrl-C too). Returns its last state."""
    try:
        while builder.running:
            if progress is not None:
                progress(builder.progress())
            time.sleep(0.25)
        state = builder.progress()
        if progress is not None:
            progress(state)
        return state
    finally:
        builder.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m vcam.engines.build_job SPEC_JSON", file=sys.stderr)
        return 2
    return job(json.loads(args[0]))


__all__ = ["job", "main", "prebuild"]


if __name__ == "__main__":
    sys.exit(main())
