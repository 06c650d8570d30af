"""The per-frame pipeline on the CPU: convert -> detect/track -> align -> swap -> blend -> convert.

:class:`Pipeline` is built once at start with every stage chosen (detector, tracker, swapper, output
format) and buffers sized for the first frame; :meth:`Pipeline.process` then runs one frame with no
branching on device or configuration. The GPU twin, ``vcam.gpu.pipeline.GpuPipeline``, offers the
same ``process`` method.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import align, blend, convert
from .config import Config
from .state import Snapshot
from .swap import Swapper
from .types import Frame, FrameStats, PixelFormat, Track

FaceFilter = Callable[[list[Track], np.ndarray], list[Track]]


def select_all(tracks: list[Track], frame: np.ndarray) -> list[Track]:
    return tracks


def select_largest(tracks: list[Track], frame: np.ndarray) -> list[Track]:
    if not tracks:
        return tracks
    def area(t: Track) -> float:
        x1, y1, x2, y2 = (float(v) for v in t.box)
        return (x2 - x1) * (y2 - y1)
    return [max(tracks, key=area)]


@dataclass
class _Buffers:
    width: int
    height: int
    bgr: np.ndarray
    out: np.ndarray | None


class Pipeline:
    """CPU pipeline. ``process(frame, snap)`` returns the output image in ``out_fmt`` and stats.

    ``out_fmt``: the publisher's pixel format (BGR, RGB, I420, NV12). 4:2:0 formats need even sizes:
    odd frames are cropped by one row/column before output conversion (``output_size`` tells).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        tracker,
        swapper: Swapper,
        out_fmt: PixelFormat = PixelFormat.BGR,
        face_filter: FaceFilter | None = None,
        enhancer=None,
    ) -> None:
        self.cfg = cfg
        self.tracker = tracker
        self.swapper = swapper
        self.out_fmt = PixelFormat(out_fmt)
        self.max_faces = cfg.pipeline.max_faces
        size = swapper.crop_size
        self.mask = blend.box_mask(size, cfg.swap.blur)
        self._crops = np.empty((self.max_faces, size, size, 3), dtype=np.uint8)
        self._mats = np.zeros((self.max_faces, 2, 3), dtype=np.float64)
        if face_filter is None:
            face_filter = select_largest if cfg.swap.faces == "largest" else select_all
        self.face_filter = face_filter
        self.enhancer = enhancer
        self._buf: _Buffers | None = None
        self.last_tracks: list[Track] = []

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        if self.out_fmt in (PixelFormat.I420, PixelFormat.NV12):
            return width - width % 2, height - height % 2
        return width, height

    def _buffers(self, width: int, height: int) -> _Buffers:
        b = self._buf
        if b is None or b.width != width or b.height != height:
            ow, oh = self.output_size(width, height)
            shape = convert.frame_shape(self.out_fmt, ow, oh)
            out = None if self.out_fmt is PixelFormat.BGR else np.empty(shape, dtype=np.uint8)
            b = self._buf = _Buffers(width, height, np.empty((height, width, 3), dtype=np.uint8), out)
        return b

    def process(self, frame: Frame, snap: Snapshot) -> tuple[np.ndarray, FrameStats]:
        stats = FrameStats(seq=frame.seq, t_capture=frame.t_capture)
        t0 = time.perf_counter()
        buf = self._buffers(frame.width, frame.height)
        img = convert.to_bgr(frame.data, frame.fmt, frame.width, frame.height, out=buf.bgr)
        t1 = time.perf_counter()
        tracks = self.tracker.update(img, frame.seq)
        self.last_tracks = tracks
        stats.full_scan = bool(getattr(self.tracker, "last_full_scan", False))
        stats.faces = len(tracks)
        t2 = time.perf_counter()
        stages = stats.stages
        stages["convert_in"] = t1 - t0
        stages["detect_track"] = t2 - t1
        face = snap.face
        if snap.swap_enabled and face is not None and tracks:
            chosen = self.face_filter(tracks, img)[: self.max_faces]
            n = len(chosen)
            if n:
                size = self.swapper.crop_size
                for i, tr in enumerate(chosen):
                    self._mats[i] = align.estimate(tr.landmarks, self.swapper.template, size)
                crops = align.warp_crops(img, self._mats[:n], size, out=self._crops[:n])
                t3 = time.perf_counter()
                swapped = self.swapper.swap(crops, face)
                t4 = time.perf_counter()
                blend.paste_back(img, swapped, self._mats[:n], self.mask, n)
                if self.enhancer is not None:
                    self.enhancer.enhance(img, np.stack([tr.landmarks for tr in chosen]))
                t5 = time.perf_counter()
                stages["align"] = t3 - t2
                stages["swap"] = t4 - t3
                stages["blend"] = t5 - t4
                stats.swapped = n
                stats.guarded = int(getattr(self.swapper, "guarded", 0))
        t6 = time.perf_counter()
        if self.out_fmt is PixelFormat.BGR:
            out = img
        else:
            ow, oh = self.output_size(frame.width, frame.height)
            src = img if (ow, oh) == (frame.width, frame.height) else img[:oh, :ow]
            out = convert.from_bgr(np.ascontiguousarray(src), self.out_fmt, out=buf.out)
        stages["convert_out"] = time.perf_counter() - t6
        return out, stats
