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
        self._tpl = TEMPLATES["arcface_112_v2"]
        self._eyes = float(np.linalg.norm(self._tpl[1] - self._tpl[0]))  # the eyes apart on a crop of side 1
        self._pose: np.ndarray | None = None  # the template's points in the frame (5, 2)
        self._vel = np.zeros((5, 2))  # their velocity, px/s
        self._n = 0  # detections since reset
        self._bias = np.zeros(2)  # the prediction's error, low-passed: the filter falling behind
        self._shape = np.zeros((7, 2))  # landmarks and box corners in template coordinates
        self._t = 0.0

    def _split(self, landmarks: np.ndarray, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from vcam.align import apply, invert, umeyama

        pts = np.concatenate([np.asarray(landmarks, np.float64).reshape(5, 2), np.asarray(box, np.float64).reshape(2, 2)])
        m = umeyama(self._tpl, pts[:5])
        return apply(m, self._tpl), apply(invert(m), pts)

    def _join(self) -> tuple[np.ndarray, np.ndarray]:
        from vcam.align import apply, umeyama

        assert self._pose is not None
        pts = apply(umeyama(self._tpl, self._pose), self._shape)
        corners = pts[5:]
        return pts[:5], np.concatenate([corners.min(axis=0), corners.max(axis=0)])

    def reset(self, landmarks: np.ndarray, box: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Start over at this detection: (landmarks (5, 2), box (4,)) as given."""
        self._pose, self._shape = self._split(landmarks, box)
        self._vel = np.zeros((5, 2))
        self._n = 1
        self._bias = np.zeros(2)
        self._t = float(t)
        return self._join()

    def __call__(self, landmarks: np.ndarray, box: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Filter the detection taken at ``t`` seconds: (landmarks (5, 2), box (4,)) smoothed."""
        if self._pose is None:
            return self.reset(landmarks, box, t)
        pose, shape = self._split(landmarks, box)
        dt = max(float(t) - self._t, 1e-3)
        self._t = float(t)
        guess = self._pose + self._vel * dt
        error = pose - guess
        self._bias += _alpha(dt, self.bias_cutoff) * (error.mean(axis=0) - self._bias)
        # the speed in face sizes per second: the pose's own velocity (the detector's noise barely
        # moves it; a raw difference of detections would, and let that noise through) plus the
        # prediction's low-passed error (nonzero while the filter falls behind a head that speeds up)
        side = max(float(np.linalg.norm(self._pose[1] - self._pose[0])) / self._eyes, 1.0)
        speed = (float(np.mean(np.linalg.norm(self._vel, axis=1))) + float(np.linalg.norm(self._bias)) / dt) / side
        a = _alpha(dt, self.min_cutoff + self.beta * speed)
        b = a * a / (2.0 - a)
        # The first detections since reset: the gains of a least-squares line through them (the
        # alpha-beta filter's growing-memory start), until the steady gains are the larger: a new
        # track takes its position and speed in a few frames, however fast it moves.
        self._n += 1
        n = self._n
        a, b = max(a, 2.0 * (2 * n - 1) / (n * (n + 1))), max(b, 6.0 / (n * (n + 1)))
        self._pose = guess + a * error
        self._vel += b * error / dt
        self._shape += _alpha(dt, self.shape_cutoff) * (shape - self._shape)
        return self._join()


__all__ = ["HeadFilter", "OneEuroFilter"]
