"""Faces found in photos, remembered between starts: a start with a known photo (``--face PHOTO``,
the demo portrait) needs neither the photo detector nor the recogniser before its first swap.

For an image (its decoded pixels' SHA-256) the cache keeps the largest face's 5 landmarks per
detector model, and the raw embedding per recogniser and landmarks, as small ``.npy`` files under
the user cache dir (``.../vcam/photo-faces``). The face bank keeps its own embeddings
(:mod:`vcam.stages.faces`). Files are written to a temporary name and renamed; an unreadable or
misshapen entry counts as missing (computed and written again); a cache that cannot be written
costs the computation at every start, nothing more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def root() -> Path:
    from vcam.platform import folders

    return folders.cache_dir() / "photo-faces"


def image_digest(image: np.ndarray) -> str:
    """SHA-256 of an image's shape, dtype and pixels."""
    a = np.ascontiguousarray(image)
    h = hashlib.sha256(f"{a.shape}{a.dtype.str}".encode())
    h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def detector_id(detector: Any) -> str:
    """The detector's model name (its ``cfg.model``), else its class name."""
    return str(getattr(getattr(detector, "cfg", None), "model", "") or type(detector).__name__)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:64]


def _read(path: Path, shape: tuple[int, ...] | None) -> np.ndarray | None:
    """The array at ``path`` when it is float32, finite and of ``shape`` (None: any non-empty vector)."""
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    fits = a.shape == shape if shape is not None else (a.ndim == 1 and a.size > 0)
    if not fits or a.dtype != np.float32 or not np.isfinite(a).all():
        return None
    return np.asarray(a)


def _write(path: Path, value: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, np.asarray(value, np.float32), allow_pickle=False)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("face cache not written (%s): %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _landmarks_path(digest: str, detector: str) -> Path:
    return root() / f"{digest[:32]}-{_safe(detector)}-landmarks.npy"


def _embedding_path(digest: str, recogniser: str, landmarks: np.ndarray) -> Path:
    lm = hashlib.sha256(np.ascontiguousarray(landmarks, np.float32).tobytes()).hexdigest()[:12]
    return root() / f"{digest[:32]}-{_safe(recogniser)}-{lm}.npy"


def landmarks(digest: str, detector: str) -> np.ndarray | None:
    """The (5, 2) float32 landmarks of the largest face ``detector`` found in the image, or None."""
    return _read(_landmarks_path(digest, detector), (5, 2))


def store_landmarks(digest: str, detector: str, value: np.ndarray) -> None:
    _write(_landmarks_path(digest, detector), np.asarray(value, np.float32).reshape(5, 2))


def embedding(digest: str, recogniser: str, landmarks: np.ndarray) -> np.ndarray | None:
    """The raw float32 embedding ``recogniser`` gave the face at ``landmarks``, or None."""
    return _read(_embedding_path(digest, recogniser, landmarks), None)


def store_embedding(digest: str, recogniser: str, landmarks: np.ndarray, value: np.ndarray) -> None:
    _write(_embedding_path(digest, recogniser, landmarks), np.asarray(value, np.float32).reshape(-1))


__all__ = ["detector_id", "embedding", "image_digest", "landmarks", "root", "store_embedding", "store_landmarks"]
