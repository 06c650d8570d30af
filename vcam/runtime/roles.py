"""What each model role is, in one table: the only place that reads the config for a model.

:data:`ROLES` maps a role (detector, swapper, enhancer, ...) to its registry kind, whether it is on
the hot path (it must run on the pipeline's device), the optional stage it is (the degrader may turn
it off under load), its precision rule and its batch. :func:`build` makes the stage of a role from
the config with plain parameters (the stage modules under :mod:`vcam.stages` never see the
config); :func:`fp16` is the one FP16 decision; :func:`model_names` says which roles a config uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from vcam.config import Config
from vcam.errors import ConfigError
from vcam.types import OPTIONAL_STAGES

P = TypeVar("P")


def stage_params(kind: type[P], section: object) -> P:
    """A stage's parameter dataclass (``kind``, e.g. :class:`~vcam.stages.detections.DetectParams`)
    filled from the config section that documents the same fields (``cfg.detect``)."""
    return kind(**{f.name: getattr(section, f.name) for f in fields(kind)})  # type: ignore[arg-type]


#: Most faces one swapper call takes when several streams share it.
MAX_BATCH = 32


def _pipeline_fp16(cfg: Config) -> bool:
    return bool(cfg.pipeline.fp16)


def _faces(cfg: Config) -> int:
    return int(cfg.pipeline.max_faces)


@dataclass(frozen=True)
class Role:
    """One model role: its registry ``kind``; ``hot``: on the hot path (runs on the pipeline's
    device, or the start fails); ``optional``: the optional stage it is (:data:`OPTIONAL_STAGES`),
    if any; ``precision``: FP16 from the config; ``batch``: items per engine call."""

    kind: str
    hot: bool = True
    optional: str | None = None
    precision: Callable[[Config], bool] = _pipeline_fp16
    batch: Callable[[Config], int] = _faces


ROLES: dict[str, Role] = {
    # Regions per call: every tracked face plus a share of the rolling search's tiles. [detect] fp16
    # keeps the detector in FP32 unless asked (its scores move with the precision).
    "detector": Role("detector", precision=lambda c: c.pipeline.fp16 and c.detect.fp16, batch=lambda c: 2 * c.pipeline.max_faces),
    # Every stream's faces of one round go through the swapper together (capped; a larger round
    # runs in chunks). [swap] fp32 keeps a swapper that misbehaves in FP16 in FP32.
    "swapper": Role(
        "swapper",
        precision=lambda c: c.pipeline.fp16 and not c.swap.fp32,
        batch=lambda c: min(c.pipeline.max_faces * max(1, len(c.streams)), MAX_BATCH),
    ),
    "enhancer": Role("enhancer", optional="enhancer"),
    "occluder": Role("occluder", optional="occlusion"),
    "parser": Role("parser", optional="region"),
    "landmarker": Role("landmarker"),
    "upscaler": Role("upscaler", optional="upscale", batch=lambda c: c.upscale.batch),
    # Run once per face switch and per new track: wherever it can (onnxruntime on the CPU at worst).
    "recogniser": Role("recogniser", hot=False),
}

assert {r.optional for r in ROLES.values()} - {None} == set(OPTIONAL_STAGES)


def fp16(cfg: Config, role: str) -> bool:
    """Does ``role`` run in FP16? (``--fp16`` and the role's own rule; the one place it is decided.)"""
    return bool(ROLES[role].precision(cfg))


def configured(cfg: Config, role: str) -> str:
    """The model ``cfg`` names for ``role`` (whether or not the run uses it; '' for none)."""
    from vcam.stages.recognize import DEFAULT_RECOGNISER

    return {
        "detector": cfg.detect.model,
        "swapper": cfg.swap.swapper,
        "enhancer": cfg.swap.enhancer,
        "occluder": cfg.mask.occluder,
        "parser": cfg.mask.parser,
        "landmarker": cfg.mask.landmarker,
        "upscaler": cfg.upscale.model,
        "recogniser": DEFAULT_RECOGNISER,
    }[role]


def model_names(cfg: Config) -> dict[str, str]:
    """role -> model name for the roles this config uses."""
    from vcam.stages.swap import BUILT_IN

    types = set(cfg.mask.types)
    used = {
        "detector": True,
        "swapper": True,
        "enhancer": bool(cfg.swap.enhancer),
        "occluder": "occlusion" in types,
        "parser": "region" in types,
        "landmarker": bool(cfg.mask.landmarker and types & {"face", "mouth"}),
        "upscaler": bool(cfg.upscale.model),
        "recogniser": cfg.swap.swapper not in BUILT_IN or cfg.swap.faces == "reference" or bool(cfg.swap.map),
    }
    return {role: configured(cfg, role) for role in ROLES if used[role]}


def optional_stages(cfg: Config) -> set[str]:
    """The optional stages ``cfg`` turns on (what the degrader may turn off)."""
    return {opt for role, _ in model_names(cfg).items() if (opt := ROLES[role].optional) is not None}


def model_store(cfg: Config, **kwargs: Any) -> Any:
    """The model store of ``[models]`` (its folder, pins, mirror and whether it may download)."""
    from vcam.models.download import ModelStore
    from vcam.models.hash_cache import NAME
    from vcam.platform import folders

    kwargs.setdefault("allow_download", cfg.models.allow_download)
    kwargs.setdefault("hash_cache", folders.cache_dir() / NAME)
    if cfg.models.mirror:
        kwargs.setdefault("mirrors", [cfg.models.mirror])
    return ModelStore(cfg.models_dir, pins=dict(cfg.models.sha256), **kwargs)


def role_backend(cfg: Config, role: str) -> str:
    """The backend of ``role``: its ``[engines.ROLE] backend``, else ``[pipeline] backend``."""
    own = getattr(cfg.engines, role, None)
    return (own.backend if own is not None else "") or cfg.pipeline.backend


def engine_backend(cfg: Config, role: str, device: str, *, providers: Sequence[str] | None = None) -> str:
    """The engine backend ``role`` is built with on ``device``: :func:`role_backend`, except that a
    CPU pipeline chosen by ``--device auto`` runs an onnxruntime model (``auto`` or ``onnxruntime``)
    on the accelerator onnxruntime offers here (DirectML, CoreML: :func:`vcam.engines.accelerator_here`,
    ``providers`` in place of onnxruntime's own list); ``--device cpu`` keeps everything on the CPU."""
    backend = role_backend(cfg, role)
    if device != "cpu" or cfg.pipeline.device != "auto" or backend not in ("auto", "onnxruntime"):
        return backend
    from vcam.engines import accelerator_here

    acc = accelerator_here(providers)
    return acc.backend if acc is not None else backend


def remote_options(cfg: Config, role: str, model: str) -> dict[str, Any]:
    """The :class:`~vcam.engines.remote.RemoteEngine` settings of ``[engines.ROLE]`` (the token from
    its environment variable when the file has none); a bad URL is one ConfigError line."""
    import os

    from vcam.engines.remote import parse_url

    e = getattr(cfg.engines, role)
    where = f"[engines.{role}] url"
    if not e.url:
        raise ConfigError(f"{where} is empty but backend = 'remote'", hint="set url = 'grpc://127.0.0.1:8001' (see `vcam serve`)")
    token = e.token or (os.environ.get(e.token_env, "") if e.token_env else "")
    parse_url(e.url, token=token, cert=e.cert, where=where)
    return {
        "url": e.url, "model": e.model or model, "timeout": float(e.timeout), "token": token,
        "ca": e.ca, "cert": e.cert, "key": e.key, "on_fault": e.on_fault,
    }  # fmt: skip


def build(
    role: str,
    cfg: Config,
    *,
    name: str | None = None,
    store: Any = None,
    ops: Any = None,
    device: str = "cpu",
    backend: str | None = None,
    download: bool | None = None,
    mask: Any = None,
    crop_size: int | None = None,
    threads: int = 0,
    short_lived: bool = False,
) -> Any:
    """The stage of ``role`` for ``cfg`` (model ``name``, default the config's; ``backend``, default
    :func:`engine_backend`: ``[pipeline] backend`` or an accelerator): its precision and batch from
    :data:`ROLES`, its other settings from the config's section. ``store``: default
    :func:`model_store`. ``mask``: the swapper's paste mask; ``crop_size``: the masker's crop (the
    swapper's). ``threads``: the CPU threads of one call on
    onnxruntime (detector, swapper, recogniser; 0: one per core). ``short_lived``: a swap network for
    seconds of frames (:func:`vcam.engines.create_engine`)."""
    spec = ROLES[role]
    name = name if name is not None else configured(cfg, role)
    store = store if store is not None else model_store(cfg)
    backend = backend or engine_backend(cfg, role, device)
    engine = {"store": store, "device": device, "backend": backend, "fp16": fp16(cfg, role), "download": download}
    batch = spec.batch(cfg)
    if role == "detector":
        from dataclasses import replace

        from vcam.stages.detect import make_detector
        from vcam.stages.detections import DetectParams

        params = replace(stage_params(DetectParams, cfg.detect), model=name)
        return make_detector(
            params, roi_size=cfg.track.roi_size, store=store, ops=ops, device=device, backend=backend,
            fp16=engine["fp16"], max_regions=batch, threads=threads,
        )  # fmt: skip
    if role == "swapper":
        from vcam.stages.swap import BUILT_IN, make_builtin
        from vcam.stages.swap_neural import create_swapper

        if name in BUILT_IN:
            s = cfg.swap
            return make_builtin(
                name,
                crop_size=s.crop_size,
                color_match=s.color_match,
                seamless=s.seamless,
                local_color=s.local_color and s.color_match,  # a part of the colour match: off with it
                ops=ops,
                mask=mask,
                max_faces=batch,
            )
        if backend == "remote":
            engine["backend"] = "onnxruntime"  # unused: the remote engine replaces it
            return create_swapper(name, ops=ops, mask=mask, max_faces=batch, remote=remote_options(cfg, role, name), **engine)
        return create_swapper(
            name,
            ops=ops,
            mask=mask,
            max_faces=batch,
            compile=cfg.pipeline.compile,
            threads=threads,
            short_lived=short_lived,
            **engine,
        )
    if role == "recogniser":
        from vcam.stages.recognize import create_recogniser

        return create_recogniser(name=name, max_batch=batch, threads=threads, **engine)
    if role in ("enhancer", "landmarker", "upscaler"):
        from vcam.models import open_engine

        if role == "upscaler" and not name:
            raise ConfigError("the frame enhancer is off ([upscale] model = '')", hint="set [upscale] model, e.g. real_esrgan_x2")
        model, eng = open_engine(name, role, max_batch=batch, **engine)
        if role == "enhancer":
            from vcam.stages.enhance import Enhancer

            return Enhancer(model, eng, ops=ops, amount=cfg.swap.enhancer_amount, blur=cfg.swap.blur, max_faces=batch)
        if role == "landmarker":
            from vcam.stages.landmark import Landmarker

            return Landmarker(model, eng, ops=ops, max_faces=batch)
        from vcam.stages.upscale import FrameEnhancer

        up = cfg.upscale
        return FrameEnhancer(model, eng, ops=ops, tile=up.tile, overlap=up.overlap, batch=batch)
    if role in ("occluder", "parser"):
        from vcam.models import open_engine

        return open_engine(name, role, max_batch=batch, **engine)
    raise KeyError(role)


def build_masker(cfg: Config, crop_size: int, *, ops: Any, store: Any = None, device: str = "cpu") -> Any:
    """The mask stage of ``[mask]`` over ``crop_size`` crops, its models (occluder, parser,
    landmarker: the roles the config uses) built through :func:`build`."""
    from vcam.stages.mask import create_masker

    mc, used = cfg.mask, model_names(cfg)
    store = store if store is not None else model_store(cfg)
    kw = {"store": store, "ops": ops, "device": device}
    return create_masker(
        mc.types,
        crop_size,
        ops=ops,
        max_faces=cfg.pipeline.max_faces,
        occluder=build("occluder", cfg, store=store, device=device) if "occluder" in used else None,
        parser=build("parser", cfg, store=store, device=device) if "parser" in used else None,
        regions=mc.regions,
        landmarker=build("landmarker", cfg, **kw) if "landmarker" in used else None,
        face_scale=mc.face_scale,
        mouth_scale=mc.mouth_scale,
        feather=mc.face_feather,
    )


__all__ = [
    "MAX_BATCH",
    "ROLES",
    "Role",
    "build",
    "build_masker",
    "configured",
    "fp16",
    "model_names",
    "model_store",
    "optional_stages",
    "remote_options",
    "role_backend",
]
