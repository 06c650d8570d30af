"""Neural face models: the registry (:mod:`.registry`), verified resumable downloads
(:mod:`.download`), offline stand-ins (:mod:`.standin`) and the ``vcam models`` commands (:mod:`.cli`)."""

from .registry import MODELS, ModelSpec, get

__all__ = ["MODELS", "ModelSpec", "get"]
