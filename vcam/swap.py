"""Swap stage: the Swapper interface and the model-free swappers.

A swapper receives the aligned target crops of every face in the frame at once and returns the
swapped crops, so a neural engine can run them as one batch. Source preparation (embeddings, latents,
colour statistics) happens in :meth:`Swapper.prepare`, off the frame loop, so switching the active
face is a pointer swap.

- :class:`ClassicSwapper` (the built-in default; needs no downloaded model): the source photo's
  aligned face, colour-matched to each target face (mean and spread per channel inside a face mask).
- :class:`IdentitySwapper` returns the target crops unchanged (tests: the geometry round-trips).
- :class:`SolidSwapper` fills each crop with one colour (tests: only the paste box changes).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np

from .errors import ConfigError
from .types import SourceFace


@runtime_checkable
class Swapper(Protocol):
    """Batched swapper. Crops are (F, S, S, 3) uint8 BGR aligned with ``template`` at ``crop_size``."""

    name: str
    template: str
    crop_size: int

    def prepare(self, face: SourceFace) -> SourceFace:
        """Return ``face`` with ``latents[self.name]`` filled. May be slow; never called per frame."""
        ...

    def swap(self, crops: np.ndarray, face: SourceFace) -> np.ndarray:
        """Swap every crop to ``face`` (prepared). Returns (F, S, S, 3) uint8 BGR."""
        ...


def face_ellipse(size: int) -> np.ndarray:
    """Soft elliptical weight (size, size) float32 over the inner face of an arcface_128 crop.

    Used for colour statistics, so hair, background and the crop corners do not bias them.
    """
    v, u = np.mgrid[0:size, 0:size].astype(np.float32) / size
    # Eyes at y~0.40, mouth at y~0.72 in arcface_128; centre between them, cover brows to chin.
    d = ((u - 0.5) / 0.30) ** 2 + ((v - 0.56) / 0.36) ** 2
    return np.clip(1.5 - d, 0.0, 1.0).astype(np.float32)


def _resize_crop(img: np.ndarray, size: int) -> np.ndarray:
    if img.shape[0] == size and img.shape[1] == size:
        return img
    import cv2

    interp = cv2.INTER_AREA if img.shape[0] > size else cv2.INTER_CUBIC
    return cv2.resize(img, (size, size), interpolation=interp)


class ClassicSwapper:
    """Model-free swap: the aligned source face, colour-matched to each target, per channel."""

    name = "classic"
    template = "arcface_128"

    def __init__(self, crop_size: int = 128, color_match: bool = True) -> None:
        self.crop_size = int(crop_size)
        self.color_match = bool(color_match)
        self._weight = face_ellipse(self.crop_size)[None, :, :, None]  # (1, S, S, 1)
        self._wsum = float(self._weight.sum())
        self.guarded = 0

    def _stats(self, crops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weighted per-channel mean and std of (F, S, S, 3) crops -> two (F, 1, 1, 3) arrays."""
        x = crops.astype(np.float32)
        mean = (x * self._weight).sum(axis=(1, 2), keepdims=True) / self._wsum
        var = (((x - mean) ** 2) * self._weight).sum(axis=(1, 2), keepdims=True) / self._wsum
        return mean, np.sqrt(var) + 1e-3

    def prepare(self, face: SourceFace) -> SourceFace:
        crop = _resize_crop(np.ascontiguousarray(face.image), self.crop_size)
        if crop.ndim != 3 or crop.shape[2] != 3:
            raise ConfigError(f"source face '{face.name}' image has shape {crop.shape}, expected (S, S, 3)")
        mean, std = self._stats(crop[None])
        # Latent: the source crop normalised by its own statistics (S, S, 3) float32, plus raw crop.
        norm = ((crop.astype(np.float32) - mean[0]) / std[0]).astype(np.float32)
        latents = dict(face.latents)
        latents[self.name] = norm
        latents[self.name + ".raw"] = crop
        return dataclasses.replace(face, latents=latents)

    def swap(self, crops: np.ndarray, face: SourceFace) -> np.ndarray:
        if self.name not in face.latents:
            face = self.prepare(face)
        if not self.color_match:
            raw = face.latents[self.name + ".raw"]
            return np.broadcast_to(raw, crops.shape).copy()
        mean_t, std_t = self._stats(crops)
        out = face.latents[self.name][None] * std_t + mean_t
        np.floor(out + 0.5, out=out)
        return out.clip(0, 255).astype(np.uint8)


class IdentitySwapper:
    """Returns the target crops unchanged."""

    name = "identity"
    template = "arcface_128"

    def __init__(self, crop_size: int = 128) -> None:
        self.crop_size = int(crop_size)
        self.guarded = 0

    def prepare(self, face: SourceFace) -> SourceFace:
        return face

    def swap(self, crops: np.ndarray, face: SourceFace) -> np.ndarray:
        return crops.copy()


class SolidSwapper:
    """Fills every crop with one BGR colour."""

    name = "solid"
    template = "arcface_128"

    def __init__(self, crop_size: int = 128, color: tuple[int, int, int] = (255, 0, 255)) -> None:
        self.crop_size = int(crop_size)
        self.color = np.array(color, dtype=np.uint8)
        self.guarded = 0

    def prepare(self, face: SourceFace) -> SourceFace:
        return face

    def swap(self, crops: np.ndarray, face: SourceFace) -> np.ndarray:
        out = np.empty_like(crops)
        out[...] = self.color
        return out


BUILT_IN = ("classic", "identity", "solid")


def make_swapper(name: str, *, crop_size: int = 128, color_match: bool = True) -> Swapper:
    """A built-in swapper by name: 'classic', 'identity' or 'solid'.

    Neural swappers from the model registry are built by :func:`vcam.swap_neural.create_swapper`.
    """
    if name == "classic":
        return ClassicSwapper(crop_size, color_match)
    if name == "identity":
        return IdentitySwapper(crop_size)
    if name == "solid":
        return SolidSwapper(crop_size)
    raise ConfigError(f"unknown built-in swapper '{name}'", hint="use 'classic' or a model from `vcam models list`")
