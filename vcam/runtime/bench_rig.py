"""The bench's rigs: synthetic frames and faces, a tracker that always finds them, the bench's
config and its CUDA pipeline built through the assembly (:func:`gpu_rig`). :mod:`vcam.runtime.bench`
times them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vcam.state import Snapshot
from vcam.types import Frame, PixelFormat, Track

SIZES = {"720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160)}
# arcface_112_v2 five points at 112 px, used to place synthetic faces.
_FACE5 = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]])


def synthetic_faces(n: int, width: int, height: int, side: float | None = None) -> list[np.ndarray]:
    """``n`` non-overlapping faces (5-point landmarks) on a grid over the frame."""
    cols = int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / cols))
    side = side or min(width / cols, height / rows) * 0.5
    out = []
    for k in range(n):
        r, c = divmod(k, cols)
        cx, cy = (c + 0.5) * width / cols, (r + 0.5) * height / rows
        out.append((_FACE5 / 112.0 - 0.5) * side + np.array([cx, cy]))
    return out


def synthetic_frame(width: int, height: int, fmt: PixelFormat, seed: int = 0) -> np.ndarray:
    """A textured (not constant) raw frame in ``fmt``."""
    from vcam.kernels.convert import from_bgr_ref

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    bgr = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), ((x + y) % 256)], -1).astype(np.int16)
    bgr = np.clip(bgr + rng.integers(-20, 21, bgr.shape), 0, 255).astype(np.uint8)
    if fmt in (PixelFormat.BGR, PixelFormat.RGB):
        return bgr if fmt is PixelFormat.BGR else bgr[..., ::-1].copy()
    if fmt is PixelFormat.YUYV:
        i420 = from_bgr_ref(bgr, PixelFormat.I420)
        yy = i420[:height]
        u = i420[height : height + height // 4].reshape(height // 2, width // 2)
        v = i420[height + height // 4 :].reshape(height // 2, width // 2)
        out = np.empty((height, width // 2, 4), np.uint8)
        out[..., 0], out[..., 2] = yy[:, 0::2], yy[:, 1::2]
        out[..., 1], out[..., 3] = np.repeat(u, 2, 0), np.repeat(v, 2, 0)
        return out.reshape(height, width, 2)
    return from_bgr_ref(bgr, fmt)


class FixedTracker:
    """Bench tracker: runs the detector on one region per face every frame (real work and readback)
    and returns the same ``n`` tracks, so each configuration swaps exactly ``n`` faces."""

    def __init__(self, detector: Any, faces: list[np.ndarray]) -> None:
        self.detector = detector
        self.last_full_scan = False
        self.tracks = []
        rects = []
        for i, lm in enumerate(faces):
            x1, y1 = lm.min(0) - 20
            x2, y2 = lm.max(0) + 20
            self.tracks.append(
                Track(id=i, box=np.array([x1, y1, x2, y2], np.float32), landmarks=lm.astype(np.float32), score=1.0)
            )
            side = 2.0 * max(x2 - x1, y2 - y1)
            rects.append([(x1 + x2 - side) / 2, (y1 + y2 - side) / 2, side])
        self.rects = np.array(rects, dtype=np.float64)

    def update(self, frame: Any, seq: int, t: float | None = None) -> list[Track]:
        self.last_detections = self.detector.detect_regions(frame, self.rects)
        return self.tracks

    # ``[track] predict`` (what `vcam run` does on CUDA): the frame is swapped with the tracks, its
    # detection runs after its swap on the back stream, and that detection is read at the next frame.
    def confident(self, frame: Any, seq: int) -> bool:
        return True

    def predict(self, seq: int) -> list[Track]:
        return self.tracks

    def launch(self, frame: Any, seq: int, t: float | None = None, *, deferred: bool = False) -> Any:
        return self.detector.launch_regions(frame, self.rects)

    def complete(self, step: Any) -> list[Track]:
        self.last_detections = step.result()
        return self.tracks


def bench_snapshot(face: Any) -> Snapshot:
    """What every bench frame uses: ``face`` swapped in, no mapping, no desk setting (the state's
    own :class:`~vcam.state.Snapshot`, so a field the pipeline starts reading is there)."""
    return Snapshot(face=face, swap_enabled=True, version=0)


def _pct(v: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(v) * 1e3, q)) if v else float("nan")


def _inswapper_file(model: str | None) -> Path:
    """The swapper file the GPU bench runs: ``model``, else the full-size inswapper stand-in (the
    real architecture, random weights), built once per machine in the user cache dir."""
    if model:
        return Path(model)
    from vcam.models import standin
    from vcam.platform import folders

    path = folders.cache_dir() / "bench" / "inswapper_128.onnx"
    if not path.is_file():
        standin.write("inswapper_128", path, seed=0)
    return path


def bench_config(
    *,
    device: str,
    swapper: str,
    max_faces: int,
    models_dir: Path | None = None,
    fp16: bool = False,
    compile: str = "auto",
    masks: tuple[str, ...] = ("box",),
    predict: bool = False,
    band: bool = True,
) -> Any:
    """The config of the bench's pipeline (the assembly builds it from this, as for ``vcam run``).
    ``compile="auto"`` is ``"load"`` here: a benchmark times what is built, never beside a build."""
    from vcam.config_file import build

    compile = "load" if compile == "auto" else compile

    data: dict[str, Any] = {
        "pipeline": {"device": device, "max_faces": max_faces, "fp16": fp16, "compile": compile, "band": band},
        "swap": {"swapper": swapper},
        "mask": {"types": list(masks)},
        "track": {"predict": "on" if predict else "off"},
    }
    if device == "cuda":
        data["pipeline"]["backend"] = "torch"
    if models_dir is not None:
        data["models"] = {"dir": str(models_dir)}
    return build(data)


def _models_dir(model: Path) -> Path:
    """A models folder holding ``model`` under the inswapper's registry name, and the recogniser the
    assembly loads with a neural swapper (its stand-in, when the folder has none: the bench gives the
    swapper its latents directly)."""
    from vcam.models import registry, standin
    from vcam.platform import folders
    from vcam.stages.recognize import DEFAULT_RECOGNISER

    file = registry.get("inswapper_128").file
    folder = Path(model).parent
    if Path(model).name != file:
        folder = folders.cache_dir() / "bench" / "models"
        folder.mkdir(parents=True, exist_ok=True)
        link = folder / file
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(model).resolve())
    if not (folder / (registry.get(DEFAULT_RECOGNISER).file or "")).is_file():
        standin.write(DEFAULT_RECOGNISER, folder, seed=0)
    return folder


@dataclass
class GpuRig:
    """The bench's CUDA pipeline, built and warmed up (:func:`gpu_rig`): ``frame(seq)`` writes the
    synthetic frame into the pipeline's next pinned host slot (the camera's write) and returns it;
    the formats, precision and masks it was built with are kept for the report."""

    pipe: Any
    snap: Any
    frame: Any
    ops: Any
    engine: Any
    detector: Any
    free0: int
    in_fmt: PixelFormat
    out_fmt: PixelFormat
    fp16: bool
    masks: tuple[str, ...]
    band: bool = True

    def close(self) -> None:
        self.ops.synchronize()
        self.engine.close()


def gpu_rig(
    width: int,
    height: int,
    faces: int,
    *,
    model: Path,
    in_fmt: PixelFormat = PixelFormat.NV12,
    out_fmt: PixelFormat = PixelFormat.I420,
    fp16: bool = True,
    max_faces: int | None = None,
    compile: str = "auto",
    masks: tuple[str, ...] = ("box", "face"),
    predict: bool = True,
    band: bool = True,
) -> GpuRig:
    """The pipeline on CUDA ops, built by the assembly (:mod:`vcam.runtime.assemble`) as ``vcam run``
    builds it: the embedded RetinaFace and the inswapper file on the torch engine, pasted with
    ``masks`` (shapes only: no mask model), frames moved in bands or whole (``band``, ``[pipeline]
    band``), the faces fixed (:class:`FixedTracker`), ten frames run through it."""
    import cupy
    import torch

    from vcam.runtime import assemble
    from vcam.types import SourceFace

    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    cfg = bench_config(
        device="cuda", models_dir=_models_dir(model), swapper="inswapper_128", max_faces=max_faces or max(8, faces),
        fp16=fp16, compile=compile, masks=masks, predict=predict, band=band,
    )  # fmt: skip
    asm = assemble.build(cfg)
    engine = asm.swapper.engine
    engine.wait_compiled()  # compile="auto": the built sizes load in the background; time them in use
    det, sw, ops = asm.detector, asm.swapper, asm.ops
    det.warmup(height, width)
    pipe = asm.make_pipeline(
        out_fmt, width, height, in_fmt, timing=True, tracker=FixedTracker(det, synthetic_faces(faces, width, height))
    )
    asm.wait_compiled()  # and the graphs the warm-ups left to the background
    ops.synchronize()
    face = SourceFace(
        name="bench",
        image=np.zeros((128, 128, 3), np.uint8),
        latents={sw.name: np.random.default_rng(1).standard_normal(512).astype(np.float32)},
    )
    snap = bench_snapshot(face)
    raw = synthetic_frame(width, height, in_fmt)

    def frame(seq: int) -> Frame:
        slot = pipe.host_slot()
        np.copyto(slot, raw.reshape(slot.shape))  # the camera's write, outside the timed region
        return Frame(data=slot, width=width, height=height, fmt=in_fmt, t_capture=0.0, seq=seq)

    for i in range(10):
        pipe.process(frame(i), snap)
    return GpuRig(
        pipe=pipe, snap=snap, frame=frame, ops=ops, engine=engine, detector=det, free0=free0,
        in_fmt=PixelFormat(in_fmt), out_fmt=PixelFormat(out_fmt), fp16=fp16, masks=tuple(masks), band=band,
    )  # fmt: skip


__all__ = ["SIZES", "bench_snapshot", "synthetic_faces", "synthetic_frame", "FixedTracker", "GpuRig", "bench_config", "gpu_rig"]
