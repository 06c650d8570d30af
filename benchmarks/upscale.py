"""The frame enhancer's cost (issue 12 part 2): tiled super-resolution per frame, and its GPU memory.

    python -m benchmarks.upscale --device cuda [--fp16] [--json bench_upscale.json]
    python -m benchmarks.upscale --device cpu --tiny --sizes 160x120 --peak 320x240   # a smoke check

Per input size (default 1280x720 and 1920x1080, both x2 with ``real_esrgan_x2``): the time of one
:meth:`~vcam.stages.upscale.FrameEnhancer.enhance` (cut, model, feathered accumulation, normalisation; the
ops synchronised after each frame, so it is the frame's whole device time), of the cheap path
:meth:`~vcam.stages.upscale.FrameEnhancer.resize`, and with ``--untiled`` (the first size only) one engine
call on the whole frame as the baseline (the engine alone: no conversion, no batching); "model calls"
is the tiled run's engine calls alone (the rest of a frame is the stage's own work). Then the
same at ``--peak`` (default 3840x2160: 4K in, 8K out) with the peak GPU memory: PyTorch's
``max_memory_allocated`` (weights, activations, CUDA graph pools) and CuPy's pool (the frame, the
accumulator, the output), both reported.

The model is the full-size stand-in (Real-ESRGAN's RRDBNet with random weights: the same cost as the
real file), built with dynamic input dims into a temporary folder, unless ``--model-dir`` holds the
file (a real download or a stand-in); ``--tiny`` builds the small stand-in instead (CPU smoke runs).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_report
from vcam.config import UpscaleConfig
from vcam.models import registry, standin
from vcam.ops import make_ops
from vcam.stages.upscale import FrameEnhancer


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    return int(w), int(h)


def _picture(w: int, h: int) -> np.ndarray:
    import cv2

    from vcam.stages.demo import portrait

    return np.ascontiguousarray(cv2.resize(portrait("astronaut"), (w, h), interpolation=cv2.INTER_LINEAR))


def _times(fn: Any, ops: Any, frames: int) -> list[float]:
    """Milliseconds per call of ``fn()``, the ops synchronised after each."""
    out = []
    for _ in range(frames):
        t0 = time.perf_counter()
        fn()
        ops.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import cupy
        import torch

        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


def _model_path(args: argparse.Namespace, spec: registry.ModelSpec, tmp: str) -> Path:
    if args.model_dir:
        path = Path(args.model_dir) / (spec.file or f"{spec.name}.onnx")
        if not path.is_file():
            raise SystemExit(f"{path} not found (vcam models pull {spec.name}, or leave out --model-dir for the stand-in)")
        return path
    import onnx

    path = Path(tmp) / (spec.file or f"{spec.name}.onnx")
    onnx.save(standin.build_upscaler(spec, tiny=args.tiny, dynamic=True), str(path))
    return path


def _row(fe: FrameEnhancer, ops: Any, frame: np.ndarray, frames: int) -> dict:
    h, w = frame.shape[:2]
    dev = ops.asarray(frame)
    fe.warmup(w, h)
    enh = _times(lambda: fe.enhance(dev), ops, frames)
    rsz = _times(lambda: fe.resize(dev), ops, frames)

    def model_only() -> None:  # the same engine calls on the same inputs: no cut, no accumulation
        for n, *_ in fe._batches:
            fe.engine.run_device(fe._feeds[n], stream=ops.stream)

    model = _times(model_only, ops, frames)
    return {
        "input": [w, h],
        "output": list(fe.output_size(w, h)),
        "tiles": fe.tiles,
        "enhance_ms_mean": float(np.mean(enh)),
        "enhance_ms_p50": float(np.percentile(enh, 50)),
        "enhance_ms_p90": float(np.percentile(enh, 90)),
        "model_ms_mean": float(np.mean(model)),
        "resize_ms_mean": float(np.mean(rsz)),
        "untiled_ms_mean": None,
        "nan_tiles": fe.guarded(),
    }


def _engine(path: Path, args: argparse.Namespace, max_batch: int) -> Any:
    if args.channels_last:  # the torch engine with NHWC convolutions (its default for native modules only)
        from vcam.engines.torch import TorchEngine

        return TorchEngine(path, device=args.device, fp16=args.fp16, max_batch=max_batch, channels_last=True)
    from vcam.engines import create_engine

    return create_engine(path, backend=args.backend, device=args.device, fp16=args.fp16, max_batch=max_batch)


def _untiled(path: Path, args: argparse.Namespace, ops: Any, frame: np.ndarray, frames: int) -> float | None:
    """Mean ms of one engine call on the whole frame (None when the file fixes its input size)."""
    engine = _engine(path, args, 1)
    info = engine.inputs[0]
    if all(isinstance(d, int) for d in info.shape[2:]):
        return None
    h, w = frame.shape[:2]
    feeds = engine.input_buffers(1, {info.name: (3, h, w)})
    x = feeds[info.name]
    with ops.activate():  # on the ops' stream, which the engine call follows
        x[0] = ops.asarray((frame[..., ::-1].astype(np.float32) / 255).transpose(2, 0, 1).astype(x.dtype))
    run = lambda: engine.run_device(feeds, stream=ops.stream)  # noqa: E731
    _times(run, ops, 2)  # capture, autotune
    return float(np.mean(_times(run, ops, frames)))


def _gpu_memory(device: str) -> dict:
    if device != "cuda":
        return {"torch_max_allocated_mb": None, "cupy_used_mb": None, "cupy_total_mb": None}
    import cupy
    import torch

    pool = cupy.get_default_memory_pool()
    return {
        "torch_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
        "cupy_used_mb": pool.used_bytes() / 2**20,
        "cupy_total_mb": pool.total_bytes() / 2**20,
    }


def main(argv: list[str] | None = None) -> dict:
    up = UpscaleConfig()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--model", default="real_esrgan_x2", choices=[m.name for m in registry.by_kind("upscaler")])
    ap.add_argument("--model-dir", default="", help="folder holding the model file (default: build the stand-in)")
    ap.add_argument("--tiny", action="store_true", help="the tiny stand-in (CPU smoke runs)")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--backend", default="auto", choices=("auto", "tensorrt", "torch", "onnxruntime"))
    ap.add_argument("--channels-last", action="store_true", help="the torch engine with NHWC convolutions")
    ap.add_argument("--tile", type=int, default=up.tile)
    ap.add_argument("--overlap", type=int, default=up.overlap)
    ap.add_argument("--batch", type=int, default=up.batch)
    ap.add_argument("--sizes", default="1280x720,1920x1080", help="input sizes, comma separated")
    ap.add_argument("--peak", default="3840x2160", help="input size of the memory measurement ('' : none)")
    ap.add_argument("--untiled", action="store_true", help="also the whole frame in one engine call (first size)")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--json", default="bench_upscale.json")
    args = ap.parse_args(argv)
    spec = registry.get(args.model)
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    ops = make_ops(args.device)
    results, peak = [], None
    with tempfile.TemporaryDirectory(prefix="vcam-bench-upscale-") as tmp:
        path = _model_path(args, spec, tmp)
        engine = _engine(path, args, args.batch)
        engine_line = engine.describe()
        for i, (w, h) in enumerate(sizes):
            fe = FrameEnhancer(spec, engine, ops=ops, tile=args.tile, overlap=args.overlap, batch=args.batch)
            row = _row(fe, ops, _picture(w, h), args.frames)
            del fe
            _free(args.device)
            if args.untiled and i == 0:
                row["untiled_ms_mean"] = _untiled(path, args, ops, _picture(w, h), args.frames)
                _free(args.device)
            results.append(row)
        if args.peak:
            w, h = _size(args.peak)
            _free(args.device)
            if args.device == "cuda":
                import torch

                torch.cuda.reset_peak_memory_stats()
            fe = FrameEnhancer(spec, engine, ops=ops, tile=args.tile, overlap=args.overlap, batch=args.batch)
            peak = _row(fe, ops, _picture(w, h), max(2, args.frames // 4))
            peak.update(_gpu_memory(args.device))
            del fe
            _free(args.device)

    from rich.console import Console
    from rich.table import Table

    kind = "tiny stand-in" if args.tiny else ("file" if args.model_dir else "full-size stand-in")
    table = Table(
        title=f"vcam frame enhancer, {spec.name} ({kind}), tile {args.tile} overlap {args.overlap} batch {args.batch}, "
        f"{engine_line}, {args.device} ({platform.processor() or platform.machine()})"
    )
    cols = ("input -> output", "tiles", "enhance ms mean", "p50", "p90", "model calls ms", "resize ms", "untiled model ms")
    for col in cols:
        table.add_column(col, justify="left" if col.startswith("input") else "right")

    def add(r: dict, label: str = "") -> None:
        untiled = "-" if r["untiled_ms_mean"] is None else f"{r['untiled_ms_mean']:.1f}"
        table.add_row(
            f"{r['input'][0]}x{r['input'][1]} -> {r['output'][0]}x{r['output'][1]}{label}",
            str(r["tiles"]),
            f"{r['enhance_ms_mean']:.1f}",
            f"{r['enhance_ms_p50']:.1f}",
            f"{r['enhance_ms_p90']:.1f}",
            f"{r['model_ms_mean']:.1f}",
            f"{r['resize_ms_mean']:.2f}",
            untiled,
        )

    for r in results:
        add(r)
    if peak is not None:
        add(peak, " (peak)")
    con = Console(width=200)
    con.print(table)
    if peak is not None and peak["torch_max_allocated_mb"] is not None:
        con.print(
            f"peak GPU memory at {peak['input'][0]}x{peak['input'][1]} -> {peak['output'][0]}x{peak['output'][1]}: "
            f"torch max allocated {peak['torch_max_allocated_mb']:.0f} MiB, CuPy pool used {peak['cupy_used_mb']:.0f} MiB "
            f"(held {peak['cupy_total_mb']:.0f} MiB)"
        )
    payload = write_report(
        args.json,
        {
            "device": args.device,
            "model": spec.name,
            "stand_in": not args.model_dir,
            "tiny": args.tiny,
            "fp16": args.fp16,
            "engine": engine_line,
            "tile": args.tile,
            "overlap": args.overlap,
            "batch": args.batch,
            "channels_last": args.channels_last,
            "frames": args.frames,
            "results": results,
            "peak": peak,
        },
    )
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
