"""The floor under a neural swap's first frame: what every start must pay before the swapper can run.

    python -m benchmarks.startup_floor [--model PATH] [--runs 3] [--json OUT]

Each piece runs in fresh processes, ``--runs`` times, the median kept (warm caches: run it once
before measuring). Pieces:

- ``interpreter``: ``python -c pass``;
- ``vcam CLI``: ``import vcam.cli.run`` over the interpreter (what `vcam run` imports before it loads);
- ``import torch`` over the interpreter (wall), and ``-X importtime``'s own figure for it;
- ``CUDA context``: the first CUDA tensor after ``import torch``;
- ``swapper ready (autotune on/off)``: the inswapper's engine from its saved build (memory-mapped
  weights), FP16, up to its batch-1 CUDA graph, with cuDNN's per-shape benchmark as the engine
  chooses it (on for the swapper) and off.

The sum of the first four and the faster engine line is the earliest a swapped frame can exist with
the network on torch (the detector's own first call and the frame itself come on top). Prints a table
and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

ENGINE = r"""
import json, sys, time
import torch
t0 = time.perf_counter()
torch.zeros(1, device="cuda")
ctx = time.perf_counter() - t0
from vcam.engines.torch import TorchEngine
model, cache, autotune = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t0 = time.perf_counter()
e = TorchEngine(model, device="cuda", fp16=True, max_batch=8, cache_dir=cache, saved_build=True,
                background_capture=True, autotune=autotune)
ready = time.perf_counter() - t0
print(json.dumps({"ctx": ctx, "ready": ready, "from_saved": e.from_saved}))
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p))


def _wall(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, env=_env(), capture_output=True, timeout=300)
    return time.perf_counter() - t0


def _importtime(module: str) -> float:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], env=_env(), capture_output=True, text=True, timeout=300
    )
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s(\S+)$", line)
        if m and m.group(2) == module:
            return int(m.group(1)) / 1e6
    return float("nan")


def _engine(model: Path, cache: Path, autotune: bool) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", ENGINE, str(model), str(cache), "1" if autotune else "0"],
        env=_env(), capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/vcam-e2e/models/inswapper_128.onnx")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="vcam-floor-"))
    _engine(Path(args.model), cache, True)  # the saved build written, caches filled
    runs: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for label, cmd in (
            ("interpreter", ["-c", "pass"]),
            ("vcam CLI", ["-c", "import vcam.cli.run"]),
            ("import torch", ["-c", "import torch"]),
        ):
            runs.setdefault(label, []).append(_wall(cmd))
        runs.setdefault("import torch (importtime)", []).append(_importtime("torch"))
        for autotune in (True, False):
            e = _engine(Path(args.model), cache, autotune)
            runs.setdefault("CUDA context", []).append(e["ctx"])
            runs.setdefault(f"swapper ready, autotune {'on' if autotune else 'off'}", []).append(e["ready"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    interp = med["interpreter"]
    rows = [
        ("interpreter", interp),
        ("vcam CLI (over the interpreter)", med["vcam CLI"] - interp),
        ("import torch (over the interpreter)", med["import torch"] - interp),
        ("import torch (-X importtime)", med["import torch (importtime)"]),
        ("CUDA context", med["CUDA context"]),
        ("swapper ready, autotune on", med["swapper ready, autotune on"]),
        ("swapper ready, autotune off", med["swapper ready, autotune off"]),
    ]
    floor = interp + rows[1][1] + rows[2][1] + med["CUDA context"] + min(rows[5][1], rows[6][1])
    print(f"start-up floor of a swap on torch (median of {args.runs} fresh processes each)")
    for label, s in rows:
        print(f"  {label:38s} {s:6.2f} s")
    print(f"  {'floor (no detector, no frame)':38s} {floor:6.2f} s   target: first swapped frame <= 3 s")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": med, "floor_s": floor}, indent=1))


if __name__ == "__main__":
    main()
