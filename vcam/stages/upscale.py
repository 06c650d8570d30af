"""Frame enhancer (optional): super-resolution of the whole output frame, tiled, with feathered seams.

A super-resolution model of the registry's ``upscaler`` kind (Real-ESRGAN x2/x4) turns the frame
(H, W) into (scale*H, scale*W). The model never sees the whole frame: memory is bounded by the tile
and the batch, not the frame, and an engine with CUDA graphs sees one fixed input shape.

Tiles. The frame is covered by ``tile`` x ``tile`` input tiles on a grid of stride ``tile - overlap``
per axis, row-major; the last row and column are shifted back so they end on the frame's edge, so
when the frame is at least a tile in both directions no tile reaches outside it. Along an axis
shorter than a tile one tile starts at 0 and its outside part repeats the edge pixels (the
warp-crop's replicate border); only its inside part is used. Each batch of ``batch`` tiles is cut
straight into the engine's input by :func:`vcam.kernels.warp.warp_crops_normalized` (a translation:
exact pixels, RGB / 255), run in one engine call, and accumulated at once (the engine's outputs are
its own buffers, valid until its next call).

Seams. A network's output is wrong near a tile's edges (its convolutions see zero padding there
instead of the neighbouring pixels), and two tiles' outputs differ a little over their overlap. So
every output pixel is the weighted mean of the tiles that cover it,
``out = sum_t w_t * v_t / sum_t w_t``, with a separable weight ``w_t = p(ty) * p(tx)`` per tile: 1 in
the tile's body, and across the ``scale * overlap`` output pixels next to a side that borders another
tile the upper half of a Gaussian, ``exp(-((M - d) / sigma)^2 / 2)`` at a pixel centre ``d`` pixels
from that side, ``M`` the margin and ``sigma = M / 3``: ~0.01 at the edge, 0.14 a third of the way
in, 0.61 two thirds in, smooth (no kink) where it meets 1. A side on the frame's border is never feathered, so the
border is not darkened. The weights depend on the geometry alone (:func:`feather_profile`: four
profiles of one tile side, chosen per tile by :func:`tile_grid`'s flags).

The accumulation and normalisation are the kernels of :mod:`vcam.kernels.tiles` (NumPy on the CPU,
``kernels/tiles.cu`` on CUDA); on CUDA nothing in :meth:`FrameEnhancer.enhance`
waits for the host and nothing is allocated after the first frame of a size. FP16 guard: a tile whose
output holds NaN/Inf contributes the bilinear resize of its input region instead (the cheap path),
and is counted (:meth:`FrameEnhancer.guarded`). :meth:`FrameEnhancer.resize` is that cheap path for
the whole frame, to the same output size, when the daemon skips the stage (``[upscale] drop_first``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.errors import ModelError
from vcam.kernels import tiles, warp
from vcam.models import registry
from vcam.models.registry import ModelSpec
from vcam.ops import make_ops

LEFT, RIGHT, TOP, BOTTOM = 1, 2, 4, 8  # feathered sides (tile_grid's flags)


# -- geometry -------------------------------------------------------------------------------------
def tile_positions(length: int, tile: int, overlap: int) -> list[int]:
    """Tile starts along one axis: stride ``tile - overlap``, the last one ending on the edge; [0]
    when the axis is no longer than a tile."""
    if length <= tile:
        return [0]
    stride = max(1, tile - overlap)
    return list(range(0, length - tile, stride)) + [length - tile]


def tile_grid(width: int, height: int, tile: int, overlap: int) -> tuple[np.ndarray, np.ndarray]:
    """Every tile of a ``width`` x ``height`` frame, row-major: origins (T, 2) int64 (x, y, input
    pixels) and flags (T,) int32, the sides that border another tile (LEFT | RIGHT | TOP | BOTTOM);
    a side on the frame's border is never feathered."""
    xs, ys = tile_positions(width, tile, overlap), tile_positions(height, tile, overlap)
    origins = np.array([(x, y) for y in ys for x in xs], np.int64).reshape(-1, 2)
    x, y = origins[:, 0], origins[:, 1]
    flags = ((x > 0) * LEFT + (x + tile < width) * RIGHT + (y > 0) * TOP + (y + tile < height) * BOTTOM).astype(np.int32)
    return origins, flags


def feather_profile(size: int, margin: int) -> np.ndarray:
    """(4, size) float32 weight profiles of one tile side (output pixels): row ``k`` feathers the low
    side when ``k & 1`` and the high side when ``k & 2`` over ``margin`` pixels (see the module
    docstring); row 0 is all ones."""
    d = np.arange(size, dtype=np.float64) + 0.5  # pixel centres from the low edge
    m = float(margin)

    def ramp(dist: np.ndarray) -> np.ndarray:
        if m <= 0:
            return np.ones_like(dist)
        sigma = m / 3.0
        return np.where(dist >= m, 1.0, np.exp(-0.5 * ((m - dist) / sigma) ** 2))

    lo, hi = ramp(d), ramp(size - d)
    return np.stack([np.ones(size), lo, hi, lo * hi]).astype(np.float32)


# -- the stage ------------------------------------------------------------------------------------
#: Frame sizes whose buffers the frame enhancer keeps at once (one per stream size).
MAX_SIZES = 4


class FrameEnhancer:
    """Tiled super-resolution of whole frames with registry model ``spec`` (an ``upscaler``) on
    ``engine`` (see the module docstring).

    ``tile``: tile side in input pixels (rounded down to a multiple of 4, as the x2 model's pixel
    unshuffle needs an even side; an engine whose file fixes the input size dictates it instead);
    ``overlap``: input pixels shared by neighbouring tiles (at most half a tile); ``batch``: tiles per
    engine call (at most the engine's ``max_batch``). Buffers are made for a frame size on its first
    frame (or :meth:`configure`) and kept (up to :data:`MAX_SIZES` sizes, for streams of different
    sizes); then :meth:`enhance` allocates nothing and, on CUDA, never waits.
    """

    def __init__(
        self, spec: ModelSpec | str, engine: Any, *, ops: Any = None, tile: int = 256, overlap: int = 32, batch: int = 4
    ) -> None:
        if ops is None:  # frames in host memory
            ops = make_ops("cpu")
        self.spec = registry.of_kind(spec, "upscaler")
        if self.spec.output != "unit":
            raise ModelError(f"{self.spec.name}: the frame enhancer reads [0, 1] outputs, the row says {self.spec.output}")
        self.name = self.spec.name
        self.scale = int(self.spec.scale)
        self.engine = engine
        self.ops = ops
        info = engine.inputs[0]
        self._input = info.name
        dims = tuple(info.shape[2:])
        self.fixed = len(dims) == 2 and all(isinstance(d, int) for d in dims)
        if self.fixed:
            if dims[0] != dims[1]:
                raise ModelError(f"{self.name}: the file's input is {dims[1]}x{dims[0]}; the frame enhancer cuts square tiles")
            self.tile = int(dims[0])
        else:
            self.tile = max(8, int(tile) - int(tile) % 4)
        out_dims = tuple(engine.outputs[0].shape[2:]) if engine.outputs else ()
        if len(out_dims) == 2 and all(isinstance(d, int) for d in out_dims) and self.fixed:
            if out_dims != (self.tile * self.scale,) * 2:
                raise ModelError(
                    f"{self.name}: the file maps {self.tile} px to {out_dims[0]} px, the registry says x{self.scale}",
                    hint="this is not the expected model file; check the name",
                )
        self.overlap = max(0, min(int(overlap), self.tile // 2))
        self.batch = max(1, min(int(batch), int(getattr(engine, "max_batch", batch))))
        self._mean255, self._std255 = self.spec.input_mean_std_255
        self._weights = ops.asarray(feather_profile(self.tile * self.scale, self.overlap * self.scale))
        self._guard = ops.empty((self.batch,), np.int32)
        self._size: tuple[int, int] | None = None
        # Buffers of each frame size seen (several streams of different sizes share the enhancer).
        self._sizes: dict[tuple[int, int], tuple] = {}
        self._batches: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self._feeds: dict[int, dict[str, Any]] = {}
        self._acc: Any = None
        self._out: Any = None
        self.tiles = 0

    # -- geometry ---------------------------------------------------------------------------------
    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(W, H) of the enhanced frame of a ``width`` x ``height`` frame."""
        return self.scale * int(width), self.scale * int(height)

    def configure(self, width: int, height: int) -> None:
        """Tiles, engine inputs (CUDA graphs are captured here) and buffers for this frame size; a
        no-op for the size already configured."""
        if self._size == (width, height):
            return
        cached = self._sizes.pop((width, height), None)
        if cached is not None:  # another stream's size, configured before: switch to it
            self._sizes[(width, height)] = cached
            self._batches, self._feeds, self._acc, self._out, self.tiles = cached
            self._size = (width, height)
            return
        t, s = self.tile, self.scale
        origins, flags = tile_grid(width, height, t, self.overlap)
        batches = []
        for start in range(0, origins.shape[0], self.batch):
            o = origins[start : start + self.batch]
            mats = np.zeros((o.shape[0], 2, 3), np.float64)  # crop_from_frame: a translation
            mats[:, 0, 0] = mats[:, 1, 1] = 1.0
            mats[:, :, 2] = -o
            batches.append((o.shape[0], mats, o * s, flags[start : start + self.batch].copy()))
        shapes = {self._input: (3, t, t)}
        feeds = {n: self.engine.input_buffers(n, shapes) for n in sorted({b[0] for b in batches})}
        ow, oh = self.output_size(width, height)
        while len(self._sizes) >= MAX_SIZES:  # the least recently used size's buffers go first
            self._sizes.pop(next(iter(self._sizes)))
        self._acc = self._out = None
        self._acc = self.ops.empty((oh, ow, 4), np.float32)
        self._out = self.ops.empty((oh, ow, 3), np.uint8)
        self._batches, self._feeds, self._size = batches, feeds, (width, height)
        self.tiles = int(origins.shape[0])
        self._sizes[(width, height)] = (batches, feeds, self._acc, self._out, self.tiles)

    def warmup(self, width: int, height: int) -> None:
        """Configure for this size and enhance one black frame (kernel builds, engine autotuning), so
        the first live frame pays for nothing."""
        frame = self.ops.asarray(np.zeros((height, width, 3), np.uint8))
        self.enhance(frame)
        self.ops.synchronize()

    # -- per frame --------------------------------------------------------------------------------
    def enhance(self, frame: Any, out: Any = None) -> Any:
        """``frame`` (H, W, 3) uint8 BGR in the ops' memory -> (scale*H, scale*W, 3) uint8 BGR: ``out``,
        or the enhancer's own buffer (valid until its next call)."""
        h, w = frame.shape[:2]
        self.configure(w, h)
        ops, acc = self.ops, self._acc
        out = self._out if out is None else out
        with ops.activate():
            acc.fill(0)
            for n, mats, origins, flags in self._batches:
                feeds = self._feeds[n]
                warp.warp_crops_normalized(
                    ops, frame, mats, self.tile, self._mean255, self._std255, self.spec.rgb, out=feeds[self._input]
                )
                y = self.engine.run_device(feeds, stream=ops.stream)[0]
                tiles.accumulate_tiles(ops, y, n, origins, flags, self._weights, acc, self._guard, frame, self.spec.rgb)
            return tiles.normalize_tiles(ops, acc, out)

    def resize(self, frame: Any, out: Any = None) -> Any:
        """The cheap path: ``frame`` resized bilinearly to :meth:`output_size` (into ``out``, or the
        same buffer :meth:`enhance` returns)."""
        h, w = frame.shape[:2]
        self.configure(w, h)
        with self.ops.activate():
            return tiles.resize_bilinear(self.ops, frame, self._out if out is None else out)

    # -- reporting --------------------------------------------------------------------------------
    def guarded(self) -> int:
        """Tiles whose output held NaN/Inf and were replaced by the resize, since the start."""
        return int(self.ops.to_host(self._guard).sum())

    def describe(self) -> str:
        fixed = ", fixed by the file" if self.fixed else ""
        tiles = f"{self.tiles} tile{'s' if self.tiles != 1 else ''} of " if self.tiles else "tiles of "
        return (
            f"{self.name} x{self.scale}: {tiles}{self.tile} px{fixed} (overlap {self.overlap}, {self.batch} a call): "
            f"{self.engine.describe()}"
        )


__all__ = [
    "FrameEnhancer",
    "feather_profile",
    "tile_grid",
    "tile_positions",
]
