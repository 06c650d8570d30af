"""Smoothing filters of the tracker: the One-Euro filter (Casiez et al. 2012) over 2-D points."""

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
