"""When the compiled swapper engine takes over in a live `vcam run`, and what its load costs the
frames: each variant is a fresh `vcam -v run --device cuda --fp16 --model inswapper_128` of a paced
1080p one-face clip to the null output, with the batch-1 artifact `vcam engines build` left in the
engine cache. Usage on the GPU (after `vcam engines build --model DIR/inswapper_128.onnx --fp16
--batch 1`):

    python tools/live_load_probe.py DIR OUT [--variants now,late,plain] [--seconds 12]

Variants: ``now``: vcam as it is (Inductor imported in a thread from the swapper's construction on,
the artifact loaded from the end of its warm-up on); ``now01``: as ``now``, with a switch interval of
0.1 ms (not 0.5) while loading; ``late``: the load starts at the first
swapped frame instead; ``plain``: that, and no early import (the load imports Inductor itself: as
before 2026-12-01). Prints one row per variant (first frame, first swapped frame, Inductor import,
load, in use, calls run uncompiled, latency, drops) and writes OUT/live_load.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

_LATE = (
    "from vcam.engines.compiled import CompiledLoader as L\n"
    "_plan = L.plan\n"
    "def _late(self, sizes, items):\n"
    "    start = L.resume\n"
    "    L.resume = lambda self: None\n"
    "    try:\n"
    "        _plan(self, sizes, items)\n"
    "    finally:\n"
    "        L.resume = start\n"
    "L.plan = _late\n"
)
PATCHES = {
    "now": "",
    "now01": "import vcam.engines.threads as t; t.QUICK_SWITCHES.seconds = 0.0001\n",
    "late": _LATE,
    "plain": _LATE + "import vcam.engines.compiled as c; c.built_any = lambda *a, **k: False\n",
}
#: Every INFO line of vcam's loggers, stamped with milliseconds since logging was imported.
TIMELINE = (
    "import logging, sys\n"
    "_h = logging.StreamHandler(sys.stderr)\n"
    "_h.setFormatter(logging.Formatter('T+%(relativeCreated)d ms %(threadName)s %(name)s: %(message)s'))\n"
    "logging.getLogger('vcam').addHandler(_h)\n"
)

FIELDS = {
    "first_frame_s": r"first frame ([\d.]+) s after start",
    "first_swapped_s": r"through the pipeline ([\d.]+) s",
    "early_frames": r"(\d+) early frames",
    "import_s": r"Inductor imported for the compiled engines in ([\d.]+) s",
    "loaded_s": r"compiled engine for batch 1 loaded in ([\d.]+) s",
    "in_use_s": r"compiled engine for batch 1 in use ([\d.]+) s after its load started",
    "uncompiled_calls": r"(\d+) earlier calls ran uncompiled",
    "p50_ms": r"latency p50 ([\d.]+) ms",
    "p99_ms": r"latency p50 [\d.]+ ms, p99 ([\d.]+) ms",
    "dropped_capture": r"dropped (\d+) at capture",
    "dropped_late": r"(\d+) over the latency budget",
}


def run(variant: str, models: Path, work: Path, seconds: float) -> dict:
    from gpu_e2e import make_clip

    clip, photo = work / "one_face.mp4", ROOT / "vcam" / "assets" / "grace_hopper.jpg"
    if not clip.is_file():
        make_clip(clip, 60, 1)
    cfg = work / "live_load.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    code = TIMELINE + PATCHES[variant] + "import sys\nfrom vcam.cli import main\nsys.argv[0] = 'vcam'\nmain()\n"
    args = ["-v", "run", "-c", str(cfg), "--quiet", "--device", "cuda", "--fp16", "--model", "inswapper_128"]
    args += ["--face", str(photo), "--input", str(clip), "--realtime", "--duration", f"{seconds:g}s", "--output", "null"]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    text = r.stdout + r.stderr
    row: dict = {"variant": variant, "rc": r.returncode, "wall_s": round(time.perf_counter() - t0, 1)}
    for key, pat in FIELDS.items():
        m = re.search(pat, text)
        row[key] = float(m.group(1)) if m else None
    keep = ("compiled", "Inductor", "first frame")
    row["lines"] = [ln.strip()[:240] for ln in text.splitlines() if any(k in ln for k in keep)][:8]
    row["timeline"] = [ln[:200] for ln in text.splitlines() if ln.startswith("T+")][:40]
    if r.returncode:
        row["tail"] = text[-1500:]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models")
    ap.add_argument("out")
    ap.add_argument("--variants", default="plain,now,now01,late,plain,now,now01")
    ap.add_argument("--seconds", type=float, default=12.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/vcam-live-load")
    work.mkdir(parents=True, exist_ok=True)
    rows = [run(v, Path(args.models), work, args.seconds) for v in args.variants.split(",") if v]
    cols = ["first_frame_s", "first_swapped_s", "import_s", "loaded_s", "in_use_s", "uncompiled_calls", "p50_ms", "p99_ms"]
    cols += ["dropped_capture", "dropped_late"]
    print(f"{'variant':<10} " + " ".join(f"{c:>16}" for c in cols))
    for row in rows:
        print(f"{row['variant']:<10} " + " ".join(f"{'-' if row[c] is None else row[c]:>16}" for c in cols))
        for ln in row["lines"]:
            print(f"    {ln}")
        if row.get("tail"):
            print(row["tail"])
    (out / "live_load.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
