"""``vcam bench``: the GPU hot path against the naive loop, on synthetic frames.

For each frame size and face count: per-stage device times (CUDA events), end-to-end latency p50/p99
from the raw frame in a pinned host buffer to the output bytes in a pinned host buffer, throughput
with pipelining (submit frame N+1 before collecting frame N), and peak GPU memory; and in the same run
the naive loop (per frame: upload, CPU warp with OpenCV, one model call per face, download, float
blend of the full frame on the CPU). The swapper is the inswapper architecture with random weights
(the full-size stand-in file, or ``--model``) on the torch engine (FP16, channels-last, CUDA graphs);
the detector is the embedded RetinaFace on the GPU, run on one
region per face every frame (as the tracker does between scans) with its real readback, while the
faces themselves are fixed synthetic positions so every configuration swaps exactly N faces.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from vcam.errors import DeviceError
from vcam.runtime.bench_rig import (  # noqa: F401 - the rigs, re-exported for the tools
    SIZES,
    FixedTracker,
    GpuRig,
    _inswapper_file,
    _pct,
    bench_config,
    bench_snapshot,
    gpu_rig,
    synthetic_faces,
    synthetic_frame,
)
from vcam.types import Frame, PixelFormat


def bench_gpu(width: int, height: int, faces: int, *, frames: int = 200, **rig_options: Any) -> dict:
    """Time the pipeline of :func:`gpu_rig` (``rig_options``: its keyword arguments): latency frame
    by frame, then throughput pipelined."""
    import cupy
    import torch

    rig = gpu_rig(width, height, faces, **rig_options)
    pipe, snap, frame, ops, engine = rig.pipe, rig.snap, rig.frame, rig.ops, rig.engine
    lat, stages = [], {}
    c0 = ops.transfers.snapshot()
    for i in range(frames):
        f = frame(i)
        # A daemon paced by its camera applies the last frame's detection, and plans the next frame's
        # tracks and band, while it waits for the frame (settle); so does the bench, outside the
        # timed region, as the camera's write is.
        while not pipe.settle():
            time.sleep(0.0001)
        t0 = time.perf_counter()
        _, st = pipe.process(f, snap)
        lat.append(time.perf_counter() - t0)
        for k, v in st.stages.items():
            stages.setdefault(k, []).append(v)
    c1 = ops.transfers.snapshot()
    # Throughput with pipelining: frame N+1 is submitted before frame N is collected.
    t0 = time.perf_counter()
    prev = None
    for i in range(frames):
        s = pipe.submit(frame(i), snap)
        if prev is not None:
            pipe.collect(prev)
        prev = s
    pipe.collect(prev)
    fps = frames / (time.perf_counter() - t0)
    free1 = cupy.cuda.runtime.memGetInfo()[0]
    peak = torch.cuda.max_memory_reserved() + cupy.get_default_memory_pool().total_bytes()
    res = {
        "size": f"{width}x{height}",
        "faces": faces,
        "in_fmt": rig.in_fmt.value,
        "out_fmt": rig.out_fmt.value,
        "fp16": rig.fp16,
        "masks": ",".join(rig.masks),
        "band": rig.band,
        "banded_frames": pipe.banded,
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "fps_pipelined": fps,
        "stages_ms": {k: float(np.median(v) * 1e3) for k, v in stages.items()},
        "copies_per_frame": {"h2d": (c1[0] - c0[0]) / frames, "d2h": (c1[1] - c0[1]) / frames},
        "peak_gpu_mb_allocators": peak / 2**20,
        "gpu_mb_in_use_device": (rig.free0 - free1) / 2**20,
        "guarded": pipe.guarded(),
        "engines": {"detector": rig.detector.engine.describe(), "swapper": engine.describe()},
        "compiled": engine.compiled_for(faces),
        "predicted_frames": pipe.predicted,
    }
    rig.close()
    return res


def _naive_faces(bgr: np.ndarray, lms: list[np.ndarray], swap: Any, mask: np.ndarray) -> np.ndarray:
    """The naive loops' per-face work (what the peers do): a CPU warp, ``swap(crop) -> crop`` one face
    at a time, and a float blend of the whole frame with a full-frame warped mask."""
    import cv2

    from vcam import align

    height, width = bgr.shape[:2]
    img = bgr.astype(np.float32)
    for lm in lms:
        m = align.estimate(lm, "arcface_128", 128)
        crop = cv2.warpAffine(bgr, m, (128, 128), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        inv = cv2.invertAffineTransform(m)
        warped = cv2.warpAffine(swap(crop), inv, (width, height), flags=cv2.INTER_LINEAR).astype(np.float32)
        mk = cv2.warpAffine(mask, inv, (width, height), flags=cv2.INTER_LINEAR)[..., None]
        img = img * (1.0 - mk) + warped * mk
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def bench_naive(
    width: int,
    height: int,
    faces: int,
    *,
    model: Path,
    frames: int = 20,
    in_fmt: PixelFormat = PixelFormat.NV12,
    out_fmt: PixelFormat = PixelFormat.I420,
    fp16: bool = True,
) -> dict:
    """The naive loop (what the peers do): per frame a CPU conversion and upload, then per face a CPU
    warp, one eager model call with its own upload and download, a float blend of the whole frame on
    the CPU with a full-frame warped mask; a CPU conversion out."""
    import torch

    from vcam.engines import create_engine
    from vcam.kernels import convert
    from vcam.kernels import paste as blend

    engine = create_engine(model, backend="torch", device="cuda", fp16=fp16, max_batch=1)
    engine.cuda_graphs = False  # eager calls, one face at a time
    raw = synthetic_frame(width, height, in_fmt)
    lms = synthetic_faces(faces, width, height)
    mask = blend.box_mask(128, 0.3)
    latent = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)

    def swap(crop: np.ndarray) -> np.ndarray:  # one eager model call per face, with its own copies
        x = np.ascontiguousarray(crop[..., ::-1].transpose(2, 0, 1)[None], dtype=np.float32) / 255.0
        y = engine.run({"target": x, "source": latent})[0]
        return (y[0].transpose(1, 2, 0)[..., ::-1] * 255.0).clip(0, 255).astype(np.uint8)

    times = []
    for i in range(frames + 3):
        t0 = time.perf_counter()
        bgr = convert.to_bgr_ref(raw, in_fmt, width, height)
        dev = torch.from_numpy(bgr).cuda()  # the naive loop keeps a device copy it never uses well
        res = _naive_faces(bgr, lms, swap, mask)
        _ = dev.cpu()  # download
        convert.from_bgr_ref(res, out_fmt)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return {
        "size": f"{width}x{height}",
        "faces": faces,
        "p50_ms": _pct(times, 50),
        "p99_ms": _pct(times, 99),
        "fps": 1.0 / float(np.mean(times)),
    }


def bench_cpu(
    width: int,
    height: int,
    faces: int,
    *,
    frames: int = 60,
    in_fmt: PixelFormat = PixelFormat.NV12,
    out_fmt: PixelFormat = PixelFormat.I420,
) -> dict:
    """The pipeline on NumPy ops (onnxruntime detector on one region per face, classic swap), built
    by the assembly as ``vcam run --device cpu`` builds it, on the same synthetic frames; the neural
    swapper is left out on the CPU (seconds per face)."""
    from vcam.runtime import assemble
    from vcam.types import SourceFace

    asm = assemble.build(bench_config(device="cpu", swapper="classic", max_faces=max(8, faces)))
    tracker = FixedTracker(asm.detector, synthetic_faces(faces, width, height))
    sw = asm.swapper
    face = sw.prepare(SourceFace(name="bench", image=synthetic_frame(128, 128, PixelFormat.BGR, seed=3)))
    pipe = asm.make_pipeline(out_fmt, tracker=tracker, predict=False)
    raw = synthetic_frame(width, height, in_fmt)
    snap = bench_snapshot(face)
    lat, stages = [], {}
    for i in range(frames + 3):
        f = Frame(data=raw, width=width, height=height, fmt=in_fmt, t_capture=0.0, seq=i)
        t0 = time.perf_counter()
        _, st = pipe.process(f, snap)
        if i >= 3:
            lat.append(time.perf_counter() - t0)
            for k, v in st.stages.items():
                stages.setdefault(k, []).append(v)
    return {
        "size": f"{width}x{height}",
        "faces": faces,
        "in_fmt": in_fmt.value,
        "out_fmt": out_fmt.value,
        "fp16": False,
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "fps_pipelined": 1.0 / float(np.mean(lat)),
        "stages_ms": {k: float(np.median(v) * 1e3) for k, v in stages.items()},
        "copies_per_frame": {"h2d": 0, "d2h": 0},
        "peak_gpu_mb_allocators": 0.0,
    }


_IDENTITY = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])


def classic_crop(swapper: Any, crop: np.ndarray, face: Any) -> np.ndarray:
    """The classic swap of one crop the naive loop already warped with OpenCV (the crop is its own
    frame, at the identity transform)."""
    return swapper.swap(crop, _IDENTITY, face)[0][0].copy()


def bench_naive_cpu(
    width: int,
    height: int,
    faces: int,
    *,
    frames: int = 20,
    in_fmt: PixelFormat = PixelFormat.NV12,
    out_fmt: PixelFormat = PixelFormat.I420,
) -> dict:
    """The naive CPU loop: full-frame detection every frame, then per face a warp, the classic swap and
    a float blend of the whole frame with a full-frame warped mask (what the peers do)."""

    from vcam.kernels import convert
    from vcam.kernels import paste as blend
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.swap import ClassicSwapper
    from vcam.types import SourceFace

    det = RetinaFaceDetector()
    sw = ClassicSwapper(128, dense=False)  # the peers' way: a crop, pasted
    face = sw.prepare(SourceFace(name="bench", image=synthetic_frame(128, 128, PixelFormat.BGR, seed=3)))
    raw = synthetic_frame(width, height, in_fmt)
    lms = synthetic_faces(faces, width, height)
    mask = blend.box_mask(128, 0.3)
    times = []
    for i in range(frames + 2):
        t0 = time.perf_counter()
        bgr = convert.to_bgr_ref(raw, in_fmt, width, height)
        det.detect(bgr)
        convert.from_bgr_ref(_naive_faces(bgr, lms, lambda crop: classic_crop(sw, crop, face), mask), out_fmt)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return {
        "size": f"{width}x{height}",
        "faces": faces,
        "p50_ms": _pct(times, 50),
        "p99_ms": _pct(times, 99),
        "fps": 1.0 / float(np.mean(times)),
    }


MASK_SETS = (("face",), ("face", "mouth"), ("box", "face", "mouth"), ("occlusion",), ("region",))


def bench_masks(width: int, height: int, faces: list[int], *, frames: int = 200, fp16: bool = True) -> list[dict]:
    """What each mask costs per face on the GPU: :class:`~vcam.stages.mask.Masker` alone on a frame of
    ``width`` x ``height`` with n synthetic faces, per set of :data:`MASK_SETS`. ``device_ms``: CUDA
    event time per call (host gaps included: the stage's real cost on a busy stream); ``host_ms``:
    the wall time of a call's host side (shape building, launches). The occlusion and region rows
    run the registry's stand-ins (real tensors, small random networks), so their figures are the
    stand-ins', not XSeg's or BiSeNet's."""
    import tempfile

    import cupy

    from vcam import align
    from vcam.config import Config
    from vcam.config_file import build
    from vcam.kernels import paste as blend
    from vcam.models import standin
    from vcam.ops.cuda import CudaOps
    from vcam.runtime.roles import build_masker

    ops = CudaOps()
    models = Path(tempfile.mkdtemp(prefix="vcam-bench-masks-"))
    for name in ("xseg_1", "bisenet_resnet_34"):
        standin.write(name, models)
    frame = ops.asarray(synthetic_frame(width, height, PixelFormat.BGR))
    base = ops.asarray(blend.box_mask(128))
    out = []
    for types in MASK_SETS:
        cfg = Config().replace(
            models=build({"models": {"dir": str(models)}}).models,
            mask=build({"mask": {"types": list(types)}}).mask,
            pipeline=build({"pipeline": {"max_faces": max(8, *faces), "fp16": fp16}}).pipeline,
        )
        masker = build_masker(cfg, 128, ops=ops, device="cuda")
        for n in faces:
            lms = np.stack(synthetic_faces(n, width, height))
            mats = np.stack([align.estimate(lm, "arcface_128", 128) for lm in lms])
            boxes = np.concatenate([lms.min(1) - 20, lms.max(1) + 20], 1)
            with ops.activate():
                for _ in range(10):
                    masker.masks(frame, mats, lms, boxes, n, base)
                ops.synchronize()
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                host = 0.0
                e0.record(ops.stream)
                for _ in range(frames):
                    t0 = time.perf_counter()
                    masker.masks(frame, mats, lms, boxes, n, base)
                    host += time.perf_counter() - t0
                e1.record(ops.stream)
                e1.synchronize()
            dev = cupy.cuda.get_elapsed_time(e0, e1) / frames
            out.append(
                {
                    "masks": ",".join(types),
                    "faces": n,
                    "device_ms": dev,
                    "device_ms_per_face": dev / n,
                    "host_ms": host / frames * 1e3,
                }
            )
    return out


def run(
    *,
    device: str = "cuda",
    faces: list[int] = (1, 4, 8),
    sizes: list[str] = ("1080p",),
    frames: int = 200,
    compile: str = "auto",
    model: str | None = None,
    naive_frames: int = 20,
    in_fmt: str = "NV12",
    out_fmt: str = "I420",
    fp16: bool = True,
    json_path: str | None = None,
    naive: bool = True,
    console: Any = None,
    predict: bool = True,
) -> dict:
    """Run the benchmark; returns (and optionally writes) the results as a dict. ``predict``: swap
    with the tracks while each frame's detection runs (``[track] predict``, on for `vcam run` on
    CUDA); off: every frame waits for its detection."""
    if device == "cpu":
        return _run_cpu(
            faces=faces,
            sizes=sizes,
            frames=min(frames, 60),
            naive_frames=naive_frames,
            in_fmt=in_fmt,
            out_fmt=out_fmt,
            json_path=json_path,
            naive=naive,
            console=console,
        )
    if device != "cuda":
        raise DeviceError(f"unknown bench device {device!r}", hint="use --device cuda or --device cpu")
    from vcam.ops import cuda_status

    ok, why = cuda_status()
    if not ok:
        raise DeviceError(f"CUDA is not usable: {why}", hint="install CuPy and PyTorch with CUDA, or run on a GPU machine")
    import cupy
    import torch

    from vcam.kernels.build import arch

    path = _inswapper_file(model)
    info = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cupy": cupy.__version__,
        "arch": arch(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "swapper": model or "inswapper_128 stand-in (real architecture, random weights)",
        "predict": predict,
    }
    results: dict[str, Any] = {"info": info, "gpu": [], "naive": []}
    for s in sizes:
        if s not in SIZES:
            raise DeviceError(f"unknown size {s!r}", hint=f"choose from {', '.join(SIZES)}")
        w, h = SIZES[s]
        for n in faces:
            r = bench_gpu(
                w,
                h,
                n,
                model=path,
                frames=frames,
                in_fmt=PixelFormat(in_fmt),
                out_fmt=PixelFormat(out_fmt),
                fp16=fp16,
                compile=compile,
                predict=predict,
            )
            results["gpu"].append(r)
            if n == 1:
                # The same configuration without the mask stage, alternated with it (masks, box, masks,
                # box): a single run of each swings by a few tenths of a millisecond with the GPU clocks.
                kw = dict(
                    model=path, frames=frames, in_fmt=PixelFormat(in_fmt), out_fmt=PixelFormat(out_fmt), fp16=fp16,
                    compile=compile, predict=predict,
                )  # fmt: skip
                box = [bench_gpu(w, h, 1, masks=("box",), **kw)]
                masked = [r, bench_gpu(w, h, 1, masks=("box", "face"), **kw)]
                box.append(bench_gpu(w, h, 1, masks=("box",), **kw))
                r0 = dict(box[-1])
                r0["p50_ms"] = float(np.median([b["p50_ms"] for b in box]))
                r0["p99_ms"] = float(np.median([b["p99_ms"] for b in box]))
                results["gpu"].append(r0)
                over = {
                    "size": s,
                    "box_p50_ms": [b["p50_ms"] for b in box],
                    "masked_p50_ms": [m["p50_ms"] for m in masked],
                    "overhead_p50_ms": float(np.median([m["p50_ms"] for m in masked]) - r0["p50_ms"]),
                }
                results["mask_overhead"] = over
                # Whole frames against frames moved in bands (the default), alternated the same way.
                whole, banded = [], list(masked)
                for _ in range(2):
                    whole.append(bench_gpu(w, h, 1, band=False, **kw))
                    banded.append(bench_gpu(w, h, 1, **kw))
                whole.append(bench_gpu(w, h, 1, band=False, **kw))
                r1 = dict(whole[-1])
                r1["p50_ms"] = float(np.median([b["p50_ms"] for b in whole]))
                r1["p99_ms"] = float(np.median([b["p99_ms"] for b in whole]))
                results["gpu"].append(r1)
                runs = [m["p50_ms"] for m in banded]
                results["band_gain"] = {
                    "size": s,
                    "whole_p50_ms": [b["p50_ms"] for b in whole],
                    "banded_p50_ms": runs,
                    "gain_p50_ms": float(r1["p50_ms"] - np.median(runs)),
                }
                # The headline row: the median of the runs in bands (the default).
                r["p50_runs"] = runs
                r["p50_ms"] = float(np.median(runs))
                r["p99_ms"] = float(np.median([m["p99_ms"] for m in banded]))
                if console:
                    g = results["band_gain"]
                    console.print(
                        f"gpu {s} faces=1 p50 runs: whole frames {', '.join(f'{v:.2f}' for v in g['whole_p50_ms'])}; "
                        f"in bands {', '.join(f'{v:.2f}' for v in g['banded_p50_ms'])}; bands {-g['gain_p50_ms']:+.2f} ms"
                    )
                if console:
                    runs_box = ", ".join(f"{v:.2f}" for v in over["box_p50_ms"])
                    runs_masked = ", ".join(f"{v:.2f}" for v in over["masked_p50_ms"])
                    console.print(
                        f"gpu {s} faces=1 p50 runs: box only {runs_box}; box,face {runs_masked}; "
                        f"mask stage {over['overhead_p50_ms']:+.2f} ms"
                    )
            if naive:
                nr = bench_naive(
                    w, h, n, model=path, frames=naive_frames, in_fmt=PixelFormat(in_fmt), out_fmt=PixelFormat(out_fmt), fp16=fp16
                )
                nr["speedup_throughput"] = r["fps_pipelined"] / nr["fps"]
                results["naive"].append(nr)
                if console:
                    console.print(f"naive {s} faces={n}: p50 {nr['p50_ms']:.2f} ms ({nr['speedup_throughput']:.1f}x slower)")
    w, h = SIZES[sizes[0]]
    results["masks"] = bench_masks(w, h, sorted(set(faces)), frames=frames, fp16=fp16)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return results


def _run_cpu(*, faces, sizes, frames, naive_frames, in_fmt, out_fmt, json_path, naive, console) -> dict:
    info = {
        "gpu": f"CPU ({platform.processor() or platform.machine()}, no GPU)",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "swapper": "classic",
    }
    results: dict[str, Any] = {"info": info, "gpu": [], "naive": []}
    for s in sizes:
        if s not in SIZES:
            raise DeviceError(f"unknown size {s!r}", hint=f"choose from {', '.join(SIZES)}")
        w, h = SIZES[s]
        for n in faces:
            r = bench_cpu(w, h, n, frames=frames, in_fmt=PixelFormat(in_fmt), out_fmt=PixelFormat(out_fmt))
            results["gpu"].append(r)
            if console:
                console.print(
                    f"cpu {s} faces={n}: p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms {r['fps_pipelined']:.1f} fps"
                )
            if naive:
                nr = bench_naive_cpu(w, h, n, frames=naive_frames, in_fmt=PixelFormat(in_fmt), out_fmt=PixelFormat(out_fmt))
                nr["speedup_throughput"] = r["fps_pipelined"] / nr["fps"]
                results["naive"].append(nr)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return results


def table(results: dict) -> Any:
    from rich.table import Table

    how = {True: " (detection beside the swap: [track] predict)", False: " (every frame waits for its detection)"}
    t = Table(title=f"vcam bench — {results['info'].get('gpu', '?')}{how.get(results['info'].get('predict'), '')}")
    for col in (
        "size",
        "faces",
        "masks",
        "bands",
        "swap",
        "p50 ms",
        "p99 ms",
        "fps (pipelined)",
        "naive p50 ms",
        "speedup",
        "peak GPU MB",
        "copies/frame",
    ):
        t.add_column(col, justify="right")
    naive = {(r["size"], r["faces"]): r for r in results.get("naive", [])}
    for r in results["gpu"]:
        nr = naive.get((r["size"], r["faces"]), {})
        t.add_row(
            r["size"],
            str(r["faces"]),
            r.get("masks", ""),
            "yes" if r.get("banded_frames") else "no",
            "compiled" if r.get("compiled") else "cuDNN",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['fps_pipelined']:.0f}",
            f"{nr.get('p50_ms', float('nan')):.1f}",
            f"{nr.get('speedup_throughput', float('nan')):.1f}x",
            f"{r['peak_gpu_mb_allocators']:.0f}",
            f"{r['copies_per_frame']['h2d']:.0f} up / {r['copies_per_frame']['d2h']:.0f} down",
        )
    if not results.get("masks"):
        return t
    from rich.console import Group

    m = Table(title="mask stage alone (occlusion/region: stand-in networks)")
    for col in ("masks", "faces", "device ms", "ms per face", "host ms"):
        m.add_column(col, justify="right")
    for r in results["masks"]:
        m.add_row(r["masks"], str(r["faces"]), f"{r['device_ms']:.3f}", f"{r['device_ms_per_face']:.4f}", f"{r['host_ms']:.3f}")
    return Group(t, m)
