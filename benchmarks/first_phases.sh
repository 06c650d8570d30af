#!/usr/bin/env bash
# Where the first seconds of `vcam -v run --device cuda` go (issue 39): one 12-s realtime run per
# early-frames mode (inswapper FP16, stand-in weights, 33 ms budget, the demo), every log line
# stamped with the seconds since the command began, the load's phase lines ("load phase on cuda:
# import torch ...", "captured at start-up", "captured in the background") and the status lines
# kept; then the bare import and CUDA-init times. Run by `gpu_check.sh firstseconds` (or alone, from
# the repository root, with PYTHONPATH set as gpu_check.sh sets it). Output under $OUT:
#   phases_MODE.log   the stamped run;  phases.txt   the lines that matter, every mode;  imports.txt
# PHASES_MODES (default "swap pixelate"), PHASES_DURATION (default 12s), PHASES_ARGS (extra flags).
set -uo pipefail
OUT=${OUT:-/tmp/vcam-gpu}; mkdir -p "$OUT"
M=/tmp/vcam-e2e/models; mkdir -p $M
for n in inswapper_128 arcface_w600k_r50; do
  [ -f $M/$n.onnx ] || python3 -m vcam models stand-in $n --out $M >/dev/null 2>&1 || true
done
stamp() { python3 -c "
import sys, time
t0 = time.time()
for line in sys.stdin:
    sys.stdout.write(f'{time.time() - t0:7.2f} {line}')
    sys.stdout.flush()
"; }
run="run --device cuda --realtime --panel off --duration ${PHASES_DURATION:-12s} --face vcam/assets/grace_hopper.jpg
  --model inswapper_128 --fp16 --input demo --output null --max-latency 33ms ${PHASES_ARGS:-}"
: > "$OUT/phases.txt"
for mode in ${PHASES_MODES:-swap pixelate}; do
  printf '[models]\ndir = "%s"\n[pipeline]\nearly_frames = "%s"\n' $M "$mode" > /tmp/vcam-phases-$mode.toml
  # shellcheck disable=SC2086
  timeout 120 python3 -m vcam -v $run -c /tmp/vcam-phases-$mode.toml 2>&1 | grep -v NON-COMMERCIAL | stamp \
    > "$OUT/phases_$mode.log"
  { echo "== early_frames = $mode"
    grep -E "phase|ahead|captured|start-up:|loaded|switch|pixelated|status|stopped" "$OUT/phases_$mode.log" | cut -c1-230
  } >> "$OUT/phases.txt"
done
python3 -c "
import time
t = time.perf_counter(); import torch; a = time.perf_counter()
torch.zeros(1, device='cuda'); b = time.perf_counter()
import cupy; c = time.perf_counter(); cupy.zeros(1); d = time.perf_counter()
print(f'import torch {a - t:.2f} s, its CUDA init {b - a:.2f} s, import cupy {c - b:.2f} s, its init {d - c:.2f} s')
" 2>&1 | tee "$OUT/imports.txt"
cat "$OUT/phases.txt"
