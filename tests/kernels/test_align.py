"""Align stage: the 5-point similarity in closed form against Umeyama's SVD, and the affine inverse."""

from __future__ import annotations

import numpy as np
import pytest

from vcam import align


def umeyama_svd(src, dst):
    """Umeyama (1991) by SVD, with the reflection fix: the oracle of the closed form."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    n = len(src)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s0, d0 = src - mu_s, dst - mu_d
    u, sig, vt = np.linalg.svd(d0.T @ s0 / n)
    sign = np.array([1.0, -1.0 if np.linalg.det(u) * np.linalg.det(vt) < 0 else 1.0])
    rot = u @ np.diag(sign) @ vt
    var = (s0**2).sum() / n
    scale = (sig * sign).sum() / var if var > 0 else 1.0
    m = np.zeros((2, 3))
    m[:, :2] = scale * rot
    m[:, 2] = mu_d - m[:, :2] @ mu_s
    return m


@pytest.mark.parametrize("seed", range(40))
def test_the_closed_form_is_umeyama(seed):
    rng = np.random.default_rng(seed)
    src = rng.uniform(0, 1000, (5, 2))
    if seed % 4 == 0:  # an exact similarity: recovered exactly
        ang, sc = rng.uniform(-np.pi, np.pi), rng.uniform(0.05, 4)
        rot = sc * np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
        dst = src @ rot.T + rng.uniform(-500, 500, 2)
    elif seed % 4 == 1:  # mirrored points: the best fit without reflection
        dst = src * [-1, 1] + rng.normal(0, 3, (5, 2))
    else:  # noisy landmarks against a template
        dst = align.TEMPLATES["arcface_128"] * 128 + rng.normal(0, 5, (5, 2))
    got, ref = align.umeyama(src, dst), umeyama_svd(src, dst)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(ref).max()))
    if seed % 4 == 0:
        np.testing.assert_allclose(align.apply(got, src), dst, atol=1e-6)


def test_degenerate_points_give_a_translation():
    m = align.umeyama(np.full((5, 2), 7.0), np.full((5, 2), 3.0))
    np.testing.assert_allclose(m, [[1, 0, -4], [0, 1, -4]])


def test_invert_round_trips_and_refuses_a_singular_matrix():
    rng = np.random.default_rng(1)
    mats = rng.normal(0, 2, (6, 2, 3))
    pts = rng.uniform(-50, 50, (7, 2))
    inv = align.invert(mats)
    assert inv.shape == mats.shape
    for m, i in zip(mats, inv):
        np.testing.assert_allclose(align.apply(i, align.apply(m, pts)), pts, atol=1e-9)
        np.testing.assert_allclose(align.invert(m), i)
    with pytest.raises(np.linalg.LinAlgError):
        align.invert(np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 1.0]]))


@pytest.mark.parametrize("count", [0, 1, align.FEW, align.FEW + 1, 40])
def test_invert_in_floats_is_numpy_s_inverse(count):
    """One matrix and small batches are inverted in Python floats, larger batches by NumPy: each
    within rounding of NumPy's inverse, in the batch's shape; a singular one in a batch refuses."""
    rng = np.random.default_rng(count)
    mats = rng.normal(0, 2, (count, 2, 3))
    got = align.invert(mats)
    assert got.shape == mats.shape and got.dtype == np.float64
    if count:
        a = np.linalg.inv(mats[:, :, :2])
        want = np.concatenate([a, -a @ mats[:, :, 2:]], axis=-1)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(align.invert(mats[0]), want[0], rtol=1e-12, atol=1e-12)
        mats[-1, :, :2] = [[1.0, 2.0], [2.0, 4.0]]
        with pytest.raises(np.linalg.LinAlgError):
            align.invert(mats)
