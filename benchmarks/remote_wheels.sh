#!/usr/bin/env bash
# The wheels `gpu_check.sh remote` needs on the lent GPU machine (Python 3.12, no internet), fetched
# here into three ignored folders of this checkout, each small enough for one call's carry:
#   .whl-serve-a/  nvidia-pytriton 0.7.0 alone (55 MB: the tritonserver binary and its stubs)
#   .whl-serve-b/  the rest of the serving environment: numpy 1.26.4 and PyTriton's dependencies
#                  (pip takes only what the machine's own packages do not satisfy)
#   .whl/          + tritonclient and python-rapidjson, vcam's client side (gpu_check installs .whl/)
# On the device, warm calls: carry .whl-serve-a: `mkdir -p /tmp/w && cp .whl-serve-a/*.whl /tmp/w/`;
# carry .whl-serve-b: `cp .whl-serve-b/*.whl /tmp/w/`; carry .whl: `bash benchmarks/gpu_check.sh remote`.
set -euo pipefail
cd "$(dirname "$0")/.."
get() {  # DIR, then pip download's arguments
  local dir=$1; shift
  mkdir -p "$dir"
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "$@" 2>&1 | grep -v WARNING || true
}
get .whl-serve-a --no-deps nvidia-pytriton==0.7.0
get .whl-serve-b nvidia-pytriton==0.7.0 numpy==1.26.4
rm -f .whl-serve-b/nvidia_pytriton-*.whl
get .whl --no-deps tritonclient==2.73.0 python-rapidjson
du -sh .whl-serve-a .whl-serve-b .whl
