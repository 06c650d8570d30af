#!/usr/bin/env bash
# The remote-swap measurement (benchmarks/remote.py) on the lent GPU machine, which has no internet.
#
# The serving environment's wheels (nvidia-pytriton 0.7.0 and what it needs that the machine's
# Python lacks, with numpy 1.26) do not fit one call's carry: put them in a folder there first, over
# warm calls (e.g. one call carrying the pytriton wheel, one carrying the rest, each copying its
# folder to /tmp/w), then, carrying .whl (vcam's own client-side wheels):
#   WHEELS=/tmp/w OUT=$OUT bash benchmarks/remote_device.sh [extra benchmarks.remote args]
# The machine's python3 is a virtual environment holding torch: VCAM_SERVE_SYSTEM_SITE=1 makes the
# serving environment see its packages (vcam.runtime.serve adds them by a .pth after its own).
# Writes $OUT/remote.json, $OUT/remote_delay.json, $OUT/remote.txt and the killed-server test's output
# in $OUT/killed.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vcam-remote}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the client side: vcam's own packages and tritonclient[grpc] (not numpy 1.26: that is the server's)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
# the server side: vcam serve's environment, seeing the machine's torch, numpy 1.26 first; pip takes
# every wheel from the two folders (no index)
export VCAM_SERVE_SYSTEM_SITE=1 PIP_NO_INDEX=1 PIP_FIND_LINKS="${WHEELS:-$PWD/.whl-serve} $PWD/.whl"
python3 -m vcam serve setup
(python3 -m pytest -q -rs -s -p no:randomly tests/runtime/test_remote_run.py -k killed 2>&1 | tail -12 >"$OUT/killed.txt") || true
# one face, local against remote, and 8 clients (each its own process, its pipeline on the GPU) with the
# batcher's default wait; then the 8 clients again with a longer wait (batching across clients)
python3 -m benchmarks.remote /tmp/vr-a --clients 8 --seconds 8 --size 1080p --fp16-wire --client-device cuda "$@" 2>&1 |
  grep -v "NON-COMMERCIAL" | tee "$OUT/remote.txt"
cp /tmp/vr-a/remote.json "$OUT/remote.json"
python3 -m benchmarks.remote /tmp/vr-b --model-dir /tmp/vr-a/models --no-one --clients 8 --seconds 8 --size 1080p --fp16-wire \
  --client-device cuda --queue-delay-us "${DELAY_US:-4000}" "$@" 2>&1 | grep -v "NON-COMMERCIAL" | tee -a "$OUT/remote.txt"
cp /tmp/vr-b/remote.json "$OUT/remote_delay.json"
