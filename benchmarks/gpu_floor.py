"""The floor under issue 39's "first GPU-swapped frame within 3 s": the least a fresh process has to do
before the swap network gives its first output on the GPU, with nothing of vcam's around it.

    python -m benchmarks.gpu_floor [--model PATH] [--runs 3] [--device cuda|cpu] [--json OUT]

Each run is a fresh ``python3`` process (as ``vcam run`` is) that does only this, timed from the
parent's spawn (wall clock, the same host): the interpreter's start; ``import torch``; the CUDA
context (one tensor on the GPU); the swap network's module from the engine cache's saved build
(:func:`vcam.engines.native.saved.open_native`, as the torch engine opens it; the ONNX parse on a
first run); its weights to the GPU in FP16, channels-last; the first forward (cuDNN's heuristics,
no autotuning) to a synchronised output; a second forward. ``vcam run`` has more to do before its
first GPU frame (the CLI, the camera, the detector, the pipeline's buffers): what it takes beyond
this floor is what start-up work could still win; below the floor nothing in-process can go.
Default model: the benchmarks' full-size inswapper stand-in (:func:`benchmarks.startup.standin_swapper`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS = ("interpreter", "import torch", "cuda context", "module", "weights on the GPU", "first forward", "second forward")


def child(model: str, spawned: float, device: str = "cuda") -> None:
    stamps = {"interpreter": time.time()}
    import torch

    stamps["import torch"] = time.time()
    dtype = torch.float16 if device == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.zeros(1, device=device)
    sync()
    stamps["cuda context"] = time.time()
    from vcam.engines.native.saved import open_native

    build, _ = open_native(model)
    if build is None:
        raise SystemExit(f"{model}: no native module for this graph")
    module = build.module.eval()
    stamps["module"] = time.time()
    module = module.to(device=device, dtype=dtype, memory_format=torch.channels_last)
    sync()
    stamps["weights on the GPU"] = time.time()
    torch.backends.cudnn.benchmark = False
    shapes = {name: tuple(1 if d is None or isinstance(d, str) else int(d) for d in shape) for name, shape, _ in build.inputs}
    feeds = [torch.randn(*shapes[name], device=device, dtype=dtype) for name in build.call_order]
    with torch.inference_mode():
        module(*feeds)
        sync()
        stamps["first forward"] = time.time()
        module(*feeds)
        sync()
        stamps["second forward"] = time.time()
    print("FLOOR " + json.dumps({k: v - spawned for k, v in stamps.items()}), flush=True)


def run_once(model: str, device: str) -> dict[str, float]:
    spawned = time.time()
    code = f"from benchmarks.gpu_floor import child; child({model!r}, {spawned!r}, {device!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("FLOOR ")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"the floor's process failed (exit {r.returncode}): {(r.stderr or r.stdout)[-800:]}")
    return json.loads(line[len("FLOOR ") :])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="ONNX swap network (default: the benchmarks' inswapper stand-in)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the harness checked, FP32")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    model = args.model
    if model is None:
        from benchmarks.startup import standin_swapper

        model = str(standin_swapper())
    runs = [run_once(model, args.device) for _ in range(args.runs)]
    print(f"{'step (s from the spawn)':28}" + "".join(f"{'run ' + str(i + 1):>9}" for i in range(len(runs))) + f"{'median':>9}")
    for step in STEPS:
        vals = [r[step] for r in runs]
        print(f"{step:28}" + "".join(f"{v:9.2f}" for v in vals) + f"{statistics.median(vals):9.2f}")
    result = {
        "model": model,
        "device": args.device,
        "runs": runs,
        "median": {s: statistics.median(r[s] for r in runs) for s in STEPS},
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
