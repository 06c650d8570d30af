"""What the benchmark's Triton servers run each batch in, for both server kinds (PyTriton's
``vcam/assets/triton_worker.py --runner`` and the Python backend's ``vcam/assets/triton_model.py``
with a ``runner`` parameter): ``serve(source, max_batch)``.

- ``source`` ``"empty"``: a model that computes nothing (its answer is its first input, the crop:
  the same bytes back as the swap's); what the server and the trip cost alone, the floor;
- else vcam's own PyTorch engine on the GPU (CUDA graphs, FP16) on that ONNX file (what ``vcam serve
  --engine vcam`` runs), so the server swaps with the same code as a local daemon and the comparison
  measures the trip.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def serve(source: str, max_batch: int) -> tuple[Any, str]:
    return empty(source, max_batch) if source == "empty" else torch_engine(source, max_batch)


def empty(source: str, max_batch: int) -> tuple[Any, str]:
    def run(names: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [next(iter(inputs.values()))]

    return run, "a model that computes nothing (its answer: its first input)"


def torch_engine(source: str, max_batch: int) -> tuple[Any, str]:
    from vcam.runtime.serve_runner import torch_engine as vcam_engine

    return vcam_engine(source, max_batch)
