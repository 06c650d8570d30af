"""Parity of every CUDA kernel with its NumPy twin (random inputs, odd sizes, poisoned outputs).

Tolerances: uint8 outputs within 1 level; float outputs within 1e-3 relative (norm of the difference
over the norm of the reference) and a small absolute bound per element. Needs CuPy and a CUDA GPU;
skips with the reason elsewhere (VCAM_REQUIRE=gpu turns the skip into a failure).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require
from vcam import align, blend, convert
from vcam.types import PixelFormat

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    from vcam.gpu import available

    ok, why = available()
    if not ok:
        require("gpu", why)
    import cupy

    return cupy


def _poisoned(cp, shape, dtype):
    a = cp.empty(shape, dtype=dtype)
    if np.dtype(dtype).kind == "f":
        a.fill(np.nan)
    else:
        a.fill(77)
    return a


def _close_u8(got, ref):
    d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert d.max() <= 1, f"max diff {d.max()} at {np.unravel_index(d.argmax(), d.shape)}"


def _close_f(got, ref, atol=0.05):
    got = got.astype(np.float64)
    ref = ref.astype(np.float64)
    assert np.isfinite(got).all(), "output has NaN/Inf (unwritten poisoned elements)"
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)
    assert rel <= 1e-3, f"relative error {rel:.2e}"
    assert np.abs(got - ref).max() <= atol


SIZES = [(64, 48), (33, 17), (1280, 720), (97, 131)]


@pytest.mark.parametrize("w,h", SIZES)
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "GRAY", "BGRA", "YUYV", "NV12", "I420"])
def test_to_bgr(cp, fmt, w, h):
    from vcam.gpu import convert as gconvert

    rng = np.random.default_rng(w * 7 + h)
    if fmt in ("YUYV",) and w % 2:
        w += 1
    if fmt in ("NV12", "I420") and (w % 2 or h % 2):
        w, h = w + w % 2, h + h % 2
    if fmt == "BGRA":
        data, pf = rng.integers(0, 256, (h, w, 4), dtype=np.uint8), PixelFormat.BGR
    elif fmt == "GRAY":
        data, pf = rng.integers(0, 256, (h, w), dtype=np.uint8), PixelFormat.GRAY
    else:
        pf = PixelFormat(fmt)
        data = rng.integers(0, 256, convert.frame_shape(pf, w, h), dtype=np.uint8)
    ref = convert.to_bgr(data, pf, w, h)
    out = _poisoned(cp, (h, w, 3), cp.uint8)
    gconvert.to_bgr(cp.asarray(data), pf, w, h, out=out)
    _close_u8(out.get(), ref)


@pytest.mark.parametrize("w,h", [(64, 48), (34, 18), (1920, 1080), (98, 130)])
@pytest.mark.parametrize("fmt", ["RGB", "BGR", "I420", "NV12"])
def test_from_bgr(cp, fmt, w, h):
    from vcam.gpu import convert as gconvert

    rng = np.random.default_rng(w + h)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    pf = PixelFormat(fmt)
    ref = convert.from_bgr(frame, pf)
    out = _poisoned(cp, ref.shape, cp.uint8)
    gconvert.from_bgr(cp.asarray(frame), pf, out=out)
    _close_u8(out.get(), ref)


@pytest.mark.parametrize("w,h", [(641, 359), (160, 160), (1920, 1080)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_detector_input(cp, w, h, dtype):
    from vcam.gpu import convert as gconvert

    rng = np.random.default_rng(w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    # Regions inside, straddling the border, outside, plus the full-frame letterbox; 35 > 32 (chunks).
    rects = [[0, 0, max(h, w)]]
    for _ in range(34):
        side = rng.uniform(20, 1.5 * max(h, w))
        rects.append([rng.uniform(-side, w), rng.uniform(-side, h), side])
    rects = np.array(rects)
    for size in (160, 97):
        ref = convert.detector_input(frame, rects, size)
        out = _poisoned(cp, ref.shape, dtype)
        gconvert.detector_input(cp.asarray(frame), rects, size, out=out)
        got = out.get()
        if dtype == "float16":
            _close_f(got, ref.astype(np.float16).astype(np.float64), atol=0.5)
        else:
            _close_f(got, ref)


def _random_mats(rng, n, w, h, size):
    mats = []
    for _ in range(n):
        side = rng.uniform(30, 0.8 * min(w, h) + 30)
        cx, cy = rng.uniform(-0.2 * w, 1.2 * w), rng.uniform(-0.2 * h, 1.2 * h)
        lm = (align.TEMPLATES["arcface_128"] - 0.5) * side
        ang = rng.uniform(-0.6, 0.6)
        rot = np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
        mats.append(align.estimate(lm @ rot.T + [cx, cy], "arcface_128", size))
    return np.array(mats)


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 5), (1920, 1080, 8), (199, 101, 33)])
def test_warp_crops(cp, w, h, n):
    from vcam.gpu import align as galign

    rng = np.random.default_rng(n + w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mats = _random_mats(rng, n, w, h, 128)
    for size in (128, 111):
        m = _random_mats(rng, n, w, h, size)
        ref = align.warp_crops(frame, m, size)
        out = _poisoned(cp, ref.shape, cp.uint8)
        galign.warp_crops(cp.asarray(frame), m, size, out=out)
        _close_u8(out.get(), ref)
    del mats


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 6), (1920, 1080, 8)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rgb", [True, False])
def test_warp_crops_normalized(cp, w, h, n, dtype, rgb):
    from vcam.gpu import align as galign

    rng = np.random.default_rng(n * 3 + w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mean, std = (127.5, 120.0, 110.0), (127.5, 64.0, 255.0)
    for size in (112, 128, 75):
        m = _random_mats(rng, n, w, h, size)
        ref = align.warp_crops_normalized(frame, m, size, mean, std, rgb)
        out = _poisoned(cp, ref.shape, dtype)
        galign.warp_crops_normalized(cp.asarray(frame), m, size, mean, std, rgb, out=out)
        if dtype == "float16":
            _close_f(out.get(), ref.astype(np.float16), atol=5e-3)
        else:
            _close_f(out.get(), ref, atol=1e-4)


def _paste_case(rng, w, h, n, size=128):
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mats = _random_mats(rng, n, w, h, size)
    if n > 1:  # force an overlap: the second face sits on the first one
        mats[1] = mats[0].copy()
        mats[1][:, 2] += 9.0
    return frame, mats


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 7), (1920, 1080, 8), (333, 211, 34)])
def test_paste_back(cp, w, h, n):
    from vcam.gpu import blend as gblend

    rng = np.random.default_rng(n * 11 + w)
    size = 128
    frame, mats = _paste_case(rng, w, h, n, size)
    crops = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    mask = blend.box_mask(size, 0.3)
    ref = blend.paste_back(frame.copy(), crops, mats, mask, n)
    dframe = cp.asarray(frame)
    gblend.paste_back(dframe, cp.asarray(crops), mats, cp.asarray(mask), n)
    got = dframe.get()
    _close_u8(got, ref)
    # Pixels outside every paste box are untouched, bit for bit.
    boxes = blend.paste_boxes(mats, size, h, w)
    outside = np.ones((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        outside[y0:y1, x0:x1] = False
    assert np.array_equal(got[outside], frame[outside])
    assert (got != frame).any()


def test_crops_from_planar_guard(cp):
    from vcam.gpu import align as galign

    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float16):
        out = rng.uniform(0, 1, (4, 3, 64, 64)).astype(dtype)
        inp = rng.uniform(0, 1, (4, 3, 64, 64)).astype(dtype)
        out[2, 1, 5, 7] = np.nan
        out[3, 0, 0, 0] = np.inf
        ref_c, ref_g = np.zeros((4, 64, 64, 3), np.uint8), np.zeros(4, np.int32)
        galign.crops_from_planar_reference(out, inp, 4, ref_c, ref_g)
        crops, guard = _poisoned(cp, (4, 64, 64, 3), cp.uint8), cp.full(4, 9, dtype=cp.int32)
        galign.crops_from_planar(cp.asarray(out), cp.asarray(inp), 4, crops, guard)
        _close_u8(crops.get(), ref_c)
        assert guard.get().tolist() == ref_g.tolist() == [0, 0, 1, 1]


def test_compile_error_is_device_error(cp, tmp_path, monkeypatch):
    from vcam.errors import DeviceError
    from vcam.gpu import _compile

    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void k() { this is not C++; }\n')
    monkeypatch.setattr(_compile, "kernel_path", lambda name: bad)
    with pytest.raises(DeviceError, match="compiling kernels/broken.cu"):
        _compile.module("broken")
