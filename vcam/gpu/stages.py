"""Build the GPU stages for the daemon from one Config: detector, swapper, pipeline.

The daemon calls these once at start when ``--device`` resolves to ``cuda``; nothing here runs per
frame. Source faces are still prepared on the host (photos are detected once with the CPU detector,
embeddings come from the recogniser), and the swapper uploads a face's latent once per face switch.
"""

from __future__ import annotations

from typing import Any

from ..errors import DeviceError
from ..types import PixelFormat


def make_context() -> tuple[Any, Any]:
    """(transfers counter, compute stream) shared by the detector and the pipeline."""
    import cupy

    from .pipeline import Transfers

    return Transfers(), cupy.cuda.Stream(non_blocking=True)


def make_detector(cfg, *, transfers, stream):
    from ..detect import EMBEDDED_DETECTOR

    if cfg.detect.model != EMBEDDED_DETECTOR:
        raise DeviceError(f"the GPU path runs the embedded RetinaFace detector only, not '{cfg.detect.model}'",
                          hint=f"use --device cpu or detect.model = '{EMBEDDED_DETECTOR}'")
    from .pipeline import GpuRetinaFace

    return GpuRetinaFace(cfg.detect, cfg.track.roi_size, fp16=cfg.pipeline.fp16,
                         max_regions=cfg.pipeline.max_faces, transfers=transfers, stream=stream)


def make_swapper(cfg, *, store=None, recogniser=None):
    """GpuClassicSwapper for the built-in swap, GpuNeuralSwapper for the inswapper family."""
    from ..swap import BUILT_IN
    from .pipeline import GpuClassicSwapper, GpuIdentitySwapper, GpuNeuralSwapper

    name = cfg.swap.swapper
    if name in BUILT_IN:
        if name == "identity":
            return GpuIdentitySwapper(cfg.swap.crop_size, max_faces=cfg.pipeline.max_faces)
        if name != "classic":
            raise DeviceError(f"the '{name}' test swapper runs on the CPU only", hint="use --device cpu")
        return GpuClassicSwapper(cfg.swap.crop_size, cfg.swap.color_match, max_faces=cfg.pipeline.max_faces)
    from ..engines.inswapper_torch import load_inswapper_from_onnx
    from ..models import registry
    from ..swap_neural import inswapper_latent, read_emap

    spec = registry.get(name)
    if spec.source != "emap" or spec.size != 128:
        raise DeviceError(f"{name} has no native GPU module yet (the GPU path runs the inswapper family)",
                          hint="use --device cpu for this model, or choose inswapper_128 / inswapper_128_fp16")
    path = store.ensure([name])[name]
    emap = read_emap(path)
    rec_name = recogniser.name

    def latent(face):
        return inswapper_latent(face.embeddings[rec_name], emap)

    return GpuNeuralSwapper(load_inswapper_from_onnx(path), name=name, crop_size=spec.size,
                            max_faces=cfg.pipeline.max_faces, fp16=cfg.pipeline.fp16, latent=latent,
                            compile=cfg.pipeline.compile)


def host_frame_filter(face_filter):
    """Wrap a host face filter (identity lock): the frame is downloaded only when a new track needs
    its embedding, never on the frames in between."""
    if face_filter is None:
        return None

    def choose(tracks, frame):
        if any(t.similarity is None for t in tracks):
            import cupy

            frame = cupy.asnumpy(frame)
        return face_filter(tracks, frame)

    return choose


def make_pipeline(cfg, *, tracker, swapper, width: int, height: int, in_fmt: PixelFormat, out_fmt: PixelFormat,
                  face_filter=None, transfers=None, stream=None):
    from .pipeline import GpuPipeline

    pipe = GpuPipeline(cfg, tracker=tracker, swapper=swapper, width=width, height=height, in_fmt=in_fmt,
                       out_fmt=out_fmt, face_filter=host_frame_filter(face_filter), transfers=transfers, stream=stream)
    warm = getattr(getattr(tracker, "detector", None), "warmup", None)
    if warm is not None:
        warm(height, width)
    if hasattr(swapper, "warmup"):
        swapper.warmup()
    return pipe


