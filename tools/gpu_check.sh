#!/usr/bin/env bash
# One device session: GPU tests, `vcam bench`, and `vcam run --device cuda` on the demo clip.
# Usage on the lent GPU (results under $OUT): bash tools/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
OUT=${OUT:-/tmp/vcam-gpu}; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
VCAM_REQUIRE=gpu python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py tests/test_gpu_pipeline.py \
  tests/test_engines_torch.py 2>&1 | tee "$OUT/tests.log" | tail -n 25
python3 -m vcam bench --device cuda --size 1080p --faces 1,4,8 --frames 200 --json "$OUT/bench_1080p.json" 2>&1 | tee "$OUT/bench_1080p.txt" | tail -n 14
python3 -m vcam bench --device cuda --size 720p,4k --faces 1 --frames 200 --json "$OUT/bench_720p_4k.json" 2>&1 | tee "$OUT/bench_720p_4k.txt" | tail -n 10
for extra in "" "--fp16"; do
  python3 -m vcam run --device cuda --input demo --output null --frames 600 --fast --max-latency 0 --quiet $extra 2>&1 | tail -n 2
done | tee "$OUT/run.txt"
