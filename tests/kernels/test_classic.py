"""The classic swap's kernels (vcam.kernels.classic): the thin-plate warp grid, the colour map fitted
to the L*a*b* transfer, and the render into the frame, each against its definition, and the ops
(NumPy always, CUDA where present) against the NumPy references."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from conftest import host

from vcam.kernels import classic
from vcam.kernels.paste import box_mask


def _affine_pts(pts: np.ndarray, m: np.ndarray) -> np.ndarray:
    return pts @ m[:, :2].T + m[:, 2]


def test_tps_reproduces_an_affine_map_and_interpolates_its_points():
    rng = np.random.default_rng(1)
    dst = rng.uniform(0, 128, (40, 2))
    m = np.array([[1.7, 0.3, 12.0], [-0.2, 1.9, -5.0]])
    fit = classic.tps_fit(dst, _affine_pts(dst, m))
    probe = rng.uniform(-20, 150, (500, 2))
    np.testing.assert_allclose(classic.tps_eval(dst, fit, probe), _affine_pts(probe, m), atol=1e-6)
    bent = _affine_pts(dst, m) + rng.normal(0, 3, dst.shape)  # not affine: still through every point
    np.testing.assert_allclose(classic.tps_eval(dst, classic.tps_fit(dst, bent), dst), bent, atol=1e-6)
    grid, ox, oy, inv = classic.tps_grid(dst, _affine_pts(dst, m), (10, 20, 110, 80))
    assert grid.shape == (classic.GRID, classic.GRID, 2) and grid.dtype == np.float32
    nodes = np.stack(np.meshgrid(ox + np.arange(classic.GRID) / inv, oy + np.arange(classic.GRID) / inv), -1)
    np.testing.assert_allclose(grid, _affine_pts(nodes.reshape(-1, 2), m).reshape(grid.shape), atol=1e-3)
    assert ox <= 10 and oy <= 20 and ox + (classic.GRID - 1) / inv >= 110 and oy + (classic.GRID - 1) / inv >= 80


def _samples(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    skin = np.array([120.0, 150.0, 200.0]) + rng.normal(0, 25, (classic.FIT_SAMPLES, 3))
    return np.clip(skin, 0, 255).astype(np.float32)


def _stats(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lab = classic._lab_of(s)
    return lab.mean(0).astype(np.float32), (lab.std(0) + 1e-3).astype(np.float32)


def test_color_fit_is_the_lab_transfer_as_one_affine_map():
    s = _samples()
    ms, ss = _stats(s)
    out = np.empty((3, 12), np.float32)
    mt = ms + np.array([-12.0, 6.0, -4.0], np.float32)  # a darker, redder, bluer target
    st = ss * np.array([0.8, 1.2, 1.0], np.float32)
    grey_mean, grey_std = np.array([55.0, 0.0, 0.0], np.float32), np.array([9.0, 1e-3, 1e-3], np.float32)
    classic.color_fit_ref(
        np.stack([s, s, s]),
        np.stack([ms] * 3),
        np.stack([ss] * 3),
        np.stack([ms, mt, grey_mean]),
        np.stack([ss, st, grey_std]),
        3,
        True,
        out,
    )
    maps = out.reshape(3, 3, 4)

    def apply(k: int, x: np.ndarray) -> np.ndarray:
        return x @ maps[k, :, :3].T + maps[k, :, 3]

    # the source's own statistics: (about) the identity
    assert np.abs(apply(0, s) - s).max() < 1.5
    # another target: the exact transfer of the samples, within a few levels
    exact = classic._bgr_of((classic._lab_of(s) - ms) / ss * st + mt)
    err = np.abs(apply(1, s) - exact)
    assert err.mean() < 1.5 and err.max() < 6, (err.mean(), err.max())
    # a grey target: every colour maps to a grey
    g = apply(2, s)
    assert np.abs(g - g.mean(1, keepdims=True)).max() < 0.5
    # without the match: the identity
    classic.color_fit_ref(s[None], ms[None], ss[None], mt[None], st[None], 1, False, out)
    np.testing.assert_array_equal(out[0], [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0])


def test_ops_color_fit(ops):
    n = 3
    s = np.stack([_samples(k) for k in range(n)])
    stats = [_stats(x) for x in s]
    ms = np.stack([a for a, _ in stats])
    ss = np.stack([b for _, b in stats])
    mt, st = ms[::-1].copy(), ss[::-1].copy()
    ref = classic.color_fit_ref(s, ms, ss, mt, st, n, True, np.empty((n, 12), np.float32))
    out = ops.asarray(np.full((n, 12), np.nan, np.float32))
    classic.color_fit(ops, *(ops.asarray(a) for a in (s, ms, ss, mt, st)), n, True, out)
    # float32 on the device against float64 here: a few parts in 10^4 on the offsets (tens of levels)
    np.testing.assert_allclose(host(ops, out), ref, rtol=1e-3, atol=1e-4)


def test_ops_tps_nodes(ops):
    """The spline's nodes on the device (a record by value per face) against the NumPy evaluation,
    both faces of a batch, a pyramid level's scale folded in; and the grid is the spline's."""
    rng = np.random.default_rng(5)
    recs = []
    for n, scale in ((37, 1.0), (44, 0.5)):
        dst = rng.uniform(4, 124, (n, 2))
        src = dst * 3.0 + rng.normal(0, 4.0, dst.shape)
        rec, ox, oy, inv = classic.tps_spline(dst, src, (2, 3, 125, 122), scale=scale)
        recs.append(rec)
        nodes = np.stack(np.meshgrid(ox + np.arange(classic.GRID) / inv, oy + np.arange(classic.GRID) / inv), -1)
        exact = classic.tps_eval(dst, classic.tps_fit(dst, src), nodes.reshape(-1, 2)).reshape(nodes.shape)
        got = classic.tps_nodes_ref(rec, 1, np.empty((1, classic.GRID, classic.GRID, 2), np.float32))[0]
        np.testing.assert_allclose(got, (exact + 0.5) * scale - 0.5, atol=2e-3)
    splines = np.concatenate(recs)
    ref = classic.tps_nodes_ref(splines, 2, np.empty((2, classic.GRID, classic.GRID, 2), np.float32))
    out = ops.asarray(np.full((3, classic.GRID, classic.GRID, 2), np.nan, np.float32))
    with ops.activate():
        classic.tps_nodes(ops, splines, 2, out)
    got = host(ops, out)
    np.testing.assert_allclose(got[:2], ref, atol=2e-3)  # float32 terms summed in another order
    assert np.isnan(got[2]).all()


def _face_crops(n: int, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``n`` smooth random BGR crops (n, size, size, 3) uint8 and a face-like weight (size, size)."""
    rng = np.random.default_rng(n)
    crops = np.stack([cv2.GaussianBlur(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), (0, 0), 2.0) for _ in range(n)])
    yy, xx = np.mgrid[:size, :size]
    r = np.hypot((xx - size / 2) / (0.4 * size), (yy - size / 2) / (0.48 * size))
    return crops, np.clip((1.0 - r) / 0.15, 0, 1).astype(np.float32)


def test_color_fit_crops_measures_the_target_then_fits():
    """The fused statistics + fit equal the L*a*b* weighted mean and spread (float64 here) of each
    crop passed to :func:`color_fit_ref`; without the match, the identity."""
    n = 3
    crops, w = _face_crops(n)
    s = np.stack([_samples(k) for k in range(n)])
    stats = [_stats(x) for x in s]
    ms, ss = np.stack([a for a, _ in stats]), np.stack([b for _, b in stats])
    got = classic.color_fit_crops_ref(crops, w, float(w.sum()), s, ms, ss, n, True, np.empty((n, 12), np.float32))
    lab = classic._lab_of(crops.astype(np.float64))
    wt = w.astype(np.float64)[None, :, :, None]
    mt = (lab * wt).sum((1, 2)) / wt.sum()
    st = np.sqrt((((lab - mt[:, None, None]) ** 2) * wt).sum((1, 2)) / wt.sum()) + 1e-3
    want = classic.color_fit_ref(s, ms, ss, mt.astype(np.float32), st.astype(np.float32), n, True, np.empty((n, 12), np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    off = classic.color_fit_crops_ref(crops, w, float(w.sum()), s, ms, ss, n, False, np.empty((n, 12), np.float32))
    np.testing.assert_array_equal(off, np.tile([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0], (n, 1)))


@pytest.mark.parametrize("match", [True, False])
def test_ops_color_fit_crops(ops, match):
    """One launch per frame on the device (a block per face) against the NumPy reference; faces past
    ``count`` in the buffers are left alone."""
    n = 3
    crops, w = _face_crops(n + 1)
    s = np.stack([_samples(k) for k in range(n + 1)])
    stats = [_stats(x) for x in s]
    ms, ss = np.stack([a for a, _ in stats]), np.stack([b for _, b in stats])
    ref = classic.color_fit_crops_ref(crops, w, float(w.sum()), s, ms, ss, n, match, np.empty((n + 1, 12), np.float32))
    out = ops.asarray(np.full((n + 1, 12), np.nan, np.float32))
    dev = [ops.asarray(a) for a in (crops, w, s, ms, ss)]
    classic.color_fit_crops(ops, dev[0], dev[1], float(w.sum()), *dev[2:], n, match, out)
    got = host(ops, out)
    np.testing.assert_allclose(got[:n], ref[:n], rtol=1e-3, atol=1e-3)
    assert np.isnan(got[n]).all()


def _scene(seed: int = 0):
    """A textured frame (odd size), two sources with a face weight, grids of a bent map, masks."""
    rng = np.random.default_rng(seed)
    h, w = 257, 321
    frame = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (0, 0), 1.0)
    sources = []
    for side in (150, 97):
        src = np.empty((side, side, 4), np.uint8)
        src[..., :3] = cv2.GaussianBlur(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), (0, 0), 0.8)
        yy, xx = np.mgrid[:side, :side]
        r = np.hypot(xx - side / 2, yy - side / 2) / (side / 2)
        src[..., 3] = np.round(np.clip((0.9 - r) / 0.2, 0, 1) * 255)
        sources.append(src)
    size = 64
    mats = np.array([[[0.45, 0.05, -20.0], [-0.05, 0.45, -15.0]], [[0.8, 0.0, -180.0], [0.0, 0.8, -120.0]]])
    grids, origins = [], []
    for src in sources:
        side = src.shape[0]
        dst = rng.uniform(4, size - 4, (20, 2))
        s_pts = dst * (side / size) + rng.normal(0, 2.0, dst.shape)
        g, ox, oy, inv = classic.tps_grid(dst, s_pts, (2, 3, size - 5, size - 2))
        grids.append(g)
        origins.append((ox, oy, inv))
    masks = np.stack([box_mask(size), box_mask(size, 0.5)])
    affine = np.array([[1.1, 0.0, 0.05, -8, 0.0, 0.9, 0.0, 10, 0.02, 0.0, 1.0, 3]] * 2, np.float32)
    affine[1] = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]
    return frame, sources, np.stack(grids), np.array(origins), affine, masks, mats


@pytest.mark.parametrize("per_face", [True, False])
def test_ops_classic_paste(ops, per_face):
    frame, sources, grids, origins, affine, masks, mats = _scene()
    mask = masks if per_face else masks[0]
    ref = classic.classic_paste_ref(frame.copy(), sources, grids, origins, affine, mask, mats, 2)
    assert np.any(ref != frame)
    out = ops.asarray(frame.copy())
    classic.classic_paste(
        ops, out, [ops.asarray(s) for s in sources], grids, origins, ops.asarray(affine), ops.asarray(mask), mats, 2
    )
    got = host(ops, out)
    d = np.abs(got.astype(np.int16) - ref)
    # float32 warp coordinates on the device: a level of rounding on a few percent of the pasted pixels
    assert d.max() <= 2 and (d > 1).mean() < 1e-3 and (d > 0).mean() < 0.05, f"max {d.max()}, {(d > 0).mean():.4f} differ"
    # only the paste boxes change
    from vcam.kernels.paste import paste_boxes

    inside = np.zeros(frame.shape[:2], bool)
    for x0, y0, x1, y1 in paste_boxes(mats, 64, *frame.shape[:2]):
        inside[y0:y1, x0:x1] = True
    assert np.array_equal(got[~inside], frame[~inside])


@pytest.mark.parametrize("offsets", [False, True])
def test_classic_paste_of_float32_sources_is_the_paste_of_their_bytes(offsets):
    """The CPU swapper keeps its sources in float32 (nothing converted per frame, the paste reads
    them where they are): the same frame to the bit as the uint8 sources give."""
    frame, sources, grids, origins, affine, masks, mats = _scene(2)
    off = np.random.default_rng(4).uniform(-20, 20, (2, 12, 12, 3)).astype(np.float32) if offsets else None
    want = classic.classic_paste_ref(frame.copy(), sources, grids, origins, affine, masks, mats, 2, off)
    floats = [s.astype(np.float32) for s in sources]
    got = classic.classic_paste_ref(frame.copy(), floats, grids, origins, affine, masks, mats, 2, off)
    assert np.any(want != frame)
    np.testing.assert_array_equal(got, want)


def test_classic_paste_draws_the_source_through_the_warp():
    """A frame made by warping a source image with a known affine; the render of that source with a
    grid of the same affine (crop = frame here), mask 1, weight 1, identity colour: the frame back."""
    rng = np.random.default_rng(3)
    side = 200
    src = cv2.GaussianBlur(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), (0, 0), 1.5)
    src4 = np.concatenate([src, np.full((side, side, 1), 255, np.uint8)], -1)
    frame_from_src = np.array([[0.6, 0.1, 20.0], [-0.1, 0.6, 30.0]])
    size = 160
    frame = np.clip(
        cv2.warpAffine(
            src.astype(np.float32), frame_from_src, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        )
        + 0.5,
        0,
        255,
    ).astype(np.uint8)
    src_from_frame = cv2.invertAffineTransform(frame_from_src)
    dst = rng.uniform(20, 140, (30, 2))
    grid, ox, oy, inv = classic.tps_grid(dst, _affine_pts(dst, src_from_frame), (0, 0, size - 1, size - 1))
    blank = np.zeros_like(frame)
    eye = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    mask = np.ones((size, size), np.float32)
    out = classic.classic_paste_ref(
        blank,
        [src4],
        grid[None],
        np.array([[ox, oy, inv]]),
        np.array([[1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]], np.float32),
        mask,
        eye[None],
        1,
    )
    inner = (slice(40, 120), slice(40, 120))
    d = np.abs(out[inner].astype(np.int16) - frame[inner])
    assert d.max() <= 1, d.max()


def test_classic_paste_adds_the_colour_offsets(ops):
    """The local colour match's offsets: a flat grid adds what the colour map's offset column adds;
    a varying one (a ramp over the crop) renders alike on both devices."""
    frame, sources, grids, origins, affine, masks, mats = _scene(1)
    flat = np.broadcast_to(np.array([10.0, -5.0, 3.0], np.float32), (2, 6, 6, 3)).copy()
    shifted = affine.copy()
    shifted[:, 3::4] += flat[0, 0, 0]
    want = classic.classic_paste_ref(frame.copy(), sources, grids, origins, shifted, masks, mats, 2)
    got = classic.classic_paste_ref(frame.copy(), sources, grids, origins, affine, masks, mats, 2, flat)
    assert np.abs(got.astype(np.int16) - want).max() <= 1
    assert np.any(got != classic.classic_paste_ref(frame.copy(), sources, grids, origins, affine, masks, mats, 2))
    ramp = (np.linspace(-30, 30, 8, dtype=np.float32)[None, None, :, None] * np.ones((2, 8, 1, 3), np.float32)).copy()
    ref = classic.classic_paste_ref(frame.copy(), sources, grids, origins, affine, masks, mats, 2, ramp)
    out = ops.asarray(frame.copy())
    dev = [ops.asarray(s) for s in sources]
    classic.classic_paste(ops, out, dev, grids, origins, ops.asarray(affine), ops.asarray(masks), mats, 2, ops.asarray(ramp))
    d = np.abs(host(ops, out).astype(np.int16) - ref)
    assert d.max() <= 2 and (d > 1).mean() < 1e-3 and (d > 0).mean() < 0.05, f"max {d.max()}, {(d > 0).mean():.4f} differ"
