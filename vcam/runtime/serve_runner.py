"""What ``vcam serve --engine vcam`` runs each batch in, inside the server: vcam's own PyTorch engine
(FP16 with CUDA graphs on the GPU where torch sees one, FP32 on the CPU otherwise), the local swap's
code. Called by the Python backend's model (vcam/assets/triton_model.py) or PyTriton's worker as
``torch_engine(source, max_batch)`` -> ``(run(output_names, inputs) -> outputs, description)``;
imported there after the serving environment's own packages (its numpy < 2 first)."""

from __future__ import annotations

from typing import Any

import numpy as np


def torch_engine(source: str, max_batch: int) -> tuple[Any, str]:
    import torch

    from vcam.engines import create_engine

    cuda = bool(torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    engine = create_engine(source, backend="torch", device=device, fp16=cuda, max_batch=max_batch)
    kinds = {i.name: i.dtype for i in engine.inputs}

    def run(names: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(engine.run({k: np.asarray(v, dtype=kinds[k]) for k, v in inputs.items()}))

    return run, f"vcam {engine.describe()}"


__all__ = ["torch_engine"]
