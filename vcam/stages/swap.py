"""Swap stage: the Swapper interface, the model-free swappers and the neural (registry) swapper.

A swapper gets the frame and the ``crop_from_frame`` matrix of every face to swap, and returns the
swapped crops and the mask to paste them with, all faces at once (one batched model call). It runs
on an :class:`~vcam.ops.Ops` (NumPy or CUDA), so one class serves both devices; its buffers are
allocated at construction for ``max_faces``. Source preparation (embeddings, latents, colour
statistics, face-region masks) happens in :meth:`Swapper.prepare`, off the frame loop. Each face of
a batch may have its own source (per-person mapping): the swapper keeps one source row per face slot
and writes a row only when the face assigned to it changes, so a steady assignment costs nothing
per frame and a switch is one upload per changed row, never a per-frame copy.

- :class:`ClassicSwapper` (the built-in default; needs no downloaded model): the source photo's
  aligned face, only inside the source's own face region (a landmark polygon, feathered inwards),
  its colours moved to each target's statistics in CIE L*a*b* (mean and spread per channel inside
  the face region, :mod:`vcam.kernels.color`), optionally with the seamless offset membrane
  (:func:`vcam.kernels.color.lab_membrane`) that carries the target's lighting across the face.
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
from collections.abc import Sequence
from typing import Any, Protocol, Union, runtime_checkable

import numpy as np

from vcam.align import TEMPLATES
from vcam.errors import ConfigError, FaceError
from vcam.kernels import classic, color, warp
from vcam.kernels.build import on_device
from vcam.ops import make_ops
from vcam.stages import mask as vmask
from vcam.stages import swap_classic
from vcam.stages.swap_classic import face_region
from vcam.types import SourceFace

log = logging.getLogger(__name__)

BUILT_IN = ("classic", "identity", "solid")

#: One source for every face, or one per face (row ``i`` of the batch gets ``faces[i]``).
Sources = Union[SourceFace, Sequence[SourceFace]]

#: Crop pixels by which the classic swap's source region stays inside the face outline, so that no
#: bilinear footprint of a pasted pixel (photo -> aligned crop, crop -> frame) reaches a pixel
#: outside the outline: the hat, hair, collar and backdrop of the source photo never show.
SOURCE_MARGIN = 3.0
#: The largest crop the dense classic swap reads the target's colour statistics from.
STATS_SIZE = 64
#: The local colour match of the dense classic swap (``[swap] local_color``): the swapped face and
#: the target are compared on a crop of LOCAL_SIZE pixels, their difference blurred inside the paste
#: (a Gaussian of LOCAL_SIGMA crop sides, normalised by the paste's weight) onto a LOCAL_GRID x
#: LOCAL_GRID grid of colour offsets the render adds, at most LOCAL_LIMIT levels: the target's light
#: and shading at the scale of a cheek, none of its features.
LOCAL_SIZE = 32
LOCAL_GRID = 12
LOCAL_SIGMA = 0.2
LOCAL_LIMIT = 40.0


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

    def swap(self, frame: Any, crop_from_frame: np.ndarray, faces: Sources) -> tuple[Any, Any]:
        """Swap the F faces at ``crop_from_frame`` (F, 2, 3) of ``frame`` (H, W, 3).

        ``faces``: one :class:`SourceFace` that every face gets, or a sequence of exactly F of them,
        face ``i`` getting ``faces[i]`` (prepared with :meth:`prepare`; an unprepared face is
        prepared on its switch, slowly). Sources are compared by identity: the swapper uploads a
        face's data only when the face assigned to a row changes. Returns (crops (F, S, S, 3),
        mask (S, S) or (F, S, S)), views of the swapper's buffers valid until the next call."""
        ...

    def swap_batch(self, parts: Sequence[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        """The faces of several frames in one batch (several streams): ``parts`` = ``[(frame,
        crop_from_frame (F_i, 2, 3)), ...]``; rows follow the parts in order (``faces`` as in
        :meth:`swap`, one per row in all). Returns what :meth:`swap` returns for all rows."""
        ...

    def guarded(self) -> int:
        """Faces passed through so far because the model produced NaN/Inf (reads a device counter:
        call it now and then, not per frame)."""
        ...


def _resize_crop(img: np.ndarray, size: int) -> np.ndarray:
    if img.shape[0] == size and img.shape[1] == size:
        return img
    import cv2

    interp = cv2.INTER_AREA if img.shape[0] > size else cv2.INTER_CUBIC
    return cv2.resize(img, (size, size), interpolation=interp)


def _ops(ops: Any) -> Any:
    if ops is not None:
        return ops
    return make_ops("cpu")  # frames in host memory


class SwapperBase:
    """Buffers and bookkeeping every swapper shares: crops, the paste mask, the per-face guard, the
    source assigned to each row."""

    name = ""
    template = "arcface_128"

    def __init__(self, crop_size: int, *, ops: Any = None, mask: Any = None, max_faces: int = 8) -> None:
        from vcam.kernels.paste import box_mask

        self.ops = _ops(ops)
        self.crop_size = int(crop_size)
        self.max_faces = int(max_faces)
        self.mask = self.ops.asarray(box_mask(self.crop_size)) if mask is None else mask
        s = self.crop_size
        self._crops = self.ops.empty((self.max_faces, s, s, 3), np.uint8)
        self._guard = self.ops.empty((self.max_faces,), np.int32)
        self._face_key: Any = None  # the one face every row holds, when it was given alone
        self._row_faces: list[SourceFace | None] = [None] * self.max_faces

    def guarded(self) -> int:
        return int(self.ops.to_host(self._guard).sum())

    def swap(self, frame: Any, crop_from_frame: np.ndarray, faces: Sources) -> tuple[Any, Any]:
        return self.swap_batch(((frame, crop_from_frame),), faces)

    def swap_batch(self, parts: Sequence[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        parts = [(frame, np.asarray(mats, np.float64).reshape(-1, 2, 3)) for frame, mats in parts]
        with self.ops.activate():  # array-library calls of the swapper run on the ops' stream
            return self._swap(parts, faces)

    def _swap(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        raise NotImplementedError

    #: True when :meth:`swap_submit` returns before the swap is done (a remote engine): the caller
    #: may do other work before :meth:`swap_wait`.
    deferred = False

    def swap_submit(self, parts: Sequence[tuple[Any, np.ndarray]], faces: Sources) -> Any:
        """Start :meth:`swap_batch`; :meth:`swap_wait` of the returned ticket gives its result (here
        the swap is done at once; a swapper on a remote engine only sends it)."""
        return self.swap_batch(parts, faces)

    def swap_wait(self, ticket: Any) -> tuple[Any, Any]:
        """The ``(crops, mask)`` of a :meth:`swap_submit`."""
        return ticket  # type: ignore[no-any-return]

    def _check(self, parts: list[tuple[Any, np.ndarray]]) -> int:
        n = sum(int(m.shape[0]) for _, m in parts)
        if n > self.max_faces:
            raise ValueError(f"{n} faces, the swapper was built for at most {self.max_faces}")
        return n

    @staticmethod
    def _rows(parts: list[tuple[Any, np.ndarray]]) -> list[tuple[Any, np.ndarray, int, int]]:
        """``(frame, mats, first row, end row)`` of each part with faces."""
        out, lo = [], 0
        for frame, mats in parts:
            hi = lo + int(mats.shape[0])
            if hi > lo:
                out.append((frame, mats, lo, hi))
            lo = hi
        return out

    def _changed_rows(self, faces: Sources, n: int) -> list[tuple[int, SourceFace]]:
        """The rows whose source differs from ``faces`` (one face: every row; a sequence: rows
        ``0..n-1``), as ``(row, face)``; empty when nothing changed (the per-frame case). Call
        :meth:`_commit` once the rows are written."""
        if isinstance(faces, SourceFace):
            if self._face_key is faces:
                return []
            want: Sequence[SourceFace] = [faces] * self.max_faces
        else:
            want = faces
            if len(want) != n:
                raise ValueError(f"{len(want)} source faces for {n} faces: give one source, or one per face")
            if not all(isinstance(f, SourceFace) for f in want):
                raise TypeError("faces must be SourceFace objects")
        rows = [(i, f) for i, f in enumerate(want) if self._row_faces[i] is not f]
        if not rows and isinstance(faces, SourceFace):
            self._face_key = faces  # every row holds it already
        return rows

    def _commit(self, faces: Sources, rows: list[tuple[int, SourceFace]]) -> None:
        for i, f in rows:
            self._row_faces[i] = f
        self._face_key = faces if isinstance(faces, SourceFace) else None

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


def _crop_landmarks(face: SourceFace, size: int, template: str) -> np.ndarray:
    """The source's landmarks (P, 2) in the pixels of its crop resized to ``size``; without landmarks
    the image is taken as aligned with ``template`` (the face bank's crops are)."""
    h, w = face.image.shape[:2]
    if face.landmarks is None:
        return TEMPLATES[template] * size
    lm = np.asarray(face.landmarks, np.float64).reshape(-1, 2)
    return (lm + 0.5) * np.array([size / w, size / h]) - 0.5  # pixel centres, as cv2.resize maps them


class ClassicSwapper(SwapperBase):
    """Model-free swap (see the module docstring): the source's face region only, colour-matched
    in L*a*b* to each target, optionally seamless.

    Per face slot (row) it keeps the source's normalised L*a*b* crop, its raw crop and its paste
    mask (the box mask times the source's face region, so nothing outside the source's own face is
    ever pasted, even where the target's face is larger); rows change only when the assignment does.
    Per frame, on the ops' device with preallocated buffers and no host wait: warp the targets,
    convert them to L*a*b*, weigh their statistics inside the template's face region, and convert
    ``source_norm * std_t + mean_t`` (plus the membrane when seamless) back to BGR.

    ``local_color`` (the dense swap): the light and colour matched locally too (:data:`LOCAL_SIZE`).
    ``color_match=False`` pastes the raw source crop (still only its face region); with
    ``seamless`` it gets the membrane on its own colours. ``sigma``: the membrane's blur in grid
    cells (about 8 crop pixels each); ``clip``: the largest L*a*b* difference one band pixel adds.
    ``template``: the alignment of the crops it is given (default ``arcface_128``).
    """

    name = "classic"

    def __init__(
        self,
        crop_size: int = 128,
        color_match: bool = True,
        *,
        seamless: bool = False,
        sigma: float = 2.5,
        clip: float = 12.0,
        ops: Any = None,
        mask: Any = None,
        max_faces: int = 8,
        dense: bool | None = None,
        template: str = "",
        local_color: bool = True,
    ) -> None:
        super().__init__(crop_size, ops=ops, mask=mask, max_faces=max_faces)
        if template:  # the crops of another swapper (a remote one's local stand-in)
            self.template = template
        self.color_match = bool(color_match)
        self.seamless = bool(seamless)
        self.dense = (not self.seamless) if dense is None else bool(dense) and not self.seamless
        self._dense_sources: dict[int, tuple[SourceFace, list[Any], np.ndarray, dict[tuple[int, bool], np.ndarray]]] = {}
        #: A :class:`~vcam.stages.landmark.Landmarker` (the mask stage's): the dense swap then warps
        #: with the 68 points it finds on the source and the mask stage finds on the target.
        self.landmarker: Any = None
        self.sigma, self.clip = float(sigma), float(clip)
        ops = self.ops
        s, f = self.crop_size, self.max_faces
        self._box = np.asarray(ops.to_host(self.mask) if mask is not None else _box(s), np.float32)
        if self._box.shape != (s, s):
            raise ValueError(f"the paste mask is {self._box.shape}, the crop is {s} x {s}")
        # Target statistics: weighted by the face region of the template, where every aligned target
        # face lies (the target's own landmarks are the mask stage's business); the dense swap
        # reads them from a crop of at most STATS_SIZE pixels (statistics need no detail).
        self._stats_size = min(STATS_SIZE, s) if self.dense else s
        weight = face_region(TEMPLATES[self.template] * self._stats_size, self._stats_size, margin=SOURCE_MARGIN)
        self._wsum = float(weight.sum())
        self._w = ops.asarray(weight[None, :, :, None])
        self._w2d = ops.asarray(np.ascontiguousarray(weight, np.float32))
        # Source rows (written on an assignment change only).
        self._src_norm = ops.empty((f, s, s, 3), np.float32)
        self._src_raw = ops.empty((f, s, s, 3), np.uint8)
        self._src_mask = ops.empty((f, s, s), np.float32)
        self._src_stats = ops.empty((2, f, 3), np.float32)  # the source's own mean, std per row
        self._src_stats_rows = (self._src_stats[0], self._src_stats[1])  # views, made once
        self._band = ops.empty((f, s, s), np.float32) if self.seamless else None
        # Per-frame scratch.
        lab = self.color_match or self.seamless
        t = self._stats_size
        self._lab = ops.empty((f, t, t, 3), np.float32) if lab else None
        self._tmp = ops.empty((f, t, t, 3), np.float32) if self.color_match else None
        self._samples = ops.empty((f, classic.FIT_SAMPLES, 3), np.float32)
        self._affine = ops.empty((f, 12), np.float32)
        if self.dense and t != s:
            self._crops = ops.empty((f, t, t, 3), np.uint8)
        self._mean = ops.empty((f, 1, 1, 3), np.float32)
        self._std = ops.empty((f, 1, 1, 3), np.float32)
        g = color.membrane_grid(s)
        self._membrane = ops.empty((f, g, g, 3), np.float32) if self.seamless else None
        self._out = ops.empty((f, s, s, 3), np.uint8)
        self._grids = ops.empty((f, classic.GRID, classic.GRID, 2), np.float32) if self.dense else None
        self.local_color = bool(local_color) and self.dense
        if self.local_color:
            q, g = LOCAL_SIZE, LOCAL_GRID
            self._lc_target = ops.empty((f, q, q, 3), np.uint8)
            self._lc_src = ops.empty((f, q * q, 3), np.float32)  # each row's source crop at q pixels
            self._lc_srcw = ops.empty((f, q, q), np.float32)  # and its face weight there
            self._lc_down = ops.asarray(_area_matrix(s, q))  # (q, s): crop -> q pixels, area means
            nodes = (np.arange(g) + 0.5) * (q / g) - 0.5
            blur = np.exp(-0.5 * ((np.arange(q)[None, :] - nodes[:, None]) / (LOCAL_SIGMA * q)) ** 2)
            self._lc_blur = ops.asarray(blur.astype(np.float32))  # (g, q): the blur sampled at the nodes
            self._lc_floor = np.float32(0.02 * float(blur.sum(1).max()) ** 2)

    # -- source side (off the frame loop) ---------------------------------------------------------
    def prepare(self, face: SourceFace) -> SourceFace:
        """Fill ``latents``: ``classic`` the normalised L*a*b* crop (S, S, 3), ``classic.raw`` the
        crop, ``classic.mask`` the paste mask (S, S), ``classic.stats`` its mean and std (2, 3)."""
        s = self.crop_size
        img = np.ascontiguousarray(face.image)
        if img.ndim != 3 or img.shape[2] != 3:
            raise ConfigError(f"source face '{face.name}' image has shape {img.shape}, expected (S, S, 3)")
        crop = _resize_crop(img, s)
        lms = _crop_landmarks(face, s, self.template)
        region = face_region(lms, s, margin=SOURCE_MARGIN * max(1.0, s / min(img.shape[:2])))
        wsum = float(region.sum())
        if wsum <= 0:
            raise FaceError(f"source face '{face.name}': its landmarks give no face region", hint="use another photo")
        lab = color.lab_from_bgr_ref(crop[None], 1, np.empty((1, s, s, 3), np.float32))
        mean, std = np.empty((1, 1, 1, 3), np.float32), np.empty((1, 1, 1, 3), np.float32)
        _weighted_stats(np, lab, region[None, :, :, None], wsum, np.empty_like(lab), mean, std)
        latents = dict(face.latents)
        latents[self.name] = ((lab[0] - mean[0]) / std[0]).astype(np.float32)
        latents[self.name + ".raw"] = crop
        latents[self.name + ".mask"] = (self._box * region).astype(np.float32)
        latents[self.name + ".stats"] = np.concatenate([mean.reshape(1, 3), std.reshape(1, 3)]).astype(np.float32)
        latents[self.name + ".samples"] = swap_classic.fit_samples(crop, region)
        if self.local_color:
            local = _local_colours(crop, latents[self.name + ".mask"])
            latents[self.name + ".local"], latents[self.name + ".local_w"] = local
        if self.dense:  # the source at its own resolution (square), its landmarks there
            side = max(img.shape[:2])
            big = _resize_crop(img, side) if img.shape[0] != img.shape[1] else img
            lms_big = _crop_landmarks(face, side, self.template)
            if self.landmarker is not None and lms_big.shape[0] == 5:
                dense = swap_classic.source_68(self.landmarker, big, lms_big)
                lms_big = lms_big if dense is None else dense
            for k, level in enumerate(swap_classic.source_levels(big, lms_big)):
                latents[f"{self.name}.level{k}"] = level
            latents[self.name + ".points"] = lms_big.astype(np.float32)
        return dataclasses.replace(face, latents=latents)

    def warm(self, batch: int = 1) -> None:
        """One swap and paste of ``batch`` faces on a grey frame now (a grey face aligned with the
        template), in the load rather than in the first frame with a face: on CUDA, CuPy builds each
        kernel at its first call (the colour fit, the warp grid, the paste, the local colour
        match's array arithmetic: 13 builds, 2.75 s of the first face's frame on a fresh H100,
        ``benchmarks/kernel_builds.py``). One face and two or more (``batch``), each once: CuPy's
        element-wise kernels are built per number of dimensions, and one face's arrays have fewer
        once its size-1 axes are merged (two faces after a one-face warm-up built two more, 184 ms).
        The rows are left to the face, which the next frame's faces replace as any change of face does."""
        for n in sorted({1, min(max(2, int(batch)), self.max_faces)}):
            self._warm_once(n)
        self.ops.synchronize()

    def _warm_once(self, n: int) -> None:
        s = self.crop_size
        grey = np.tile(np.linspace(60, 200, s, dtype=np.float32)[None, :, None], (s, 1, 3)).astype(np.uint8)
        face = SourceFace("warm-up", grey)
        frame = self.ops.empty((2 * s, 2 * s, 3), np.uint8)
        mats = np.tile(np.array([[1.0, 0.0, -s / 2], [0.0, 1.0, -s / 2]]), (n, 1, 1))  # crop from frame
        landmarks = np.tile(TEMPLATES[self.template] * s + s / 2, (n, 1, 1))  # the template, in the frame
        crops, mask = self.swap_batch([(frame, mats)], face)
        self.paste(frame, crops, mats, mask, n, sources=face, landmarks=landmarks)

    def _prepared(self, face: SourceFace) -> SourceFace:
        lat = face.latents
        s = self.crop_size
        keys = [self.name, self.name + ".raw", self.name + ".mask", self.name + ".stats", self.name + ".samples"]
        ok = all(k in lat for k in keys + ([self.name + ".level0"] if self.dense else []))
        if ok and np.shape(lat[self.name]) == (s, s, 3) and np.shape(lat[self.name + ".mask"]) == (s, s):
            return face
        return self.prepare(face)  # not prepared (or for another crop size): slow, once per switch

    def _source(self, faces: Sources, n: int) -> None:
        rows = self._changed_rows(faces, n)
        if not rows:
            return
        ops = self.ops
        uploaded: dict[int, tuple[Any, ...]] = {}
        for _, face in rows:  # every face prepared (it may raise) before any row changes
            if id(face) not in uploaded:
                lat = self._prepared(face).latents
                m = np.asarray(lat[self.name + ".mask"], np.float32)
                host = [
                    np.asarray(lat[self.name], np.float32),
                    np.asarray(lat[self.name + ".raw"], np.uint8),
                    m,
                    np.asarray(lat[self.name + ".stats"], np.float32),
                    np.asarray(lat[self.name + ".samples"], np.float32),
                ]
                if self.seamless:
                    host.append((np.float32(4) * m * (np.float32(1) - m)).astype(np.float32))  # the band: 1 mid-ramp
                if self.local_color:  # the face's colours and weight at LOCAL_SIZE (made by prepare)
                    local = (lat.get(self.name + ".local"), lat.get(self.name + ".local_w"))
                    if local[0] is None or np.shape(local[1]) != (LOCAL_SIZE, LOCAL_SIZE):
                        local = _local_colours(lat[self.name + ".raw"], m)
                    host.extend(local)
                uploaded[id(face)] = tuple(ops.asarray(np.ascontiguousarray(a)) for a in host)
        for i, face in rows:
            dev = uploaded[id(face)]
            self._src_norm[i] = dev[0]
            self._src_raw[i] = dev[1]
            self._src_mask[i] = dev[2]
            self._src_stats[:, i] = dev[3]
            self._samples[i] = dev[4]
            if self._band is not None:
                self._band[i] = dev[5]
            if self.local_color:
                self._lc_src[i] = dev[-2]
                self._lc_srcw[i] = dev[-1]
        self._commit(faces, rows)

    # -- frame side -------------------------------------------------------------------------------
    def _swap(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        n = self._check(parts)
        self._source(faces, n)
        if self.dense:
            return self._swap_dense(parts, n)
        masks = self._src_mask[:n]
        if n == 0 or not (self.color_match or self.seamless):
            return self._src_raw[:n], masks
        ops = self.ops
        for frame, mats, lo, hi in self._rows(parts):
            warp.warp_crops(ops, frame, mats, self.crop_size, out=self._crops[lo:hi])
        crops = self._crops[:n]
        lab = color.lab_from_bgr(ops, crops, n, self._lab[:n])
        if self.color_match:
            mean, std = self._mean[:n], self._std[:n]
            _weighted_stats(ops.xp, lab, self._w, self._wsum, self._tmp[:n], mean, std)
            scale, shift = std.reshape(n, 3), mean.reshape(n, 3)
        else:  # the source's own colours: norm * std_s + mean_s
            scale, shift = self._src_stats[1, :n], self._src_stats[0, :n]
        membrane = None
        if self.seamless:
            membrane = color.lab_membrane(
                ops, lab, self._src_norm[:n], self._band[:n], n, self._membrane[:n], scale, shift, self.sigma, self.clip
            )
        out = color.bgr_from_lab(ops, self._src_norm[:n], n, self._out[:n], scale, shift, membrane)
        return out, masks

    def _swap_dense(self, parts: list[tuple[Any, np.ndarray]], n: int) -> tuple[Any, Any]:
        """The dense swap's half before the paste: each face's colour map (n, 12) from the target's
        statistics (the rows :meth:`paste` renders with) and the box mask."""
        ops, t = self.ops, self._stats_size
        if n == 0:
            return self._affine[:0], self.mask
        if self.color_match:
            k = t / self.crop_size  # the statistics crop: the swapper's crop at t pixels
            for frame, mats, lo, hi in self._rows(parts):
                m = mats * k
                m[:, :, 2] += 0.5 * k - 0.5
                # statistics: within a level of the exact warp on the CPU, in a fifth of its time
                warp.warp_crops(ops, frame, m, t, out=self._crops[lo:hi], exact=False)
        # The target's statistics and the colour fit in one launch (the buffers whole: the kernel
        # reads the first n faces; no per-frame views).
        src_mean, src_std = self._src_stats_rows
        classic.color_fit_crops(
            ops, self._crops, self._w2d, self._wsum, self._samples, src_mean, src_std, n, self.color_match, self._affine
        )
        return self._affine[:n], self.mask

    def _dense_source(self, face: SourceFace) -> tuple[list[Any], np.ndarray, dict[tuple[int, bool], np.ndarray]]:
        """The source pyramid in the ops' memory, the source's landmarks and their warp control
        points per layout (``{(5 or 68, posed): points}``, filled on first use) (uploaded once per face; the
        last ``2 * max_faces`` faces are kept)."""
        hit = self._dense_sources.get(id(face))
        if hit is not None and hit[0] is face:
            return hit[1], hit[2], hit[3]
        lat = self._prepared(face).latents
        levels, k = [], 0
        # On the CPU in float32 (what the paste samples: converted once, not a region every frame)
        dtype = np.uint8 if on_device(self.ops) else np.float32
        while f"{self.name}.level{k}" in lat:
            levels.append(self.ops.asarray(np.ascontiguousarray(lat[f"{self.name}.level{k}"], dtype)))
            k += 1
        pts = np.asarray(lat[self.name + ".points"], np.float64)
        while len(self._dense_sources) >= 2 * self.max_faces:
            self._dense_sources.pop(next(iter(self._dense_sources)))
        self._dense_sources[id(face)] = (face, levels, pts, {})
        return levels, pts, self._dense_sources[id(face)][3]

    def paste(
        self,
        frame: Any,
        crops: Any,
        crop_from_frame: np.ndarray,
        mask: Any,
        count: int,
        *,
        sources: Sources,
        landmarks: Any,
        dense: Any = None,
    ) -> Any:
        """Blend ``count`` swapped faces into ``frame`` in place. The dense swap renders each source
        warped onto the target's ``landmarks`` (F, 5 or 68, 2) in frame pixels, at the frame's
        resolution, with the colour maps ``crops`` of :meth:`swap` and the paste ``mask`` (crop
        space); ``dense`` (F, 68, 2): a landmarker's points, used for each face where they agree
        with its 5 (:func:`~vcam.stages.swap_classic.plausible`). Otherwise the crops are pasted
        (:func:`vcam.kernels.paste.paste_back`)."""
        from vcam.kernels.paste import paste_back

        n = int(count)
        if not self.dense:
            return paste_back(self.ops, frame, crops, crop_from_frame, mask, n)
        mats = np.asarray(crop_from_frame, np.float64).reshape(-1, 2, 3)[:n]
        faces = [sources] * n if isinstance(sources, SourceFace) else list(sources)
        lms = np.asarray(landmarks, np.float64)[:n]
        d68 = None if dense is None else np.asarray(dense, np.float64)[:n]
        target = []
        for f in range(n):  # 68 points where the landmarker's agree with the face's 5
            pts = lms[f]
            if d68 is not None and pts.shape[0] == 5 and swap_classic.plausible(d68[f], pts):
                pts = d68[f]
            target.append(vmask.to_crop(pts[None], mats[f : f + 1])[0])
        splines = np.empty(n, classic.SPLINE)
        origins = np.empty((n, 3), np.float64)
        images = []
        for f in range(n):
            levels, pts, controls = self._dense_source(faces[f])
            tgt, src = swap_classic.matched(target[f], pts)
            sizes = [int(lv.shape[0]) for lv in levels]
            splines[f : f + 1], origins[f], level = swap_classic.warp_grid(tgt, src, mats[f], sizes, controls)
            images.append(levels[level])
        with self.ops.activate():
            grids = classic.tps_nodes(self.ops, splines, n, self._grids)  # on the device there
            offsets = self._local_offsets(frame, crops, mask, mats, n) if self.local_color else None
            return classic.classic_paste(self.ops, frame, images, grids, origins, crops, mask, mats, n, offsets)

    def _local_offsets(self, frame: Any, affine: Any, mask: Any, mats: np.ndarray, n: int) -> Any:
        """The local colour match's offsets (n, LOCAL_GRID, LOCAL_GRID, 3) float32 (see
        :data:`LOCAL_SIZE`), in the aligned crop: the target's crop at LOCAL_SIZE pixels against each
        row's source crop there through its colour map, ``a`` the source's face weight times the
        paste mask (the warp moves the source's features onto the target's by a pixel or two at
        this size: nothing at the blur's scale), then ``blur(a * (target - swapped)) / blur(a)``."""
        ops, xp, q, s = self.ops, self.ops.xp, LOCAL_SIZE, self.crop_size
        k = q / s
        small = mats * k
        small[:, :, 2] += 0.5 * k - 0.5
        # within a level of the exact warp on the CPU (an estimate, blurred below), in a tenth of its time
        target = warp.warp_crops(ops, frame, small, q, out=self._lc_target[:n], exact=False)
        # Two-operand einsums throughout: small products that stay off the BLAS threads on the CPU.
        down, ein = self._lc_down, xp.einsum
        rows_of = mask[:n] if mask.ndim == 3 else mask[None]
        if isinstance(mask, np.ndarray) and s % q == 0:  # the area means as block sums: 0.05 ms, not 0.17
            r = s // q
            block = rows_of.reshape(-1, q, r, s).sum(2).reshape(-1, q, q, r).sum(3)
            a = self._lc_srcw[:n] * (block * np.float32(1.0 / (r * r)))
        else:
            a = self._lc_srcw[:n] * ein("fik,jk->fij", ein("il,flk->fik", down, rows_of), down)
        rows = affine[:n].reshape(n, 3, 4)
        swapped = ein("fpk,fck->fpc", self._lc_src[:n], rows[:, :, :3]) + rows[:, None, :, 3]
        diff = (target.reshape(n, q * q, 3).astype(np.float32) - swapped) * a.reshape(n, q * q, 1)
        g = self._lc_blur  # (og, q): the blur down the rows, then along them
        num = ein("jk,fikc->fijc", g, ein("il,flkc->fikc", g, diff.reshape(n, q, q, 3)))
        den = ein("jk,fik->fij", g, ein("il,flk->fik", g, a))
        off = num / (den[..., None] + self._lc_floor)
        return xp.clip(off, -LOCAL_LIMIT, LOCAL_LIMIT).astype(np.float32)


def _local_colours(raw: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A source crop's colours at :data:`LOCAL_SIZE` (means over its paste mask ``mask`` only), as
    ((q * q, 3), its weight (q, q)), float32. Two two-operand einsums: the three-operand one
    (no contraction order) took 0.4-0.9 s on 2 CPU cores, in the first swapped frame."""
    m = np.asarray(mask, np.float32)
    down = _area_matrix(m.shape[0], LOCAL_SIZE)
    weighed = np.asarray(raw, np.float32) * m[..., None]
    w = down @ m @ down.T
    colours = np.einsum("ikc,jk->ijc", np.einsum("il,lkc->ikc", down, weighed), down) / np.maximum(w, 1e-6)[..., None]
    return colours.reshape(-1, 3).astype(np.float32), w.astype(np.float32)


def _area_matrix(size: int, q: int) -> np.ndarray:
    """(q, size) float32: row i averages the pixels of the i-th of q equal spans of ``size`` (a
    pixel straddling two spans shared by its overlap)."""
    edges = np.arange(q + 1) * (size / q)
    lo, hi = np.arange(size)[None, :], np.arange(1, size + 1)[None, :]
    overlap = np.clip(np.minimum(hi, edges[1:, None]) - np.maximum(lo, edges[:-1, None]), 0, None)
    return (overlap / (size / q)).astype(np.float32)


def paste_faces(
    ops: Any,
    swapper: Any,
    frame: Any,
    crops: Any,
    mats: np.ndarray,
    mask: Any,
    n: int,
    sources: Sources,
    landmarks: Any,
    dense: Any = None,
) -> Any:
    """Blend the ``n`` swapped faces into ``frame``: through the swapper's own ``paste`` where it has
    one (the dense classic swap draws at the frame's resolution from the target's ``landmarks``, or
    the 68 ``dense`` points of a landmarker), else :func:`vcam.kernels.paste.paste_back` of its crops."""
    render = getattr(swapper, "paste", None)
    if render is not None:
        return render(frame, crops, mats, mask, n, sources=sources, landmarks=landmarks, dense=dense)
    from vcam.kernels.paste import paste_back

    return paste_back(ops, frame, crops, mats, mask, n)


def _box(size: int) -> np.ndarray:
    from vcam.kernels.paste import box_mask

    return box_mask(size)


class IdentitySwapper(SwapperBase):
    """Returns the target crops unchanged."""

    name = "identity"

    def _swap(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        n = self._check(parts)
        for frame, mats, lo, hi in self._rows(parts):
            warp.warp_crops(self.ops, frame, mats, self.crop_size, out=self._crops[lo:hi])
        return self._crops[:n], self.mask


class SolidSwapper(SwapperBase):
    """Fills every crop with one BGR colour."""

    name = "solid"

    def __init__(self, crop_size: int = 128, color: tuple[int, int, int] = (255, 0, 255), **kw: Any) -> None:
        super().__init__(crop_size, **kw)
        with self.ops.activate():
            self._crops[...] = self.ops.asarray(np.array(color, dtype=np.uint8))

    def _swap(self, parts: list[tuple[Any, np.ndarray]], faces: Sources) -> tuple[Any, Any]:
        return self._crops[: self._check(parts)], self.mask


def make_builtin(
    name: str,
    *,
    crop_size: int = 128,
    color_match: bool = True,
    seamless: bool = False,
    ops: Any = None,
    mask: Any = None,
    max_faces: int = 8,
    local_color: bool = True,
) -> SwapperBase:
    """A built-in swapper by name: 'classic', 'identity' or 'solid' (``color_match``, ``seamless`` and
    ``local_color`` are the classic swap's ``[swap]`` keys)."""
    kw = {"ops": ops, "mask": mask, "max_faces": max_faces}
    if name == "classic":
        return ClassicSwapper(crop_size, color_match, seamless=seamless, local_color=local_color, **kw)
    if name == "identity":
        return IdentitySwapper(crop_size, **kw)
    if name == "solid":
        return SolidSwapper(crop_size, **kw)
    raise ConfigError(f"unknown built-in swapper '{name}'", hint="use 'classic' or a model from `vcam models list`")


# -- neural swappers ------------------------------------------------------------------------------


__all__ = [
    "BUILT_IN",
    "ClassicSwapper",
    "IdentitySwapper",
    "SolidSwapper",
    "Swapper",
    "face_region",
    "make_builtin",
    "paste_faces",
]
