#!/usr/bin/env bash
# Old against new in one device call, alternated: `vcam bench` (1080p, faces 1 and 8) and the one-stream
# paced daemon, ROUNDS times each, on the same GPU. Usage (repo root on the device):
#   bash benchmarks/ab.sh OLD_TREE [ROUNDS]
# OLD_TREE: an exported older checkout (e.g. `git archive <commit> | tar -x -C .old`), whose benchmark
# harnesses may still live in vcam/bench/. Results: $OUT/ab_<tree>_<round>_{bench,daemon}.{json,txt}, and
# one table of both trees (printed, and $OUT/ab_summary.json). AB_BREAKDOWN=1 adds the paced daemon's
# latency breakdown (benchmarks/latency_breakdown.py, this tree's harness copied into OLD_TREE, whose
# vcam it then runs) with one face and with AB_FACES (default 6) faces: capture->published p50/p99 and
# the frame loop's host CPU per frame (issue 28), in $OUT/ab_<tree>_<round>_lb<faces>.{json,txt}.
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
if [ "${AB_BREAKDOWN:-0}" = 1 ]; then  # the new harness measures both trees alike
  cp "$new/benchmarks/latency_breakdown.py" "$new/benchmarks/streams.py" "$old/benchmarks/"
fi
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
    if [ "${AB_BREAKDOWN:-0}" = 1 ]; then
      for faces in 1 ${AB_FACES:-6}; do
        ( cd "$root" && timeout 150 python3 -m benchmarks.latency_breakdown --model-dir "$M" --paced --faces "$faces" \
            --seconds ${AB_SECONDS:-6} --compile "$compile" --first 0 --json "$OUT/ab_${tree}_${r}_lb${faces}.json" ) \
          > "$OUT/ab_${tree}_${r}_lb${faces}.txt" 2>&1 || echo "breakdown $faces $tree $r failed"
      done
    fi
    echo "round $r $tree done"
  done
done
python3 - "$OUT" "$rounds" <<'PY'
# One table (and ab_summary.json): per tree and round, `vcam bench` p50/p99 for the first row of each
# face count (box,face masks, banded), and the paced daemon's whole-run p50/p99.
import json, pathlib, sys
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
rows, summary = [], {}
for r in range(1, rounds + 1):
    for tree in ("old", "new"):
        b, d = load(f"ab_{tree}_{r}_bench.json"), load(f"ab_{tree}_{r}_daemon.json")
        row = {}
        for res in (b or {}).get("gpu", []):
            row.setdefault(f"bench {res['faces']} face p50/p99", f"{res['p50_ms']:.2f}/{res['p99_ms']:.2f}")
        for res in ((d or {}).get("results") or {}).values():
            row["daemon paced p50/p99"] = f"{res['worst_p50_ms']:.2f}/{res['worst_p99_ms']:.2f}"
        for lb in sorted(out.glob(f"ab_{tree}_{r}_lb*.json")):
            got, faces = load(lb.name) or {}, lb.stem.rsplit("_lb", 1)[1]
            if "capture->published p50" in got:
                row[f"lb {faces}f p50/p99"] = f"{got['capture->published p50']:.2f}/{got['capture->published p99']:.2f}"
            if "host CPU ms per frame p50" in got:
                row[f"lb {faces}f CPU/frame p50/p99"] = f"{got['host CPU ms per frame p50']:.2f}/{got['host CPU ms per frame p99']:.2f}"
        summary[f"{tree}{r}"] = row
        rows.append((f"{tree} {r}", row))
cols = sorted({k for _, row in rows for k in row})
print("ms".ljust(8) + "".join(c.rjust(24) for c in cols))
for name, row in rows:
    print(name.ljust(8) + "".join(row.get(c, "-").rjust(24) for c in cols))
(out / "ab_summary.json").write_text(json.dumps(summary, indent=1))
PY
