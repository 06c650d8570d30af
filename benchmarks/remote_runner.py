"""What the benchmark's Triton server runs each batch in (``vcam/assets/triton_worker.py --runner
benchmarks.remote_runner:torch_engine``): vcam's own PyTorch engine on the GPU (CUDA graphs, FP16),
so the server swaps with the same code as a local daemon and the comparison measures the trip."""

from __future__ import annotations

from typing import Any

import numpy as np


def torch_engine(source: str, max_batch: int) -> tuple[Any, str]:
    from vcam.engines import create_engine

    engine = create_engine(source, backend="torch", device="cuda", fp16=True, max_batch=max_batch)
    kinds = {i.name: i.dtype for i in engine.inputs}

    def run(names: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return engine.run({k: np.asarray(v, dtype=kinds[k]) for k, v in inputs.items()})

    return run, f"vcam {engine.describe()}"
