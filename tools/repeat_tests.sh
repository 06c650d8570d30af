#!/usr/bin/env bash
# Run the whole test suite N times in a row (default 20) and stop at the first failing run: the
# check that no test is flaky. Usage: tools/repeat_tests.sh [N] [pytest args...]
# Each run's output is kept in ${REPEAT_LOG_DIR:-/tmp/vcam-repeat}/run-K.log; a summary line per run.
# BUSY=1: keep every core busy meanwhile (stress-ng --cpu N where it is installed, else one Python
# busy loop per core), as on a developer's machine with other work running.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${BUSY:-0}" = 1 ]; then
    cores=$(nproc)
    if command -v stress-ng >/dev/null; then
        stress-ng --cpu "$cores" --quiet &
        load=$!
    else
        python3 -c "
import multiprocessing as mp
def spin():
    while True:
        pass
for _ in range($cores - 1):
    mp.Process(target=spin, daemon=True).start()
spin()" &
        load=$!
    fi
    trap 'kill $load 2>/dev/null; pkill -P $load 2>/dev/null' EXIT
    echo "keeping $cores cores busy (pid $load)"
fi
n=${1:-20}
shift || true
logs=${REPEAT_LOG_DIR:-/tmp/vcam-repeat}
mkdir -p "$logs"
for k in $(seq 1 "$n"); do
    start=$(date +%s)
    python -m pytest -q -p no:cacheprovider "$@" >"$logs/run-$k.log" 2>&1
    rc=$?
    echo "run $k/$n: rc=$rc $(($(date +%s) - start))s $(tail -n 1 "$logs/run-$k.log")"
    if [ $rc -ne 0 ]; then
        grep -E '^(FAILED|ERROR)' "$logs/run-$k.log"
        echo "run $k failed; its log: $logs/run-$k.log"
        exit $rc
    fi
done
echo "all $n runs passed"
