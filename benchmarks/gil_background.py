"""The frames' rounds beside the compiled engines' load, at several thread switch intervals (issue 39:
with a compiled cache, one stream published 85 % of its frames in the first 10 s, and the camera
paused 133-184 ms eight times while Inductor loaded in the background, H100).

    python -m benchmarks.gil_background [--intervals 0.5,0.02,0.02+aside,0.02+aside+waits] [--runs 3]
        [--ops 250] [--wait MS] [--device cpu|cuda] [--json OUT]

Each run is a fresh process. A round is ``--ops`` small PyTorch calls on ``--device``, each of which
lets go of the interpreter's lock as a round's CUDA launches and copies do, 30 rounds a second. Beside
them a thread runs what the compiled loader runs first, :func:`vcam.engines.artifacts.prepare_load`
(Inductor's imports, torch's source hash), with the switch interval set to one of ``--intervals``
(milliseconds), alternated run by run; ``INTERVAL+aside`` runs the loader inside
:meth:`vcam.engines.gate.RoundTurns.stepping_aside` and marks each round, as the daemon does.
``--wait MS``: each round then waits that long in C (a frame's download: the GPU's time), inside
:meth:`~vcam.engines.gate.RoundTurns.waiting`, which ``+waits`` (``INTERVAL+aside+waits``) makes
release the round meanwhile (``$VCAM_TURNS_RELEASE_WAITS``). A thread
that gave the lock up for a call waits up to the interval to get it back from a thread running Python:
a round of many calls pays that wait each time.
Prints the medians of each interval (round p50, p90 and longest while the load runs, the round alone,
the load's seconds) and writes JSON with every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import write_report

CHILD = r"""
import json, statistics, sys, threading, time
import torch
interval_ms, ops, device, aside = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
wait_s, release = float(sys.argv[5]) / 1e3, sys.argv[6] == "1"
x = torch.zeros(16, device=device)
from vcam.engines import artifacts
from vcam.engines.gate import RoundTurns
turns = RoundTurns(on=aside, release_waits=release)
def one_round():
    t = time.perf_counter()
    y = x
    for _ in range(ops):
        y = torch.add(y, 1.0)
    if device == "cuda":
        torch.cuda.synchronize()
    if wait_s:
        with turns.waiting():  # the frame's download: the GPU's time, no interpreter needed
            time.sleep(wait_s)
    return time.perf_counter() - t
alone = [one_round() for _ in range(30)]
took = {}
def load():
    t = time.perf_counter()
    with turns.stepping_aside():
        artifacts.prepare_load()
    took["s"] = time.perf_counter() - t
sys.setswitchinterval(interval_ms / 1e3)
thread = threading.Thread(target=load)
thread.start()
beside = []
while thread.is_alive():
    with turns.round():
        r = one_round()
    beside.append(r)
    time.sleep(max(0.0, 1 / 30 - r))
beside.sort()
print(json.dumps({"interval_ms": interval_ms, "aside": aside, "parked": turns.parked, "alone_ms": statistics.median(alone) * 1e3,
    "p50_ms": statistics.median(beside) * 1e3, "p90_ms": beside[int(0.9 * len(beside))] * 1e3,
    "max_ms": beside[-1] * 1e3, "rounds": len(beside), "load_s": took.get("s")}))
"""


def one(setting: str, ops: int, device: str, wait_ms: float = 0.0) -> dict:
    """One fresh process (see the module docstring); ``setting`` is an interval in ms, ``+aside``
    after it for the loader stepping aside while a round runs, ``+waits`` after that for the
    rounds' waits (``wait_ms`` a round) released to it (:meth:`RoundTurns.waiting`)."""
    tree = str(Path(__file__).resolve().parents[1])  # this checkout's vcam
    interval, *flags = setting.split("+")
    aside, release = "aside" in flags, "waits" in flags
    argv = [sys.executable, "-c", CHILD, interval, str(ops), device, "1" if aside else "0", str(wait_ms), "1" if release else "0"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tree, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"the run failed ({r.returncode}): {r.stderr[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default="0.5,0.02", help="intervals in ms, alternated; INTERVAL+aside: the loader steps aside")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ops", type=int, default=250, help="calls in a round")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--wait", type=float, default=0.0, help="ms each round then waits in C (a GPU download's wait)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    intervals = [x.strip() for x in args.intervals.split(",")]
    for x in intervals:
        float(x.partition("+")[0])  # a bad interval fails here, not in a child
    runs = []
    for r in range(args.runs):
        for iv in intervals if r % 2 == 0 else intervals[::-1]:
            row = one(iv, args.ops, args.device, args.wait)
            runs.append(row)
            got = f"round p50 {row['p50_ms']:.1f} ms, p90 {row['p90_ms']:.1f}, longest {row['max_ms']:.0f}"
            row["setting"] = iv
            print(f"  run {r + 1}, {iv} ms: {got}")
    waits = f", then a {args.wait:g} ms wait," if args.wait else ""
    print(
        f"\nrounds of {args.ops} calls on {args.device}{waits} beside the compiled loader's imports, medians of {args.runs} runs"
    )
    print(f"{'interval':>15} {'alone':>7} {'p50':>7} {'p90':>7} {'longest':>8} {'load s':>7}")
    table = []
    for iv in intervals:
        mine = [x for x in runs if x["setting"] == iv]
        row = {k: statistics.median(x[k] for x in mine) for k in ("alone_ms", "p50_ms", "p90_ms", "max_ms", "load_s")}
        table.append({"setting": iv, **row})
        cells = [f"{row[k]:>7.1f}" for k in ("alone_ms", "p50_ms", "p90_ms")]
        print(f"{iv + ' ms':>15} {' '.join(cells)} {row['max_ms']:>8.0f} {row['load_s']:>7.2f}")
    payload = {"args": vars(args) | {"json": str(args.json)}, "runs": runs, "table": table}
    return write_report(str(args.json), payload) if args.json is not None else payload


if __name__ == "__main__":
    main()
