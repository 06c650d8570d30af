"""Enhance stage (optional): face restoration after the swap, on an engine and an ops object.

The restorer (gfpgan_1.4 and models of its layout) sees each swapped face on its own template
(``ffhq_512`` at 512), warped straight into the engine's input; its output comes back as crops and
is pasted with the box mask scaled by ``amount`` (0 leaves the frame as it is, 1 pastes the
restored face fully inside the mask). The same code runs on the CPU and the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcam.align import PlanarAffine, estimate
from vcam.kernels import paste, warp
from vcam.models import registry
from vcam.models.registry import ModelSpec
from vcam.ops import make_ops


class Enhancer:
    """Face restoration with registry model ``spec`` on ``engine`` (see the module docstring)."""

    def __init__(
        self, spec: ModelSpec | str, engine: Any, *, ops: Any = None, amount: float = 0.8, blur: float = 0.3, max_faces: int = 8
    ) -> None:
        from vcam.kernels.paste import box_mask

        if ops is None:
            ops = make_ops("cpu")  # frames in host memory
        self.spec = registry.of_kind(spec, "enhancer")
        self.name = self.spec.name
        self.template = self.spec.template or "ffhq_512"
        self.crop_size = self.spec.size
        self.engine = engine
        self.ops = ops
        self.max_faces = int(max_faces)
        self.amount = float(np.clip(amount, 0.0, 1.0))
        self.blur = float(blur)
        self._input = engine.inputs[0].name
        self._mean255, self._std255 = self.spec.input_mean_std_255
        self._affine = PlanarAffine.for_model(self.spec.mean, self.spec.std, self.spec.output)
        s = self.crop_size
        self._mask = ops.asarray(box_mask(s, blur) * np.float32(self.amount))
        self._crops = ops.empty((self.max_faces, s, s, 3), np.uint8)
        self._guard = ops.empty((self.max_faces,), np.int32)

    def guarded(self) -> int:
        return int(self.ops.to_host(self._guard).sum())

    def describe(self) -> str:
        return f"{self.name}: {self.engine.describe()}"

    def set_amount(self, amount: float) -> None:
        """How much of the restored face is blended in from now on (0..1; the panel's slider)."""
        from vcam.kernels.paste import box_mask

        amount = float(np.clip(amount, 0.0, 1.0))
        if amount != self.amount:
            self.amount = amount
            self._mask = self.ops.asarray(box_mask(self.crop_size, self.blur) * np.float32(amount))

    def enhance(self, frame: Any, landmarks: np.ndarray, *, amount: Any = None) -> Any:
        """Restore the faces with 5-point ``landmarks`` (F, 5, 2) in ``frame`` (in place); returns it.
        ``amount``: a new blend amount (:meth:`set_amount`) from this frame on; None keeps it."""
        if amount is not None:
            self.set_amount(amount)
        lms = np.asarray(landmarks, np.float64).reshape(-1, 5, 2)[: self.max_faces]
        n = lms.shape[0]
        if n == 0 or self.amount <= 0:
            return frame
        mats = np.stack([estimate(lm, self.template, self.crop_size) for lm in lms])
        with self.ops.activate():
            feeds = self.engine.input_buffers(n)
            x = feeds[self._input]
            warp.warp_crops_normalized(self.ops, frame, mats, self.crop_size, self._mean255, self._std255, self.spec.rgb, out=x)
            out = self.engine.run_device(feeds, stream=self.ops.stream)[0]
            crops = warp.crops_from_planar(self.ops, out, x, n, self._crops, self._guard, self._affine, self.spec.rgb)
            return paste.paste_back(self.ops, frame, crops, mats, self._mask, n)


__all__ = ["Enhancer"]
