"""The frame enhancer (issue 12 part 2): tiles, feathered seams, the Real-ESRGAN stand-ins, the CUDA twins.

CPU tests use the tiny RRDBNet stand-ins (one block, 16 features) on small frames; the GPU tests
(``ops``/``device`` fixtures, marked ``gpu``) compare the CUDA kernels and the whole stage on CUDA
with the NumPy twins and skip cleanly without a GPU.
"""

from __future__ import annotations

import json
import time

import cv2
import numpy as np
import pytest
from conftest import host, need_torch, poisoned

from vcam.config import Config
from vcam.engines import TensorInfo, create_engine
from vcam.errors import ConfigError, ModelError
from vcam.kernels import tiles
from vcam.kernels.tiles import accumulate_tiles_ref, normalize_tiles_ref
from vcam.models import registry, standin
from vcam.models.download import ModelStore
from vcam.runtime.roles import build as build_role
from vcam.stages import upscale
from vcam.stages.upscale import FrameEnhancer, feather_profile, tile_grid, tile_positions

UPSCALERS = ["real_esrgan_x2", "real_esrgan_x2_fp16", "real_esrgan_x4", "real_esrgan_x4_fp16"]


def _picture(w: int = 96, h: int = 80) -> np.ndarray:
    from vcam.stages import demo

    return np.ascontiguousarray(cv2.resize(demo.portrait("astronaut"), (w, h), interpolation=cv2.INTER_AREA))


_ENGINES: dict = {}


def _tiny_engine(name: str, backend: str = "onnxruntime", device: str = "cpu", max_batch: int = 4, fp16: bool = False):
    """The tiny stand-in with dynamic H and W (any tile side, and the untiled run), cached per module."""
    key = (name, backend, device, max_batch, fp16)
    if key not in _ENGINES:
        model = standin.build_upscaler(registry.get(name), tiny=True, dynamic=True).SerializeToString()
        _ENGINES[key] = create_engine(model, name=name, backend=backend, device=device, max_batch=max_batch, fp16=fp16)
    return _ENGINES[key]


def _untiled(engine, frame: np.ndarray) -> np.ndarray:
    """The model on the whole frame at once, rounded to uint8 BGR like the stage."""
    x = (frame[..., ::-1].astype(np.float32) / 255).transpose(2, 0, 1)[None].copy()
    y = engine.run({"input": x})[0][0]
    return np.floor(np.clip(y, 0, 1) * np.float32(255) + np.float32(0.5)).astype(np.uint8)[::-1].transpose(1, 2, 0)


class NearestEngine:
    """A fake upscaler: nearest-neighbour x``scale`` of its input (exact), NaN for the tiles whose
    running index is in ``nan``; runs on NumPy or CuPy arrays, whichever it is fed."""

    backend, device, precision = "fake", "cpu", "fp32"

    def __init__(self, scale: int, max_batch: int = 4, nan=()):
        self.scale, self.max_batch, self.nan, self.seen = scale, max_batch, set(nan), 0
        self.inputs = [TensorInfo("input", ("N", 3, "H", "W"), "float32")]
        self.outputs = [TensorInfo("output", ("N", 3, "H", "W"), "float32")]
        self._bufs: dict = {}

    def describe(self) -> str:
        return "nearest"

    def input_buffers(self, n, shapes=None):
        shape = tuple(shapes["input"])
        if shape not in self._bufs:
            self._bufs[shape] = np.zeros((self.max_batch, *shape), np.float32)
        return {"input": self._bufs[shape][:n]}

    def run_device(self, feeds, stream=None):
        x = feeds["input"]
        xp = np if isinstance(x, np.ndarray) else __import__("cupy")
        y = xp.repeat(xp.repeat(x, self.scale, axis=2), self.scale, axis=3)
        for i in range(x.shape[0]):
            if self.seen + i in self.nan:
                y[i, :, 3:5, 2] = xp.nan
        self.seen += x.shape[0]
        return [y]


class CupyNearestEngine(NearestEngine):
    def input_buffers(self, n, shapes=None):
        import cupy

        shape = tuple(shapes["input"])
        if shape not in self._bufs:
            self._bufs[shape] = cupy.zeros((self.max_batch, *shape), cupy.float32)
        return {"input": self._bufs[shape][:n]}


# -- geometry ---------------------------------------------------------------------------------------
def test_tile_grid_covers_the_frame_from_inside():
    assert tile_positions(100, 48, 16) == [0, 32, 52]  # stride 32, the last one ends on the edge
    assert tile_positions(80, 48, 16) == [0, 32]
    assert tile_positions(48, 48, 16) == [0] and tile_positions(30, 48, 16) == [0]  # shorter: one padded tile
    for w, h, t, o in ((100, 80, 48, 16), (37, 29, 12, 4), (30, 200, 48, 24), (256, 256, 64, 0)):
        origins, flags = tile_grid(w, h, t, o)
        cover = np.zeros((h, w), int)
        for (x, y), f in zip(origins, flags):
            cover[y : y + t, x : x + t] += 1
            assert (x + t <= w or x == 0) and (y + t <= h or y == 0)  # inside whenever the frame is larger
            assert bool(f & upscale.LEFT) == (x > 0) and bool(f & upscale.RIGHT) == (x + t < w)
            assert bool(f & upscale.TOP) == (y > 0) and bool(f & upscale.BOTTOM) == (y + t < h)
        assert cover.min() >= 1
        assert list(origins[:, 1]) == sorted(origins[:, 1])  # row-major


def test_feather_profile_is_a_gaussian_shoulder_and_one_inside():
    size, m = 96, 24
    p = feather_profile(size, m)
    assert p.shape == (4, size) and p.dtype == np.float32
    np.testing.assert_array_equal(p[0], 1.0)
    lo, hi = p[1], p[2]
    np.testing.assert_allclose(hi, lo[::-1])
    assert lo[0] < 0.02 and (lo[m:] == 1.0).all()  # ~0 at the edge, 1 beyond the margin
    assert (np.diff(lo[: m + 1]) > 0).all()  # rising across the margin
    d = np.arange(m) + 0.5
    np.testing.assert_allclose(lo[:m], np.exp(-0.5 * ((m - d) / (m / 3)) ** 2), rtol=1e-6)
    np.testing.assert_allclose(p[3], lo * hi, rtol=1e-6)
    np.testing.assert_array_equal(feather_profile(16, 0), 1.0)  # no overlap: hard tiles


# -- (a) the accumulation against a direct float64 computation ---------------------------------------
def _case(seed: int, dtype=np.float32):
    """Tiles of a 37x29 frame at x2 (12 px input tiles, overlap 4), model output with values outside
    [0, 1], one NaN tile; returns everything accumulate_tiles takes."""
    rng = np.random.default_rng(seed)
    w, h, t, o, s = 37, 29, 12, 4, 2
    origins, flags = tile_grid(w, h, t, o)
    n = origins.shape[0]
    out = rng.uniform(-0.2, 1.2, (n, 3, t * s, t * s)).astype(dtype)
    out[3, 1, 5, 7] = np.nan
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return out, origins * s, flags, feather_profile(t * s, o * s), frame, (h * s, w * s)


def test_accumulate_matches_a_direct_float64_computation():
    out, origins, flags, weights, frame, (oh, ow) = _case(0)
    n, size = out.shape[0], out.shape[-1]
    acc = np.zeros((oh, ow, 4), np.float32)
    guard = np.zeros(n, np.int32)
    accumulate_tiles_ref(out, n, origins, flags, weights, acc, guard, frame)
    assert guard.tolist() == [int(i == 3) for i in range(n)]
    # the oracle: every output pixel as the weighted mean over the tiles covering it, in float64,
    # weights from the formula (not from feather_profile), the NaN tile replaced by the exact resize
    num, den = np.zeros((oh, ow, 3)), np.zeros((oh, ow))
    m, sigma = 8.0, 8.0 / 3
    ramp = lambda dist: np.where(dist >= m, 1.0, np.exp(-0.5 * ((m - dist) / sigma) ** 2))  # noqa: E731
    dist = np.arange(size) + 0.5
    resized = tiles.resize_bilinear_ref(frame, np.zeros((oh, ow, 3), np.uint8))
    exact = tiles._samples(frame, 0, 0, ow, oh, 0.5, 0.5).astype(np.float64)
    assert np.abs(np.floor(exact + 0.5) - resized).max() == 0
    for i, ((x, y), f) in enumerate(zip(origins, flags)):
        wx = (ramp(dist) if f & 1 else 1.0) * (ramp(size - dist) if f & 2 else 1.0) * np.ones(size)
        wy = (ramp(dist) if f & 4 else 1.0) * (ramp(size - dist) if f & 8 else 1.0) * np.ones(size)
        wt = wy[:, None] * wx[None, :]
        ys, xs = slice(y, min(y + size, oh)), slice(x, min(x + size, ow))
        hh, ww = ys.stop - y, xs.stop - x
        v = exact[ys, xs] if i == 3 else np.clip(out[i].astype(np.float64), 0, 1)[::-1].transpose(1, 2, 0)[:hh, :ww] * 255
        num[ys, xs] += wt[:hh, :ww, None] * v
        den[ys, xs] += wt[:hh, :ww]
    np.testing.assert_allclose(acc[..., 3], den, rtol=1e-5)
    np.testing.assert_allclose(acc[..., :3], num, rtol=1e-5, atol=1e-3)
    got = normalize_tiles_ref(acc, np.zeros((oh, ow, 3), np.uint8))
    ref = num / den[..., None]
    assert np.abs(got - ref).max() <= 0.5 + 1e-3  # rounded, never further than half a level
    # no pixel rests on the ~0 weights of feathered edges alone (the least: where 4 tiles overlap)
    assert den.min() > 0.4


def test_normalize_rounds_and_handles_no_weight():
    acc = np.array([[[10.0, 20.0, 30.5, 2.0], [0.0, 0.0, 0.0, 0.0], [600.0, -3.0, 127.4, 1.0]]], np.float32)
    out = normalize_tiles_ref(acc, np.full((1, 3, 3), 77, np.uint8))
    assert out.tolist() == [[[5, 10, 15], [0, 0, 0], [255, 0, 127]]]


# -- the whole stage on the CPU ---------------------------------------------------------------------
@pytest.mark.parametrize("w,h,tile,overlap", [(37, 29, 12, 4), (96, 80, 32, 16), (20, 50, 32, 8), (64, 64, 64, 16)])
@pytest.mark.parametrize("scale", [2, 4])
def test_tiles_put_back_an_exact_model_exactly(ops, w, h, tile, overlap, scale):
    """With a model that is exact (nearest x scale), the tiled result is exactly the model's: every
    tile position, the padded tiles of a frame smaller than a tile and the feathering leave no trace."""
    engine = (CupyNearestEngine if ops.device == "cuda" else NearestEngine)(scale)
    frame = np.random.default_rng(w + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
    fe = FrameEnhancer(f"real_esrgan_x{scale}", engine, ops=ops, tile=tile, overlap=overlap, batch=3)
    dev = ops.asarray(frame) if ops.device != "cpu" else frame
    got = host(ops, fe.enhance(dev, out=poisoned(ops, (h * scale, w * scale, 3), np.uint8)))
    np.testing.assert_array_equal(got, frame.repeat(scale, 0).repeat(scale, 1))
    assert fe.guarded() == 0


def test_a_nan_tile_falls_back_to_the_resize_and_is_counted(ops):
    w, h = 40, 30
    frame = np.random.default_rng(3).integers(0, 256, (h, w, 3), dtype=np.uint8)
    engine = (CupyNearestEngine if ops.device == "cuda" else NearestEngine)(2, nan=[1])
    fe = FrameEnhancer("real_esrgan_x2", engine, ops=ops, tile=16, overlap=4, batch=4)
    dev = ops.asarray(frame) if ops.device != "cpu" else frame
    got = host(ops, fe.enhance(dev)).astype(int)
    assert fe.guarded() == 1
    origins, _ = tile_grid(w, h, 16, 4)
    assert origins[:3].tolist() == [[0, 0], [12, 0], [24, 0]]
    resized = tiles.resize_bilinear_ref(frame, np.zeros((h * 2, w * 2, 3), np.uint8)).astype(int)
    nearest = frame.repeat(2, 0).repeat(2, 1).astype(int)
    own = (slice(0, 24), slice(32, 48))  # tile 1's alone (output px): its weight 1, no other tile there
    assert np.abs(got[own] - resized[own]).max() <= 1
    elsewhere = (slice(40, 60), slice(0, 40))
    np.testing.assert_array_equal(got[elsewhere], nearest[elsewhere])
    fe.enhance(dev)
    assert fe.guarded() == 1  # the NaN was the 2nd tile of the run only


def test_resize_is_the_cheap_path_to_the_same_size(ops):
    frame = np.random.default_rng(5).integers(0, 256, (31, 45, 3), dtype=np.uint8)
    fe = FrameEnhancer("real_esrgan_x4", NearestEngine(4), ops=ops, tile=16, overlap=4)
    dev = ops.asarray(frame) if ops.device != "cpu" else frame
    got = host(ops, fe.resize(dev))
    assert got.shape == (124, 180, 3) and fe.output_size(45, 31) == (180, 124)
    ref = tiles.resize_bilinear_ref(frame, np.zeros((124, 180, 3), np.uint8))
    assert np.abs(got.astype(int) - ref).max() <= 1


# -- (b) tiled == untiled ---------------------------------------------------------------------------
# The tiny stand-in's receptive field (radius, input pixels): x4 runs conv_first, 15 dense-block convs
# and conv_body at the input's resolution (17 px), then 4 convs at 2x and 4x (under 1.5 px): about
# 18 px, so an overlap of 24 keeps every tile's zero-padded border inside its neighbour's body. x2
# runs the same 17 convs after the pixel unshuffle, at half resolution: about 37 px, so overlap 40.
@pytest.mark.parametrize("name,tile,overlap", [("real_esrgan_x4", 48, 24), ("real_esrgan_x2", 80, 40)])
def test_tiled_equals_untiled(name, tile, overlap):
    frame = _picture(96, 80)
    engine = _tiny_engine(name)
    ref = _untiled(engine, frame)
    fe = FrameEnhancer(name, engine, tile=tile, overlap=overlap, batch=4)
    got = fe.enhance(frame)
    assert fe.tiles > 1 and got.shape == ref.shape
    d = np.abs(got.astype(int) - ref)
    assert d.max() <= 4 and d.mean() < 0.1, (d.max(), d.mean())
    hard = FrameEnhancer(name, engine, tile=tile, overlap=0, batch=4).enhance(frame)
    assert np.abs(hard.astype(int) - ref).max() > 20  # without the overlap the tiles' borders show


# -- (c) seams --------------------------------------------------------------------------------------
def _seam_energy(img: np.ndarray, edges_x, edges_y, period: int) -> tuple[float, float]:
    """Mean |difference| of neighbouring rows/columns across the tile edges, and across every other
    ``period``-th row/column (the same phase of the upsampling pattern) at least 3 px from an edge."""
    f = img.astype(np.float64)
    seam, other = [], []
    for axis, edges in ((1, edges_x), (0, edges_y)):
        d = np.abs(np.diff(f, axis=axis)).mean(axis=(0, 2) if axis == 1 else (1, 2))  # d[c-1]: c-1 | c
        seam += [d[e - 1] for e in edges]
        other += [d[c - 1] for c in range(period, img.shape[axis], period) if min(abs(c - e) for e in edges) > 2]
    return float(np.mean(seam)), float(np.mean(other))


@pytest.mark.parametrize("name", ["real_esrgan_x4", "real_esrgan_x2"])
def test_seams_do_not_show(name):
    """Gradient energy across the tile edges against elsewhere: ~1 with the feathered overlap; a
    naive tiling (no overlap: hard cuts) makes it several times larger on the same picture, so the
    metric sees seams. Normalised by the same ratio of the untiled output (the picture's own edges)."""
    w, h, tile = 96, 80, 32
    frame = _picture(w, h)
    engine = _tiny_engine(name)
    ref = _untiled(engine, frame)
    s = registry.get(name).scale
    ratios = {}
    for overlap in (16, 0):
        fe = FrameEnhancer(name, engine, tile=tile, overlap=overlap, batch=4)
        out = fe.enhance(frame)
        origins, _ = tile_grid(w, h, tile, overlap)
        ex = sorted({int(s * e) for x in origins[:, 0] for e in (x, x + tile) if 0 < s * e < s * w})
        ey = sorted({int(s * e) for y in origins[:, 1] for e in (y, y + tile) if 0 < s * e < s * h})
        seam, other = _seam_energy(out, ex, ey, 2 * s)
        seam0, other0 = _seam_energy(ref, ex, ey, 2 * s)
        ratios[overlap] = (seam / other, (seam / other) / (seam0 / other0))
    feathered, naive = ratios[16], ratios[0]  # measured: ~(0.95, 1.02) and ~(2.8-3.9, 4-5.6)
    assert feathered[0] < 1.2 and feathered[1] < 1.1, ratios
    assert naive[0] > 2.5 and naive[1] > 2.5, ratios


# -- (d) CUDA twins (the ``ops`` fixture: NumPy always, CUDA where present) ---------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_accumulate_and_normalize_parity(ops, dtype):
    out, origins, flags, weights, frame, (oh, ow) = _case(1, dtype)
    n = out.shape[0]
    ref_acc = np.zeros((oh, ow, 4), np.float32)
    ref_guard = np.zeros(n, np.int32)
    accumulate_tiles_ref(out, n, origins, flags, weights, ref_acc, ref_guard, frame)
    ref = normalize_tiles_ref(ref_acc, np.zeros((oh, ow, 3), np.uint8))
    acc, guard = ops.asarray(np.zeros((oh, ow, 4), np.float32)), ops.asarray(np.zeros(n, np.int32))
    d = (lambda a: ops.asarray(np.array(a, copy=True))) if ops.device != "cpu" else (lambda a: np.array(a, copy=True))
    tiles.accumulate_tiles(ops, d(out), n, origins, flags, d(weights), acc, guard, d(frame))
    got = host(ops, tiles.normalize_tiles(ops, acc, poisoned(ops, (oh, ow, 3), np.uint8)))
    np.testing.assert_allclose(host(ops, acc), ref_acc, rtol=1e-6, atol=1e-4)
    assert host(ops, guard).tolist() == ref_guard.tolist()
    assert np.abs(got.astype(int) - ref).max() <= 1


def test_accumulate_parity_more_tiles_than_a_launch(ops):
    """70 small tiles of an odd frame in one call (kernels/tiles.cu takes 64 a launch)."""
    rng = np.random.default_rng(7)
    w, h, t, o, s = 61, 47, 8, 2, 2
    origins, flags = tile_grid(w, h, t, o)
    n = origins.shape[0]
    assert n > 64
    out = rng.random((n, 3, t * s, t * s), dtype=np.float32)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    weights = feather_profile(t * s, o * s)
    ref = np.zeros((h * s, w * s, 4), np.float32)
    accumulate_tiles_ref(out, n, origins * s, flags, weights, ref, np.zeros(n, np.int32), frame, rgb=False)
    acc = ops.asarray(np.zeros_like(ref))
    dev = (lambda a: ops.asarray(np.array(a, copy=True))) if ops.device != "cpu" else (lambda a: a)
    tiles.accumulate_tiles(
        ops, dev(out), n, origins * s, flags, dev(weights), acc, ops.asarray(np.zeros(n, np.int32)), dev(frame), False
    )
    np.testing.assert_allclose(host(ops, acc), ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("w,h,ow,oh", [(45, 31, 90, 62), (37, 29, 148, 116), (64, 48, 100, 75)])
def test_resize_bilinear_parity(ops, w, h, ow, oh):
    frame = np.random.default_rng(w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    dev = ops.asarray(frame) if ops.device != "cpu" else frame
    got = host(ops, tiles.resize_bilinear(ops, dev, poisoned(ops, (oh, ow, 3), np.uint8)))
    ref = tiles.resize_bilinear_ref(frame, np.zeros((oh, ow, 3), np.uint8))
    assert np.abs(got.astype(int) - ref).max() <= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["real_esrgan_x2", "real_esrgan_x4"])
def test_frame_enhancer_on_each_device_matches_the_cpu(device, name):
    """The stage on ``device`` (torch engine; CUDA ops on cuda) against the CPU stage (NumPy ops,
    onnxruntime): an odd frame, border tiles, a last partial batch. On CUDA also: no host transfer
    and no new memory per frame, and FP16 close to FP32."""
    need_torch()
    from vcam.ops import make_ops
    from vcam.ops.numpy import NumpyOps

    frame = _picture(75, 53)
    kw = dict(tile=32, overlap=12, batch=5)
    ref = FrameEnhancer(name, _tiny_engine(name, max_batch=5), ops=NumpyOps(), **kw).enhance(frame)
    ops = make_ops(device)
    fe = FrameEnhancer(name, _tiny_engine(name, "torch", device, max_batch=5), ops=ops, **kw)
    assert fe.tiles == 0 and fe.tile == 32
    dev = ops.asarray(frame) if device != "cpu" else frame
    got = host(ops, fe.enhance(dev))
    assert fe.tiles == 12  # 4 x 3: batches of 5, 5 and 2
    d = np.abs(got.astype(int) - ref)
    assert d.max() <= 2 and d.mean() < 0.05, (d.max(), d.mean())
    assert fe.guarded() == 0 and name in fe.describe()
    if device == "cuda":
        import cupy

        ops.synchronize()
        pool = cupy.get_default_memory_pool()
        before, used = ops.transfers.snapshot(), pool.used_bytes()
        for _ in range(2):
            fe.enhance(dev)
        ops.synchronize()
        assert ops.transfers.snapshot() == before and pool.used_bytes() == used
        half = FrameEnhancer(name, _tiny_engine(name, "torch", "cuda", max_batch=5, fp16=True), ops=ops, **kw)
        d16 = np.abs(host(ops, half.enhance(dev)).astype(int) - ref)
        assert d16.mean() < 1.0, d16.mean()


# -- (e) registry rows and stand-ins ----------------------------------------------------------------
def test_upscaler_rows():
    assert "upscaler" in registry.KINDS
    assert [m.name for m in registry.by_kind("upscaler")] == UPSCALERS
    for name in UPSCALERS:
        spec = registry.get(name)
        assert spec.base == "models-3.0.0" and spec.file == f"{name}.onnx" and "BSD-3-Clause" in spec.licence
        assert spec.scale == (2 if "x2" in name else 4) and spec.output == "unit" and spec.rgb
        assert spec.input_mean_std_255 == ((0.0,) * 3, (255.0,) * 3)  # RGB / 255
        assert spec.inputs[0].shape == ("N", 3, 256, 256) and spec.outputs[0].shape == (
            "N",
            3,
            256 * spec.scale,
            256 * spec.scale,
        )
        assert spec.approx_mb > 0


def test_standin_is_rrdbnet():
    """The stand-in against an independent RRDBNet written with torch (basicsr's forward), with the
    stand-in's own weights: the same output. The full size has Real-ESRGAN's weight counts."""
    torch = need_torch()
    import torch.nn.functional as F
    from onnx import numpy_helper

    assert standin.count_parameters(standin.build("real_esrgan_x4")) == 16_697_987  # RealESRGAN_x4plus
    for name in ("real_esrgan_x2", "real_esrgan_x4"):
        spec = registry.get(name)
        model = standin.build_upscaler(spec, tiny=True, dynamic=True)
        wt = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in model.graph.initializer}

        def conv(t, n):
            return F.conv2d(t, wt[n + ".weight"], wt[n + ".bias"], padding=1)

        def lrelu(t):
            return F.leaky_relu(t, 0.2)

        x = torch.from_numpy(np.random.default_rng(0).random((2, 3, 24, 40), dtype=np.float32))
        fea = conv(F.pixel_unshuffle(x, 2) if spec.scale == 2 else x, "conv_first")
        trunk = fea
        for r in range(1, 4):  # one RRDB block in the tiny variant
            rdb_in, parts = trunk, [trunk]
            for k in range(1, 6):
                y = conv(torch.cat(parts, 1), f"body.0.rdb{r}.conv{k}")
                parts.append(lrelu(y))
            trunk = y * 0.2 + rdb_in
        trunk = trunk * 0.2 + fea
        fea = fea + conv(trunk, "conv_body")
        for k in (1, 2):
            fea = lrelu(conv(F.interpolate(fea, scale_factor=2, mode="nearest"), f"conv_up{k}"))
        ref = conv(lrelu(conv(fea, "conv_hr")), "conv_last").numpy()
        got = _tiny_engine(name).run({"input": x.numpy()})[0]
        assert got.shape == (2, 3, 24 * spec.scale, 40 * spec.scale)
        np.testing.assert_allclose(got, ref, atol=1e-5)


def test_registry_standin_loads_through_open_engine(tmp_path):
    """`vcam models stand-in real_esrgan_x2 --tiny` in the models dir, then the frame enhancer built by its role:
    the file fixes 256-px tiles (the registry's shape), which the stage takes over its config."""
    from dataclasses import replace

    from typer.testing import CliRunner

    from vcam.cli.models import app

    r = CliRunner().invoke(app, ["stand-in", "real_esrgan_x2", "--out", str(tmp_path), "--tiny"])
    assert r.exit_code == 0, r.output
    cfg = Config()
    cfg = cfg.replace(
        models=replace(cfg.models, dir=str(tmp_path)), upscale=replace(cfg.upscale, model="real_esrgan_x2", tile=128)
    )
    fe = build_role("upscaler", cfg, store=ModelStore(tmp_path), device="cpu")
    assert fe.fixed and fe.tile == 256 and fe.scale == 2 and fe.batch == cfg.upscale.batch
    assert fe.engine.max_batch == cfg.upscale.batch
    frame = _picture(96, 80)
    out = fe.enhance(frame)
    assert out.shape == (160, 192, 3) and fe.tiles == 1  # smaller than a tile: one padded tile
    near = cv2.resize(frame, (192, 160), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out.astype(int) - near).mean() < 40  # the stand-in passes the picture through
    assert "real_esrgan_x2 x2: 1 tile of 256 px, fixed by the file" in fe.describe()
    with pytest.raises(ModelError, match="is an enhancer, not an upscaler"):
        build_role("upscaler", cfg.replace(upscale=replace(cfg.upscale, model="gfpgan_1.4")), store=ModelStore(tmp_path))
    with pytest.raises(ConfigError, match="frame enhancer is off"):
        build_role("upscaler", Config())
    with pytest.raises(ModelError, match="not an upscaler"):
        FrameEnhancer("gfpgan_1.4", NearestEngine(2))


# -- the benchmark ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_runs_on_the_cpu(tmp_path):
    from benchmarks import upscale as bench

    path = tmp_path / "bench.json"
    payload = bench.main(
        ["--device", "cpu", "--tiny", "--sizes", "64x48", "--peak", "80x64", "--frames", "2", "--untiled", "--json", str(path)]
    )
    data = json.loads(path.read_text())
    assert data["device"] == "cpu" and data["model"] == "real_esrgan_x2" and payload["results"]
    row = data["results"][0]
    assert row["input"] == [64, 48] and row["output"] == [128, 96] and row["enhance_ms_mean"] > 0
    assert row["resize_ms_mean"] > 0 and row["untiled_ms_mean"] > 0
    assert data["peak"]["input"] == [80, 64] and data["peak"]["output"] == [160, 128]


# -- (g) the stage in the daemon --------------------------------------------------------------------
def _daemon_cfg(models, **extra):
    from vcam.config_file import build

    data = {
        "capture": {"input": "demo", "width": 160, "height": 120},
        "pipeline": {"device": "cpu"},
        "models": {"dir": str(models)},
        "upscale": {"model": "real_esrgan_x2", "tile": 64, "overlap": 16, "batch": 4},
        "status": {"interval": "0.1s"},
    }
    for table, values in extra.items():
        data.setdefault(table, {}).update(values)
    return build(data)


@pytest.fixture(scope="module")
def x2_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("x2")
    standin.write("real_esrgan_x2", d, tiny=True)
    return d


@pytest.mark.slow
def test_vcam_run_upscales_every_frame_of_a_file(x2_models, tmp_path):
    """`vcam run --upscale real_esrgan_x2` to a file: every frame written, at twice the size, and the
    summary names where the upscaler ran."""
    import av
    from conftest import vcam_cli

    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[models]\ndir = '{x2_models}'\n[upscale]\ntile = 64\noverlap = 16\n[capture]\nwidth = 160\nheight = 120\n")
    out = tmp_path / "big.mp4"
    r = vcam_cli(
        "run",
        "-c",
        str(cfg),
        "--input",
        "demo",
        "--output",
        f"file:{out}",
        "--frames",
        "6",
        "--device",
        "cpu",
        "--quiet",
        "--upscale",
        "real_esrgan_x2",
    )
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert "upscaler real_esrgan_x2" in text and "published of 6" in text, text
    assert "enhancer skipped" not in text  # a file conversion enhances every frame, however slow
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="bgr24") for f in c.decode(video=0)]
    assert len(frames) == 6 and frames[0].shape == (240, 320, 3)


@pytest.mark.slow
def test_an_enhancer_over_the_budget_is_skipped_before_frames_are_dropped(x2_models, monkeypatch):
    """A 30 fps source, a latency budget and an enhancer that takes twice the budget: with
    drop_first (default) the frames are resized instead and published in time, the skip counted
    and shown in the status; without it, the frames miss the budget and are dropped.

    The budget is three times the frame's latency without the enhancer, measured here first (45 ms
    at least, the budget on an idle machine), so the frames fit it on a busy machine too."""
    from vcam.runtime.daemon import Daemon
    from vcam.stages.outputs import NullOutput
    from vcam.stages.upscale import FrameEnhancer
    from vcam.status import status_suffix

    def cfg(**extra):
        return _daemon_cfg(x2_models, capture={"pacing": "realtime"}, degrade={"enabled": False}, **extra)

    calib = Daemon(cfg(pipeline={"max_latency": 0}, upscale={"model": ""}), output=NullOutput(160, 120), control=False)
    calib.run(duration=1.0)
    budget = max(0.045, 3 * calib.summary.percentile(90) / 1e3)
    enhance = FrameEnhancer.enhance

    def slow(self, frame, out=None):
        time.sleep(2 * budget)
        return enhance(self, frame, out)

    monkeypatch.setattr(FrameEnhancer, "enhance", slow)
    runs = {}
    for drop_first in (True, False):
        statuses = []
        d = Daemon(
            cfg(pipeline={"max_latency": f"{budget * 1e3:.0f}ms"}, upscale={"drop_first": drop_first}),
            output=NullOutput(320, 240),
            control=False,
            on_status=lambda s, a, w: statuses.append(s),
        )
        d.run(duration=max(2.0, 25 * budget))  # 10 frames at least through the enhancer without drop_first
        runs[drop_first] = (d.summary, statuses[-1])
    kept, status = runs[True]
    why = f"budget {budget * 1e3:.0f} ms: {kept.line()}"
    assert kept.upscale_skipped > 0.5 * kept.frames_in and kept.frames_out > 0.8 * kept.frames_in, why
    assert "upscale skipped" in status_suffix(status) and "frame enhancer skipped on" in kept.line()
    plain, _ = runs[False]
    # Without it the frames miss the budget: dropped, or published late where the camera would freeze.
    missed = plain.dropped_latency + plain.published_late
    assert plain.upscale_skipped == 0 and missed > 0.5 * plain.frames_in, plain.line()


def test_frames_of_two_sizes_alternate_without_rebuilding():
    """Two streams of different sizes share one enhancer: each size is configured once, then
    frames alternate between them with the same results as alone."""
    engine = _tiny_engine("real_esrgan_x2")
    fe = FrameEnhancer("real_esrgan_x2", engine, tile=48, overlap=16, batch=4)
    a, b = _picture(96, 80), _picture(64, 112)
    want = {k: np.array(fe.enhance(img), copy=True) for k, img in (("a", a), ("b", b))}
    bufs = {}
    for k, img in (("a", a), ("b", b), ("a", a), ("b", b)):
        got = fe.enhance(img)
        bufs.setdefault(k, got)
        assert got is bufs[k]  # the size's own buffer, not a new one
        np.testing.assert_array_equal(got, want[k])
