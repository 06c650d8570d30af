"""Neural face models: the registry (:mod:`.registry`), verified resumable downloads
(:mod:`.download`), offline stand-ins (:mod:`.standin`) and the ``vcam models`` commands (:mod:`.cli`)."""

from __future__ import annotations

from typing import Any

from vcam.models.registry import MODELS, ModelSpec, get, of_kind


def open_engine(
    name: str,
    kind: str,
    cfg: Any,
    *,
    store: Any = None,
    device: str = "cpu",
    backend: str | None = None,
    download: bool | None = None,
    max_batch: int | None = None,
) -> tuple[ModelSpec, Any]:
    """The registry model ``name``, which must be a ``kind``, verified (downloaded when allowed) and
    loaded on an engine on ``device`` with the config's backend and precision; ``max_batch`` items a
    call (default: the face batch, ``[pipeline] max_faces``). A model of another kind is refused
    before its file is touched."""
    spec = of_kind(name, kind)
    from vcam.engines import create_engine
    from vcam.models.download import ModelStore

    store = store or ModelStore.from_config(cfg)
    path = store.ensure([name], download=download)[name]
    engine = create_engine(
        path,
        backend=backend or cfg.pipeline.backend,
        device=device,
        fp16=cfg.pipeline.fp16,
        max_batch=max_batch or cfg.pipeline.max_faces,
    )
    return spec, engine


__all__ = ["MODELS", "ModelSpec", "get", "open_engine"]
