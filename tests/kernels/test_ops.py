"""Every array operation of the pipeline, one test body per operation over both ops implementations.

Each body runs on the ``ops`` fixture (NumPy always; CUDA where a GPU with CuPy is present) and
checks golden values or invariants that hold for any correct implementation, then agreement with
the NumPy reference (on NumPy that is the reference itself; on CUDA it is the parity test, on random
odd sizes with poisoned outputs). Tolerances: uint8 within 1 level; float outputs within 1e-3
relative (norm of the difference over the norm of the reference) and a small absolute bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host, poisoned

from vcam import align
from vcam.align import PlanarAffine
from vcam.kernels import convert, detect, warp
from vcam.kernels import paste as blend
from vcam.ops import make_ops
from vcam.types import PixelFormat

# The 1080p cases take seconds each on a busy CPU: slow (run by .ci/run, not by tools/check).
FULL_HD = pytest.mark.slow


def _close_u8(got, ref):
    d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert d.max() <= 1, f"max diff {d.max()} at {np.unravel_index(d.argmax(), d.shape)}"


def _close_f(got, ref, atol=0.05):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.isfinite(got).all(), "output has NaN/Inf (unwritten poisoned elements)"
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)
    assert rel <= 1e-3, f"relative error {rel:.2e}"
    assert np.abs(got - ref).max() <= atol


def _dev(ops, a):
    """A copy of host array ``a`` in the ops' memory (never the caller's own buffer)."""
    return ops.asarray(np.array(a, copy=True))


# -- convert ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("w,h", [(64, 48), (33, 17), (1280, 720), (97, 131)])
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "GRAY", "BGRA", "RGBP", "YUYV", "NV12", "I420"])
def test_to_bgr(ops, fmt, w, h):
    rng = np.random.default_rng(w * 7 + h)
    if fmt == "YUYV" and w % 2:
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
    got = host(ops, convert.to_bgr(ops, _dev(ops, data), pf, w, h, out=poisoned(ops, (h, w, 3), np.uint8)))
    if fmt in ("BGR", "RGB", "BGRA", "GRAY"):  # exact: a channel shuffle
        src = data[..., :3] if fmt != "GRAY" else np.repeat(data[..., None], 3, axis=2)
        np.testing.assert_array_equal(got, src[..., ::-1] if fmt == "RGB" else src)
    if fmt == "RGBP":  # exact: planes to pixels
        np.testing.assert_array_equal(got, data.transpose(1, 2, 0)[..., ::-1])
    _close_u8(got, convert.to_bgr_ref(data, pf, w, h))


def test_yuv_limited_range_golden(ops):
    """BT.601 limited range: Y 16 is black, Y 235 white, neutral chroma stays grey."""
    w, h = 4, 2
    i420 = np.full((h * 3 // 2, w), 128, np.uint8)
    i420[:h, :2], i420[:h, 2:] = 16, 235
    got = host(ops, convert.to_bgr(ops, _dev(ops, i420), PixelFormat.I420, w, h))
    assert got[:, :2].max() == 0 and got[:, 2:].min() == 255


@pytest.mark.parametrize("w,h", [(64, 48), (34, 18), pytest.param(1920, 1080, marks=FULL_HD), (98, 130)])
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "I420", "NV12"])
def test_from_bgr(ops, fmt, w, h):
    rng = np.random.default_rng(w + h)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    pf = PixelFormat(fmt)
    ref = convert.from_bgr_ref(frame, pf)
    got = host(ops, convert.from_bgr(ops, _dev(ops, frame), pf, out=poisoned(ops, ref.shape, np.uint8)))
    _close_u8(got, ref)
    # A smooth frame survives the round trip through 4:2:0 within a few levels.
    smooth = np.stack([*np.meshgrid(np.linspace(60, 90, w), np.linspace(80, 110, h)), np.full((h, w), 120.0)], -1)
    smooth = smooth.astype(np.uint8)
    back = host(ops, convert.to_bgr(ops, convert.from_bgr(ops, _dev(ops, smooth), pf), pf, w, h))
    assert np.abs(back.astype(int) - smooth).max() <= (0 if fmt in ("BGR", "RGB") else 4)


def _frame_in(rng, fmt, w, h):
    if fmt == "BGRA":
        return rng.integers(0, 256, (h, w, 4), dtype=np.uint8), PixelFormat.BGR
    if fmt == "GRAY":
        return rng.integers(0, 256, (h, w), dtype=np.uint8), PixelFormat.GRAY
    pf = PixelFormat(fmt)
    return rng.integers(0, 256, convert.frame_shape(pf, w, h), dtype=np.uint8), pf


@pytest.mark.parametrize("w,h", [(64, 48), pytest.param(1920, 1080, marks=FULL_HD), (98, 130)])
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "GRAY", "BGRA", "RGBP", "YUYV", "NV12", "I420"])
def test_to_bgr_by_rows(ops, fmt, w, h):
    """A frame converted in row bands (the band around the faces first, then the rows above and
    below it: the pipeline's banded frames) equals the whole frame converted at once, exactly; a
    band writes its rows only; and the rows agree with the NumPy reference (the parity test on
    CUDA)."""
    rng = np.random.default_rng(w * 3 + h)
    data, pf = _frame_in(rng, fmt, w, h)
    y0, y1 = 2 * (h // 7), 2 * (h // 3) + 2
    whole = host(ops, convert.to_bgr(ops, _dev(ops, data), pf, w, h))
    dev = _dev(ops, data)
    out = ops.asarray(np.zeros((h, w, 3), np.uint8))
    convert.to_bgr(ops, dev, pf, w, h, out=out, rows=(y0, y1))
    band = host(ops, out)
    np.testing.assert_array_equal(band[y0:y1], whole[y0:y1])
    assert not band[:y0].any() and not band[y1:].any(), "a band wrote rows outside it"
    for rows in ((0, y0), (y1, h), (y1, y1)):
        convert.to_bgr(ops, dev, pf, w, h, out=out, rows=rows)
    np.testing.assert_array_equal(host(ops, out), whole)
    _close_u8(band[y0:y1], convert.to_bgr_ref(data, pf, w, h)[y0:y1])


@pytest.mark.parametrize("w,h", [(64, 48), pytest.param(1920, 1080, marks=FULL_HD), (98, 130)])
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "I420", "NV12"])
def test_from_bgr_by_rows(ops, fmt, w, h):
    """The output format written in row bands equals the whole frame converted at once, exactly; a
    band writes its own rows of every plane only; the rows agree with the NumPy reference."""
    rng = np.random.default_rng(w + 5 * h)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    pf = PixelFormat(fmt)
    y0, y1 = 2 * (h // 5), 2 * (h // 3) + 2
    whole = host(ops, convert.from_bgr(ops, _dev(ops, frame), pf))
    dev = _dev(ops, frame)
    out = ops.asarray(np.zeros(whole.shape, np.uint8))
    convert.from_bgr(ops, dev, pf, out=out, rows=(y0, y1))
    got = host(ops, out).reshape(-1)
    written = np.zeros(got.size, bool)
    for lo, hi in convert.band_bytes(pf, w, h, (y0, y1)):
        written[lo:hi] = True
    np.testing.assert_array_equal(got[written], whole.reshape(-1)[written])
    assert not got[~written].any(), "a band wrote outside its rows"
    ref = convert.from_bgr_ref(frame, pf).reshape(-1)
    _close_u8(got[written], ref[written])
    for rows in ((0, y0), (y1, h)):
        convert.from_bgr(ops, dev, pf, out=out, rows=rows)
    np.testing.assert_array_equal(host(ops, out), whole)


def test_rows_outside_the_frame_or_odd_in_420_are_refused(ops):
    frame = ops.asarray(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="even bounds"):
        convert.from_bgr(ops, frame, PixelFormat.I420, rows=(1, 4))
    with pytest.raises(ValueError, match="not within"):
        convert.to_bgr(ops, ops.asarray(np.zeros((12, 8), np.uint8)), PixelFormat.NV12, 8, 8, rows=(2, 10))
    with pytest.raises(ValueError, match="not within"):
        convert.from_bgr(ops, frame, PixelFormat.BGR, rows=(5, 3))


def test_frame_rows_and_put_rows_round_trip():
    """:func:`vcam.kernels.convert.frame_rows` cuts rows out of a frame as a frame of their own (every
    layout), and :func:`vcam.kernels.convert.put_rows` writes them back where they came from."""
    rng = np.random.default_rng(3)
    w, h = 10, 8
    for fmt in ("BGR", "GRAY", "BGRA", "RGBP", "YUYV", "NV12", "I420"):
        data, pf = _frame_in(rng, fmt, w, h)
        part = convert.frame_rows(data, pf, w, h, (2, 6))
        assert part.size == data.size // 2, fmt
        back = np.zeros(convert.frame_shape(pf, w, h), np.uint8) if fmt not in ("BGRA", "GRAY") else None
        if back is not None:
            convert.put_rows(part, back, pf, w, h, (2, 6))
            for lo, hi in convert.band_bytes(pf, w, h, (2, 6)):
                np.testing.assert_array_equal(back.reshape(-1)[lo:hi], data.reshape(-1)[lo:hi])


def _regions(rng, w, h, count):
    """The full-frame letterbox, then regions inside, straddling the border and outside."""
    rects = [[0, 0, max(h, w)]]
    for _ in range(count - 1):
        side = rng.uniform(20, 1.5 * max(h, w))
        rects.append([rng.uniform(-side, w), rng.uniform(-side, h), side])
    return np.array(rects)


def _close_cv(got, ref, scale):
    """Within :data:`~vcam.kernels.detect.CV_TOLERANCE` frame levels of the reference (float16: plus its
    rounding), and on average well within one level."""
    levels = np.abs(np.asarray(got, np.float64) - ref) / np.float64(scale).max()
    assert np.isfinite(levels).all(), "output has NaN/Inf (unwritten poisoned elements)"
    assert levels.max() <= detect.CV_TOLERANCE + 0.2, levels.max()
    assert levels.mean() <= 0.5, levels.mean()


@pytest.mark.parametrize("w,h", [(641, 359), (160, 160), pytest.param(1920, 1080, marks=FULL_HD)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_detector_input(ops, w, h, dtype):
    rng = np.random.default_rng(w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    rects = _regions(rng, w, h, 35)  # 35 > 32: two launches on CUDA
    mean, scale = (104.0, 117.0, 123.0), (1 / 128, 1 / 64, 1 / 32)
    for size, rgb in ((160, False), (97, True)):
        ref = detect.detector_input_ref(frame, rects, size, mean, scale=scale, rgb=rgb)
        got = host(
            ops,
            detect.detector_input(
                ops, _dev(ops, frame), rects, size, mean, scale=scale, rgb=rgb, out=poisoned(ops, ref.shape, dtype)
            ),
        )
        if ops.device == "cpu":  # the CPU front is OpenCV's bilinear (tests/kernels/test_detect_cv.py)
            _close_cv(got, ref, scale)
        elif dtype == "float16":
            _close_f(got, ref.astype(np.float16), atol=0.01)
        else:
            _close_f(got, ref, atol=1e-4)
        # A window of the resized region is its top-left corner (a full scan feeds only that).
        win = host(
            ops,
            detect.detector_input(
                ops,
                _dev(ops, frame),
                rects[:1],
                size,
                mean,
                scale=scale,
                rgb=rgb,
                out=poisoned(ops, (1, 3, size - 33, size - 7), dtype),
            ),
        )
        # (On the CPU the whole region may go through cv2.resize and the window through warpAffine:
        # their fixed-point weights differ by up to a level.)
        atol = 1e-6 if ops.device != "cpu" else 1.01 * max(scale) + (0.01 if dtype == "float16" else 0)
        np.testing.assert_allclose(win, got[:1, :, : size - 33, : size - 7], rtol=0, atol=atol)


def test_detector_input_golden(ops):
    """A region that is the frame at its own size samples every pixel exactly: (pixel - mean) * scale,
    in RGB order when asked; padding outside the frame is the normalised zero."""
    rng = np.random.default_rng(2)
    frame = rng.integers(0, 256, (40, 64, 3), dtype=np.uint8)
    got = host(
        ops,
        detect.detector_input(
            ops, _dev(ops, frame), np.array([[0.0, 0.0, 64.0]]), 64, (10.0, 20.0, 30.0), scale=(0.5, 0.25, 2.0), rgb=True
        ),
    )
    want = (frame.astype(np.float32) - [10, 20, 30]) * np.float32([0.5, 0.25, 2.0])
    np.testing.assert_allclose(got[0, :, :40], want[..., ::-1].transpose(2, 0, 1), rtol=0, atol=1e-4)
    assert not got[0, :, 40:].any()


# -- align ------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 5), pytest.param(1920, 1080, 8, marks=FULL_HD), (199, 101, 33)])
def test_warp_crops(ops, w, h, n):
    rng = np.random.default_rng(n + w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    for size in (128, 111):
        m = _random_mats(rng, n, w, h, size)
        ref = warp.warp_crops_ref(frame, m, size)
        got = host(ops, warp.warp_crops(ops, _dev(ops, frame), m, size, out=poisoned(ops, ref.shape, np.uint8)))
        _close_u8(got, ref)
    # Golden: the identity and a whole-pixel shift copy the frame exactly.
    eye = np.array([[[1.0, 0, 0], [0, 1.0, 0]], [[1.0, 0, -7.0], [0, 1.0, -3.0]]])
    got = host(ops, warp.warp_crops(ops, _dev(ops, frame), eye, 64))
    np.testing.assert_array_equal(got[0], frame[:64, :64])
    np.testing.assert_array_equal(got[1], frame[3:67, 7:71])


def test_the_cpu_warp_for_estimates_is_within_a_level_of_the_reference():
    """``exact=False`` on the CPU (the local colour match's and the colour statistics' crops):
    OpenCV's uint8 warp, within :data:`~vcam.kernels.warp.CV_LEVELS` of the reference on noise
    (the worst case), crops far smaller than the region they reach included; the golden shifts exact."""
    rng = np.random.default_rng(11)
    frame = rng.integers(0, 256, (359, 641, 3), dtype=np.uint8)
    cpu = make_ops("cpu")
    for size in (16, 32, 64, 111):
        m = _random_mats(rng, 6, 641, 359, size)
        ref = warp.warp_crops_ref(frame, m, size)
        got = warp.warp_crops(cpu, frame, m, size, out=np.full(ref.shape, 7, np.uint8), exact=False)
        assert np.abs(got.astype(np.int16) - ref).max() <= warp.CV_LEVELS
        assert (got != ref).mean() < 0.5  # the same samples, not merely close ones
    eye = np.array([[[1.0, 0, 0], [0, 1.0, 0]], [[1.0, 0, -7.0], [0, 1.0, -3.0]]])
    got = warp.warp_crops(cpu, frame, eye, 64, exact=False)
    np.testing.assert_array_equal(got[0], frame[:64, :64])
    np.testing.assert_array_equal(got[1], frame[3:67, 7:71])


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 6), pytest.param(1920, 1080, 8, marks=FULL_HD)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rgb", [True, False])
def test_warp_crops_normalized(ops, w, h, n, dtype, rgb):
    rng = np.random.default_rng(n * 3 + w)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mean, std = (127.5, 120.0, 110.0), (127.5, 64.0, 255.0)
    for size in (112, 128, 75):
        m = _random_mats(rng, n, w, h, size)
        ref = warp.warp_crops_normalized_ref(frame, m, size, mean, std, rgb)
        got = host(
            ops, warp.warp_crops_normalized(ops, _dev(ops, frame), m, size, mean, std, rgb, out=poisoned(ops, ref.shape, dtype))
        )
        if dtype == "float16":
            _close_f(got, ref.astype(np.float16), atol=5e-3)
        else:
            _close_f(got, ref, atol=1e-4)
    eye = np.array([[[1.0, 0, 0], [0, 1.0, 0]]])
    got = host(ops, warp.warp_crops_normalized(ops, _dev(ops, frame), eye, 32, mean, std, rgb))
    want = (frame[:32, :32].astype(np.float32)[..., :: -1 if rgb else 1] - np.float32(mean)) / np.float32(std)
    np.testing.assert_allclose(got[0], want.transpose(2, 0, 1), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "out_dtype,in_dtype", [("float32", "float32"), ("float32", "float16"), ("float16", "float16"), ("float16", "float32")]
)
def test_crops_from_planar(ops, out_dtype, in_dtype):
    """Model output to uint8 BGR crops through the model's affine; NaN/Inf faces get their input back
    and the per-face guard counts them, cumulatively."""
    rng = np.random.default_rng(5)
    size = 37
    aff = PlanarAffine.for_model((0.5, 0.4, 0.3), (0.5, 0.25, 0.2), "mean_std")
    out = rng.uniform(-2.5, 2.5, (4, 3, size, size)).astype(out_dtype)
    inp = rng.uniform(-2.0, 2.0, (4, 3, size, size)).astype(in_dtype)
    out[2, 1, 5, 7] = np.nan
    out[3, 0, 0, 0] = np.inf
    ref_c, ref_g = np.zeros((4, size, size, 3), np.uint8), np.zeros(4, np.int32)
    warp.crops_from_planar_ref(out, inp, 4, ref_c, ref_g, aff, True)
    crops, guard = poisoned(ops, (4, size, size, 3), np.uint8), ops.asarray(np.zeros(4, np.int32))
    for _ in range(2):
        warp.crops_from_planar(ops, _dev(ops, out), _dev(ops, inp), 4, crops, guard, aff, True)
    _close_u8(host(ops, crops), ref_c)
    assert host(ops, guard).tolist() == [0, 0, 2, 2] and ref_g.tolist() == [0, 0, 1, 1]
    # Golden, face 0 (RGB model, BGR crop): value = clip(out * std + mean, 0, 1) * 255, rounded.
    want = np.floor(
        np.clip(
            out[0].astype(np.float32) * np.float32([[[0.5]], [[0.25]], [[0.2]]]) + np.float32([[[0.5]], [[0.4]], [[0.3]]]), 0, 1
        )
        * 255
        + 0.5
    )
    _close_u8(host(ops, crops)[0], want[::-1].transpose(1, 2, 0))
    # The guard's fallback is the unswapped input: pixel = input * std * 255 + mean * 255.
    back = np.clip(
        np.floor(
            inp[2].astype(np.float32) * np.float32([[[127.5]], [[63.75]], [[51.0]]])
            + np.float32([[[127.5]], [[102.0]], [[76.5]]])
            + 0.5
        ),
        0,
        255,
    )
    _close_u8(host(ops, crops)[2], back[::-1].transpose(1, 2, 0))


# -- blend ------------------------------------------------------------------------------------------
def _paste_case(rng, w, h, n, size=128):
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mats = _random_mats(rng, n, w, h, size)
    if n > 1:  # force an overlap: the second face sits on the first one
        mats[1] = mats[0].copy()
        mats[1][:, 2] += 9.0
    return frame, mats


@pytest.mark.parametrize("w,h,n", [(320, 240, 1), (641, 359, 7), pytest.param(1920, 1080, 8, marks=FULL_HD), (333, 211, 34)])
@pytest.mark.parametrize("per_face", [False, True])
def test_paste_back(ops, w, h, n, per_face):
    rng = np.random.default_rng(n * 11 + w)
    size = 128
    frame, mats = _paste_case(rng, w, h, n, size)
    crops = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    mask = blend.box_mask(size, 0.3)
    if per_face:  # one mask per face: the box mask scaled differently per face
        mask = (mask[None] * rng.uniform(0.2, 1.0, (n, 1, 1))).astype(np.float32)
    ref = blend.paste_back_ref(frame.copy(), crops, mats, mask, n)
    dframe = _dev(ops, frame)
    blend.paste_back(ops, dframe, _dev(ops, crops), mats, _dev(ops, mask), n)
    got = host(ops, dframe)
    _close_u8(got, ref)
    # Pixels outside every paste box are untouched, bit for bit.
    boxes = blend.paste_boxes(mats, size, h, w)
    outside = np.ones((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        outside[y0:y1, x0:x1] = False
    assert np.array_equal(got[outside], frame[outside])
    assert (got != frame).any()


def test_paste_back_golden(ops):
    """An identity placement with a mask of 1 inside copies the crop; a mask of 0 keeps the frame."""
    frame = np.full((40, 40, 3), 50, np.uint8)
    crop = np.full((1, 16, 16, 3), 200, np.uint8)
    mask = np.zeros((16, 16), np.float32)
    mask[1:-1, 1:-1] = 1.0
    m = np.array([[[1.0, 0, -10.0], [0, 1.0, -12.0]]])  # crop pixel (u, v) is frame (u + 10, v + 12)
    d = _dev(ops, frame)
    blend.paste_back(ops, d, _dev(ops, crop), m, _dev(ops, mask), 1)
    got = host(ops, d)
    assert (got[13:27, 11:25] == 200).all() and (got[:12] == 50).all() and (got[:, :10] == 50).all()
    assert (got[12, 10:26] == 50).all()  # the mask's zero ring


def test_readback_and_transfer_counts(ops):
    """Several arrays (two of the same shape, as YuNet's cls and obj heads) come back in one readback."""
    a, b = _dev(ops, np.arange(12, dtype=np.float32).reshape(3, 4)), _dev(ops, np.ones((2, 2), np.int32))
    c = _dev(ops, -np.arange(12, dtype=np.float32).reshape(3, 4))
    before = ops.transfers.d2h
    got = ops.readback([a, b, c])
    np.testing.assert_array_equal(got[0], np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(got[1], np.ones((2, 2)))
    np.testing.assert_array_equal(got[2], -np.arange(12).reshape(3, 4))
    assert ops.transfers.d2h - before == (1 if ops.device == "cuda" else 0)


@pytest.mark.gpu
def test_compile_error_is_device_error(ops, tmp_path, monkeypatch):
    if ops.device != "cuda":
        pytest.skip("kernels are compiled on CUDA only")
    from vcam.errors import DeviceError
    from vcam.kernels import build as kernels

    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void k() { this is not C++; }\n')
    monkeypatch.setattr(kernels, "kernel_path", lambda name: bad)
    with pytest.raises(DeviceError, match="compiling kernels/broken.cu"):
        kernels.Kernels().module("broken")
