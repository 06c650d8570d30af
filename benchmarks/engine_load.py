"""How long the swapper's engine takes to load, the old way against the new, each in a fresh process.

    python -m benchmarks.engine_load [--device cpu|cuda] [--fp16] [--runs 3] [--model PATH] [--json OUT]

Variants (alternated run by run; every load in its own process, so no cache of the process, such as
cuDNN's tuned algorithms, carries over; the time is the engine's construction, imports excluded):

- ``torch parse``: the ONNX file read and the native module built from it, and on CUDA every batch
  size's graph captured before the engine is ready (the code before saved builds);
- ``torch saved``: the module from its saved build (memory-mapped, no ONNX read), and on CUDA only
  the first batch size captured (the others in the background: their time is the second figure);
- on the CPU also ``ort optimise`` (onnxruntime optimising the graph, as every start did) against
  ``ort cached`` (the optimised graph from the engine cache).

The model defaults to the full-size inswapper stand-in that ``benchmarks.startup`` makes. Prints a
table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
kind, model, device, fp16, cache = sys.argv[1:6]
fp16 = fp16 == "1"
if kind.startswith("torch"):
    import torch
    from vcam.engines.torch import TorchEngine
    if device == "cuda":
        torch.zeros(1, device="cuda")  # the CUDA context, outside the timing
    saved = kind == "torch saved"
    t0 = time.perf_counter()
    e = TorchEngine(model, device=device, fp16=fp16, max_batch=8, cache_dir=cache, saved_build=saved, background_capture=saved)
    ready = time.perf_counter() - t0
    e.wait_graphs(300)
    done = time.perf_counter() - t0
    from vcam.engines.native import saved as s
    s.wait_saves(300)
    print(json.dumps({"ready_s": ready, "all_graphs_s": done, "from_saved": e.from_saved}))
else:
    from vcam.engines.ort import OrtEngine
    import onnxruntime  # noqa: F401 - imported outside the timing
    t0 = time.perf_counter()
    e = OrtEngine(model, device="cpu", cache_dir=cache)
    ready = time.perf_counter() - t0
    print(json.dumps({"ready_s": ready, "all_graphs_s": ready, "from_saved": kind == "ort cached"}))
"""


def _child(kind: str, model: Path, device: str, fp16: bool, cache: Path) -> dict:
    here = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p))
    args = [sys.executable, "-c", CHILD, kind, str(model), device, "1" if fp16 else "0", str(cache)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{kind}: rc={r.returncode}: {(r.stdout + r.stderr).strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from benchmarks.startup import standin_swapper

    model = Path(args.model) if args.model else standin_swapper()
    kinds = ["torch parse", "torch saved"] + (["ort optimise", "ort cached"] if args.device == "cpu" else [])
    with tempfile.TemporaryDirectory(prefix="vcam-engine-load-") as tmp:
        kept = Path(tmp) / "kept"  # the saved build and the optimised graph, made once before the timed runs
        _child("torch saved", model, args.device, args.fp16, kept)
        if args.device == "cpu":
            _child("ort cached", model, args.device, args.fp16, kept)
        results: dict[str, list[dict]] = {k: [] for k in kinds}
        for i in range(args.runs):
            for kind in kinds:
                cache = kept if kind in ("torch saved", "ort cached") else Path(tmp) / f"fresh-{i}-{kind.replace(' ', '-')}"
                res = _child(kind, model, args.device, args.fp16, cache)
                results[kind].append(res)
                print(
                    f"run {i + 1} {kind:13s} ready {res['ready_s']:6.2f} s, all graphs {res['all_graphs_s']:6.2f} s", flush=True
                )
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{model.name}: engine ready, fresh process each ({args.device}{' fp16' if args.fp16 else ''}, {args.runs} runs)"
    )
    for col in ("variant", "ready s (median)", "ready s (all)", "every graph s (median)"):
        t.add_column(col, justify="right")
    summary = {}
    for kind, rows in results.items():
        ready = sorted(r["ready_s"] for r in rows)
        every = sorted(r["all_graphs_s"] for r in rows)
        med = ready[len(ready) // 2]
        summary[kind] = {"ready_median_s": med, "every_graph_median_s": every[len(every) // 2], "runs": rows}
        t.add_row(kind, f"{med:.2f}", ", ".join(f"{x:.2f}" for x in ready), f"{every[len(every) // 2]:.2f}")
    Console(width=120).print(t)
    if args.json:
        out = {
            "device": args.device,
            "fp16": args.fp16,
            "model": str(model),
            "date": time.strftime("%Y-%m-%d"),
            "results": summary,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
