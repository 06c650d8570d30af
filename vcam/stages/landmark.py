"""Landmark stage (optional): 68 points per face for the face and mouth masks, on an engine and an ops
object.

``2dfan4`` (and models of its layout) sees each face through FaceFusion's box crop: the box scaled
so its longer side is 195 of the model's 256 pixels and centred, a translation and a scale only
(``crop_from_frame = [[s, 0, tx], [0, s, ty]]``, ``s = 195 / max(w, h)``). Every face of a frame is
warped straight into the engine's input and run in one engine call; the points come back in one
readback, in 64-pixel heatmap units, and are mapped to frame pixels through the inverse crop.

``fan_68_5`` needs no image: :meth:`Landmarker.from_five` maps the 5 detector points into the unit
``ffhq_512`` frame, lets the model place 68 points there and maps them back.

Differences from FaceFusion's recipe: no rotation by the face angle (faces are cropped upright), no
contrast boost of dark crops (CLAHE), and pixels outside the frame repeat the border (FaceFusion:
black). The same code runs on the CPU and the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.align import apply, estimate, invert
from vcam.errors import ModelError
from vcam.kernels import warp
from vcam.models import registry
from vcam.models.registry import ModelSpec
from vcam.ops import make_ops

#: FaceFusion's 2dfan4 crop: the box's longer side becomes this many pixels of the 256 crop.
BOX_SIDE = 195.0


def box_crops(boxes: np.ndarray, size: int, side: float = BOX_SIDE) -> np.ndarray:
    """``crop_from_frame`` (F, 2, 3) float64 of FaceFusion's landmark crop for ``boxes`` (F, 4)
    x1, y1, x2, y2 in frame pixels: scale ``side / max(w, h)`` (the side clipped to at least 1 px),
    the box centre at the crop centre ``size / 2``. Convention: pixel indices, as ``cv2.warpAffine``."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    scale = side / np.clip(np.maximum(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]), 1.0, None)
    mats = np.zeros((b.shape[0], 2, 3), np.float64)
    mats[:, 0, 0] = mats[:, 1, 1] = scale
    mats[:, 0, 2] = (size - (b[:, 0] + b[:, 2]) * scale) * 0.5
    mats[:, 1, 2] = (size - (b[:, 1] + b[:, 3]) * scale) * 0.5
    return mats


def _not_a_landmarker(spec: ModelSpec) -> ModelError:
    article = "an" if spec.kind[:1] in "aeiou" else "a"
    return ModelError(
        f"{spec.name} is {article} {spec.kind}, not a landmarker",
        hint="choose one of: " + ", ".join(m.name for m in registry.by_kind("landmarker")),
    )


def _output_index(engine: Any, name: str) -> int:
    names = [o.name for o in engine.outputs]
    return names.index(name) if name in names else 0


class Landmarker:
    """68 face landmarks with registry model ``spec`` (kind ``landmarker``) on ``engine`` (see the
    module docstring). ``ops``: where frames live (default: NumPy); ``max_faces``: the most faces
    one engine call takes (more are run in several calls)."""

    def __init__(self, spec: ModelSpec | str, engine: Any, *, ops: Any = None, max_faces: int = 8) -> None:
        if ops is None:  # frames in host memory
            ops = make_ops("cpu")
        self.spec = registry.get(spec) if isinstance(spec, str) else spec
        if self.spec.kind != "landmarker":
            raise _not_a_landmarker(self.spec)
        self.name = self.spec.name
        self.engine = engine
        self.ops = ops
        self.max_faces = max(1, int(max_faces))
        self._input = engine.inputs[0].name
        self.from_points = len(self.spec.inputs[0].shape) == 3  # fan_68_5: (N, 5, 2) points, no image
        self.size = int(self.spec.size)
        self._mean255, self._std255 = self.spec.input_mean_std_255
        self._points = _output_index(engine, self.spec.outputs[0].name)
        self.scores: np.ndarray = np.zeros((0, 68), np.float32)

    def describe(self) -> str:
        return f"{self.name}: {self.engine.describe()}"

    def crops(self, boxes: np.ndarray) -> np.ndarray:
        """The ``crop_from_frame`` matrices (F, 2, 3) the model sees ``boxes`` (F, 4) through."""
        return box_crops(boxes, self.size)

    def landmarks(self, frame: Any, boxes: np.ndarray, *, five: np.ndarray | None = None) -> np.ndarray:
        """68 points (F, 68, 2) float32 in frame pixels for ``boxes`` (F, 4) x1, y1, x2, y2 (host)
        in ``frame`` (H, W, 3) uint8 BGR in the ops' memory. Up to ``max_faces`` faces per engine call
        and readback. ``scores`` then holds the per-point scores (F, 68). A points model (fan_68_5)
        needs ``five`` (F, 5, 2), the detector's points, and no image (see :meth:`from_five`)."""
        if self.from_points:
            if five is None:
                raise ModelError(
                    f"{self.name} maps 5 detector points to 68 and needs no image",
                    hint="call from_five(landmarks5), or pass five=landmarks5",
                )
            return self.from_five(five)
        b = np.asarray(boxes, np.float64).reshape(-1, 4)
        out = np.zeros((b.shape[0], 68, 2), np.float32)
        scores = np.zeros((b.shape[0], 68), np.float32)
        for s in range(0, b.shape[0], self.max_faces):
            part = b[s : s + self.max_faces]
            out[s : s + len(part)], scores[s : s + len(part)] = self._run_crops(frame, self.crops(part))
        self.scores = scores
        return out

    def _run_crops(self, frame: Any, mats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = mats.shape[0]
        with self.ops.activate():
            feeds = self.engine.input_buffers(n)
            x = feeds[self._input]
            warp.warp_crops_normalized(self.ops, frame, mats, self.size, self._mean255, self._std255, self.spec.rgb, out=x)
            res = self.engine.run_device(feeds, stream=self.ops.stream)[self._points]
            (host,) = self.ops.readback([res[:n]])
        host = np.asarray(host, np.float64).reshape(n, -1, 3)
        heat = self.spec.outputs[1].shape[-1] if len(self.spec.outputs) > 1 else 64
        crop_pts = host[:, :, :2] * (self.size / heat)  # heatmap units -> crop pixels
        inv = invert(mats)
        pts = np.stack([apply(inv[f], crop_pts[f]) for f in range(n)])
        return pts.astype(np.float32), host[:, :, 2].astype(np.float32)

    def from_five(self, landmarks5: np.ndarray) -> np.ndarray:
        """68 points (F, 68, 2) float32 from 5 detector points ``landmarks5`` (F, 5, 2) in frame
        pixels (fan_68_5): each face is mapped into the unit ``ffhq_512`` frame by the similarity
        that aligns its 5 points to the template, the model runs on all faces in one call, and its
        points are mapped back. ModelError for an image model."""
        if not self.from_points:
            raise ModelError(
                f"{self.name} finds landmarks in the image, not from 5 points",
                hint="call landmarks(frame, boxes), or use fan_68_5 for from_five",
            )
        lms = np.asarray(landmarks5, np.float64).reshape(-1, 5, 2)
        out = np.zeros((lms.shape[0], 68, 2), np.float32)
        for s in range(0, lms.shape[0], self.max_faces):
            part = lms[s : s + self.max_faces]
            out[s : s + len(part)] = self._run_points(part)
        return out

    def _run_points(self, lms: np.ndarray) -> np.ndarray:
        n = lms.shape[0]
        mats = np.stack([estimate(lm, self.spec.template or "ffhq_512", 1) for lm in lms])  # unit_from_frame
        unit = np.stack([apply(mats[f], lms[f]) for f in range(n)])
        with self.ops.activate():
            feeds = self.engine.input_buffers(n)
            x = feeds[self._input]
            x[...] = self.ops.asarray(np.ascontiguousarray(unit, dtype=x.dtype))
            res = self.engine.run_device(feeds, stream=self.ops.stream)[self._points]
            (host,) = self.ops.readback([res[:n]])
        host = np.asarray(host, np.float64).reshape(n, -1, 2)
        inv = invert(mats)
        return np.stack([apply(inv[f], host[f]) for f in range(n)]).astype(np.float32)


__all__ = ["BOX_SIDE", "Landmarker", "box_crops"]
