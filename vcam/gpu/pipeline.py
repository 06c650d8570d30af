"""The per-frame pipeline on the GPU: one upload and one download per frame.

    host pinned ring slot --(copy stream, H2D)--> raw device slot --event--> compute stream:
    to_bgr -> detector_input (ROIs from the previous frame's tracks | full scan) -> detector ->
    top-K on device -> [readback: a few KB of candidates] -> host NMS + tracker -> warp all faces
    -> swap (one batched call) -> paste-back all faces -> output colour --event--> copy stream:
    D2H into the pinned output slot.

Frame N+1's upload runs on the copy stream while frame N computes, and frame N's download overlaps
frame N+1's compute (use :meth:`GpuPipeline.submit` / :meth:`GpuPipeline.collect`; ``process`` is
submit + collect). Device buffers are allocated at start for the frame size and ``max_faces``; the
face batch is fixed-size with a valid count (swapper graphs per batch bucket). Per-frame matrices
and regions travel by value in kernel parameter blocks. Every host<->device copy goes through
:class:`Transfers`, which counts them (the tests assert one upload, one download and one detection
readback per frame).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import align as align_ref
from .. import blend as blend_ref
from ..convert import DETECTOR_MEAN, frame_shape
from ..errors import DeviceError, InputError
from ..types import Detection, Frame, FrameStats, PixelFormat, Track
from . import align as galign
from . import blend as gblend
from . import convert as gconvert


class Transfers:
    """All host<->device copies of the GPU path, counted. Pinned host buffers make them async."""

    def __init__(self) -> None:
        self.h2d = 0
        self.d2h = 0
        self.h2d_bytes = 0
        self.d2h_bytes = 0

    def upload(self, dst: Any, src: np.ndarray, stream: Any) -> None:
        dst.set(src.reshape(dst.shape), stream=stream)
        self.h2d += 1
        self.h2d_bytes += src.nbytes

    def download(self, dst: np.ndarray, src: Any, stream: Any) -> None:
        src.get(stream=stream, out=dst.reshape(src.shape))
        self.d2h += 1
        self.d2h_bytes += dst.nbytes

    def snapshot(self) -> tuple[int, int]:
        return self.h2d, self.d2h


def pinned(shape: tuple, dtype: Any = np.uint8) -> np.ndarray:
    """A page-locked host array (allocated once; async copies need it)."""
    import cupy

    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    mem = cupy.cuda.alloc_pinned_memory(max(n, 1))
    return np.frombuffer(mem, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


def _torch_stream(stream: Any) -> Any:
    import torch

    return torch.cuda.ExternalStream(stream.ptr)


class _Graphed:
    """A torch module run through CUDA graphs, one per input shape, with static input buffers.

    ``inputs(shape)`` returns the static input tensors for that shape (write into them, e.g. from a
    CuPy kernel through DLPack), ``run(shape, stream)`` replays the graph on ``stream`` and returns
    the static outputs. Graphs are captured on first use of a shape (warm-up does that at start).
    """

    def __init__(self, module: Any, make_inputs: Callable[[tuple], tuple], use_graphs: bool = True) -> None:
        self.module = module
        self.make_inputs = make_inputs
        self.use_graphs = use_graphs
        self._entries: dict[tuple, tuple] = {}

    def inputs(self, key: tuple) -> tuple:
        e = self._entries.get(key)
        if e is None:
            e = self._capture(key)
        return e[0]

    def _capture(self, key: tuple) -> tuple:
        import torch

        ins = self.make_inputs(key)
        if not self.use_graphs:
            e = (ins, None, None)
            self._entries[key] = e
            return e
        import gc

        # Objects freed during capture (old graphs, CuPy buffers) would invalidate it: free them now.
        gc.collect()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(3):
                self.module(*ins)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(g):
            outs = self.module(*ins)
        e = (ins, g, outs)
        self._entries[key] = e
        return e

    def run(self, key: tuple, stream: Any) -> Any:
        import torch

        e = self._entries.get(key) or self._capture(key)
        ins, g, outs = e
        with torch.cuda.stream(_torch_stream(stream)), torch.inference_mode():
            if g is None:
                return self.module(*ins)
            g.replay()
            return outs


class GpuRetinaFace:
    """RetinaFace on the GPU with the :class:`vcam.detect.Detector` interface, frames as CuPy arrays.

    ``module``: a torch module ``x (N, 3, H, W) -> (loc, conf, landmarks)`` (default: the embedded
    weights in the native module of :mod:`vcam.engines.retinaface_torch`). The model's top ``top_k`` candidates per image
    are picked on the device; only they are read back (one small D2H through ``transfers``) and
    decoded, filtered and NMS'd on the host with the same arithmetic as ``vcam.detect``.
    """

    def __init__(self, cfg: Any = None, roi_size: int = 160, *, module: Any = None, fp16: bool = True,
                 max_regions: int = 8, transfers: Transfers | None = None, stream: Any = None,
                 top_k: int = 16, use_graphs: bool = True) -> None:
        import cupy
        import torch

        from ..config import DetectConfig

        self.cfg = cfg or DetectConfig()
        self.roi_size = int(roi_size)
        self.fp16 = bool(fp16)
        self.dtype = torch.float16 if fp16 else torch.float32
        if module is None:
            from ..engines.retinaface_torch import load_retinaface_from_onnx

            module = load_retinaface_from_onnx().to(device="cuda", dtype=self.dtype).eval()
            if self.fp16:  # channels-last is faster for this network in FP16 (docs/engines.md)
                module = module.to(memory_format=torch.channels_last)
        self.max_regions = int(max_regions)
        self.top_k = int(top_k)
        self.transfers = transfers or Transfers()
        self.stream = stream or cupy.cuda.Stream(non_blocking=True)
        self._graphs = _Graphed(self._forward(module), self._make_inputs, use_graphs)
        # Readback buffer: per image top_k x [score, loc(4), landmarks(10), prior index].
        self._host = pinned((max(self.max_regions, 1), self.top_k, 16), np.float32)
        self._done = cupy.cuda.Event(disable_timing=True)
        self._priors: dict[tuple[int, int], np.ndarray] = {}

    def _make_inputs(self, key: tuple) -> tuple:
        import torch

        n, h, w = key
        return (torch.zeros((n, 3, h, w), device="cuda", dtype=self.dtype),)

    def _forward(self, module: Any) -> Callable:
        import torch

        k = self.top_k

        def fwd(x: Any) -> Any:
            loc, conf, lmk = module(x)
            score = conf[..., 1].float()
            kk = min(k, score.shape[1])
            top, idx = torch.topk(score, kk, dim=1)
            loc_k = torch.gather(loc.float(), 1, idx[..., None].expand(-1, -1, 4))
            lmk_k = torch.gather(lmk.float(), 1, idx[..., None].expand(-1, -1, 10))
            packed = torch.cat([top[..., None], loc_k, lmk_k, idx[..., None].float()], dim=2)
            if kk < k:
                packed = torch.nn.functional.pad(packed, (0, 0, 0, k - kk), value=-1.0)
            return packed

        return fwd

    def _priors_for(self, h: int, w: int) -> np.ndarray:
        from ..detect import priors

        p = self._priors.get((h, w))
        if p is None:
            p = self._priors[(h, w)] = priors(h, w).astype(np.float64)
        return p

    def _full_shape(self, h: int, w: int) -> tuple[int, int, float]:
        from ..detect import _ALIGN, _round_up

        side = float(max(h, w))
        size = int(self.cfg.size)
        in_h = min(size, _round_up(math.ceil(h * size / side), _ALIGN))
        in_w = min(size, _round_up(math.ceil(w * size / side), _ALIGN))
        return in_h, in_w, side

    def warmup(self, height: int, width: int) -> None:
        """Capture the graphs for a full scan of this frame size and 1..max_regions ROIs."""
        in_h, in_w, _ = self._full_shape(height, width)
        self._graphs.inputs((1, in_h, in_w))
        for n in range(1, self.max_regions + 1):
            self._graphs.inputs((n, self.roi_size, self.roi_size))

    def _run(self, frame: Any, rects: np.ndarray, size: int, in_h: int, in_w: int) -> np.ndarray:
        import cupy

        n = rects.shape[0]
        key = (n, in_h, in_w)
        (x,) = self._graphs.inputs(key)
        xin = cupy.from_dlpack(x)
        if (in_h, in_w) == (size, size):
            gconvert.detector_input(frame, rects, size, DETECTOR_MEAN, out=xin, stream=self.stream)
        else:  # full scan trimmed to what covers the frame: letterbox into a scratch, copy the window
            full = self._scratch(size, xin.dtype)
            gconvert.detector_input(frame, rects, size, DETECTOR_MEAN, out=full, stream=self.stream)
            with self.stream:
                xin[...] = full[:, :, :in_h, :in_w]
        packed = self._graphs.run(key, self.stream)
        dev = cupy.from_dlpack(packed)
        self.transfers.download(self._host[:n], dev, self.stream)
        self._done.record(self.stream)
        self._done.synchronize()  # the one host wait of the frame: a few KB of candidates
        return self._host[:n]

    def _scratch(self, size: int, dtype: Any) -> Any:
        import cupy

        s = getattr(self, "_full_buf", None)
        if s is None or s.shape[2] != size or s.dtype != dtype:
            s = self._full_buf = cupy.empty((1, 3, size, size), dtype=dtype)
        return s

    def _decode(self, cand: np.ndarray, h: int, w: int, to_frame: tuple[float, float, float]) -> list[Detection]:
        """Candidates read back as rows [score, loc(4), landmarks(10), prior index] -> detections."""
        from ..detect import decode

        c = cand[cand[:, 0] >= self.cfg.score]
        if not len(c):
            return []
        pri = self._priors_for(h, w)[c[:, 15].astype(np.int64)]
        return decode(pri, c[:, 1:5], c[:, 5:15], c[:, 0], h, w, to_frame, self.cfg)

    # -- Detector interface (frames are CuPy (H, W, 3) uint8 BGR) ----------------------------
    def detect(self, frame_bgr: Any) -> list[Detection]:
        h, w = frame_bgr.shape[:2]
        in_h, in_w, side = self._full_shape(h, w)
        size = int(self.cfg.size)
        cand = self._run(frame_bgr, np.array([[0.0, 0.0, side]]), size, in_h, in_w)
        return self._decode(cand[0], in_h, in_w, (0.0, 0.0, side / size))

    def detect_regions(self, frame_bgr: Any, rects: np.ndarray) -> list[list[Detection]]:
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 3)
        if rects.shape[0] == 0:
            return []
        if rects.shape[0] > self.max_regions:
            raise ValueError(f"at most {self.max_regions} regions per frame, got {rects.shape[0]}")
        s = self.roi_size
        cand = self._run(frame_bgr, rects, s, s, s)
        return [self._decode(cand[r], s, s, (rects[r, 0], rects[r, 1], rects[r, 2] / s)) for r in range(rects.shape[0])]


class GpuClassicSwapper:
    """Classic swap on the GPU (CuPy ops): the source crop colour-matched to each target face with
    the weighted per-channel statistics of ``vcam.swap.ClassicSwapper`` (same weights, same formula)."""

    name = "classic"
    template = "arcface_128"

    def __init__(self, crop_size: int = 128, color_match: bool = True, *, max_faces: int = 8) -> None:
        import cupy

        from ..swap import ClassicSwapper, face_ellipse

        self.cpu = ClassicSwapper(crop_size, color_match)
        self.crop_size = int(crop_size)
        self.color_match = bool(color_match)
        self._w = cupy.asarray(face_ellipse(self.crop_size))[None, :, :, None]
        self._wsum = float(self.cpu._wsum)
        self._crops = cupy.empty((max_faces, crop_size, crop_size, 3), dtype=cupy.uint8)
        self._out = cupy.empty_like(self._crops)
        self._face_key: Any = None
        self._norm = self._raw = None
        self.guard = cupy.zeros(max_faces, dtype=cupy.int32)

    def prepare(self, face: Any) -> Any:
        return self.cpu.prepare(face)

    def _source(self, face: Any) -> None:
        import cupy

        if self._face_key is not face:  # once per face switch, not per frame
            face = self.cpu.prepare(face) if self.cpu.name not in face.latents else face
            self._norm = cupy.asarray(face.latents[self.cpu.name])
            self._raw = cupy.asarray(face.latents[self.cpu.name + ".raw"])
            self._face_key = face

    def swap_frame(self, frame: Any, mats: np.ndarray, face: Any, stream: Any) -> Any:
        import cupy

        n = mats.shape[0]
        self._source(face)
        crops = galign.warp_crops(frame, mats, self.crop_size, out=self._crops[:n], stream=stream)
        out = self._out[:n]
        with stream:
            if not self.color_match:
                out[...] = self._raw[None]
                return out
            x = crops.astype(cupy.float32)
            mean = (x * self._w).sum(axis=(1, 2), keepdims=True) / self._wsum
            var = (((x - mean) ** 2) * self._w).sum(axis=(1, 2), keepdims=True) / self._wsum
            std = cupy.sqrt(var) + 1e-3
            y = self._norm[None] * std + mean
            out[...] = cupy.clip(cupy.floor(y + 0.5), 0, 255).astype(cupy.uint8)
        return out


class GpuIdentitySwapper:
    """Returns the warped target crops unchanged (GPU twin of ``vcam.swap.IdentitySwapper``)."""

    name = "identity"
    template = "arcface_128"

    def __init__(self, crop_size: int = 128, *, max_faces: int = 8) -> None:
        import cupy

        self.crop_size = int(crop_size)
        self._crops = cupy.empty((max_faces, crop_size, crop_size, 3), dtype=cupy.uint8)
        self.guard = cupy.zeros(max_faces, dtype=cupy.int32)

    def prepare(self, face: Any) -> Any:
        return face

    def swap_frame(self, frame: Any, mats: np.ndarray, face: Any, stream: Any) -> Any:
        n = mats.shape[0]
        return galign.warp_crops(frame, mats, self.crop_size, out=self._crops[:n], stream=stream)


class GpuNeuralSwapper:
    """A neural swapper (inswapper layout: ``target`` (N, 3, S, S) RGB [0, 1], ``source`` (N, 512))
    on PyTorch, FP16, channels-last, one CUDA graph per batch bucket (1, 2, 4, 8, ... max_faces).

    The warp kernel writes the model input in place (DLPack view of the graph's static input); the
    output goes through the FP16 guard kernel into uint8 BGR crops for the paste-back.
    """

    template = "arcface_128"

    def __init__(self, module: Any, *, name: str = "inswapper_128", crop_size: int = 128, max_faces: int = 8,
                 fp16: bool = True, channels_last: bool = True, latent: Callable[[Any], np.ndarray] | None = None,
                 use_graphs: bool = True, compile: bool = False, buckets: Any = None) -> None:
        import cupy
        import torch

        self.name = name
        self.crop_size = int(crop_size)
        self.max_faces = int(max_faces)
        self.dtype = torch.float16 if fp16 else torch.float32
        module = module.to("cuda", dtype=self.dtype)
        if channels_last:
            module = module.to(memory_format=torch.channels_last)
        self.module = module.eval()
        self.compiled = bool(compile)
        if compile:  # Triton convolutions (max-autotune); captured in the CUDA graphs below
            from ..engines.torch import compile_module

            self.module = compile_module(self.module)
        self.channels_last = channels_last
        self._latent_fn = latent
        s = self.crop_size
        self._target = torch.zeros((self.max_faces, 3, s, s), device="cuda", dtype=self.dtype)
        self._source_t = torch.zeros((self.max_faces, 512), device="cuda", dtype=self.dtype)
        self._target_cp = cupy.from_dlpack(self._target)
        # Batch sizes with a captured graph (each costs a compile with ``compile``): powers of two up to
        # max_faces by default; a face count runs in the smallest bucket that holds it.
        self.buckets = sorted(set(buckets)) if buckets else sorted(
            {min(self.max_faces, 1 << k) for k in range(0, max(1, self.max_faces).bit_length() + 1)})
        if self.buckets[-1] < self.max_faces:
            self.buckets.append(self.max_faces)
        self._graphs = _Graphed(self._fwd, self._inputs_for, use_graphs)
        self._crops = cupy.empty((self.max_faces, s, s, 3), dtype=cupy.uint8)
        self.guard = cupy.zeros(self.max_faces, dtype=cupy.int32)
        self._face_key: Any = None

    def _inputs_for(self, key: tuple) -> tuple:
        (b,) = key
        return (self._target[:b], self._source_t[:b])

    def _fwd(self, target: Any, source: Any) -> Any:
        import torch

        if self.channels_last:
            target = target.contiguous(memory_format=torch.channels_last)
        return self.module(target, source).contiguous()

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def warmup(self) -> None:
        """Capture (and with ``compile``, compile) every batch bucket now, before the first frame."""
        import logging

        if self.compiled:
            logging.getLogger(__name__).warning(
                "compiling the swap network for batch sizes %s: about 2 minutes each on the first start, "
                "cached afterwards", ", ".join(map(str, self.buckets)))
        for b in self.buckets:
            self._graphs.inputs((b,))

    def prepare(self, face: Any) -> Any:
        return face

    def _source(self, face: Any) -> None:
        import torch

        if self._face_key is not face:  # once per face switch
            lat = face.latents.get(self.name) if face is not None else None
            if lat is None and self._latent_fn is not None:
                lat = self._latent_fn(face)
            if lat is None:
                lat = np.zeros(512, np.float32)
            self._source_t.copy_(torch.as_tensor(np.asarray(lat, np.float32).reshape(1, 512)).expand(self.max_faces, 512))
            self._face_key = face

    def swap_frame(self, frame: Any, mats: np.ndarray, face: Any, stream: Any) -> Any:
        n = mats.shape[0]
        self._source(face)
        b = self.bucket(n)
        galign.warp_crops_normalized(frame, mats, self.crop_size, (0.0, 0.0, 0.0), (255.0, 255.0, 255.0), True,
                                     out=self._target_cp[:n], stream=stream)
        out = self._graphs.run((b,), stream)
        import cupy

        galign.crops_from_planar(cupy.from_dlpack(out), self._target_cp, n, self._crops, self.guard, stream=stream)
        return self._crops[:n]


class GpuPipeline:
    """GPU twin of :class:`vcam.pipeline.Pipeline`: ``process(frame, snap) -> (out, stats)``.

    ``tracker``: the CPU tracker logic (``update(frame, seq) -> list[Track]``) built around a GPU
    detector such as :class:`GpuRetinaFace`, so it receives the device frame and reads back only
    detections. ``swapper``: :class:`GpuClassicSwapper` or :class:`GpuNeuralSwapper`.
    ``width``/``height``/``in_fmt`` fix the buffers (a different frame size raises; rebuild the
    pipeline). ``ring``: pinned host slots per direction. ``timing``: record CUDA events between
    stages and report device milliseconds in ``stats.stages`` (``gpu_*`` keys).

    The returned output array is a view of a pinned ring slot, valid until ``ring`` more frames are
    submitted (publish or copy it before then).
    """

    def __init__(self, cfg: Any, *, tracker: Any, swapper: Any, width: int, height: int,
                 in_fmt: PixelFormat = PixelFormat.YUYV, out_fmt: PixelFormat = PixelFormat.I420,
                 face_filter: Callable | None = None, ring: int = 3, transfers: Transfers | None = None,
                 stream: Any = None, timing: bool = False) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise DeviceError("the GPU pipeline needs CuPy", hint="pip install 'fastswap-cam[cuda13]' or use --device cpu") from exc
        self.cfg = cfg
        self.tracker = tracker
        self.swapper = swapper
        self.width, self.height = int(width), int(height)
        self.in_fmt = PixelFormat(in_fmt)
        self.out_fmt = PixelFormat(out_fmt)
        self.max_faces = int(cfg.pipeline.max_faces)
        self.transfers = transfers or Transfers()
        self.compute = stream or cupy.cuda.Stream(non_blocking=True)
        self.copy = cupy.cuda.Stream(non_blocking=True)
        if face_filter is None:
            from ..pipeline import select_all, select_largest

            face_filter = select_largest if cfg.swap.faces == "largest" else select_all
        self.face_filter = face_filter
        if self.in_fmt is PixelFormat.MJPEG:
            raise InputError("the GPU pipeline's ring takes raw frames; decode MJPEG with vcam.gpu.convert.to_bgr",
                             hint="request fourcc = 'YUYV' or use --device cpu for MJPEG cameras")
        in_shape = frame_shape(self.in_fmt, self.width, self.height)
        ow, oh = self.output_size(self.width, self.height)
        out_shape = frame_shape(self.out_fmt, ow, oh)
        self.ring = int(ring)
        self._host_in = [pinned(in_shape) for _ in range(self.ring)]
        self._host_out = [pinned(out_shape) for _ in range(self.ring)]
        self._d_raw = [cupy.empty(in_shape, dtype=cupy.uint8) for _ in range(self.ring)]
        self._d_out = [cupy.empty(out_shape, dtype=cupy.uint8) for _ in range(self.ring)]
        self._d_bgr = cupy.empty((self.height, self.width, 3), dtype=cupy.uint8)
        self._d_even = cupy.empty((oh, ow, 3), dtype=cupy.uint8) if (ow, oh) != (self.width, self.height) else None
        size = swapper.crop_size
        self._mask = cupy.asarray(blend_ref.box_mask(size, cfg.swap.blur))
        self._mats = np.zeros((self.max_faces, 2, 3), dtype=np.float64)
        ev = lambda: cupy.cuda.Event(disable_timing=True)  # noqa: E731
        self._ev_up = [ev() for _ in range(self.ring)]
        self._ev_raw_free = [ev() for _ in range(self.ring)]
        self._ev_out = [ev() for _ in range(self.ring)]
        self._ev_down = [ev() for _ in range(self.ring)]
        self._timing = bool(timing)
        self._tev = {k: [cupy.cuda.Event() for _ in range(self.ring)] for k in
                     ("start", "convert_in", "detect", "align_swap", "blend", "convert_out")} if timing else {}
        self._pending: dict[int, FrameStats] = {}
        self._next = 0
        self._seq_slot: dict[int, int] = {}
        self.last_tracks: list[Track] = []

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        if self.out_fmt in (PixelFormat.I420, PixelFormat.NV12):
            return width - width % 2, height - height % 2
        return width, height

    def host_slot(self) -> np.ndarray:
        """The pinned buffer the next :meth:`submit` uploads from: a capture thread may read the
        camera straight into it (then ``frame.data`` is this array and no host copy is made)."""
        slot = self._next
        self._ev_up[slot].synchronize()  # its previous upload has left
        return self._host_in[slot]

    def _mark(self, name: str, slot: int) -> None:
        if self._timing:
            self._tev[name][slot].record(self.compute)

    def submit(self, frame: Frame, snap: Any) -> int:
        """Queue one frame; returns its slot for :meth:`collect`. Blocks only on the detection readback."""
        if (frame.width, frame.height, PixelFormat(frame.fmt)) != (self.width, self.height, self.in_fmt):
            raise InputError(f"frame is {frame.width}x{frame.height} {frame.fmt}, pipeline was built for "
                             f"{self.width}x{self.height} {self.in_fmt.value}", hint="rebuild the GPU pipeline for the new size")
        t0 = time.perf_counter()
        stats = FrameStats(seq=frame.seq, t_capture=frame.t_capture)
        slot = self._next
        self._next = (slot + 1) % self.ring
        host_in = self._host_in[slot]
        data = np.asarray(frame.data)
        if not (data.__array_interface__["data"][0] == host_in.__array_interface__["data"][0]):
            self._ev_up[slot].synchronize()
            np.copyto(host_in, data.reshape(host_in.shape))
        # Upload on the copy stream once compute is done with this raw slot and its output slot.
        self.copy.wait_event(self._ev_raw_free[slot])
        self.transfers.upload(self._d_raw[slot], host_in, self.copy)
        self._ev_up[slot].record(self.copy)
        self.compute.wait_event(self._ev_up[slot])
        self._mark("start", slot)
        gconvert.to_bgr(self._d_raw[slot], self.in_fmt, self.width, self.height, out=self._d_bgr, stream=self.compute)
        self._ev_raw_free[slot].record(self.compute)
        self._mark("convert_in", slot)
        t1 = time.perf_counter()
        tracks = self.tracker.update(self._d_bgr, frame.seq)
        self.last_tracks = tracks
        self._mark("detect", slot)
        stats.full_scan = bool(getattr(self.tracker, "last_full_scan", False))
        stats.faces = len(tracks)
        t2 = time.perf_counter()
        stats.stages["convert_in"] = t1 - t0
        stats.stages["detect_track"] = t2 - t1
        face = snap.face
        n = 0
        if snap.swap_enabled and face is not None and tracks:
            chosen = self.face_filter(tracks, self._d_bgr)[: self.max_faces]
            n = len(chosen)
            if n:
                size = self.swapper.crop_size
                for i, tr in enumerate(chosen):
                    self._mats[i] = align_ref.estimate(tr.landmarks, self.swapper.template, size)
                crops = self.swapper.swap_frame(self._d_bgr, self._mats[:n], face, self.compute)
                self._mark("align_swap", slot)
                gblend.paste_back(self._d_bgr, crops, self._mats[:n], self._mask, n, stream=self.compute)
                stats.swapped = n
        if n == 0:
            self._mark("align_swap", slot)
        self._mark("blend", slot)
        src = self._d_bgr
        if self._d_even is not None:
            ow, oh = self._d_even.shape[1], self._d_even.shape[0]
            with self.compute:
                self._d_even[...] = self._d_bgr[:oh, :ow]
            src = self._d_even
        self.compute.wait_event(self._ev_down[slot])  # the previous download from this slot has left
        gconvert.from_bgr(src, self.out_fmt, out=self._d_out[slot], stream=self.compute)
        self._mark("convert_out", slot)
        self._ev_out[slot].record(self.compute)
        self.copy.wait_event(self._ev_out[slot])
        self.transfers.download(self._host_out[slot], self._d_out[slot], self.copy)
        self._ev_down[slot].record(self.copy)
        stats.stages["host_swap_blend_out"] = time.perf_counter() - t2
        stats.stages["host_submit"] = time.perf_counter() - t0
        self._pending[slot] = stats
        return slot

    def collect(self, slot: int) -> tuple[np.ndarray, FrameStats]:
        """Wait for ``slot``'s download; returns (pinned output view, stats)."""
        self._ev_down[slot].synchronize()
        stats = self._pending.pop(slot)
        if self._timing:
            import cupy

            t = self._tev
            for a, b in (("start", "convert_in"), ("convert_in", "detect"), ("detect", "align_swap"),
                         ("align_swap", "blend"), ("blend", "convert_out")):
                stats.stages["gpu_" + b] = cupy.cuda.get_elapsed_time(t[a][slot], t[b][slot]) / 1e3
        stats.t_publish = time.perf_counter()
        return self._host_out[slot], stats

    def process(self, frame: Frame, snap: Any) -> tuple[np.ndarray, FrameStats]:
        return self.collect(self.submit(frame, snap))

    def synchronize(self) -> None:
        self.compute.synchronize()
        self.copy.synchronize()
