#!/usr/bin/env bash
# Old against new in one device call, alternated: `vcam bench` (1080p, faces 1 and 8) and the one-stream
# paced daemon, ROUNDS times each, on the same GPU. Usage (repo root on the device):
#   bash benchmarks/ab.sh OLD_TREE [ROUNDS]
# OLD_TREE: an exported older checkout (e.g. `git archive <commit> | tar -x -C .old`), whose benchmark
# harnesses may still live in vcam/bench/. Results: $OUT/ab_<tree>_<round>_{bench,daemon}.{json,txt}.
set -uo pipefail
export PYTHONUNBUFFERED=1
old=$(cd "${1:?usage: ab.sh OLD_TREE [ROUNDS]}" && pwd); rounds=${2:-2}
new=$PWD
OUT=${OUT:-/tmp/vcam-ab}; mkdir -p "$OUT"
M=${MODEL_DIR:-/tmp/vcam-e2e/models}; mkdir -p "$M"
site=""; [ -d /tmp/site ] && site=/tmp/site:
compile=${AB_COMPILE:-off}
for name in inswapper_128 arcface_w600k_r50; do
  [ -f "$M/$name.onnx" ] || PYTHONPATH=$site$new python3 -m vcam models stand-in $name --out "$M" >/dev/null 2>&1
done
streams_module() { [ -f "$1/benchmarks/streams.py" ] && echo benchmarks.streams || echo vcam.bench.streams; }
for r in $(seq 1 "$rounds"); do
  for tree in old new; do
    root=${!tree}
    export PYTHONPATH=$site$root
    ( cd "$root" && timeout 200 python3 -m vcam bench --device cuda --size 1080p --faces 1,8 --frames ${AB_FRAMES:-200} \
        --no-naive --compile "$compile" --json "$OUT/ab_${tree}_${r}_bench.json" ) > "$OUT/ab_${tree}_${r}_bench.txt" 2>&1 \
      || echo "bench $tree $r failed"
    ( cd "$root" && timeout 150 python3 -m "$(streams_module "$root")" --device cuda --streams 1 --size 1080p \
        --seconds ${AB_SECONDS:-6} --swapper inswapper_128 --model-dir "$M" --fp16 --modes daemon-paced --compile "$compile" \
        --json "$OUT/ab_${tree}_${r}_daemon.json" ) > "$OUT/ab_${tree}_${r}_daemon.txt" 2>&1 || echo "daemon $tree $r failed"
    echo "round $r $tree done"
  done
done
python3 - "$OUT" "$rounds" <<'PY'
import json, sys, pathlib
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def rows(tree):
    for r in range(1, rounds + 1):
        try:
            b = json.loads((out / f"ab_{tree}_{r}_bench.json").read_text())
        except Exception:
            b = None
        try:
            d = json.loads((out / f"ab_{tree}_{r}_daemon.json").read_text())
        except Exception:
            d = None
        yield r, b, d
summary = {}
for tree in ("old", "new"):
    for r, b, d in rows(tree):
        summary[f"{tree}{r}"] = {"bench": b, "daemon": d}
(out / "ab_summary.json").write_text(json.dumps(summary, indent=1, default=str))
print("written", out / "ab_summary.json")
PY
