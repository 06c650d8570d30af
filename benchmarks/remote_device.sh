#!/usr/bin/env bash
# The remote-swap measurement (benchmarks/remote.py) on the lent GPU machine, which has no internet.
#
# Before the device call, from the checkout (wheels for Python 3.12; the serving environment's numpy 1.26
# goes into .whl-serve/ so the main environment keeps its numpy 2):
#   ../shared/tools/device-wheels tritonclient==2.73.0 grpcio==1.85.3 protobuf==6.33.6 python-rapidjson==1.25 \
#     ml-dtypes==0.5.4 nvidia-pytriton==0.7.0 pyzmq==27.3.0 sh==2.4.0 wrapt==2.5.2 typing-inspect==0.9.0 \
#     mypy-extensions==1.2.0 importlib-metadata==10.2.0 lazy-importer==0.1.0 zipp==4.1.2 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 \
#     aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 \
#     idna==3.20 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 \
#     brotli==1.2.1 certifi==2026.10.19.post1 urllib3==2.8.0 packaging==26.4
#   mkdir -p .whl-serve && (cd .whl-serve && python3 -m pip download -q --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 numpy==1.26.4)
# Then, as the device command:  OUT=$OUT bash benchmarks/remote_device.sh [extra benchmarks.remote args]
# It writes $OUT/remote.json, $OUT/remote.txt and the server's log.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vcam-remote}
mkdir -p "$OUT"
# the client side: tritonclient[grpc] beside vcam's own packages (not numpy 1.26: that is .whl-serve's)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/tritonclient-*.whl .whl/grpcio-*.whl .whl/protobuf-*.whl .whl/python_rapidjson-*.whl .whl/ml_dtypes-*.whl
export PYTHONPATH=/tmp/site:$PWD
# the server side: vcam serve's environment, seeing the machine's torch (system site), numpy 1.26 first;
# pip takes every wheel from the two folders (no index)
export VCAM_SERVE_SYSTEM_SITE=1 PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl-serve $PWD/.whl"
python3 -m vcam serve setup
python3 -m benchmarks.remote "$OUT" --clients 4,8 --seconds 8 --size 1080p --fp16-wire "$@" 2>&1 | tee "$OUT/remote.txt"
