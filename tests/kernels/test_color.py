"""CIE L*a*b* conversions and the seamless membrane (vcam.kernels.color and the ops' twins).

The references are checked against the CIE formula in float64 and against OpenCV; the ops (NumPy
always, CUDA where present) against the references on odd sizes with poisoned outputs: uint8 within
one level, floats within 1e-3 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host, poisoned

from vcam.kernels import color


def _cie_lab(bgr: np.ndarray) -> np.ndarray:
    """The textbook definition in float64: sRGB curve, the sRGB/D65 matrix, D65 white, CIE f(t)."""
    c = np.asarray(bgr, np.float64)[..., ::-1] / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    d = 6.0 / 29.0
    f = np.where(xyz > d**3, np.cbrt(xyz), xyz / (3 * d * d) + 4.0 / 29.0)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def _lab(crops: np.ndarray) -> np.ndarray:
    return color.lab_from_bgr_ref(crops, crops.shape[0], np.empty(crops.shape, np.float32))


def _bgr(lab: np.ndarray, **kw) -> np.ndarray:
    return color.bgr_from_lab_ref(lab, lab.shape[0], np.empty(lab.shape, np.uint8), **kw)


def _colours(n: int = 4096, seed: int = 0) -> np.ndarray:
    """(1, 64, n // 64, 3) uint8: random colours plus the cube's corners and the greys."""
    rng = np.random.default_rng(seed)
    px = rng.integers(0, 256, (n, 3), dtype=np.uint8)
    corners = np.array([[b, g, r] for b in (0, 255) for g in (0, 255) for r in (0, 255)], np.uint8)
    px[:8] = corners
    px[8:264] = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    return px.reshape(1, 64, n // 64, 3)


def test_lab_is_the_cie_formula():
    x = _colours()
    got = _lab(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _cie_lab(x), rtol=0, atol=2e-4)
    white, black = got[0, 0, 7], got[0, 0, 0]  # corners (255, 255, 255) and (0, 0, 0)
    np.testing.assert_allclose(white, [100, 0, 0], atol=1e-3)
    np.testing.assert_allclose(black, [0, 0, 0], atol=1e-6)


def test_lab_against_opencv():
    """OpenCV's COLOR_BGR2Lab on float input is the same space. Deliberate difference: OpenCV reads
    the sRGB curve from an interpolated table and uses its own six-digit matrix and white point, so
    it is up to about 0.5 off in a/b and 0.2 in L (mean under 0.1); ours is the exact formula
    (the previous test)."""
    import cv2

    x = _colours(16384, seed=3)
    ref = cv2.cvtColor(x[0].astype(np.float32) / 255.0, cv2.COLOR_BGR2Lab)
    d = np.abs(_lab(x)[0] - ref).reshape(-1, 3)
    assert d[:, 0].max() < 0.25 and d[:, 1:].max() < 0.6, d.max(axis=0)
    assert d.mean(axis=0).max() < 0.12, d.mean(axis=0)


def test_greys_have_no_chroma_and_rising_lightness():
    greys = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1).reshape(1, 16, 16, 3)
    lab = _lab(greys).reshape(256, 3)
    assert np.abs(lab[:, 1:]).max() < 1e-3
    assert np.all(np.diff(lab[:, 0]) > 0)
    back = _bgr(lab.reshape(1, 16, 16, 3)).reshape(256, 3)
    np.testing.assert_array_equal(back, greys.reshape(256, 3))


@pytest.mark.slow
def test_round_trip_of_every_colour_within_one_level():
    """All 2^24 colours: BGR -> L*a*b* -> BGR gives each back within one level."""
    v = np.arange(256, dtype=np.uint8)
    worst = 0
    for b in range(0, 256, 64):
        bb, gg, rr = np.meshgrid(v[b : b + 64], v, v, indexing="ij")
        x = np.stack([bb, gg, rr], axis=-1).reshape(1, 64 * 256, 256, 3)
        worst = max(worst, int(np.abs(_bgr(_lab(x)).astype(np.int16) - x).max()))
    assert worst <= 1


def test_scale_shift_rounding_and_clipping():
    x = _colours(1024)
    lab = _lab(x)
    ones, zeros = np.ones((1, 3), np.float32), np.zeros((1, 3), np.float32)
    np.testing.assert_array_equal(_bgr(lab, scale=ones, shift=zeros), _bgr(lab))
    # L*a*b* statistics moved wholesale: everything to one colour
    flat = _bgr(lab, scale=zeros, shift=np.array([[53.585014, 0.0, 0.0]], np.float32))  # L of grey 128
    assert np.all(flat == 128)
    assert np.all(_bgr(lab, scale=ones, shift=np.array([[200.0, 0, 0]], np.float32)) == 255)
    assert np.all(_bgr(lab, scale=ones, shift=np.array([[-200.0, 0, 0]], np.float32)) == 0)
    nan = np.full((1, 2, 2, 3), np.nan, np.float32)
    assert np.all(_bgr(nan) == 0)  # non-finite -> black, never garbage
    with pytest.raises(ValueError, match="both scale and shift"):
        _bgr(lab, scale=ones)


def _ring(size: int, count: int) -> np.ndarray:
    """(count, size, size) float32 band weights: a ring around the crop centre."""
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    r = np.hypot(xx - size / 2, yy - size / 2) / (size / 2)
    w = np.clip(1 - np.abs(r - 0.6) / 0.1, 0, 1).astype(np.float32)
    return np.repeat(w[None], count, axis=0)


def test_membrane_spreads_a_constant_difference():
    """A band with one constant difference gives that difference everywhere near and inside it; a
    difference beyond ``clip`` counts as ``clip``; bgr_from_lab adds the grid."""
    size, n = 64, 2
    rng = np.random.default_rng(1)
    src = (rng.random((n, size, size, 3), np.float32) * np.float32(60)).astype(np.float32)
    diff = np.array([[5.0, -3.0, 2.0], [30.0, -30.0, 0.0]], np.float32)
    tgt = (src + diff[:, None, None, :]).astype(np.float32)
    g = color.membrane_grid(size)
    out = color.lab_membrane_ref(tgt, src, _ring(size, n), n, np.empty((n, g, g, 3), np.float32), sigma=2.0, clip=12.0)
    centre = out[:, g // 2 - 1 : g // 2 + 1, g // 2 - 1 : g // 2 + 1].reshape(n, -1, 3)
    np.testing.assert_allclose(centre[0], np.broadcast_to(diff[0], centre[0].shape), rtol=2e-3, atol=1e-3)
    np.testing.assert_allclose(centre[1], np.broadcast_to([12.0, -12.0, 0.0], centre[1].shape), rtol=2e-3, atol=1e-3)
    # the grid added by bgr_from_lab: a constant membrane is a shift (within rounding of the bilinear weights)
    lab = _lab(_colours(64 * 64 * n).reshape(n, 64, 64, 3))
    const = np.broadcast_to(np.array([4.0, 1.0, -2.0], np.float32), (n, g, g, 3)).copy()
    shifted = _bgr(lab, scale=np.ones((n, 3), np.float32), shift=np.broadcast_to(const[0, 0, 0], (n, 3)).copy())
    assert np.abs(_bgr(lab, membrane=const).astype(np.int16) - shifted).max() <= 1


def test_membrane_rejects_a_grid_too_large():
    t = np.zeros((1, 8, 8, 3), np.float32)
    too = np.empty((1, color.MAX_GRID + 1, color.MAX_GRID + 1, 3), np.float32)
    with pytest.raises(ValueError, match="membrane grid"):
        color.lab_membrane_ref(t, t, np.zeros((1, 8, 8), np.float32), 1, too)


# -- the ops: NumPy is the reference itself; CUDA its parity ---------------------------------------
def _close_f(got, ref, atol):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(got).all(), "output has NaN/Inf (unwritten poisoned elements)"
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)
    assert rel <= 1e-3, f"relative error {rel:.2e}"
    assert np.abs(got - ref).max() <= atol


@pytest.mark.parametrize("size,faces,count", [(37, 3, 3), (37, 3, 2), (128, 2, 2), (9, 1, 1)])
def test_ops_lab_from_bgr(ops, size, faces, count):
    rng = np.random.default_rng(size + faces)
    crops = rng.integers(0, 256, (faces, size, size, 3), dtype=np.uint8)
    ref = color.lab_from_bgr_ref(crops, count, np.full(crops.shape, np.nan, np.float32))
    got = host(ops, color.lab_from_bgr(ops, ops.asarray(crops), count, poisoned(ops, crops.shape, np.float32)))
    _close_f(got[:count], ref[:count], atol=2e-3)
    assert np.isnan(got[count:]).all(), "rows past count were written"


@pytest.mark.parametrize("size,faces,count", [(37, 3, 3), (37, 3, 2), (128, 2, 2)])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("with_membrane", [False, True])
def test_ops_bgr_from_lab(ops, size, faces, count, affine, with_membrane):
    rng = np.random.default_rng(size * 3 + faces)
    lab = _lab(rng.integers(0, 256, (faces, size, size, 3), dtype=np.uint8))
    lab[0, 0, :3] = [[150.0, 0, 0], [-20.0, 0, 0], [50.0, 140.0, -140.0]]  # out of gamut: clipped
    kw = {}
    if affine:
        kw["scale"] = rng.uniform(0.5, 1.5, (faces, 3)).astype(np.float32)
        kw["shift"] = rng.uniform(-10, 10, (faces, 3)).astype(np.float32)
    if with_membrane:
        g = color.membrane_grid(size)
        kw["membrane"] = rng.uniform(-8, 8, (faces, g, g, 3)).astype(np.float32)
    ref = color.bgr_from_lab_ref(lab, count, np.full(lab.shape, 77, np.uint8), **kw)
    dev_kw = {k: ops.asarray(v) for k, v in kw.items()}
    got = host(ops, color.bgr_from_lab(ops, ops.asarray(lab), count, poisoned(ops, lab.shape, np.uint8), **dev_kw))
    d = np.abs(got[:count].astype(np.int16) - ref[:count])
    assert d.max() <= 1, f"max diff {d.max()} at {np.unravel_index(d.argmax(), d.shape)}"
    assert np.all(got[count:] == 77), "rows past count were written"


@pytest.mark.parametrize("size,faces,count", [(37, 3, 3), (37, 3, 2), (128, 2, 2), (256, 1, 1)])
@pytest.mark.parametrize("affine", [False, True])
def test_ops_lab_membrane(ops, size, faces, count, affine):
    rng = np.random.default_rng(size + 11 * faces)
    tgt = _lab(rng.integers(0, 256, (faces, size, size, 3), dtype=np.uint8))
    src = _lab(rng.integers(0, 256, (faces, size, size, 3), dtype=np.uint8))
    w = _ring(size, faces) * rng.random((faces, size, size), np.float32)
    kw = {}
    if affine:
        kw["scale"] = rng.uniform(0.5, 1.5, (faces, 3)).astype(np.float32)
        kw["shift"] = rng.uniform(-10, 10, (faces, 3)).astype(np.float32)
    g = color.membrane_grid(size)
    ref = color.lab_membrane_ref(tgt, src, w, count, np.full((faces, g, g, 3), np.nan, np.float32), sigma=2.5, clip=12.0, **kw)
    got = color.lab_membrane(
        ops,
        ops.asarray(tgt),
        ops.asarray(src),
        ops.asarray(w),
        count,
        poisoned(ops, (faces, g, g, 3), np.float32),
        sigma=2.5,
        clip=12.0,
        **{k: ops.asarray(v) for k, v in kw.items()},
    )
    got = host(ops, got)
    _close_f(got[:count], ref[:count], atol=1e-3)
    assert np.isnan(got[count:]).all(), "rows past count were written"
