"""The filters the tracker smooths faces with: the One-Euro filter (Casiez et al. 2012), a low-pass
whose cutoff rises with speed, so a still face stops jittering while a moving one is followed; and
:class:`HeadFilter`, which applies it to the head's pose (with the pose's own velocity, so a moving
head is not trailed) and smooths the landmarks' shape in the head's own coordinates."""

from __future__ import annotations

import math

import numpy as np


class OneEuroFilter:
    """One-Euro filter over an array of 2-D points (N, 2), one cutoff per point.

    ``min_cutoff`` (Hz): cutoff at rest, lower removes more jitter; ``beta``: how fast the cutoff
    rises with speed (pixels/s), higher reduces lag; ``d_cutoff`` (Hz): smoothing of the speed.
    """

    def __init__(self, min_cutoff: float, beta: float, d_cutoff: float = 1.0) -> None:
        self.min_cutoff = float(min_cutoff)
        self.beta = float(beta)
        self.d_cutoff = float(d_cutoff)
        self._x: np.ndarray | None = None
        self._dx: np.ndarray | None = None
        self._t = 0.0

    @staticmethod
    def _alpha(dt: float, cutoff: np.ndarray | float) -> np.ndarray | float:
        tau = 1.0 / (2.0 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / dt)

    def reset(self, x: np.ndarray, t: float) -> np.ndarray:
        self._x = np.asarray(x, dtype=np.float64).copy()
        self._dx = np.zeros_like(self._x)
        self._t = float(t)
        return self._x.copy()

    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        """Filter the new sample ``x`` (N, 2) taken at time ``t`` (seconds); returns the estimate."""
        x = np.asarray(x, dtype=np.float64)
        if self._x is None or self._dx is None:
            return self.reset(x, t)
        dt = float(t) - self._t
        if dt <= 0:
            dt = 1e-3
        dx = (x - self._x) / dt
        self._dx = self._dx + self._alpha(dt, self.d_cutoff) * (dx - self._dx)
        speed = np.linalg.norm(self._dx, axis=-1, keepdims=True)
        a = self._alpha(dt, self.min_cutoff + self.beta * speed)
        self._x = self._x + a * (x - self._x)
        self._t = float(t)
        return self._x.copy()


def _alpha(dt: float, cutoff: float) -> float:
    return 1.0 / (1.0 + 1.0 / (2.0 * math.pi * cutoff * dt))


class HeadFilter:
    """Five landmarks and a box smoothed in the head's own coordinates.

    Each detection is split into the head's pose, the similarity that best maps the alignment
    template onto the landmarks (what the swap pastes with: :func:`vcam.align.estimate`), and what
    is left, the landmarks and the box in the template's coordinates. The pose (the template's
    five points in the frame) follows a One-Euro cutoff (``min_cutoff`` Hz at rest, rising by
    ``beta`` Hz per face size a second of speed) around a constant-velocity prediction whose
    velocity it learns as an alpha-beta filter does (beta = alpha^2 / (2 - alpha), critically
    damped): at rest the detector's noise is averaged away, and a head moving steadily is followed
    without the lag a plain low-pass has; the prediction's error low-passed at ``bias_cutoff`` Hz
    counts as speed too, so a head that speeds up or turns back is caught up with. The shape left
    (how the eyes, nose and mouth sit on that head, and its box) changes only as the face turns or
    talks: a low-pass of ``shape_cutoff`` Hz. Chosen on the steadiness scene of
    :mod:`benchmarks.precision_real` (docs/benchmarks.md).
    """

    def __init__(self, min_cutoff: float, beta: float, shape_cutoff: float = 3.0, bias_cutoff: float = 0.3) -> None:
        from vcam.align import TEMPLATES

        self.min_cutoff, self.beta, self.shape_cutoff = float(min_cutoff), float(beta), float(shape_cutoff)
        self.bias_cutoff = float(bias_cutoff)
        # Every point is an (x, y) pair of Python floats: a handful of points a face, every frame,
        # where NumPy's cost per call was most of the filter's time.
        self._tpl: list[Point] = [(float(x), float(y)) for x, y in TEMPLATES["arcface_112_v2"]]
        (x0, y0), (x1, y1) = self._tpl[0], self._tpl[1]
        self._eyes = math.hypot(x1 - x0, y1 - y0)  # the eyes apart on a crop of side 1
        self._pose: list[Point] | None = None  # the template's points in the frame (5)
        self._vel: list[Point] = [(0.0, 0.0)] * 5  # their velocity, px/s
        self._n = 0  # detections since reset
        self._bias: Point = (0.0, 0.0)  # the prediction's error, low-passed: the filter falling behind
        self._shape: list[Point] = [(0.0, 0.0)] * 7  # landmarks and box corners in template coordinates
        self._t = 0.0

    def _split(self, landmarks: np.ndarray, box: np.ndarray) -> tuple[list[Point], list[Point]]:
        from vcam.align import similarity

        pts = np.asarray(landmarks, np.float64).reshape(5, 2).tolist() + np.asarray(box, np.float64).reshape(2, 2).tolist()
        a, b, tx, ty = similarity(self._tpl, pts[:5])
        d = a * a + b * b  # the inverse of [[a, -b], [b, a]] is [[a, b], [-b, a]] / d
        pose = [(a * x - b * y + tx, b * x + a * y + ty) for x, y in self._tpl]
        shape = [((a * (x - tx) + b * (y - ty)) / d, (a * (y - ty) - b * (x - tx)) / d) for x, y in pts]
        return pose, shape

    def _join(self) -> tuple[np.ndarray, np.ndarray]:
        from vcam.align import similarity

        assert self._pose is not None
        a, b, tx, ty = similarity(self._tpl, self._pose)
        pts = [(a * x - b * y + tx, b * x + a * y + ty) for x, y in self._shape]
        (cx0, cy0), (cx1, cy1) = pts[5], pts[6]
        box = [min(cx0, cx1), min(cy0, cy1), max(cx0, cx1), max(cy0, cy1)]
        return np.array(pts[:5], dtype=np.float64), np.array(box, dtype=np.float64)

    def reset(self, landmarks: np.ndarray, box: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Start over at this detection: (landmarks (5, 2), box (4,)) as given."""
        self._pose, self._shape = self._split(landmarks, box)
        self._vel = [(0.0, 0.0)] * 5
        self._n = 1
        self._bias = (0.0, 0.0)
        self._t = float(t)
        return self._join()

    def __call__(self, landmarks: np.ndarray, box: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Filter the detection taken at ``t`` seconds: (landmarks (5, 2), box (4,)) smoothed."""
        if self._pose is None:
            return self.reset(landmarks, box, t)
        pose, shape = self._split(landmarks, box)
        dt = max(float(t) - self._t, 1e-3)
        self._t = float(t)
        guess = [(x + vx * dt, y + vy * dt) for (x, y), (vx, vy) in zip(self._pose, self._vel)]
        error = [(px - gx, py - gy) for (px, py), (gx, gy) in zip(pose, guess)]
        k = _alpha(dt, self.bias_cutoff)
        bx, by = self._bias
        self._bias = (bx + k * (sum(e[0] for e in error) / 5 - bx), by + k * (sum(e[1] for e in error) / 5 - by))
        # the speed in face sizes per second: the pose's own velocity (the detector's noise barely
        # moves it; a raw difference of detections would, and let that noise through) plus the
        # prediction's low-passed error (nonzero while the filter falls behind a head that speeds up)
        (x0, y0), (x1, y1) = self._pose[0], self._pose[1]
        side = max(math.hypot(x1 - x0, y1 - y0) / self._eyes, 1.0)
        speed = (sum(math.hypot(vx, vy) for vx, vy in self._vel) / 5 + math.hypot(*self._bias) / dt) / side
        a = _alpha(dt, self.min_cutoff + self.beta * speed)
        b = a * a / (2.0 - a)
        # The first detections since reset: the gains of a least-squares line through them (the
        # alpha-beta filter's growing-memory start), until the steady gains are the larger: a new
        # track takes its position and speed in a few frames, however fast it moves.
        self._n += 1
        n = self._n
        a, b = max(a, 2.0 * (2 * n - 1) / (n * (n + 1))), max(b, 6.0 / (n * (n + 1)))
        self._pose = [(gx + a * ex, gy + a * ey) for (gx, gy), (ex, ey) in zip(guess, error)]
        self._vel = [(vx + b * ex / dt, vy + b * ey / dt) for (vx, vy), (ex, ey) in zip(self._vel, error)]
        k = _alpha(dt, self.shape_cutoff)
        self._shape = [(sx + k * (nx - sx), sy + k * (ny - sy)) for (sx, sy), (nx, ny) in zip(self._shape, shape)]
        return self._join()


#: A 2-D point as the head filter keeps it: (x, y) in Python floats.
Point = tuple[float, float]


__all__ = ["HeadFilter", "OneEuroFilter"]
