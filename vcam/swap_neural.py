"""Neural swappers driven by the model registry, and the optional enhancer stage.

One adapter class serves every swapper family: the registry row says which template and crop size
the target crop uses, how it is normalised, how to read the output, and how the source identity is
made (``source``: ``emap`` for inswapper, ``normed`` for hyperswap, ``converted`` for simswap). So
a new model of a known family is a new row in :mod:`vcam.models.registry`, not code.

:meth:`NeuralSwapper.prepare` computes the source latent once per face (off the frame loop);
:meth:`NeuralSwapper.swap` runs every face of a frame in one batched engine call. A face whose
output holds NaN or Inf is passed through unchanged and counted in ``guarded``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from .align import estimate, warp_crops
from .blend import box_mask, paste_back
from .engines import Engine, create_engine
from .errors import FaceError, ModelError
from .models import registry
from .models.registry import ModelSpec
from .recognize import _engine_kwargs, normalize
from .types import SourceFace

log = logging.getLogger(__name__)


def read_emap(model_path: str | Path) -> np.ndarray:
    """The (512, 512) ``emap`` matrix: the LAST initializer of an inswapper ONNX graph."""
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read {model_path}: {exc}", hint="run `vcam models verify`") from None
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


class NeuralSwapper:
    """A registry swapper on an :class:`~vcam.engines.Engine`.

    ``emap``: required for ``source == "emap"`` (see :func:`read_emap`); ``converter``: an engine for
    ``source == "converted"``.
    """

    def __init__(self, spec: ModelSpec | str, engine: Engine, *, emap: np.ndarray | None = None,
                 converter: Engine | None = None) -> None:
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "swapper":
            raise ModelError(f"{self.spec.name} is a {self.spec.kind}, not a swapper", hint="see `vcam models list`")
        self.name = self.spec.name
        self.template = self.spec.template
        self.crop_size = self.spec.size
        self.recogniser = self.spec.recogniser
        self.engine = engine
        self.guarded = 0
        names = {t.name: t for t in engine.inputs}
        for t in self.spec.inputs:
            if t.name not in names:
                raise ModelError(
                    f"{self.name}: the model has inputs {list(names)}, expected {[t.name for t in self.spec.inputs]}",
                    hint="this file is not the model the registry describes",
                )
        self._target = names["target"]
        self._source = names["source"]
        if self.spec.source == "emap":
            if emap is None:
                raise ModelError(f"{self.name} needs its emap matrix", hint="build it with create_swapper or pass emap=read_emap(path)")
            self.emap = np.asarray(emap, np.float32)
        self.converter = converter
        if self.spec.source == "converted" and converter is None:
            raise ModelError(f"{self.name} needs the {self.spec.converter} embedding converter", hint=f"run `vcam models pull {self.spec.converter}`")
        mean = np.asarray(self.spec.mean, np.float32)
        std = np.asarray(self.spec.std, np.float32)
        # x_model = pixel * scale + shift, per RGB (or BGR) channel, pixel in 0..255
        self._scale = (1.0 / (255.0 * std)).astype(np.float32)
        self._shift = (-mean / std).astype(np.float32)
        self._mean, self._std = mean, std

    # -- source side (off the frame loop) ------------------------------------------------------
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

    # -- frame side ----------------------------------------------------------------------------
    def preprocess(self, crops: np.ndarray) -> np.ndarray:
        """(F, S, S, 3) uint8 BGR -> (F, 3, S, S) float32 model input."""
        x = crops.astype(np.float32)
        if self.spec.rgb:
            x = x[..., ::-1]
        x = x * self._scale + self._shift
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    def postprocess(self, out: np.ndarray) -> np.ndarray:
        """(F, 3, S, S) model output -> (F, S, S, 3) float32 in 0..255 (BGR), NaN kept."""
        y = np.asarray(out, np.float32).transpose(0, 2, 3, 1)
        if self.spec.output == "mean_std":
            y = y * self._std + self._mean
        elif self.spec.output == "tanh":
            y = (y + 1.0) * 0.5
        y = np.clip(y, 0.0, 1.0) * 255.0
        return y[..., ::-1] if self.spec.rgb else y

    def swap(self, crops: np.ndarray, face: SourceFace) -> np.ndarray:
        crops = np.asarray(crops)
        if crops.ndim != 4 or crops.shape[1:] != (self.crop_size, self.crop_size, 3):
            raise ValueError(f"unexpected crops shape: {crops.shape} != (F, {self.crop_size}, {self.crop_size}, 3)")
        n = crops.shape[0]
        if n == 0:
            return crops.copy()
        latent = face.latents.get(self.name)
        if latent is None:
            raise FaceError(f"face '{face.name}' is not prepared for {self.name}", hint="call swapper.prepare(face) when the face is added")
        x = self.preprocess(crops)
        src = np.broadcast_to(np.asarray(latent, np.float32).reshape(1, -1), (n, latent.size))
        if self._target.fixed_batch == 1 and n > 1:
            raw = np.concatenate([self.engine.run({self._target.name: x[i : i + 1], self._source.name: src[i : i + 1]})[0] for i in range(n)])
        else:
            raw = self.engine.run({self._target.name: x, self._source.name: np.ascontiguousarray(src)})[0]
        raw = np.asarray(raw, np.float32)
        bad = ~np.isfinite(raw).reshape(n, -1).all(axis=1)
        if bad.any():
            raw = np.where(np.isfinite(raw), raw, 0.0).astype(np.float32)
        y = self.postprocess(raw)
        out = np.floor(y + 0.5).clip(0, 255).astype(np.uint8)
        if bad.any():
            out[bad] = crops[bad]
            self.guarded += int(bad.sum())
        return out


class Enhancer:
    """Face restoration (gfpgan_1.4) on an ffhq_512 crop, blended back into the frame.

    ``amount`` in [0, 1]: 0 leaves the frame unchanged, 1 pastes the enhanced face fully.
    """

    def __init__(self, spec: ModelSpec | str, engine: Engine, *, amount: float = 0.8, blur: float = 0.3) -> None:
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "enhancer":
            raise ModelError(f"{self.spec.name} is a {self.spec.kind}, not an enhancer")
        self.name = self.spec.name
        self.template = self.spec.template
        self.crop_size = self.spec.size
        self.engine = engine
        self.amount = float(np.clip(amount, 0.0, 1.0))
        self.guarded = 0
        self._input = engine.inputs[0]
        self._mask = box_mask(self.crop_size, blur)
        mean = np.asarray(self.spec.mean, np.float32)
        std = np.asarray(self.spec.std, np.float32)
        self._scale, self._shift = 1.0 / (255.0 * std), -mean / std

    def enhance_crops(self, crops: np.ndarray) -> np.ndarray:
        """(F, 512, 512, 3) uint8 BGR ffhq_512 crops -> enhanced crops, mixed by ``amount``."""
        n = crops.shape[0]
        x = crops.astype(np.float32)[..., ::-1] * self._scale + self._shift
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        outs = []
        for i in range(n):  # gfpgan takes one face at a time
            outs.append(np.asarray(self.engine.run({self._input.name: x[i : i + 1]})[0], np.float32))
        y = np.concatenate(outs) if outs else np.zeros((0, 3, self.crop_size, self.crop_size), np.float32)
        bad = ~np.isfinite(y).reshape(n, -1).all(axis=1)
        if bad.any():
            y = np.where(np.isfinite(y), y, 0.0).astype(np.float32)
        y = (np.clip(y, -1.0, 1.0) + 1.0) * 127.5
        y = y.transpose(0, 2, 3, 1)[..., ::-1]
        mixed = crops.astype(np.float32) * (1.0 - self.amount) + y * self.amount
        out = np.floor(mixed + 0.5).clip(0, 255).astype(np.uint8)
        if bad.any():
            out[bad] = crops[bad]
            self.guarded += int(bad.sum())
        return out

    def enhance(self, frame: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        """Enhance the faces with 5-point ``landmarks`` (F, 5, 2) in ``frame`` (BGR, in place)."""
        lms = np.asarray(landmarks, np.float64).reshape(-1, 5, 2)
        if lms.shape[0] == 0 or self.amount <= 0:
            return frame
        mats = np.stack([estimate(lm, self.template, self.crop_size) for lm in lms])
        crops = warp_crops(frame, mats, self.crop_size)
        return paste_back(frame, self.enhance_crops(crops), mats, self._mask)


def create_swapper(name: str, cfg, *, store=None, device: str | None = None, download: bool | None = None,
                   engine_kwargs: dict | None = None) -> NeuralSwapper:
    """Build the registry swapper ``name`` (and its converter) from ``cfg``'s models dir.

    Files are verified (and downloaded when allowed); ``device`` is the pipeline's resolved device.
    """
    from .models.download import ModelStore

    spec = registry.get(name)
    if spec.kind != "swapper":
        raise ModelError(f"{name} is a {spec.kind}, not a swapper", hint="choose one of: " + ", ".join(m.name for m in registry.by_kind("swapper")))
    store = store or ModelStore.from_config(cfg)
    wanted = [name] + ([spec.converter] if spec.converter else [])
    paths = store.ensure(wanted, download=download)
    kwargs = _engine_kwargs(cfg, device)
    kwargs.update(engine_kwargs or {})
    engine = create_engine(paths[name], **kwargs)
    emap = read_emap(paths[name]) if spec.source == "emap" else None
    converter = None
    if spec.converter:
        converter = create_engine(paths[spec.converter], **{**kwargs, "backend": "onnxruntime", "device": "cpu"})
    if "NON-COMMERCIAL" in spec.licence.upper():
        log.warning("%s: %s", name, spec.licence)
    return NeuralSwapper(spec, engine, emap=emap, converter=converter)


def create_enhancer(name: str, cfg, *, amount: float = 0.8, store=None, device: str | None = None,
                    download: bool | None = None, engine_kwargs: dict | None = None) -> Enhancer:
    from .models.download import ModelStore

    store = store or ModelStore.from_config(cfg)
    path = store.ensure([name], download=download)[name]
    kwargs = _engine_kwargs(cfg, device)
    kwargs.update(engine_kwargs or {})
    return Enhancer(name, create_engine(path, **kwargs), amount=amount, blur=cfg.swap.blur)
