"""Media the tests make and keep: solid-colour clips written with PyAV, and an output that records
every frame it is sent, a face turned by a depth model, a face with a cap's brim and glasses frames
painted on and a mask model that sees them (issue 40's occluders)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vcam.models import registry
from vcam.stages.outputs import NullOutput

# A palette of well-separated colours (BGR); frame i of a test clip is solid COLORS[i % len].
COLORS = [(0, 0, 220), (0, 200, 0), (210, 0, 0), (0, 200, 200), (200, 0, 200), (200, 200, 0), (40, 40, 40), (230, 230, 230)]


def write_clip(
    path: Path,
    n: int,
    width: int = 64,
    height: int = 48,
    fps: int = 25,
    *,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    gray: bool = False,
) -> list[np.ndarray]:
    """Write ``n`` solid-colour frames; return what was written (BGR, or gray levels)."""
    written = []
    with av.open(str(path), mode="w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = width, height, pix_fmt
        for i in range(n):
            if gray:
                img = np.full((height, width), 20 + 25 * (i % 9), np.uint8)
                vf = av.VideoFrame.from_ndarray(img, format="gray")
            else:
                img = np.empty((height, width, 3), np.uint8)
                img[:] = COLORS[i % len(COLORS)]
                vf = av.VideoFrame.from_ndarray(img, format="bgr24")
            vf.pts = i
            vf.time_base = Fraction(1, fps)
            written.append(img)
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return written


class Recorder(NullOutput):
    """An output that keeps a copy of every frame it is sent."""

    def __init__(self, width: int = 320, height: int = 240) -> None:
        super().__init__(width, height)
        self.got: list[np.ndarray] = []

    def send(self, data) -> None:
        super().send(data)
        self.got.append(np.array(data, copy=True))


# -- faces of known geometry ------------------------------------------------------------------------
def _jaw_local() -> np.ndarray:
    """17 jaw points (iBUG order, image-left ear to image-right ear) in the 5-point local frame: ``u``
    in eye distances along the eye line from the eye centre, ``v`` in eye-to-mouth distances."""
    half = np.array([[1.02, -0.05], [1.03, 0.25], [0.98, 0.74], [0.80, 1.18], [0.45, 1.42], [0.0, 1.50]])
    seg = np.r_[0.0, np.cumsum(np.hypot(*np.diff(half, axis=0).T))]
    t = np.linspace(0.0, seg[-1], 9)
    ear_to_chin = np.stack([np.interp(t, seg, half[:, 0]), np.interp(t, seg, half[:, 1])], 1)
    return np.concatenate([ear_to_chin * [-1.0, 1.0], ear_to_chin[::-1][1:]])


def face68(lm5: np.ndarray) -> np.ndarray:
    """A 68-point layout (iBUG 300-W order) placed by 5 detector points (F, 5, 2) or (5, 2): a mean
    face in the 5 points' local frame, so every point moves with the eyes and mouth. Not a real
    face's landmarks; geometry the tests know exactly."""
    lm = np.asarray(lm5, np.float64)
    one = lm.ndim == 2
    lm = lm.reshape(-1, 5, 2)
    t = np.linspace(0, 1, 5)
    brow_l = np.stack([-0.95 + 0.8 * t, -0.33 - 0.12 * np.sin(np.pi * t)], 1)
    brow_r = brow_l[::-1] * [-1.0, 1.0]
    nose = np.array([[0, -0.2], [0, 0.05], [0, 0.3], [0, 0.5], [-0.22, 0.6], [-0.11, 0.63], [0, 0.65], [0.11, 0.63], [0.22, 0.6]])
    a = np.linspace(np.pi, 3 * np.pi, 7)[:-1]  # eye: outer corner first, upper lid, inner corner, lower lid
    eye = np.stack([0.2 * np.cos(a), 0.08 * np.sin(a)], 1)
    eye_l, eye_r = eye + [-0.5, 0.0], (eye * [-1.0, 1.0]) + [0.5, 0.0]
    b = np.linspace(np.pi, 3 * np.pi, 13)[:-1]
    outer = np.stack([0.41 * np.cos(b), 1.0 + 0.18 * np.sin(b)], 1)
    c = np.linspace(np.pi, 3 * np.pi, 9)[:-1]
    inner = np.stack([0.3 * np.cos(c), 1.0 + 0.06 * np.sin(c)], 1)
    local = np.concatenate([_jaw_local(), brow_l, brow_r, nose, eye_l, eye_r, outer, inner])
    out = []
    for p in lm:
        centre = (p[0] + p[1]) / 2
        u, v = p[1] - p[0], (p[3] + p[4]) / 2 - centre
        out.append(centre + local[:, :1] * u + local[:, 1:] * v)
    res = np.stack(out)
    return res[0] if one else res


def face_ellipse(shape: tuple[int, int], lm68: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """(H, W) bool: the ellipse fitted to the jaw and brows of 68 landmarks (brows to chin), grown
    by ``scale`` about its centre."""
    import cv2

    (cx, cy), (w, h), ang = cv2.fitEllipse(np.asarray(lm68, np.float32)[:27])
    out = np.zeros(shape, np.uint8)
    cv2.ellipse(out, ((cx, cy), (w * scale, h * scale), ang), 1, -1)
    return out.astype(bool)


def turned(img: np.ndarray, lm5: np.ndarray, degrees: float) -> np.ndarray:
    """``img`` with its face (5 points ``lm5``) turned by ``degrees`` of yaw under weak perspective,
    from a made-up depth: an ellipsoid head (1.3 x 1.9 eye distances, 1.0 deep) and a nose bump
    (0.45 deep); each row is remapped (an occluded stretch behind the nose is skipped)."""
    h, w = img.shape[:2]
    lm = np.asarray(lm5, np.float64)
    e = float(np.hypot(*(lm[1] - lm[0])))
    eyes, mouth = (lm[0] + lm[1]) / 2, (lm[3] + lm[4]) / 2
    cx, cy = eyes + (mouth - eyes) * 0.35
    th = math.radians(degrees)
    ys, xs = np.mgrid[:h, :w].astype(np.float64)
    dx, dy = (xs - cx) / (1.3 * e), (ys - cy) / (1.9 * e)
    r2 = dx * dx + dy * dy
    z = 1.0 * e * np.sqrt(np.clip(1 - r2, 0, None))
    z += 0.45 * e * np.exp(-((xs - lm[2, 0]) ** 2 + (ys - lm[2, 1] + 0.2 * e) ** 2) / (2 * (0.25 * e) ** 2))
    weight = np.clip((1.8 - np.sqrt(r2)) / 0.8, 0, 1)  # the turn fades out round the head
    fwd = xs + weight * ((xs - cx) * (math.cos(th) - 1) + z * math.sin(th))
    fwd = np.maximum.accumulate(fwd, axis=1)
    mapx = np.empty((h, w), np.float32)
    grid = np.arange(w, dtype=np.float64)
    for y in range(h):
        mapx[y] = np.interp(grid, fwd[y] + np.arange(w) * 1e-6, grid)
    import cv2

    return cv2.remap(img, mapx, ys.astype(np.float32), cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


BRIM = np.array([40, 20, 160], np.float32)  # BGR: a dark red cap peak
FRAMES = np.array([20, 200, 20], np.float32)  # BGR: green glasses frames


class MaskModel:
    """An engine of the mask models' interface (input buffers, ``run_device``) whose output marks
    the painted brim and frames: a parser's 19 class logits (``hat`` and ``eye_g`` there, ``skin``
    elsewhere) or an occluder's face probability (0 there, 1 elsewhere)."""

    def __init__(self, spec: registry.ModelSpec) -> None:
        self.spec = spec
        self.inputs = list(spec.inputs)
        self.parser = spec.kind == "parser"
        s = spec.size
        self._x = np.zeros((4, 3, s, s) if self.parser else (4, s, s, 3), np.float32)
        self.calls = 0

    def input_buffers(self, n: int, shapes=None) -> dict:
        return {self.inputs[0].name: self._x[:n]}

    def run_device(self, feeds: dict, stream=None) -> list:
        self.calls += 1
        x = feeds[self.inputs[0].name]
        mean, std = (np.asarray(v, np.float32) for v in self.spec.input_mean_std_255)
        if self.parser:  # NCHW, RGB, ImageNet-normalised
            bgr = (x.transpose(0, 2, 3, 1) * std + mean)[..., ::-1]
        else:  # NHWC, BGR / 255
            bgr = x * 255.0
        # a painted colour, or a blend of the two where the frames cross the brim (the crop's
        # resampling mixes them there): the nearest point of the segment between them
        axis = FRAMES - BRIM
        u = np.clip(((bgr - BRIM) @ axis) / float(axis @ axis), 0.0, 1.0)
        near = np.abs(bgr - (BRIM + u[..., None] * axis)).max(-1) < 30
        brim, frames = near & (u < 0.5), near & (u >= 0.5)
        if not self.parser:
            return [(~(brim | frames)).astype(np.float32)[..., None]]
        labels = np.where(brim, registry.PARSER_LABELS.index("hat"), registry.PARSER_LABELS.index("skin"))
        labels = np.where(frames, registry.PARSER_LABELS.index("eye_g"), labels)
        logits = np.zeros((x.shape[0], 19, *labels.shape[1:]), np.float32)
        np.put_along_axis(logits, labels[:, None], 10.0, axis=1)
        return [logits]


def occluded_portrait(det) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The astronaut's real portrait with a cap's brim across her forehead and glasses frames
    around her eyes painted on: (frame, brim pixels, frame pixels) (bool (H, W) each)."""
    import cv2

    from vcam.stages import demo

    img = demo.portrait("astronaut")
    img = cv2.resize(img, (img.shape[1] * 2, img.shape[0] * 2), interpolation=cv2.INTER_CUBIC)  # a 130 px face
    d = max(det.detect(img), key=lambda x: x.area)
    lm = d.landmarks.astype(np.float64)
    eye = float(np.hypot(*(lm[1] - lm[0])))
    brim, frames = np.zeros(img.shape[:2], np.uint8), np.zeros(img.shape[:2], np.uint8)
    top = float(min(lm[0, 1], lm[1, 1]))
    x0, x1 = lm[0, 0] - 0.9 * eye, lm[1, 0] + 0.9 * eye
    # the peak of a cap pulled down to the brows, across the top of the paste
    band = np.array(
        [[x0, top - 0.7 * eye], [x1, top - 0.7 * eye], [x1 - 0.1 * eye, top - 0.22 * eye], [x0 + 0.1 * eye, top - 0.22 * eye]]
    )
    cv2.fillConvexPoly(brim, np.round(band).astype(np.int32), 1)
    thick = max(4, int(round(eye / 10)))
    for c in lm[:2]:
        cv2.circle(frames, tuple(int(v) for v in np.round(c)), int(round(0.36 * eye)), 1, thick)
    cv2.line(
        frames,
        tuple(int(v) for v in np.round(lm[0] + [0.36 * eye, 0])),
        tuple(int(v) for v in np.round(lm[1] - [0.36 * eye, 0])),
        1,
        thick,
    )
    out = img.copy()
    out[brim.astype(bool)] = BRIM.astype(np.uint8)
    out[frames.astype(bool)] = FRAMES.astype(np.uint8)
    return out, brim.astype(bool), frames.astype(bool)
