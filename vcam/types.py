"""Data model shared by the stages.

Conventions (all stages):
- Images inside the pipeline are ``uint8`` arrays of shape ``(H, W, 3)`` in **BGR** order, C-contiguous
  (OpenCV's convention, and what RetinaFace and FaceFusion expect). On the GPU path the same layout
  lives in a CuPy array; the ``xp`` of an array is the module that created it.
- Points are ``(x, y)`` in pixel coordinates with pixel centres at integer positions, origin top-left.
- Affine matrices are ``(2, 3)`` float arrays named by direction: ``crop_from_frame`` maps a frame
  point to a crop point (``[x', y'] = M @ [x, y, 1]``); ``frame_from_crop`` is its inverse.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The optional stages the daemon may turn off under load (:mod:`vcam.runtime.degrade`), by name:
#: the frame enhancer, the face enhancer, the occlusion and the region mask models.
OPTIONAL_STAGES = ("upscale", "enhancer", "occlusion", "region")


class PixelFormat(str, enum.Enum):
    """Pixel formats a camera delivers or a virtual camera accepts."""

    BGR = "BGR"  # (H, W, 3) uint8
    RGB = "RGB"  # (H, W, 3) uint8
    GRAY = "GRAY"  # (H, W) uint8
    YUYV = "YUYV"  # (H, W, 2) uint8, packed 4:2:2 (Y0 U Y1 V)
    NV12 = "NV12"  # (H * 3 // 2, W) uint8, Y plane then interleaved UV
    I420 = "I420"  # (H * 3 // 2, W) uint8, Y plane, U plane, V plane
    MJPEG = "MJPEG"  # 1-D uint8 JPEG bytes
    RGBP = "RGBP"  # (3, H, W) uint8, planar RGB (a JPEG decoded on the GPU by nvJPEG)


@dataclass(frozen=True, slots=True)
class Frame:
    """One captured frame.

    ``data``: pixel buffer in ``fmt`` (see :class:`PixelFormat` for shapes), on the host (NumPy) or
    the device (CuPy). ``t_capture``: ``time.perf_counter()`` when the frame was read from the source.
    ``seq``: 0-based sequence number from the source; gaps mean dropped frames.
    """

    data: Any
    width: int
    height: int
    fmt: PixelFormat
    t_capture: float
    seq: int


@dataclass(frozen=True, slots=True)
class Detection:
    """A detected face. ``box``: (x1, y1, x2, y2) float32 in frame pixels; ``landmarks``: (5, 2)
    float32 (left eye, right eye, nose, left mouth corner, right mouth corner); ``score`` in [0, 1]."""

    box: np.ndarray
    landmarks: np.ndarray
    score: float

    @property
    def area(self) -> float:
        x1, y1, x2, y2 = (float(v) for v in self.box)
        return max(0.0, x2 - x1) * max(0.0, y2 - y1)


@dataclass(slots=True)
class Track:
    """A face followed across frames.

    ``landmarks``: (5, 2) float32, smoothed; ``box``: (x1, y1, x2, y2) float32, smoothed;
    ``age``: frames since the track started; ``missed``: consecutive frames without a detection;
    ``similarity``: cosine similarity to the reference face (identity lock), None if not computed.
    """

    id: int
    box: np.ndarray
    landmarks: np.ndarray
    score: float
    age: int = 0
    missed: int = 0
    last_seen: int = 0
    similarity: float | None = None


@dataclass(frozen=True, slots=True)
class SourceFace:
    """A face of the face bank, ready to swap in.

    ``image``: the aligned crop (BGR uint8); ``embeddings``: recogniser name -> (512,) float32 raw
    embedding; ``latents``: swapper name -> precomputed source latent (float32). ``stats``: per-channel
    (mean, std) of the crop inside the face mask, used by the classic swap's colour match.
    """

    name: str
    image: np.ndarray
    landmarks: np.ndarray | None = None
    embeddings: dict[str, np.ndarray] = field(default_factory=dict)
    latents: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class FrameStats:
    """Timings (seconds) and counts for one processed frame."""

    seq: int = 0
    t_capture: float = 0.0
    t_publish: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    faces: int = 0
    swapped: int = 0
    full_scan: bool = False
    upscaled: bool = False  # the frame enhancer ran on it
    upscale_skipped: bool = False  # resized instead: the enhancer would have pushed it over the budget

    @property
    def latency(self) -> float:
        return self.t_publish - self.t_capture


class Closing:
    """``close()`` marks the object closed (subclasses release more and call it); used as a context
    manager it closes on exit. The base of frame sources and outputs."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def __enter__(self):  # the subclass itself
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
