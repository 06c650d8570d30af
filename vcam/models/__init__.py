"""Neural face models: the registry (:mod:`.registry`), verified resumable downloads
(:mod:`.download`), offline stand-ins (:mod:`.standin`) and the ``vcam models`` commands (:mod:`.cli`)."""

from __future__ import annotations

from typing import Any

from vcam.models.registry import MODELS, ModelSpec, get, of_kind


def open_engine(
    name: str,
    kind: str,
    *,
    store: Any,
    device: str = "cpu",
    backend: str = "auto",
    fp16: bool = False,
    max_batch: int = 8,
    download: bool | None = None,
) -> tuple[ModelSpec, Any]:
    """The registry model ``name``, which must be a ``kind``, verified in ``store`` (downloaded when
    allowed) and loaded on an engine on ``device`` with ``backend`` and precision ``fp16``;
    ``max_batch`` items a call. A model of another kind is refused before its file is touched."""
    spec = of_kind(name, kind)
    from vcam.engines import create_engine

    path = store.ensure([name], download=download)[name]
    engine = create_engine(path, backend=backend, device=device, fp16=fp16, max_batch=max_batch)
    return spec, engine


__all__ = ["MODELS", "ModelSpec", "get", "open_engine"]
