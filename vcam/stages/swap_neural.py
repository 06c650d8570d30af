"""The neural swapper: a registry swap model (inswapper, SimSwap, HyperSwap ...) on an engine, with
its source latent (an ArcFace embedding, through the model's emap or a converter) computed once per
face switch, all faces of a frame in one batched call. :func:`create_swapper` builds it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vcam.align import PlanarAffine
from vcam.errors import FaceError, ModelError
from vcam.kernels import warp
from vcam.kernels.records import recording
from vcam.models import registry
from vcam.models.registry import ModelSpec
from vcam.stages.recognize import normalize
from vcam.stages.swap import Sources, SwapperBase
from vcam.types import SourceFace

log = logging.getLogger("vcam.stages.swap")


def read_emap(model_path: str | Path) -> np.ndarray:
    """The (512, 512) ``emap`` matrix: the LAST initializer of an inswapper ONNX graph.

    Reading it means parsing the whole file (1.4 s for 560 MB at every start), so it is kept in the
    user cache dir (``.../vcam/emap``) under the file's name, size and modification time, the facts
    the model lock trusts too; a changed file gets a new entry, an unreadable entry is rebuilt."""
    import io

    from vcam.engines.cache import _atomic_write
    from vcam.platform import folders

    path = Path(model_path)
    st = path.stat()
    cached = folders.cache_dir() / "emap" / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}.npy"
    try:
        emap = np.load(cached, allow_pickle=False)
        if emap.shape == (512, 512) and emap.dtype == np.float32:
            return emap
    except (OSError, ValueError, EOFError):
        pass
    emap = _emap_from_onnx(path)
    buf = io.BytesIO()
    np.save(buf, emap, allow_pickle=False)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(cached, buf.getvalue())
    except OSError as exc:  # a read-only cache costs the parse at every start, nothing more
        log.debug("emap cache not written (%s): %s", cached, exc)
    return emap


def _emap_from_onnx(model_path: Path) -> np.ndarray:
    from onnx import numpy_helper

    from vcam.engines.onnx_graph import load_onnx

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


class NeuralSwapper(SwapperBase):
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
        on_fault: str = "pass",
        fallback: Any = None,
        param_records: bool = False,
    ) -> None:
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "swapper":
            raise ModelError(f"{self.spec.name} is a {self.spec.kind}, not a swapper", hint="see `vcam models list`")
        super().__init__(self.spec.size, ops=ops, mask=mask, max_faces=max_faces)
        self.name = self.spec.name
        self.template = self.spec.template or "arcface_128"
        self.recogniser = self.spec.recogniser
        self.engine = engine
        #: A remote engine's faces without a good answer (:attr:`RemoteEngine.last_bad`): 'local'
        #: (swapped by ``fallback``, a swapper of the same crops: the local GPU engine or the classic
        #: swap; counted in :attr:`swapped_locally`), 'pixelate' (the input in coarse blocks) or
        #: 'pass' (the input back: the camera's real face); the last two counted by the NaN guard.
        self.on_fault = on_fault
        self.fallback = fallback
        self.swapped_locally = 0
        self.fallback_failed = 0  # faces the fallback failed on (pasted blank)
        #: The warps' faces from parameter records (:mod:`vcam.kernels.records`, a per-frame CUDA
        #: graph's groundwork; off: by value): a few records used in turn, one per call.
        self._records: list[Any] = []
        if param_records and getattr(self.ops, "concurrent", False):
            self._records = [self.ops.param_record() for _ in range(RECORDS)]
        self._record_turn = 0
        if on_fault == "local" and fallback is None:
            raise ModelError(f"{self.spec.name}: on_fault = 'local' needs a local swapper", hint="pass fallback=")
        if hasattr(engine, "on_fault_text"):
            engine.on_fault_text = fault_text(on_fault)
        # A remote engine's call is sent by swap_submit and taken by swap_wait, so the daemon overlaps
        # its round trip with the next frames' capture and detection. On the CPU only: on CUDA the
        # frame's detection of a predicted frame is ordered around the swap (it runs in one call).
        self.deferred = (
            callable(getattr(engine, "submit", None)) and callable(getattr(engine, "wait", None)) and self.ops.device == "cpu"
        )
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
        face = dataclasses.replace(face, latents=latents)
        return face if self.fallback is None else self.fallback.prepare(face)

    def _source(self, faces: Sources, n: int) -> None:
        """Each face's latent into its row of the engine's source buffer, only where the assignment
        changed (one face: every row, once per switch)."""
        rows = self._changed_rows(faces, n)
        if not rows:
            return
        latents = {}
        for _, face in rows:  # all checked before any row is written
            latent = face.latents.get(self.name)
            if latent is None:
                raise FaceError(
                    f"face '{face.name}' is not prepared for {self.name}",
                    hint="call swapper.prepare(face) when the face is added",
                )
            latents[id(face)] = latent
        buf = self.engine.input_buffers(self.max_faces)["source"]
        width = int(np.prod(buf.shape[1:]))
        if len(rows) == self.max_faces and len(latents) == 1:  # one face everywhere: one upload
            row = np.asarray(next(iter(latents.values())), np.float32).reshape(1, width)
            buf[...] = self.ops.asarray(np.ascontiguousarray(np.broadcast_to(row, (self.max_faces, width)), dtype=buf.dtype))
        else:
            for i, face in rows:
                row = np.asarray(latents[id(face)], np.float32).reshape(buf.shape[1:])
                buf[i] = self.ops.asarray(np.ascontiguousarray(row, dtype=buf.dtype))
        self._commit(faces, rows)

    def warm(self, batch: int = 1) -> None:
        """The network's first use for the first frames' ``batch`` of faces (one a stream), in the
        load rather than in the first frame through the pipeline: an engine that captures graphs
        captures that batch's now (:meth:`~vcam.engines.torch.TorchEngine.capture_first`), any
        other makes one call on its static input buffers, on the pipeline's stream (its kernels'
        modules loaded, cuDNN's choice made, memory taken). Nothing for a remote engine (one that
        submits its calls: a round trip of zeros warms nothing here)."""
        if callable(getattr(self.engine, "submit", None)):
            return
        batch = max(1, min(int(batch), self.max_faces))
        first = getattr(self.engine, "capture_first", None)
        if callable(first) and first(batch):
            return
        feeds = self.engine.input_buffers(batch)
        self.engine.run_device(feeds, stream=self.ops.stream)

    # -- frame side -------------------------------------------------------------------------------
    def _feeds(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[int, Any]:
        """The engine's inputs for ``parts`` (the target crops warped, the source rows set)."""
        n = self._check(parts)
        self._source(faces, n)
        if n == 0:
            return 0, None
        feeds = self.engine.input_buffers(n)
        record = self._next_record()
        with recording(self.ops, record):
            for frame, mats, lo, hi in self._rows(parts):
                warp.warp_crops_normalized(
                    self.ops, frame, mats, self.crop_size, self._mean255, self._std255, self.spec.rgb, out=feeds["target"][lo:hi]
                )
        if record is not None:
            record.close(self.ops)
        return n, feeds

    def _next_record(self) -> Any:
        """The parameter record of this call (cleared), or None when the warps take theirs by value."""
        if not self._records:
            return None
        record = self._records[self._record_turn]
        self._record_turn = (self._record_turn + 1) % len(self._records)
        record.clear()
        return record

    def _none(self) -> tuple[Any, Any]:
        return self._crops[:0], self.mask if self._masks is None else self._masks[:0]

    def _swap(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        n, feeds = self._feeds(parts, faces)
        if n == 0:
            return self._none()
        outs = self.engine.run_device(feeds, stream=self.ops.stream)
        return self._decode(outs, feeds["target"], n, parts, faces)

    def swap_submit(self, parts: Sequence[tuple[Any, np.ndarray]], faces: Sources) -> Any:
        """On a remote engine: the crops warped and sent; :meth:`swap_wait` takes the answer."""
        if not self.deferred:
            return super().swap_submit(parts, faces)
        parts = [(frame, np.asarray(mats, np.float64).reshape(-1, 2, 3)) for frame, mats in parts]
        with self.ops.activate():
            n, feeds = self._feeds(parts, faces)
            if n == 0:
                return ("done", self._none())
            # the target rows are kept for the NaN guard: the next submit reuses the engine's buffer
            return ("sent", n, feeds["target"].copy(), self.engine.submit(feeds), parts, faces)

    def swap_wait(self, ticket: Any) -> tuple[Any, Any]:
        if not self.deferred:
            return super().swap_wait(ticket)
        if ticket[0] == "done":
            return ticket[1]  # type: ignore[no-any-return]
        _, n, target, handle, parts, faces = ticket
        with self.ops.activate():
            return self._decode(self.engine.wait(handle), target, n, parts, faces)

    def _decode(self, outs: list[Any], target: Any, n: int, parts: Any = None, faces: Any = None) -> tuple[Any, Any]:
        """The model's outputs -> crops (and masks). Faces without a good answer from a remote
        engine take ``on_fault``: swapped by the fallback ('local'), else their input goes back
        through the NaN guard, in coarse blocks with 'pixelate'."""
        bad = self._faulted(n)
        xp = self.ops.xp
        local = bad is not None and self.on_fault == "local" and parts is not None
        if bad is not None and self.on_fault == "pixelate":
            self._pixelate(target, n, self.ops.asarray(bad))
        if local:  # no NaN left for the guard to count: these faces are swapped below
            rows = self.ops.asarray(bad)
            for i, o in enumerate(outs):  # a model mask of 1: the box mask, should the fallback fail
                o[:n][rows] = 1 if i == self._mask_index else 0
        crops = warp.crops_from_planar(
            self.ops, outs[self._image_index], target, n, self._crops, self._guard, self._affine, self.spec.rgb
        )
        masks = self.mask
        if self._masks is not None:
            masks = self._masks[:n]
            xp.fmin(outs[self._mask_index][:n, 0], self.mask, out=masks)  # NaN in the model mask: the box wins
            xp.clip(masks, 0.0, 1.0, out=masks)
        if local:
            assert bad is not None
            return self._swap_locally(crops[:n], masks, bad, n, parts, faces)
        return crops[:n], masks

    def _faulted(self, n: int) -> np.ndarray | None:
        """The rows (host bool, ``n``) of the engine's last answer that were faulted, None when none."""
        bad = getattr(self.engine, "last_bad", None)
        if bad is None or n == 0 or len(bad) < n or not bad[:n].any():
            return None
        return np.asarray(bad[:n], bool)

    def _pixelate(self, target: Any, n: int, bad: Any) -> None:
        """The faulted rows of the (normalised) target in blocks of an eighth of the crop."""
        xp = self.ops.xp
        t = target[:n]
        s, b = self.crop_size, max(1, self.crop_size // 8)
        blocks = t.reshape(n, 3, s // b, b, s // b, b).mean(axis=(3, 5), keepdims=True)
        coarse = xp.broadcast_to(blocks, (n, 3, s // b, b, s // b, b)).reshape(t.shape)
        t[...] = xp.where(bad[:, None, None, None], coarse, t)

    def _swap_locally(self, crops: Any, masks: Any, bad: np.ndarray, n: int, parts: Any, faces: Any) -> tuple[Any, Any]:
        """The faulted rows swapped by the fallback (every row is given to it: its per-row sources
        stay as they are); a fallback that fails leaves them flat (never the input)."""
        xp, s = self.ops.xp, self.crop_size
        rows = self.ops.asarray(bad)
        try:
            f_crops, f_masks = self.fallback.swap_batch(parts, faces)
        except Exception as exc:  # whatever the fallback raises, the frame goes on without the real face
            if not self.fallback_failed:  # one line, not one a frame
                log.warning("%s: the local swap failed (%s); its faces are left blank", self.name, exc)
            self.fallback_failed += int(bad.sum())
            return crops, masks
        crops[rows] = f_crops[:n][rows]
        f_masks = f_masks[:n] if f_masks.ndim == 3 else xp.broadcast_to(f_masks, (n, s, s))
        masks = masks if masks.ndim == 3 else xp.broadcast_to(masks, (n, s, s))
        self.swapped_locally += int(bad.sum())
        return crops, xp.where(rows[:, None, None], f_masks, masks).astype(np.float32)


def create_swapper(
    name: str,
    *,
    store: Any,
    ops: Any = None,
    mask: Any = None,
    device: str = "cpu",
    backend: str = "auto",
    fp16: bool = False,
    download: bool | None = None,
    max_faces: int = 8,
    compile: str = "auto",
    remote: dict[str, Any] | None = None,
    threads: int = 0,
    short_lived: bool = False,
) -> NeuralSwapper:
    """Build the registry swapper ``name`` (and its converter) from ``store`` on ``device``.

    Files are verified (and downloaded when allowed). The converter runs once per face switch, so it
    stays on onnxruntime on the CPU. ``max_faces``: rows per call (more when several streams share
    the swapper). ``compile``: ``[pipeline] compile``. ``threads``: a call's CPU threads on
    onnxruntime (0: one per core). ``short_lived``: see :func:`vcam.engines.create_engine`.
    """
    from vcam.engines import create_engine

    spec = registry.get(name)
    if spec.kind != "swapper":
        raise ModelError(
            f"{name} is a {spec.kind}, not a swapper",
            hint="choose one of: " + ", ".join(m.name for m in registry.by_kind("swapper")),
        )
    wanted = [name] + ([spec.converter] if spec.converter else [])
    paths = store.ensure(wanted, download=download)
    on_fault = "pass"
    if remote is not None:  # the model file stays for its emap (the source latents are made here)
        from vcam.engines import TensorInfo
        from vcam.engines.remote import RemoteEngine

        opts = dict(remote)
        on_fault = _checked_fault(opts.pop("on_fault", "local"))
        engine: Any = RemoteEngine(
            expect=[TensorInfo(t.name, t.shape, np.float32) for t in spec.inputs],
            expect_outputs=[TensorInfo(t.name, t.shape, np.float32) for t in spec.outputs],
            max_batch=max_faces,
            pixel_scale=tuple(255.0 * s for s in spec.std),
            pixel_shift=tuple(255.0 * m for m in spec.mean),
            label="swapper",
            device=device,
            on_fault_text=fault_text(on_fault),
            **{"model": name, **opts},
        )
    else:
        engine = create_engine(
            paths[name],
            backend=backend,
            device=device,
            fp16=fp16,
            max_batch=max_faces,
            compile=compile,
            threads=threads,
            short_lived=short_lived,
        )
    emap = read_emap(paths[name]) if spec.source == "emap" else None
    converter = create_engine(paths[spec.converter], backend="onnxruntime", device="cpu") if spec.converter else None
    if "NON-COMMERCIAL" in spec.licence.upper():
        log.warning("%s: %s", name, spec.licence)
    fallback = None
    if remote is not None and on_fault == "local":
        fallback = _local_fallback(spec, paths[name], ops=ops, max_faces=max_faces, device=device, emap=emap, converter=converter)
    elif remote is not None and on_fault == "pass":
        log.warning(
            "%s: on_fault = 'pass': faces the server does not answer for in time go out unswapped (the camera's real "
            "face); 'local' (the default) swaps them here",
            name,
        )
    return NeuralSwapper(
        spec,
        engine,
        ops=ops,
        mask=mask,
        max_faces=max_faces,
        emap=emap,
        converter=converter,
        on_fault=on_fault,
        fallback=fallback,
    )


#: What a remote swapper's faces without a good answer get ([engines.swapper] on_fault).
ON_FAULT = ("local", "pixelate", "pass")
#: Parameter records a swapper uses in turn, one per call: the pipeline's ring (two frames in flight),
#: so with one call a frame, frame N's warp reads record N mod 2 as the frame uses ring slot N mod 2
#: (a graph per slot captures one address). A record is written again only once the device has read it.
RECORDS = 2


def _checked_fault(on_fault: str) -> str:
    if on_fault not in ON_FAULT:
        raise ModelError(f"on_fault = {on_fault!r}: expected one of {', '.join(ON_FAULT)}", hint="fix [engines.swapper] on_fault")
    return on_fault


def fault_text(on_fault: str) -> str:
    """What the faces of a remote fault get under ``on_fault``, in the engine's episode line."""
    return {"local": "are swapped locally", "pixelate": "are pixelated"}.get(on_fault, "go out unswapped")


def _local_fallback(spec: ModelSpec, path: Path, *, ops: Any, max_faces: int, device: str, emap: Any, converter: Any) -> Any:
    """The swapper a remote one's faulted faces go to: the same model on a local GPU engine where
    the pipeline runs on one, else the classic swap (no model, the CPU or the pipeline's device)."""
    from vcam.errors import VcamError
    from vcam.stages.swap import ClassicSwapper

    if device == "cuda":
        from vcam.engines import create_engine

        try:
            engine = create_engine(path, backend="auto", device="cuda", max_batch=max_faces)
            return NeuralSwapper(spec, engine, ops=ops, max_faces=max_faces, emap=emap, converter=converter)
        except VcamError as exc:
            log.warning("%s: no local GPU engine for the remote's faults (%s); the classic swap stands in", spec.name, exc)
    return ClassicSwapper(spec.size, ops=ops, max_faces=max_faces, dense=False, template=spec.template or "arcface_128")


__all__ = ["ON_FAULT", "NeuralSwapper", "create_swapper", "inswapper_latent", "read_emap"]
