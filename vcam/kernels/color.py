"""Colour kernels (``kernels/color.cu``) of the classic swap: CIE L*a*b* conversions and the seamless
offset membrane. Each has a NumPy reference (``<name>_ref``), a CUDA launch with the same arguments
after ``ops``, and a front ``<name>(ops, ...)`` that picks one by the ops' device.

L*a*b* here is CIE 1976 from sRGB with the D65 white: ``L`` 0..100, ``a``/``b`` about -128..127; a
grey pixel (B = G = R) has ``a = b = 0`` (to float32 rounding). The three functions below are the CPU
twins of the kernels in ``kernels/color.cu`` and have their signatures. The arithmetic is specified
so the kernel reproduces it:

- float32 throughout, every product and sum rounded on its own (the kernels are built with
  ``--fmad=false``), sums in the order written;
- the transcendental steps (the sRGB transfer curve both ways and the cube root) are evaluated in
  float64 and rounded once to float32, so they do not depend on either side's float32 ``pow``;
- the matrices are float32 constants written with nine significant digits (exact float32 values), the
  same literals in both files.

:func:`lab_membrane_ref` is the cheap gradient-domain step of ``[swap] seamless``: the target-minus-source
difference, sampled on a band at the edge of the pasted region, spread inwards by a normalised
Gaussian blur on a coarse grid (about 8 crop pixels a cell). :func:`bgr_from_lab_ref` adds that grid,
bilinearly upsampled, to the source before it converts back, so the pasted face meets the target's
own colour and lighting at its edge and keeps the source's detail (its gradients) inside.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.kernels.build import dense, launch, on_device
from vcam.kernels.build import grid as _grid

MAX_GRID = 32  # cells per side of the membrane grid (kernels/color.cu keeps it in shared memory)

# Linear sRGB -> (X / Xn, Y, Z / Zn) with the D65 white folded in (rows sum to 1), and its inverse.
XYZ_FROM_RGB = np.array(
    [
        [0.433949947, 0.376209766, 0.189840287],
        [0.212672904, 0.715152204, 0.0721750036],
        [0.0177565832, 0.109467961, 0.872775435],
    ],
    dtype=np.float32,
)
RGB_FROM_XYZ = np.array(
    [
        [3.0799551, -1.53713882, -0.542816103],
        [-0.921258628, 1.87601089, 0.0452475101],
        [0.0528874025, -0.20402585, 1.15113842],
    ],
    dtype=np.float32,
)
_EPS = np.float32(0.00885645207)  # (6/29)^3: the cube-root branch of f(t) starts here
_SLOPE = np.float32(7.7870369)  # 1 / (3 * (6/29)^2)
_OFFSET = np.float32(0.137931034)  # 4/29
_DELTA = np.float32(0.206896558)  # 6/29: the cube branch of f^-1(t) starts here
_INV_SLOPE = np.float32(0.12841855)  # 3 * (6/29)^2
_MEMBRANE_EPS = np.float32(1e-3)  # added to the blurred band weight (cells far from the band fade to 0)


def _linear_table() -> np.ndarray:
    """sRGB code value 0..255 -> linear light, float32 (computed in float64, rounded once)."""
    c = np.arange(256, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, np.power((c + 0.055) / 1.055, 2.4))
    return lin.astype(np.float32)


_LINEAR = _linear_table()


def membrane_grid(size: int) -> int:
    """Cells per side of the membrane grid for a crop of ``size`` pixels: about 8 pixels a cell."""
    return int(min(MAX_GRID, max(2, size // 8)))


def _f(t: np.ndarray) -> np.ndarray:
    cube = np.cbrt(t.astype(np.float64)).astype(np.float32)
    return np.where(t > _EPS, cube, t * _SLOPE + _OFFSET)


def _f_inv(t: np.ndarray) -> np.ndarray:
    return np.where(t > _DELTA, (t * t) * t, (t - _OFFSET) * _INV_SLOPE)


def _rows3(a: Any, n: int) -> np.ndarray:
    """Per-face (F, 3) parameters as (n, 1, 1, 3) float32 for broadcasting over a crop."""
    return np.asarray(a, np.float32).reshape(-1, 3)[:n, None, None, :]


def lab_from_bgr_ref(crops: np.ndarray, count: int, out: np.ndarray) -> np.ndarray:
    """``out[f] = L*a*b*(crops[f])`` for ``f < count``: crops (F, S, S, 3) uint8 BGR -> out (F, S, S, 3)
    float32 (L, a, b).

    Per pixel: ``r, g, b`` = the sRGB curve of each code value (float64, then float32);
    ``x = (M00 * r + M01 * g) + M02 * b`` and likewise ``y``, ``z`` (:data:`XYZ_FROM_RGB`);
    ``f(t) = cbrt(t)`` (float64, then float32) for ``t > (6/29)^3``, else ``t * 7.7870369 + 4/29``;
    ``L = 116 * f(y) - 16``, ``a = 500 * (f(x) - f(y))``, ``b = 200 * (f(y) - f(z))``.
    """
    n = int(count)
    if n <= 0:
        return out
    src = np.asarray(crops[:n])
    b, g, r = _LINEAR[src[..., 0]], _LINEAR[src[..., 1]], _LINEAR[src[..., 2]]
    m = XYZ_FROM_RGB
    x = (m[0, 0] * r + m[0, 1] * g) + m[0, 2] * b
    y = (m[1, 0] * r + m[1, 1] * g) + m[1, 2] * b
    z = (m[2, 0] * r + m[2, 1] * g) + m[2, 2] * b
    fx, fy, fz = _f(x), _f(y), _f(z)
    dst = out[:n]
    dst[..., 0] = np.float32(116) * fy - np.float32(16)
    dst[..., 1] = np.float32(500) * (fx - fy)
    dst[..., 2] = np.float32(200) * (fy - fz)
    return out


def _upsample(membrane: np.ndarray, n: int, size: int) -> np.ndarray:
    """Bilinear upsampling of a (F, G, G, 3) grid to (n, size, size, 3) (OpenCV's INTER_LINEAR
    sampling positions, edges clamped), float32 in the kernel's order."""
    grid = membrane.shape[1]

    def axis() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = (np.arange(size, dtype=np.float32) + np.float32(0.5)) * np.float32(grid / size) - np.float32(0.5)
        pos = np.clip(pos, np.float32(0), np.float32(grid - 1))
        i0 = np.floor(pos).astype(np.int64)
        return i0, np.minimum(i0 + 1, grid - 1), (pos - i0.astype(np.float32)).astype(np.float32)

    i0, i1, t = axis()
    m = np.asarray(membrane[:n], np.float32)
    one = np.float32(1)
    fx = t[None, None, :, None]
    fy = t[None, :, None, None]
    across = m[:, :, i0] * (one - fx) + m[:, :, i1] * fx  # (n, G, S, 3): every grid row along x
    return across[:, i0] * (one - fy) + across[:, i1] * fy


def bgr_from_lab_ref(
    lab: np.ndarray,
    count: int,
    out: np.ndarray,
    scale: np.ndarray | None = None,
    shift: np.ndarray | None = None,
    membrane: np.ndarray | None = None,
) -> np.ndarray:
    """``out[f] = BGR(lab[f] * scale[f] + shift[f] + up(membrane[f]))`` for ``f < count``.

    ``lab`` (F, S, S, 3) float32; ``out`` (F, S, S, 3) uint8 BGR. ``scale``, ``shift``: (F, 3)
    float32 per face and channel, both or neither (then the identity). ``membrane``: (F, G, G, 3)
    float32 offsets from :func:`lab_membrane_ref`, bilinearly upsampled to the crop and added last.
    Per pixel, float32: ``fy = (L + 16) / 116``, ``fx = fy + a / 500``, ``fz = fy - b / 200``;
    ``f^-1(t) = (t * t) * t`` for ``t > 6/29``, else ``(t - 4/29) * 3 (6/29)^2``; linear
    ``r = (N00 * X + N01 * Y) + N02 * Z`` (:data:`RGB_FROM_XYZ`); then in float64: clamped to
    [0, 1] (NaN -> 0), the sRGB curve, ``floor(v * 255 + 0.5)``: rounded half up, within 0..255.
    """
    n = int(count)
    if n <= 0:
        return out
    if (scale is None) != (shift is None):
        raise ValueError("bgr_from_lab: give both scale and shift, or neither")
    v = np.asarray(lab[:n], np.float32)
    if scale is not None:
        v = v * _rows3(scale, n) + _rows3(shift, n)
    if membrane is not None:
        v = v + _upsample(membrane, n, v.shape[1])
    fy = (v[..., 0] + np.float32(16)) / np.float32(116)
    fx = fy + v[..., 1] / np.float32(500)
    fz = fy - v[..., 2] / np.float32(200)
    x, y, z = _f_inv(fx), _f_inv(fy), _f_inv(fz)
    m = RGB_FROM_XYZ
    lin = np.empty(v.shape, np.float64)
    for c, row in ((2, 0), (1, 1), (0, 2)):  # BGR channel c from RGB row
        lin[..., c] = (m[row, 0] * x + m[row, 1] * y) + m[row, 2] * z
    d = np.fmin(np.fmax(lin, 0.0), 1.0)
    e = 1.055 * np.power(d, 1.0 / 2.4) - 0.055
    low = d <= 0.0031308
    e[low] = d[low] * 12.92
    out[:n] = np.clip(np.floor(e * 255.0 + 0.5), 0, 255).astype(np.uint8)
    return out


def _cell_bounds(size: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """First pixel and pixel count of each of ``grid`` cells along a side of ``size`` pixels."""
    k = np.arange(grid + 1, dtype=np.int64)
    edges = (k * size) // grid
    return edges[:-1], edges[1:] - edges[:-1]


def _membrane_grid(out: Any) -> int:
    """The membrane's grid side ``G`` of ``out`` (F, G, G, 3), checked against :data:`MAX_GRID`."""
    grid = int(out.shape[1])
    if grid < 1 or grid > MAX_GRID:
        raise ValueError(f"membrane grid {grid} is outside 1..{MAX_GRID}")
    return grid


def lab_membrane_ref(
    target: np.ndarray,
    source: np.ndarray,
    weight: np.ndarray,
    count: int,
    out: np.ndarray,
    scale: np.ndarray | None = None,
    shift: np.ndarray | None = None,
    sigma: float = 2.0,
    clip: float = 12.0,
) -> np.ndarray:
    """The seamless offset grid ``out`` (F, G, G, 3) float32 for ``f < count`` (G = ``out.shape[1]``,
    at most :data:`MAX_GRID`).

    ``target``, ``source``: (F, S, S, 3) float32 L*a*b* crops; ``source`` goes through
    ``source * scale[f] + shift[f]`` first when they are given (as in :func:`bgr_from_lab_ref`);
    ``weight`` (F, S, S) float32 >= 0: where the difference is sampled (the band at the edge of the
    paste mask). Steps, float32, sums in the order written:

    1. pull: cell ``(i, j)`` covers rows ``[i*S//G, (i+1)*S//G)`` and the same columns; over its
       pixels in row-major order ``D += w * clip(target - source', -clip, clip)`` per channel and
       ``W += w`` (the clip keeps hair, glasses or a hat brim on the band from dragging the whole
       face towards their colour);
    2. blur, separable, ``g[k] = exp(-k^2 / (2 sigma^2))`` (float64, then float32) over cells:
       along x ``T[i, j] = sum_k g[|j - k|] * P[i, k]`` for k = 0..G-1, then along y the same over
       ``T``;
    3. ``out = D_blurred / (W_blurred + 1e-3)``: the weighted mean difference near each cell.
    """
    n = int(count)
    if n <= 0:
        return out
    grid = _membrane_grid(out)
    size = int(target.shape[1])
    t = np.asarray(target[:n], np.float32)
    s = np.asarray(source[:n], np.float32)
    if (scale is None) != (shift is None):
        raise ValueError("lab_membrane: give both scale and shift, or neither")
    if scale is not None:
        s = s * _rows3(scale, n) + _rows3(shift, n)
    w = np.asarray(weight[:n], np.float32)
    prod = np.empty((n, size, size, 4), np.float32)
    lim = np.float32(clip)
    prod[..., :3] = w[..., None] * np.clip(t - s, -lim, lim)
    prod[..., 3] = w
    # 1. pull: one offset of every cell at a time, so each cell sums its pixels in row-major order.
    pulled = np.zeros((n, grid, grid, 4), np.float32)
    if size % grid == 0:  # equal cells: a view per offset
        c = size // grid
        cells = prod.reshape(n, grid, c, grid, c, 4)
        for dy in range(c):
            for dx in range(c):
                pulled += cells[:, :, dy, :, dx, :]
    else:
        start, length = _cell_bounds(size, grid)
        for dy in range(int(length.max())):
            ok_y = dy < length
            ys = np.minimum(start + dy, size - 1)
            for dx in range(int(length.max())):
                ok = ok_y[:, None] & (dx < length)[None, :]
                xs = np.minimum(start + dx, size - 1)
                pulled += np.where(ok[None, :, :, None], prod[:, ys][:, :, xs], np.float32(0))
    # 2. separable blur over the cells, k in order.
    k = np.arange(grid, dtype=np.float64)
    g = np.exp(-(k * k) * (0.5 / (float(sigma) ** 2))).astype(np.float32)
    dist = np.abs(np.arange(grid)[:, None] - np.arange(grid)[None, :])  # [j, k] -> |j - k|
    across = np.zeros_like(pulled)
    for kk in range(grid):
        across += g[dist[:, kk]][None, None, :, None] * pulled[:, :, kk : kk + 1, :]
    blurred = np.zeros_like(pulled)
    for kk in range(grid):
        blurred += g[dist[:, kk]][None, :, None, None] * across[:, kk : kk + 1, :, :]
    out[:n] = blurred[..., :3] / (blurred[..., 3:] + _MEMBRANE_EPS)
    return out


# -- CUDA launches ---------------------------------------------------------------------------------
def _color_params(ops: Any, ref: Any, scale: Any, shift: Any) -> tuple[Any, Any, np.int32]:
    """(scale, shift, affine flag) kernel arguments: (F, 3) float32 device arrays, or ``ref``
    (any valid device array, never read) twice and 0 when there is no affine."""
    if (scale is None) != (shift is None):
        raise ValueError("give both scale and shift, or neither")
    if scale is None:
        return ref, ref, np.int32(0)
    cp = ops.xp
    return (
        cp.ascontiguousarray(scale.reshape(-1, 3), dtype=cp.float32),
        cp.ascontiguousarray(shift.reshape(-1, 3), dtype=cp.float32),
        np.int32(1),
    )


# -- fronts: one per kernel, by device -------------------------------------------------------------
def lab_from_bgr(ops: Any, crops: Any, count: int, out: Any) -> Any:
    """Crops (F, S, S, 3) uint8 BGR -> L*a*b* (F, S, S, 3) float32 (:func:`lab_from_bgr_ref`)."""
    if not on_device(ops):
        return lab_from_bgr_ref(crops, count, out)
    # Crops (F, S, S, 3) uint8 BGR -> L*a*b* float32 (F, S, S, 3); one thread per pixel.
    n = int(count)
    if n <= 0:
        return out
    size = int(crops.shape[1])
    total = n * size * size
    with ops.stream:  # a copy made here is ordered before the kernel
        src = ops.xp.ascontiguousarray(crops[:n], dtype=ops.xp.uint8)
    launch(ops, "color", "lab_from_bgr", (_grid(total),), (src, np.int32(total), dense(out, np.float32)))
    return out


def bgr_from_lab(ops: Any, lab: Any, count: int, out: Any, scale: Any = None, shift: Any = None, membrane: Any = None) -> Any:
    """``lab * scale[f] + shift[f]`` (+ the upsampled ``membrane``) -> uint8 BGR; ``scale``/``shift``
    (F, 3) float32 in the ops' memory (:func:`bgr_from_lab_ref`)."""
    if not on_device(ops):
        return bgr_from_lab_ref(lab, count, out, scale, shift, membrane)
    # ``lab * scale[f] + shift[f]`` (+ the membrane grid, upsampled) -> uint8 BGR crops; the
    # per-face parameters stay on the device (no host wait).
    n = int(count)
    if n <= 0:
        return out
    cp = ops.xp
    size = int(lab.shape[1])
    with ops.stream:  # copies made here are ordered before the kernel
        src = cp.ascontiguousarray(lab[:n], dtype=cp.float32)
        sc, sh, affine = _color_params(ops, src, scale, shift)
        grid = 0 if membrane is None else int(membrane.shape[1])
        mem = src if membrane is None else cp.ascontiguousarray(membrane, dtype=cp.float32)
    launch(
        ops,
        "color",
        "bgr_from_lab",
        (_grid(n * size * size),),
        (src, np.int32(n), np.int32(size), sc, sh, affine, mem, np.int32(grid), dense(out, np.uint8)),
    )
    return out


def lab_membrane(
    ops: Any,
    target: Any,
    source: Any,
    weight: Any,
    count: int,
    out: Any,
    scale: Any = None,
    shift: Any = None,
    sigma: float = 2.0,
    clip: float = 12.0,
) -> Any:
    """The seamless offset grid (F, G, G, 3) float32 (:func:`lab_membrane_ref`)."""
    if not on_device(ops):
        return lab_membrane_ref(target, source, weight, count, out, scale, shift, sigma, clip)
    # The seamless offset grid (F, G, G, 3) float32; one block of 256 threads per face.
    n = int(count)
    if n <= 0:
        return out
    grid = _membrane_grid(out)
    cp = ops.xp
    size = int(target.shape[1])
    with ops.stream:  # copies made here are ordered before the kernel
        t = cp.ascontiguousarray(target[:n], dtype=cp.float32)
        s = cp.ascontiguousarray(source[:n], dtype=cp.float32)
        w = cp.ascontiguousarray(weight[:n], dtype=cp.float32)
        sc, sh, affine = _color_params(ops, t, scale, shift)
    inv = np.float64(0.5 / float(sigma) ** 2)  # 1 / (2 sigma^2), sigma in cells
    dst = dense(out, np.float32)
    args = (t, s, w, np.int32(n), np.int32(size), sc, sh, affine, inv, np.float32(clip), np.int32(grid), dst)
    launch(ops, "color", "lab_membrane", (n,), args)
    return out


__all__ = [
    "MAX_GRID",
    "RGB_FROM_XYZ",
    "XYZ_FROM_RGB",
    "bgr_from_lab",
    "bgr_from_lab_ref",
    "lab_from_bgr",
    "lab_from_bgr_ref",
    "lab_membrane",
    "lab_membrane_ref",
    "membrane_grid",
]
