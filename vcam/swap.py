"""Swap stage: the Swapper interface, the model-free swappers and the neural (registry) swapper.

A swapper gets the frame and the ``crop_from_frame`` matrix of every face to swap, and returns the
swapped crops and the mask to paste them with, all faces at once (one batched model call). It runs
on an :class:`~vcam.ops.Ops` (NumPy or CUDA), so one class serves both devices; its buffers are
allocated at construction for ``max_faces``. Source preparation (embeddings, latents, colour
statistics) happens in :meth:`Swapper.prepare`, off the frame loop, so switching the active face is
a pointer swap; a face's latent reaches the device once per switch, never per frame.

- :class:`ClassicSwapper` (the built-in default; needs no downloaded model): the source photo's
  aligned face, colour-matched to each target face (mean and spread per channel inside a face mask).
- :class:`NeuralSwapper`: every registry swapper family (inswapper, hyperswap, simswap) on an
  inference :class:`~vcam.engines.Engine`; the registry row says the template, crop size,
  normalisation, output range and source recipe. A face whose output holds NaN/Inf is passed
  through unchanged and counted (:meth:`NeuralSwapper.guarded`).
- :class:`IdentitySwapper` returns the target crops unchanged (tests: the geometry round-trips).
- :class:`SolidSwapper` fills each crop with one colour (tests: only the paste box changes).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .align import PlanarAffine
from .errors import ConfigError, FaceError, ModelError
from .models import registry
from .models.registry import ModelSpec
from .recognize import normalize
from .types import SourceFace

log = logging.getLogger(__name__)

BUILT_IN = ("classic", "identity", "solid")


@runtime_checkable
class Swapper(Protocol):
    """Batched swapper on an ops object. Crops are (F, S, S, 3) uint8 BGR aligned with ``template``
    at ``crop_size``; masks (S, S) or (F, S, S) float32; both in the ops' memory."""

    name: str
    template: str
    crop_size: int

    def prepare(self, face: SourceFace) -> SourceFace:
        """Return ``face`` with ``latents[self.name]`` filled. May be slow; never called per frame."""
        ...

    def swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        """Swap the faces at ``crop_from_frame`` (F, 2, 3) of ``frame`` (H, W, 3) to ``face``
        (prepared). Returns (crops, mask), views of the swapper's buffers valid until the next call."""
        ...

    def guarded(self) -> int:
        """Faces passed through so far because the model produced NaN/Inf (reads a device counter:
        call it now and then, not per frame)."""
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


def _ops(ops: Any) -> Any:
    if ops is not None:
        return ops
    from .ops.numpy import NumpyOps

    return NumpyOps()


class _Base:
    """Buffers and bookkeeping every swapper shares: crops, the paste mask, the per-face guard."""

    name = ""
    template = "arcface_128"

    def __init__(self, crop_size: int, *, ops: Any = None, mask: Any = None, max_faces: int = 8) -> None:
        from .blend import box_mask

        self.ops = _ops(ops)
        self.crop_size = int(crop_size)
        self.max_faces = int(max_faces)
        self.mask = self.ops.asarray(box_mask(self.crop_size)) if mask is None else mask
        s = self.crop_size
        self._crops = self.ops.empty((self.max_faces, s, s, 3), np.uint8)
        self._guard = self.ops.empty((self.max_faces,), np.int32)
        self._face_key: Any = None

    def guarded(self) -> int:
        return int(self.ops.to_host(self._guard).sum())

    def swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        with self.ops.activate():  # array-library calls of the swapper run on the ops' stream
            return self._swap(frame, crop_from_frame, face)

    def _swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        raise NotImplementedError

    def _check(self, mats: np.ndarray) -> int:
        n = int(np.asarray(mats).reshape(-1, 2, 3).shape[0])
        if n > self.max_faces:
            raise ValueError(f"{n} faces, the swapper was built for at most {self.max_faces}")
        return n

    def prepare(self, face: SourceFace) -> SourceFace:
        return face


def _weighted_stats(xp: Any, x: Any, w: Any, wsum: float, tmp: Any, mean: Any, std: Any) -> None:
    """Per-channel mean and std of float crops ``x`` (F, S, S, 3) weighted by ``w`` (1, S, S, 1), into
    ``mean``/``std`` (F, 1, 1, 3) (std + 1e-3); ``tmp`` is scratch like ``x``. ``xp``: NumPy or CuPy."""
    xp.multiply(x, w, out=tmp)
    tmp.sum(axis=(1, 2), keepdims=True, out=mean)
    mean /= wsum
    xp.subtract(x, mean, out=tmp)
    tmp *= tmp
    tmp *= w
    tmp.sum(axis=(1, 2), keepdims=True, out=std)
    std /= wsum
    xp.sqrt(std, out=std)
    std += 1e-3


class ClassicSwapper(_Base):
    """Model-free swap: the aligned source face, colour-matched to each target, per channel."""

    name = "classic"

    def __init__(
        self, crop_size: int = 128, color_match: bool = True, *, ops: Any = None, mask: Any = None, max_faces: int = 8
    ) -> None:
        super().__init__(crop_size, ops=ops, mask=mask, max_faces=max_faces)
        self.color_match = bool(color_match)
        weight = face_ellipse(self.crop_size)[None, :, :, None]  # (1, S, S, 1)
        self._wsum = float(weight.sum())
        self._w = self.ops.asarray(weight)
        s, f = self.crop_size, self.max_faces
        self._xf = self.ops.empty((f, s, s, 3), np.float32)
        self._tmp = self.ops.empty((f, s, s, 3), np.float32)
        self._mean = self.ops.empty((f, 1, 1, 3), np.float32)
        self._std = self.ops.empty((f, 1, 1, 3), np.float32)
        self._out = self.ops.empty((f, s, s, 3), np.uint8)
        self._norm = self._raw = None

    def prepare(self, face: SourceFace) -> SourceFace:
        crop = _resize_crop(np.ascontiguousarray(face.image), self.crop_size)
        if crop.ndim != 3 or crop.shape[2] != 3:
            raise ConfigError(f"source face '{face.name}' image has shape {crop.shape}, expected (S, S, 3)")
        x = crop.astype(np.float32)[None]
        mean, std = np.empty((1, 1, 1, 3), np.float32), np.empty((1, 1, 1, 3), np.float32)
        _weighted_stats(np, x, face_ellipse(self.crop_size)[None, :, :, None], self._wsum, np.empty_like(x), mean, std)
        # Latent: the source crop normalised by its own statistics (S, S, 3) float32, plus the raw crop.
        latents = dict(face.latents)
        latents[self.name] = ((x[0] - mean[0]) / std[0]).astype(np.float32)
        latents[self.name + ".raw"] = crop
        return dataclasses.replace(face, latents=latents)

    def _source(self, face: SourceFace) -> None:
        if self._face_key is not face:  # once per face switch, not per frame
            prepared = face if self.name in face.latents else self.prepare(face)
            self._norm = self.ops.asarray(prepared.latents[self.name])
            self._raw = self.ops.asarray(prepared.latents[self.name + ".raw"])
            self._face_key = face

    def _swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        n = self._check(crop_from_frame)
        self._source(face)
        out = self._out[:n]
        if not self.color_match:
            out[...] = self._raw[None]
            return out, self.mask
        crops = self.ops.warp_crops(frame, crop_from_frame, self.crop_size, out=self._crops[:n])
        xp = self.ops.xp
        x, tmp, mean, std = self._xf[:n], self._tmp[:n], self._mean[:n], self._std[:n]
        x[...] = crops
        _weighted_stats(xp, x, self._w, self._wsum, tmp, mean, std)
        xp.multiply(self._norm[None], std, out=tmp)
        tmp += mean
        tmp += 0.5
        xp.floor(tmp, out=tmp)
        xp.clip(tmp, 0, 255, out=tmp)
        out[...] = tmp
        return out, self.mask


class IdentitySwapper(_Base):
    """Returns the target crops unchanged."""

    name = "identity"

    def _swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        n = self._check(crop_from_frame)
        return self.ops.warp_crops(frame, crop_from_frame, self.crop_size, out=self._crops[:n]), self.mask


class SolidSwapper(_Base):
    """Fills every crop with one BGR colour."""

    name = "solid"

    def __init__(self, crop_size: int = 128, color: tuple[int, int, int] = (255, 0, 255), **kw: Any) -> None:
        super().__init__(crop_size, **kw)
        with self.ops.activate():
            self._crops[...] = self.ops.asarray(np.array(color, dtype=np.uint8))

    def _swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        return self._crops[: self._check(crop_from_frame)], self.mask


def make_builtin(
    name: str, *, crop_size: int = 128, color_match: bool = True, ops: Any = None, mask: Any = None, max_faces: int = 8
) -> _Base:
    """A built-in swapper by name: 'classic', 'identity' or 'solid'."""
    kw = {"ops": ops, "mask": mask, "max_faces": max_faces}
    if name == "classic":
        return ClassicSwapper(crop_size, color_match, **kw)
    if name == "identity":
        return IdentitySwapper(crop_size, **kw)
    if name == "solid":
        return SolidSwapper(crop_size, **kw)
    raise ConfigError(f"unknown built-in swapper '{name}'", hint="use 'classic' or a model from `vcam models list`")


# -- neural swappers ------------------------------------------------------------------------------


def read_emap(model_path: str | Path) -> np.ndarray:
    """The (512, 512) ``emap`` matrix: the LAST initializer of an inswapper ONNX graph."""
    from onnx import numpy_helper

    from .engines.onnx_graph import load_onnx

    model = load_onnx(model_path, external_data=False)
    if not model.graph.initializer:
        raise ModelError(f"{Path(model_path).name} has no initializers, so no emap", hint="this is not an inswapper model")
    emap = numpy_helper.to_array(model.graph.initializer[-1]).astype(np.float32)
    if emap.shape != (512, 512):
        raise ModelError(
            f"{Path(model_path).name}: last initializer has shape {emap.shape}, expected emap (512, 512)",
            hint="this is not an inswapper model",
        )
    return emap


def inswapper_latent(embedding: np.ndarray, emap: np.ndarray) -> np.ndarray:
    """``latent = normalize(e) @ emap; latent /= ||latent||`` -> (512,) float32."""
    lat = normalize(np.asarray(embedding, np.float32).reshape(-1)) @ np.asarray(emap, np.float32)
    return normalize(lat)


class NeuralSwapper(_Base):
    """A registry swapper on an engine (see the module docstring).

    ``emap``: required for ``source == "emap"`` (see :func:`read_emap`); ``converter``: an engine for
    ``source == "converted"``. A model with a second image output of one channel (hyperswap's
    ``mask``) has it combined with the box mask (the smaller of the two wins) for the paste-back.
    """

    def __init__(
        self,
        spec: ModelSpec | str,
        engine: Any,
        *,
        ops: Any = None,
        mask: Any = None,
        max_faces: int = 8,
        emap: np.ndarray | None = None,
        converter: Any = None,
    ) -> None:
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "swapper":
            raise ModelError(f"{self.spec.name} is a {self.spec.kind}, not a swapper", hint="see `vcam models list`")
        super().__init__(self.spec.size, ops=ops, mask=mask, max_faces=max_faces)
        self.name = self.spec.name
        self.template = self.spec.template or "arcface_128"
        self.recogniser = self.spec.recogniser
        self.engine = engine
        names = [t.name for t in engine.inputs]
        want = [t.name for t in self.spec.inputs]
        if sorted(names) != sorted(want):
            raise ModelError(
                f"{self.name}: the model has inputs {names}, expected {want}",
                hint="this file is not the model the registry describes",
            )
        outs = list(engine.outputs)
        if not outs:
            raise ModelError(f"{self.name}: the model has no outputs", hint="this file is not the model the registry describes")
        self._image_index = 0
        self._mask_index = next((i for i, o in enumerate(outs[1:], 1) if len(o.shape) == 4 and o.shape[1] == 1), None)
        if self.spec.source == "emap":
            if emap is None:
                raise ModelError(
                    f"{self.name} needs its emap matrix", hint="build it with create_swapper or pass emap=read_emap(path)"
                )
            self.emap = np.asarray(emap, np.float32)
        self.converter = converter
        if self.spec.source == "converted" and converter is None:
            raise ModelError(
                f"{self.name} needs the {self.spec.converter} embedding converter",
                hint=f"run `vcam models pull {self.spec.converter}`",
            )
        self._mean255, self._std255 = self.spec.input_mean_std_255
        self._affine = PlanarAffine.for_model(self.spec.mean, self.spec.std, self.spec.output)
        s = self.crop_size
        self._masks = self.ops.empty((self.max_faces, s, s), np.float32) if self._mask_index is not None else None

    # -- source side (off the frame loop) ---------------------------------------------------------
    def source_latent(self, embedding: np.ndarray) -> np.ndarray:
        """The (512,) float32 source input for a raw recogniser embedding."""
        e = np.asarray(embedding, np.float32).reshape(-1)
        if self.spec.source == "emap":
            return inswapper_latent(e, self.emap)
        if self.spec.source == "normed":
            return normalize(e)
        if self.spec.source == "converted":
            conv_in = self.converter.inputs[0].name
            out = np.asarray(self.converter.run({conv_in: e[None]})[0], np.float32).reshape(-1)
            return normalize(out)
        raise ModelError(f"{self.name}: unknown source recipe {self.spec.source!r}")

    def prepare(self, face: SourceFace) -> SourceFace:
        emb = face.embeddings.get(self.recogniser)
        if emb is None:
            raise FaceError(
                f"face '{face.name}' has no {self.recogniser} embedding",
                hint="load it from the face bank with a recogniser (FaceBank.load(name, recogniser=...))",
            )
        latents = dict(face.latents)
        latents[self.name] = self.source_latent(emb)
        return dataclasses.replace(face, latents=latents)

    def _source(self, face: SourceFace) -> None:
        """The latent into every row of the engine's source buffer, once per face switch."""
        if self._face_key is face:
            return
        latent = face.latents.get(self.name)
        if latent is None:
            raise FaceError(
                f"face '{face.name}' is not prepared for {self.name}", hint="call swapper.prepare(face) when the face is added"
            )
        buf = self.engine.input_buffers(self.max_faces)["source"]
        rows = np.broadcast_to(np.asarray(latent, np.float32).reshape(1, -1), buf.shape)
        buf[...] = self.ops.asarray(np.ascontiguousarray(rows, dtype=buf.dtype))
        self._face_key = face

    # -- frame side -------------------------------------------------------------------------------
    def _swap(self, frame: Any, crop_from_frame: np.ndarray, face: SourceFace) -> tuple[Any, Any]:
        n = self._check(crop_from_frame)
        self._source(face)
        feeds = self.engine.input_buffers(n)
        target = feeds["target"]
        self.ops.warp_crops_normalized(
            frame, crop_from_frame, self.crop_size, self._mean255, self._std255, self.spec.rgb, out=target
        )
        outs = self.engine.run_device(feeds, stream=self.ops.stream)
        crops = self.ops.crops_from_planar(
            outs[self._image_index], target, n, self._crops, self._guard, self._affine, self.spec.rgb
        )
        if self._masks is None:
            return crops[:n], self.mask
        xp = self.ops.xp
        masks = self._masks[:n]
        xp.fmin(outs[self._mask_index][:n, 0], self.mask, out=masks)  # NaN in the model mask: the box wins
        xp.clip(masks, 0.0, 1.0, out=masks)
        return crops[:n], masks


def create_swapper(
    name: str,
    cfg: Any,
    *,
    store: Any = None,
    ops: Any = None,
    mask: Any = None,
    device: str = "cpu",
    backend: str | None = None,
    fp16: bool | None = None,
    download: bool | None = None,
) -> NeuralSwapper:
    """Build the registry swapper ``name`` (and its converter) from ``cfg``'s models dir on ``device``.

    Files are verified (and downloaded when allowed). The converter runs once per face switch, so it
    stays on onnxruntime on the CPU.
    """
    from .engines import create_engine
    from .models.download import ModelStore

    spec = registry.get(name)
    if spec.kind != "swapper":
        raise ModelError(
            f"{name} is a {spec.kind}, not a swapper",
            hint="choose one of: " + ", ".join(m.name for m in registry.by_kind("swapper")),
        )
    store = store or ModelStore.from_config(cfg)
    wanted = [name] + ([spec.converter] if spec.converter else [])
    paths = store.ensure(wanted, download=download)
    engine = create_engine(
        paths[name],
        backend=backend or cfg.pipeline.backend,
        device=device,
        fp16=cfg.pipeline.fp16 if fp16 is None else fp16,
        max_batch=cfg.pipeline.max_faces,
        compile=cfg.pipeline.compile,
    )
    emap = read_emap(paths[name]) if spec.source == "emap" else None
    converter = create_engine(paths[spec.converter], backend="onnxruntime", device="cpu") if spec.converter else None
    if "NON-COMMERCIAL" in spec.licence.upper():
        log.warning("%s: %s", name, spec.licence)
    return NeuralSwapper(spec, engine, ops=ops, mask=mask, max_faces=cfg.pipeline.max_faces, emap=emap, converter=converter)


__all__ = [
    "BUILT_IN",
    "ClassicSwapper",
    "IdentitySwapper",
    "NeuralSwapper",
    "SolidSwapper",
    "Swapper",
    "create_swapper",
    "face_ellipse",
    "inswapper_latent",
    "make_builtin",
    "read_emap",
]
