"""Classic-swap kernels (``kernels/classic.cu``): the source face warped by a dense landmark field and
blended straight into the frame at the frame's resolution, and the per-face colour map.

- :func:`tps_grid` (host): the thin-plate spline through control points of the target (crop pixels)
  and the source (source pixels), evaluated on a :data:`GRID` x :data:`GRID` grid over the target's
  face; the kernel interpolates the grid bilinearly, so a frame pixel costs a few loads whatever the
  number of landmarks.
- :func:`color_fit_ref`: the classic swap's L*a*b* statistics transfer (``(lab - mean_s) / std_s *
  std_t + mean_t``) applied exactly to :data:`FIT_SAMPLES` colours of the source's face, and fitted
  by least squares as one affine map of BGR per face (3 x 4): per pixel, the render then costs a
  3 x 4 product instead of two colour-space conversions.
- :func:`classic_paste_ref`: per frame pixel of a face's paste box: crop point (``crop_from_frame``),
  the paste mask there (crop space, bilinear, as :func:`vcam.kernels.paste.paste_back_ref`), the
  source point (the grid), the source's B, G, R and face weight there (bilinear), then
  ``frame = frame * (1 - a) + (A @ bgr + b + offset) * a`` with ``a = mask * weight``, rounded half
  up; ``offset``: a coarse grid of colour offsets over the crop (the local colour match), or 0.

Each kernel has its NumPy reference (``<name>_ref``: the CPU path and the test oracle) and a front
``<name>(ops, ...)`` that picks one by the ops' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vcam.kernels.build import grid as _grid
from vcam.kernels.build import launch, on_device
from vcam.kernels.paste import paste_boxes

GRID = 19  # warp-grid nodes per side (kernels/classic.cu)
FIT_SAMPLES = 64  # source colours the colour map is fitted on (kernels/classic.cu)
RIDGE = 1e-3  # least-squares ridge on the colour terms, per sample

TPS_MAX = 48  # control points of a spline, at most (kernels/classic.cu)

#: Mirrors ``struct Render`` of kernels/classic.cu (passed by value, one face per launch).
RENDER = np.dtype(
    {
        "names": ["crop_from_frame", "box", "grid_origin", "grid_inv", "size", "offset_size"],
        "formats": [("f8", (6,)), ("i4", (4,)), ("f4", (2,)), "f4", "i4", "i4"],
    },
    align=True,
)

#: One face's thin-plate spline as the node kernel evaluates it (mirrors ``struct Spline`` of
#: kernels/classic.cu, by value): control points ``q`` and weights ``w`` (``n`` of them) and the affine
#: part ``a`` (constant, x, y rows) in the spline's unit coordinates; node (r, c) of the grid lies at
#: ``(g0[0] + c * step, g0[1] + r * step)`` there.
SPLINE = np.dtype(
    {
        "names": ["q", "w", "a", "g0", "step", "n"],
        "formats": [("f4", (TPS_MAX, 2)), ("f4", (TPS_MAX, 2)), ("f4", (3, 2)), ("f8", (2,)), "f8", "i4"],
    },
    align=True,
)


# -- the warp field (host) -------------------------------------------------------------------------
def _tps_kernel(d2: np.ndarray) -> np.ndarray:
    """``r^2 log r^2`` of squared distances (0 at 0)."""
    d2 = np.maximum(d2, 1e-300)
    return d2 * np.log(d2)


def tps_fit(dst: np.ndarray, src: np.ndarray, smooth: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Thin-plate spline ``f`` with ``f(dst[i]) ~= src[i]`` ((N, 2) each): returns (weights (N, 2),
    affine (3, 2)) for :func:`tps_eval`. ``smooth``: regulariser in squared pixels of ``dst``."""
    p = np.asarray(dst, np.float64).reshape(-1, 2)
    v = np.asarray(src, np.float64).reshape(-1, 2)
    n = p.shape[0]
    centre = p.mean(0)
    span = max(float(np.abs(p - centre).max()), 1e-6)
    q = (p - centre) / span  # conditioned: unit-sized coordinates
    dx, dy = q[:, :1] - q[None, :, 0], q[:, 1:] - q[None, :, 1]
    k = _tps_kernel(dx * dx + dy * dy)
    k[np.diag_indices(n)] += float(smooth) / span**2
    a = np.zeros((n + 3, n + 3))
    a[:n, :n] = k
    a[:n, n] = a[n, :n] = 1.0
    a[:n, n + 1 :] = q
    a[n + 1 :, :n] = q.T
    rhs = np.zeros((n + 3, 2))
    rhs[:n] = v
    sol = np.linalg.lstsq(a, rhs, rcond=None)[0] if n < 3 else np.linalg.solve(a, rhs)
    return sol[:n], np.concatenate([sol[n:], centre[None], [[span, span]]])


def tps_eval(dst: np.ndarray, fit: tuple[np.ndarray, np.ndarray], pts: np.ndarray) -> np.ndarray:
    """The spline of :func:`tps_fit` (fitted on ``dst``) at ``pts`` (M, 2) -> (M, 2) float64."""
    w, aff = fit
    centre, span = aff[3], aff[4, 0]
    p = (np.asarray(dst, np.float64).reshape(-1, 2) - centre) / span
    x = (np.asarray(pts, np.float64).reshape(-1, 2) - centre) / span
    dx, dy = x[:, :1] - p[None, :, 0], x[:, 1:] - p[None, :, 1]
    k = _tps_kernel(dx * dx + dy * dy)
    return k @ w + aff[0] + x[:, :1] * aff[1] + x[:, 1:] * aff[2]


_INDEX = np.arange(GRID, dtype=np.float64)


def tps_spline(
    dst: np.ndarray, src: np.ndarray, box: Sequence[float], smooth: float = 0.0, scale: float = 1.0
) -> tuple[np.ndarray, float, float, float]:
    """The spline ``dst`` -> ``src`` ((N, 2) each, N <= :data:`TPS_MAX`) fitted (:func:`tps_fit`) for
    a grid over ``box`` (x0, y0, x1, y1) of the target: (one :data:`SPLINE` record (a (1,) array),
    origin x, origin y, nodes per target pixel). The grid is square (the box's longer side) and
    centred on the box. ``scale``: its output is in pixels of the source scaled by that (a pyramid
    level: ``(p + 0.5) * scale - 0.5``). :func:`tps_nodes` evaluates it."""
    x0, y0, x1, y1 = (float(b) for b in box)
    side = max(x1 - x0, y1 - y0, 1.0)
    ox, oy = (x0 + x1 - side) / 2, (y0 + y1 - side) / 2
    p = np.asarray(dst, np.float64).reshape(-1, 2)
    n = p.shape[0]
    if n > TPS_MAX:
        raise ValueError(f"a spline of at most {TPS_MAX} control points, got {n}")
    w, aff = tps_fit(p, src, smooth)
    centre, span = aff[3], aff[4, 0]
    k = float(scale)
    rec = np.zeros(1, SPLINE)
    rec["q"][0, :n] = (p - centre) / span
    rec["w"][0, :n] = w * k
    rec["a"][0] = aff[:3] * k
    rec["a"][0, 0] += 0.5 * k - 0.5
    rec["g0"][0] = ((ox - centre[0]) / span, (oy - centre[1]) / span)
    rec["step"][0] = side / (GRID - 1) / span
    rec["n"][0] = n
    return rec, float(ox), float(oy), float((GRID - 1) / side)


def tps_nodes_ref(splines: np.ndarray, count: int, out: np.ndarray) -> np.ndarray:
    """The grids (F, GRID, GRID, 2) float32 of ``count`` :data:`SPLINE` records into ``out``: at node
    (r, c), ``x = g0[0] + c * step``, ``y = g0[1] + r * step`` (float64, then float32), ``d2 = (y -
    q_y)^2 + (x - q_x)^2`` (float32, at least 1e-30), ``sum_j d2_j log(d2_j) w_j + a[0] + x a[1] + y
    a[2]`` (float32; the sum in any order: a few thousandths of a pixel)."""
    for f in range(int(count)):
        rec = splines[f]
        n = int(rec["n"])
        q, w = rec["q"][:n], rec["w"][:n]
        gx = (rec["g0"][0] + _INDEX * rec["step"]).astype(np.float32)  # node columns
        gy = (rec["g0"][1] + _INDEX * rec["step"]).astype(np.float32)  # node rows
        dx2 = np.square(gx[:, None] - q[None, :, 0])  # (GRID, n): the grid's distances are separable
        dy2 = np.square(gy[:, None] - q[None, :, 1])
        d2 = dy2[:, None, :] + dx2[None, :, :]  # (rows, cols, n)
        np.maximum(d2, np.float32(1e-30), out=d2)  # r^2 log r^2 -> 0 at a control point
        kern = d2 * np.log(d2)
        g = (kern.reshape(GRID * GRID, n) @ w).reshape(GRID, GRID, 2)
        g += rec["a"][0]
        g += gx[None, :, None] * rec["a"][1]
        g += gy[:, None, None] * rec["a"][2]
        out[f] = g
    return out


def tps_grid(
    dst: np.ndarray, src: np.ndarray, box: Sequence[float], smooth: float = 0.0
) -> tuple[np.ndarray, float, float, float]:
    """The warp grid of the spline ``dst`` -> ``src`` over ``box`` (x0, y0, x1, y1) of the target:
    (grid (GRID, GRID, 2) float32 source points, origin x, origin y, nodes per target pixel)
    (:func:`tps_spline`, then :func:`tps_nodes_ref`)."""
    rec, ox, oy, inv = tps_spline(dst, src, box, smooth)
    return tps_nodes_ref(rec, 1, np.empty((1, GRID, GRID, 2), np.float32))[0], ox, oy, inv


# -- NumPy references ------------------------------------------------------------------------------
def _srgb_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab_of(bgr: np.ndarray) -> np.ndarray:
    from vcam.kernels.color import XYZ_FROM_RGB

    m = XYZ_FROM_RGB.astype(np.float64)
    lin = _srgb_linear(np.asarray(bgr, np.float64) / 255.0)
    b, g, r = lin[..., 0], lin[..., 1], lin[..., 2]
    xyz = [(m[i, 0] * r + m[i, 1] * g) + m[i, 2] * b for i in range(3)]
    fx, fy, fz = (np.where(t > 0.008856452070808411, np.cbrt(t), t * 7.787037037037037 + 4.0 / 29.0) for t in xyz)
    return np.stack([116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)], -1)


def _bgr_of(lab: np.ndarray) -> np.ndarray:
    from vcam.kernels.color import RGB_FROM_XYZ

    m = RGB_FROM_XYZ.astype(np.float64)
    fy = (lab[..., 0] + 16.0) / 116.0
    fx = fy + lab[..., 1] / 500.0
    fz = fy - lab[..., 2] / 200.0
    x, y, z = (np.where(t > 6.0 / 29.0, t * t * t, (t - 4.0 / 29.0) * 0.12841854934601665) for t in (fx, fy, fz))
    out = np.empty(lab.shape, np.float64)
    for row in range(3):
        d = np.clip((m[row, 0] * x + m[row, 1] * y) + m[row, 2] * z, 0.0, 1.0)
        e = np.where(d <= 0.0031308, d * 12.92, 1.055 * np.power(d, 1.0 / 2.4) - 0.055)
        out[..., 2 - row] = e * 255.0
    return out


def color_fit_ref(
    samples: np.ndarray,
    src_mean: np.ndarray,
    src_std: np.ndarray,
    tgt_mean: np.ndarray,
    tgt_std: np.ndarray,
    count: int,
    match: bool,
    out: np.ndarray,
) -> np.ndarray:
    """The colour map of each face ``f < count`` into ``out`` (F, 12) float32: rows B, G, R of
    ``(a_b, a_g, a_r, offset)``. ``samples`` (F, FIT_SAMPLES, 3) float32 BGR colours of the source's
    face; ``src_mean``/``src_std``/``tgt_mean``/``tgt_std`` (F, 3) float32 L*a*b* statistics. Each
    sample's L*a*b* (the CIE formula in float64) is moved by ``(lab - src_mean) / src_std * tgt_std +
    tgt_mean`` and converted back to BGR 0..255 (linear light clamped to [0, 1], no rounding); the
    map is the least-squares fit of those pairs with a ridge of ``RIDGE * FIT_SAMPLES`` on the
    colour terms. ``match`` False: the identity."""
    n = int(count)
    if not match:
        out[:n] = np.array([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0], np.float32)
        return out
    for f in range(n):
        x = np.asarray(samples[f], np.float64).reshape(-1, 3)
        lab = _lab_of(x)
        ms, ss, mt, st = (np.asarray(a[f], np.float64).reshape(3) for a in (src_mean, src_std, tgt_mean, tgt_std))
        y = _bgr_of((lab - ms) / ss * st + mt)
        xa = np.concatenate([x, np.ones((x.shape[0], 1))], 1)
        xtx = xa.T @ xa
        xtx[np.arange(3), np.arange(3)] += RIDGE * x.shape[0]
        sol = np.linalg.solve(xtx, xa.T @ y)  # (4, 3)
        out[f] = sol.T.reshape(12).astype(np.float32)
    return out


def color_fit_crops_ref(
    crops: np.ndarray,
    weight: np.ndarray,
    wsum: float,
    samples: np.ndarray,
    src_mean: np.ndarray,
    src_std: np.ndarray,
    count: int,
    match: bool,
    out: np.ndarray,
) -> np.ndarray:
    """The colour maps of :func:`color_fit_ref` with the target statistics measured here: for each
    face ``f < count``, the L*a*b* (:func:`vcam.kernels.color.lab_from_bgr_ref`) of ``crops[f]`` ((F,
    S, S, 3) uint8 BGR, the target's face) weighted by ``weight`` ((S, S) float32 summing to
    ``wsum``): ``mean = sum(lab * w) / wsum``, ``std = sqrt(sum((lab - mean)^2 * w) / wsum) + 1e-3``
    (float32). ``match`` False: the identity (the crops are not read)."""
    from vcam.kernels.color import lab_from_bgr_ref

    n = int(count)
    if not match or n <= 0:
        return color_fit_ref(samples, src_mean, src_std, src_mean, src_std, n, False, out)
    src = np.asarray(crops)[:n]
    lab = lab_from_bgr_ref(src, n, np.empty(src.shape, np.float32)).reshape(n, -1, 3)
    w = np.asarray(weight, np.float32).reshape(-1)
    # the weighted sums as products with the weights (float32 BLAS: a pass each, not NumPy's
    # reduction over the crop's two axes)
    mean = (w @ lab) / np.float32(wsum)  # (n, 3)
    dev = lab - mean[:, None, :]
    dev *= dev
    std = np.sqrt((w @ dev) / np.float32(wsum)) + np.float32(1e-3)
    return color_fit_ref(samples, src_mean, src_std, mean, std, n, True, out)


#: The NumPy reference refines the warp grid this many times (exactly: the refined grid's bilinear
#: interpolation is the grid's) before OpenCV's warp samples it, whose 1/32-cell weights then move a
#: point by at most 1/32 of a refined cell.
REFINE = 8


def _refine(n: int) -> np.ndarray:
    """(k (n - 1) + 1, n) float32 bilinear weights: node i of the refined axis at coarse ``i / k``."""
    k = REFINE
    pos = np.arange(k * (n - 1) + 1, dtype=np.float64) / k
    lo = np.minimum(np.floor(pos).astype(int), n - 2)
    t = pos - lo
    w = np.zeros((pos.size, n))
    w[np.arange(pos.size), lo] = 1 - t
    w[np.arange(pos.size), lo + 1] = t
    return w


_REFINE_W = _refine(GRID)


def _sample(img: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """``img`` (h, w, C) uint8 or float32 at the float32 points ``pts`` (..., 2), bilinear with the
    edges replicated, as float32 (OpenCV's remap in float: no rounding to uint8; its weights are in
    1/32 pixels, a position within 1/64 pixel of the kernel's). A uint8 image: the region the points
    reach, converted; a float32 one (the CPU swapper keeps its sources so): read where it is, the
    same samples (a point's offset from the region's whole-pixel corner is exact in float32)."""
    import cv2

    h, w = img.shape[:2]
    if img.dtype == np.float32:
        mx = np.clip(pts[..., 0], np.float32(0), np.float32(w - 1))
        my = np.clip(pts[..., 1], np.float32(0), np.float32(h - 1))
        return cv2.remap(img, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    x0 = int(np.clip(np.floor(pts[..., 0].min()), 0, w - 1))
    y0 = int(np.clip(np.floor(pts[..., 1].min()), 0, h - 1))
    x1 = int(np.clip(np.ceil(pts[..., 0].max()) + 2, x0 + 1, w))
    y1 = int(np.clip(np.ceil(pts[..., 1].max()) + 2, y0 + 1, h))
    region = img[y0:y1, x0:x1].astype(np.float32)
    # points off the image: clamped first (the kernel's replicate), then moved into the region
    mx = np.clip(pts[..., 0], np.float32(0), np.float32(w - 1)) - np.float32(x0)
    my = np.clip(pts[..., 1], np.float32(0), np.float32(h - 1)) - np.float32(y0)
    return cv2.remap(region, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def offset_at_ref(offsets: np.ndarray, size: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The colour offsets (..., 3) float32 of an (og, og, 3) grid over a ``size`` crop at crop points
    ``u``, ``v`` (float64): grid cell centres at ``(i + 0.5) * size / og - 0.5``, bilinear, edges
    clamped, in float32 (what ``offset_at`` of kernels/classic.cu does)."""
    g = np.asarray(offsets, np.float32)
    og = g.shape[0]
    k = np.float32(og) / np.float32(size)
    gx = np.clip((u.astype(np.float32) + np.float32(0.5)) * k - np.float32(0.5), np.float32(0), np.float32(og - 1))
    gy = np.clip((v.astype(np.float32) + np.float32(0.5)) * k - np.float32(0.5), np.float32(0), np.float32(og - 1))
    x0, y0 = np.floor(gx).astype(np.intp), np.floor(gy).astype(np.intp)
    x1, y1 = np.minimum(x0 + 1, og - 1), np.minimum(y0 + 1, og - 1)
    fx, fy = (gx - x0.astype(np.float32))[..., None], (gy - y0.astype(np.float32))[..., None]
    top = g[y0, x0] * (np.float32(1) - fx) + g[y0, x1] * fx
    bot = g[y1, x0] * (np.float32(1) - fx) + g[y1, x1] * fx
    return top * (np.float32(1) - fy) + bot * fy  # type: ignore[no-any-return]


def classic_paste_ref(
    frame: np.ndarray,
    sources: Sequence[np.ndarray],
    grids: np.ndarray,
    origins: np.ndarray,
    affine: np.ndarray,
    mask: np.ndarray,
    crop_from_frame: np.ndarray,
    count: int,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """Render ``count`` faces into ``frame`` (H, W, 3) uint8 in place and return it.

    ``sources``: one (h, w, 4) uint8 image per face (B, G, R, face weight 0..255), or float32 of
    those values (the same result, nothing converted per frame); ``grids`` (F,
    GRID, GRID, 2) float32 source points of the warp grid; ``origins`` (F, 3): the grid's origin x,
    y in crop pixels and its nodes per crop pixel; ``affine`` (F, 12) float32 colour maps
    (:func:`color_fit_ref`); ``mask`` (S, S) or (F, S, S) float32 paste masks in crop space;
    ``crop_from_frame`` (F, 2, 3); ``offsets``: None, or (F, og, og, 3) float32 colour offsets over
    each face's crop added to its mapped colour (the local colour match; :func:`offset_at_ref` at
    the crop point, which the reference takes as the grid resized to the crop, then sampled as the
    mask is: within a hundredth of a level).
    Faces are drawn in order over their paste boxes (see the module docstring for the arithmetic)."""
    import cv2

    mats = np.asarray(crop_from_frame, np.float64).reshape(-1, 2, 3)
    n = int(count)
    masks = np.ascontiguousarray(mask, np.float32)
    size = masks.shape[-1]
    h, w = frame.shape[:2]
    boxes = paste_boxes(mats[:n], size, h, w)
    lin = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for f in range(n):
        x0, y0, x1, y1 = (int(v) for v in boxes[f])
        if x1 <= x0 or y1 <= y0:
            continue
        m = mats[f].copy()  # crop_from_roi
        m[:, 2] += m[:, 0] * x0 + m[:, 1] * y0
        a = cv2.warpAffine(
            masks[f] if masks.ndim == 3 else masks, m, (x1 - x0, y1 - y0), flags=lin, borderMode=cv2.BORDER_CONSTANT
        )
        rows, cols = np.flatnonzero((a > 0).any(1)), np.flatnonzero((a > 0).any(0))
        if rows.size == 0:
            continue
        # only the rows and columns the mask reaches (elsewhere the kernel leaves the frame as it is)
        a = a[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        x0, y0 = x0 + int(cols[0]), y0 + int(rows[0])
        x1, y1 = x0 + a.shape[1], y0 + a.shape[0]
        bw, bh = x1 - x0, y1 - y0
        m = mats[f].copy()
        m[:, 2] += m[:, 0] * x0 + m[:, 1] * y0
        ox, oy, inv = (float(v) for v in origins[f])
        coarse = np.asarray(grids[f], np.float64)
        fine = np.stack([_REFINE_W @ coarse[..., c] @ _REFINE_W.T for c in range(2)], -1).astype(np.float32)
        g = m * (inv * REFINE)  # refined grid from ROI
        g[:, 2] -= (ox * inv * REFINE, oy * inv * REFINE)
        pts = cv2.warpAffine(fine, g, (bw, bh), flags=lin, borderMode=cv2.BORDER_REPLICATE)
        src = sources[f]
        s = _sample(src if src.dtype == np.float32 else np.asarray(src, np.uint8), pts)
        a *= s[..., 3] * np.float32(1.0 / 255.0)
        colour = np.zeros((3, 5), np.float32)  # the B, G, R map; the weight channel takes no part
        colour[:, :3], colour[:, 4] = np.asarray(affine[f], np.float32).reshape(3, 4)[:, :3], np.asarray(affine[f])[3::4]
        out = cv2.transform(s, colour)
        if offsets is not None:  # the grid at the crop's pixels (exact), then like the mask (bilinear)
            fine_off = cv2.resize(np.asarray(offsets[f], np.float32), (size, size), interpolation=cv2.INTER_LINEAR)
            out += cv2.warpAffine(fine_off, m, (bw, bh), flags=lin, borderMode=cv2.BORDER_REPLICATE)
        a3 = a[..., None]
        out *= a3
        roi = frame[y0:y1, x0:x1]
        keep = roi.astype(np.float32)
        keep *= np.float32(1) - a3
        out += keep  # where a = 0: the pixel itself (x + 0 + 0.5, floored)
        out += np.float32(0.5)
        np.clip(out, 0, 255, out=out)
        roi[...] = out.astype(np.uint8)
    return frame


# -- fronts: one per kernel, by device -------------------------------------------------------------
def color_fit(
    ops: Any, samples: Any, src_mean: Any, src_std: Any, tgt_mean: Any, tgt_std: Any, count: int, match: bool, out: Any
) -> Any:
    """The per-face colour maps (F, 12) (:func:`color_fit_ref`); arrays in the ops' memory."""
    if not on_device(ops):
        return color_fit_ref(samples, src_mean, src_std, tgt_mean, tgt_std, count, match, out)
    n = int(count)
    if n <= 0:
        return out
    cp = ops.xp
    with ops.stream:  # copies made here are ordered before the kernel
        args = [cp.ascontiguousarray(a, dtype=cp.float32) for a in (samples, src_mean, src_std, tgt_mean, tgt_std)]
    launch(ops, "classic", "color_fit", ((n + 31) // 32,), (*args, np.int32(n), np.int32(bool(match)), out), block=(32,))
    return out


#: Threads per face of the ``color_fit_crops`` kernel (kernels/classic.cu STATS_THREADS).
STATS_THREADS = 256


def color_fit_crops(
    ops: Any,
    crops: Any,
    weight: Any,
    wsum: float,
    samples: Any,
    src_mean: Any,
    src_std: Any,
    count: int,
    match: bool,
    out: Any,
) -> Any:
    """The per-face colour maps (F, 12) with the target statistics measured from ``crops``
    (:func:`color_fit_crops_ref`), one launch; arrays in the ops' memory, C-contiguous (``crops``,
    ``samples``, ``src_mean``, ``src_std`` and ``out`` hold at least ``count`` faces)."""
    if not on_device(ops):
        return color_fit_crops_ref(crops, weight, wsum, samples, src_mean, src_std, count, match, out)
    n = int(count)
    if n <= 0:
        return out
    size = int(weight.shape[-1])
    args = (crops, np.int32(size), weight, np.float32(wsum), samples, src_mean, src_std, np.int32(n), np.int32(bool(match)), out)
    launch(ops, "classic", "color_fit_crops", (n,), args, block=(STATS_THREADS,))
    return out


def tps_nodes(ops: Any, splines: np.ndarray, count: int, out: Any) -> Any:
    """The warp grids of ``count`` :data:`SPLINE` records (host) into ``out`` (F, GRID, GRID, 2)
    float32 in the ops' memory (:func:`tps_nodes_ref`): one launch per face, the record by value."""
    if not on_device(ops):
        return tps_nodes_ref(splines, count, out)
    for f in range(int(count)):
        launch(ops, "classic", "tps_nodes", (_grid(GRID * GRID),), (np.ascontiguousarray(splines[f : f + 1]), out[f]))
    return out


def classic_paste(
    ops: Any,
    frame: Any,
    sources: Sequence[Any],
    grids: Any,
    origins: np.ndarray,
    affine: Any,
    mask: Any,
    crop_from_frame: np.ndarray,
    count: int,
    offsets: Any = None,
) -> Any:
    """Render ``count`` faces into ``frame`` in place (:func:`classic_paste_ref`); ``origins`` and
    ``crop_from_frame`` on the host (passed by value), ``grids`` (F, GRID, GRID, 2) float32 in the
    ops' memory (:func:`tps_nodes`; a host array is uploaded), the rest in the ops' memory. One
    launch per face, in order."""
    if not on_device(ops):
        return classic_paste_ref(frame, sources, grids, origins, affine, mask, crop_from_frame, count, offsets)
    mats = np.asarray(crop_from_frame, np.float64).reshape(-1, 2, 3)
    n = int(count)
    size = int(mask.shape[-1])
    h, w = int(frame.shape[0]), int(frame.shape[1])
    boxes = paste_boxes(mats[:n], size, h, w)
    per_face = mask.ndim == 3
    if isinstance(grids, np.ndarray):  # host grids (a test's): uploaded for the kernel
        grids = ops.asarray(np.ascontiguousarray(grids, np.float32))
    for f in range(n):
        x0, y0, x1, y1 = (int(v) for v in boxes[f])
        if x1 <= x0 or y1 <= y0:
            continue
        p = np.zeros(1, dtype=RENDER)
        p["crop_from_frame"][0] = mats[f].reshape(6)
        p["box"][0] = boxes[f]
        p["grid_origin"][0] = origins[f][:2]
        p["grid_inv"][0] = origins[f][2]
        p["size"][0] = size
        p["offset_size"][0] = 0 if offsets is None else int(offsets.shape[1])
        src = sources[f]
        args = (
            frame,
            np.int32(w),
            np.int32(h),
            src,
            np.int32(src.shape[1]),
            np.int32(src.shape[0]),
            mask[f] if per_face else mask,
            affine[f],
            grids[f],
            grids[f] if offsets is None else offsets[f],  # not read without offsets
            p,
        )
        launch(ops, "classic", "classic_paste", (_grid((x1 - x0) * (y1 - y0)),), args)
    return frame


__all__ = [
    "FIT_SAMPLES",
    "GRID",
    "RENDER",
    "SPLINE",
    "TPS_MAX",
    "classic_paste",
    "classic_paste_ref",
    "offset_at_ref",
    "STATS_THREADS",
    "color_fit",
    "color_fit_crops",
    "color_fit_crops_ref",
    "color_fit_ref",
    "tps_eval",
    "tps_fit",
    "tps_grid",
    "tps_nodes",
    "tps_nodes_ref",
    "tps_spline",
]
