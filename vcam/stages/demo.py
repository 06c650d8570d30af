"""Demo material: the two bundled public-domain portraits and a generated clip of a moving face.

:class:`DemoClip` is what ``--input demo`` plays: one portrait (Grace Hopper by default) pasted onto a
gradient with smooth pan, zoom and a small rotation. Every frame is a known affine of the still
portrait, so :meth:`DemoClip.truth` gives exact ground-truth face boxes for tracking tests.
:func:`compose` builds arbitrary frames from portraits and affines (faces leaving the frame, many
faces at once).

Convention: an ``affine`` is (2, 3) ``frame_from_portrait``: ``[x, y] = A @ [u, v, 1]`` maps a
portrait pixel centre to a frame pixel centre (OpenCV's ``warpAffine`` convention).
"""

from __future__ import annotations

import math
from importlib import resources
from typing import TYPE_CHECKING, Sequence

import cv2
import numpy as np

from vcam.errors import FaceError, InputError

if TYPE_CHECKING:
    from vcam.stages.detect import Detector

PORTRAITS = ("astronaut", "grace_hopper")


def portrait(name: str) -> np.ndarray:
    """A bundled portrait, (H, W, 3) uint8 BGR: ``"astronaut"`` (Eileen Collins, the default source
    face) or ``"grace_hopper"`` (the moving face of the demo clip). A fresh array on every call."""
    if name not in PORTRAITS:
        raise InputError(f"unknown demo portrait {name!r}", hint=f"use one of: {', '.join(PORTRAITS)}")
    data = resources.files("vcam").joinpath("assets").joinpath(f"{name}.jpg").read_bytes()
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise InputError(f"the bundled portrait {name}.jpg cannot be decoded", hint="reinstall fastswap-cam")
    return img


def placement(anchor_src: Sequence[float], anchor_dst: Sequence[float], scale: float, angle_deg: float) -> np.ndarray:
    """``frame_from_portrait`` (2, 3) float64: scale by ``scale`` and rotate by ``angle_deg``
    (counter-clockwise on screen) about portrait point ``anchor_src``, which lands on ``anchor_dst``."""
    a = math.radians(angle_deg)
    c, s = scale * math.cos(a), scale * math.sin(a)
    lin = np.array([[c, s], [-s, c]], dtype=np.float64)
    m = np.empty((2, 3), dtype=np.float64)
    m[:, :2] = lin
    m[:, 2] = np.asarray(anchor_dst, dtype=np.float64) - lin @ np.asarray(anchor_src, dtype=np.float64)
    return m


def transform_box(box: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Map box (x1, y1, x2, y2) through ``affine`` (2, 3) and re-box its four corners: (4,) float32."""
    x1, y1, x2, y2 = (float(v) for v in box)
    corners = np.array([[x1, y1, 1.0], [x2, y1, 1.0], [x2, y2, 1.0], [x1, y2, 1.0]])
    pts = corners @ np.asarray(affine, dtype=np.float64).T
    return np.array([*pts.min(axis=0), *pts.max(axis=0)], dtype=np.float32)


def face_box(image_bgr: np.ndarray, detector: Detector) -> np.ndarray:
    """Box of the largest face the detector finds in ``image_bgr``; FaceError if there is none."""
    dets = detector.detect(image_bgr)
    if not dets:
        raise FaceError("no face found in the portrait", hint="use a photo with one clearly visible face")
    return max(dets, key=lambda d: d.area).box.copy()


def gradient(width: int, height: int, top: Sequence[int] = (70, 60, 50), bottom: Sequence[int] = (150, 140, 120)) -> np.ndarray:
    """A vertical BGR gradient background (height, width, 3) uint8."""
    t = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    col = (1 - t) * np.asarray(top, dtype=np.float32) + t * np.asarray(bottom, dtype=np.float32)
    return np.ascontiguousarray(np.broadcast_to(np.round(col).astype(np.uint8)[:, None, :], (height, width, 3)))


def _paste(dst: np.ndarray, src: np.ndarray, affine: np.ndarray) -> None:
    """Warp ``src`` by ``affine`` onto ``dst`` in place, touching only the warped bounding box."""
    h, w = dst.shape[:2]
    sh, sw = src.shape[:2]
    corners = np.array([[-0.5, -0.5, 1], [sw - 0.5, -0.5, 1], [sw - 0.5, sh - 0.5, 1], [-0.5, sh - 0.5, 1]], dtype=np.float64)
    pts = corners @ np.asarray(affine, dtype=np.float64).T
    x0 = max(int(math.floor(pts[:, 0].min())), 0)
    y0 = max(int(math.floor(pts[:, 1].min())), 0)
    x1 = min(int(math.ceil(pts[:, 0].max())) + 1, w)
    y1 = min(int(math.ceil(pts[:, 1].max())) + 1, h)
    if x1 <= x0 or y1 <= y0:
        return
    m = np.asarray(affine, dtype=np.float64).copy()
    m[:, 2] -= (x0, y0)
    region = dst[y0:y1, x0:x1]  # a row-strided view: OpenCV writes into it in place
    warped = cv2.warpAffine(src, m, (x1 - x0, y1 - y0), dst=region, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)
    if warped is not region:  # pragma: no cover - an OpenCV build that copied the view
        region[...] = warped


def compose(
    size: tuple[int, int],
    items: Sequence[tuple[np.ndarray, np.ndarray]],
    background: np.ndarray | Sequence[int] | None = None,
) -> np.ndarray:
    """Build one (height, width, 3) uint8 BGR frame: ``background`` (an image of that size, a BGR
    colour, or None for a gray gradient) with each ``(portrait_bgr, frame_from_portrait)`` of
    ``items`` warped on top, in order. Parts of a portrait outside the frame are cut off."""
    width, height = int(size[0]), int(size[1])
    if isinstance(background, np.ndarray):
        if background.shape != (height, width, 3) or background.dtype != np.uint8:
            raise ValueError(f"unexpected background {background.shape} {background.dtype} != ({height}, {width}, 3) uint8")
        frame = background.copy()
    elif background is None:
        frame = gradient(width, height)
    else:
        frame = np.empty((height, width, 3), dtype=np.uint8)
        frame[...] = np.asarray(background, dtype=np.uint8)
    for img, affine in items:
        _paste(frame, img, affine)
    return frame


def group_frame(width: int, height: int, faces: int, i: int, period: int, background: np.ndarray | None = None) -> np.ndarray:
    """Frame ``i`` of a clip of ``faces`` portraits on a grid, each drifting and turning a little;
    the motion repeats every ``period`` frames, so the clip loops without a jump."""
    srcs = [portrait("grace_hopper"), portrait("astronaut")]
    cols = int(math.ceil(math.sqrt(faces)))
    rows = int(math.ceil(faces / cols))
    t = 2 * math.pi * (i % period) / period
    items = []
    for k in range(faces):
        img = srcs[k % 2]
        r, c = divmod(k, cols)
        cx = (c + 0.5) * width / cols + 0.01 * width * math.sin(t + k)
        cy = (r + 0.5) * height / rows + 0.01 * height * math.cos(t + k)
        scale = 0.75 * (height / rows) / img.shape[0]
        items.append((img, placement((img.shape[1] / 2, img.shape[0] / 2), (cx, cy), scale, 3 * math.sin(t + 2 * k))))
    return compose((width, height), items, background=background if background is not None else gradient(width, height))


def faces_scene(
    size: tuple[int, int],
    image: np.ndarray,
    box: np.ndarray,
    faces: Sequence[tuple[float, tuple[float, float]]],
    background: np.ndarray | Sequence[int] | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A frame with the portrait ``image`` (its face box ``box``) placed once per ``(face width px,
    face centre)`` of ``faces``, upright; returns the frame and each face's true box in it."""
    anchor = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    items, truth = [], []
    for px, centre in faces:
        m = placement(anchor, centre, px / float(box[2] - box[0]), 0.0)
        items.append((image, m))
        truth.append(transform_box(box, m))
    return compose(size, items, background=background), truth


class DemoClip:
    """A generated clip: portrait ``face`` moving over a gradient with smooth pan, zoom and a small
    rotation, deterministic for a ``seed``. Frames are made on demand (about a millisecond each).

    ``n_frames``: round(fps * seconds). ``frame(i)``: (height, width, 3) uint8 BGR; ``affine(i)``: its
    ``frame_from_portrait``; ``truth(i)``: ground-truth face boxes — the still portrait's detected
    face box (detected once with ``detector``, default a RetinaFaceDetector) mapped through
    ``affine(i)`` and re-boxed. Indices past the end wrap around (the clip loops).
    """

    def __init__(
        self,
        width: int = 1280,
        height: int = 720,
        fps: float = 30.0,
        seconds: float = 10.0,
        face: str = "grace_hopper",
        seed: int = 0,
        *,
        detector: Detector | None = None,
    ) -> None:
        if width < 16 or height < 16:
            raise ValueError(f"demo clip size {width}x{height} is too small (at least 16x16)")
        if fps <= 0 or seconds <= 0:
            raise ValueError(f"demo clip needs fps > 0 and seconds > 0, got {fps} and {seconds}")
        self.width, self.height, self.fps, self.seconds = int(width), int(height), float(fps), float(seconds)
        self.face = face
        self.n_frames = max(1, int(round(fps * seconds)))
        self.image = portrait(face)
        self._detector = detector
        self._face_box: np.ndarray | None = None
        rng = np.random.default_rng(seed)
        top = rng.integers(30, 110, 3)
        bottom = rng.integers(120, 220, 3)
        self.background = gradient(self.width, self.height, tuple(top), tuple(bottom))
        ph, pw = self.image.shape[:2]
        self._anchor = (pw / 2.0, ph * 0.42)  # about the middle of a head-and-shoulders portrait
        self._base_scale = 0.75 * self.height / ph
        # Motion: slow sines with seeded phases (see _motion).
        self._phase = rng.uniform(0, 2 * math.pi, 4)

    def _motion(self, i: int) -> tuple[float, float, float, float]:
        # One pan cycle about every 5 s. Clips of 2.5 s or more hold a whole number of cycles and
        # loop without a jump; shorter ones show part of a cycle.
        laps = round(self.seconds / 5.0)
        period = self.seconds / laps if laps >= 1 else 5.0
        phase = 2 * math.pi * ((i % self.n_frames) / self.fps) / period
        cx = self.width * (0.5 + 0.18 * math.sin(phase + self._phase[0]))
        cy = self.height * (0.5 + 0.06 * math.sin(2 * phase + self._phase[1]))
        zoom = 1.0 + 0.15 * math.sin(phase + self._phase[2])
        angle = 7.0 * math.sin(phase + self._phase[3])
        return cx, cy, zoom, angle

    def affine(self, i: int) -> np.ndarray:
        """``frame_from_portrait`` (2, 3) float64 of frame ``i``."""
        cx, cy, zoom, angle = self._motion(i)
        return placement(self._anchor, (cx, cy), self._base_scale * zoom, angle)

    def frame(self, i: int) -> np.ndarray:
        """Frame ``i``: (height, width, 3) uint8 BGR."""
        return compose((self.width, self.height), [(self.image, self.affine(i))], self.background)

    def face_box(self) -> np.ndarray:
        """The still portrait's face box (x1, y1, x2, y2) in portrait pixels, detected once."""
        if self._face_box is None:
            if self._detector is None:
                from vcam.stages.detect import RetinaFaceDetector

                self._detector = RetinaFaceDetector()
            self._face_box = face_box(self.image, self._detector)
        return self._face_box

    def truth(self, i: int) -> list[np.ndarray]:
        """Ground-truth face boxes of frame ``i`` (one here), (x1, y1, x2, y2) float32 frame pixels."""
        return [transform_box(self.face_box(), self.affine(i))]

    def __len__(self) -> int:
        return self.n_frames
