"""What cuDNN's autotuning costs and gives a swap network on the GPU (issue 39: pauses of 350-650 ms
in the camera after the GPU took over, while the engines captured their other batch sizes).

    python -m benchmarks.autotune [--model PATH] [--modes on,limit1,off] [--batches 1,2,4,8] [--json OUT]

Each mode in a fresh process (cuDNN's tuned algorithms are the process's): the engine (``TorchEngine``,
FP16, CUDA graphs, no background captures) with cuDNN autotuning on (``on``: PyTorch's default limit
of algorithms tried), on but trying one algorithm (``limit1``: ``torch.backends.cudnn.benchmark_limit``)
or off (``off``: cuDNN's heuristic choice). Per batch size: the first call (warm-ups, autotuning, the
graph's capture) and the longest a thread asking for the GIL every 2 ms waited meanwhile (what the
camera's frames wait); then the median of 200 calls (CUDA events; a replay each). The model defaults
to the full-size inswapper stand-in of ``benchmarks.startup``. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
mode, model, cache, batches = sys.argv[1], sys.argv[2], sys.argv[3], [int(b) for b in sys.argv[4].split(",")]
import torch
torch.zeros(1, device="cuda")
if mode == "limit1":
    torch.backends.cudnn.benchmark_limit = 1
from vcam.engines.torch import TorchEngine
e = TorchEngine(model, device="cuda", fp16=True, max_batch=max(batches), cache_dir=cache, warmup=False,
                background_capture=False, autotune=mode != "off")
from benchmarks.gil_wait import LongestWait
waits = LongestWait().__enter__()
rows = []
for b in batches:
    feeds = {}
    for info in e.inputs:
        shape = [b] + [int(d) if isinstance(d, int) and d > 0 else 1 for d in info.shape[1:]]
        feeds[info.name] = torch.as_tensor(np.random.rand(*shape).astype(info.dtype), device="cuda")
    time.sleep(0.05)
    waits.reset()
    t0 = time.perf_counter()
    e.run_device(feeds)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    wait = waits.seconds
    for _ in range(20):
        e.run_device(feeds)
    times = []
    for _ in range(200):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); e.run_device(feeds); z.record(); z.synchronize()
        times.append(a.elapsed_time(z))
    times.sort()
    rows.append({"batch": b, "first_s": first, "longest_gil_wait_s": wait, "call_ms": times[len(times) // 2]})
waits.__exit__(None, None, None)
print(json.dumps({"mode": mode, "rows": rows}))
"""


def _child(mode: str, model: Path, cache: Path, batches: str) -> dict:
    here = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(model), str(cache), batches], capture_output=True, text=True, env=env, timeout=600
    )
    if r.returncode != 0:
        raise SystemExit(f"{mode}: rc={r.returncode}: {(r.stdout + r.stderr).strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--modes", default="on,limit1,off")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from benchmarks.startup import standin_swapper

    model = Path(args.model) if args.model else standin_swapper()
    cache = Path(tempfile.mkdtemp(prefix="autotune-"))
    results = [_child(m, model, cache, args.batches) for m in args.modes.split(",")]
    print(f"{'mode':8} {'batch':>5} {'first call s':>12} {'longest GIL wait ms':>20} {'call ms (median)':>17}")
    for res in results:
        for r in res["rows"]:
            print(
                f"{res['mode']:8} {r['batch']:5d} {r['first_s']:12.2f} {r['longest_gil_wait_s'] * 1e3:20.0f} {r['call_ms']:17.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
