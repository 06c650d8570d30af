"""The early frames beside a load that runs Python: a CPU model of a GPU start, where the models'
load (``import torch``, CuPy, building the engines) shares the interpreter's lock with the frames
published meanwhile (issue 39: four streams published 50-74 % of their frames in a GPU start's first
10 s, one stream 90 %).

    python -m benchmarks.gil_early [--streams 1,4] [--rounds 2] [--load 4] [--hog python|torch|none]
        [--settings default,short|MS,...] [--json OUT]

Each run is a fresh process running the real command (``vcam run --realtime --device cpu
--max-latency 33ms``, the 1280x720 demo, ``--streams`` of it, null outputs) with the models' load
made ``--load`` seconds longer (``Daemon(load_delay=...)``, a sleep) and, from the start, a thread
doing what a load does in Python: ``python`` runs bytecode for 6 s or until the run ends (and counts its laps: the load's
own progress), ``torch`` imports torch (its time), ``none`` nothing. Two settings alternated run
by run: the thread switch interval vcam sets while the models load
(:data:`vcam.runtime.startup.LOADING_SWITCH_S`, 0.5 ms) and Python's default kept (5 ms, as
before). Per stream: frames published in the 5 s after its first / the camera's 150. Prints a table
of the medians and writes JSON with every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.first_seconds import TIMED_OUTPUTS
from vcam.runtime.startup import LOADING_SWITCH_S

CHILD = (
    TIMED_OUTPUTS
    + r"""
import os, threading
from vcam.runtime import startup
if os.environ["GIL_EARLY_INTERVAL"] == "default":
    startup.LOADING_SWITCH_S = sys.getswitchinterval()  # as before: the interval left as it was
elif os.environ["GIL_EARLY_INTERVAL"] != "short":  # another interval, in ms
    startup.LOADING_SWITCH_S = float(os.environ["GIL_EARLY_INTERVAL"]) / 1e3
from vcam.runtime import daemon as vd
init = vd.Daemon.__init__
def slower(self, *a, **k):
    k["load_delay"] = float(os.environ["GIL_EARLY_LOAD"])
    init(self, *a, **k)
vd.Daemon.__init__ = slower
work = {}
def python():
    end, x = time.perf_counter() + 6.0, 0
    work["laps"] = 0  # counted lap by lap: a run that ends first still reports the laps it saw
    while time.perf_counter() < end:
        for i in range(1000):
            x += i * i
        work["laps"] += 1
def torch():
    time.sleep(0.6)  # the command's own start first, as the load's import comes after it
    t = time.perf_counter()
    import torch  # noqa: F401
    work["import_s"] = time.perf_counter() - t
hog = os.environ["GIL_EARLY_HOG"]
if hog != "none":
    threading.Thread(target={"python": python, "torch": torch}[hog], daemon=True).start()
run = vd.Daemon.run
def reported(self, *a, **k):
    try:
        return run(self, *a, **k)
    finally:
        json.dump({"streams": {st.name: sent.get(id(st.output), []) for st in self.streams}, "work": work}, open(OUT, "w"))
vd.Daemon.run = reported
from vcam.__main__ import main
sys.argv = ["vcam", *sys.argv[2:]]
main()
"""
)

SETTINGS = ("default", "short")  # Python's 5 ms kept; vcam's LOADING_SWITCH_S (--settings: or ms)


def one(streams: int, setting: str, hog: str, load: float, seconds: float) -> dict:
    """One fresh `vcam run` (see the module docstring): each stream's share of the camera's frames
    published in the 5 s after its first, and the thread's work."""
    args = ["run", "--realtime", "--duration", f"{seconds:g}s", "--max-latency", "33ms", "--device", "cpu", "-q"]
    if streams == 1:
        args += ["--input", "demo", "--output", "null"]
    else:
        for k in range(streams):
            args += ["--stream", f"demo=null,name=s{k}"]
    tree = str(Path(__file__).resolve().parents[1])  # this checkout's vcam, whatever is installed
    env = {**os.environ, "GIL_EARLY_INTERVAL": setting, "GIL_EARLY_HOG": hog, "GIL_EARLY_LOAD": str(load)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="vcam-gil-early-") as tmp:
        out = Path(tmp) / "out.json"
        r = subprocess.run([sys.executable, "-c", CHILD, str(out), *args], capture_output=True, text=True, env=env, cwd=tmp)
        if r.returncode != 0 or not out.is_file():
            raise RuntimeError(f"vcam run failed ({r.returncode}): {(r.stdout + r.stderr)[-600:]}")
        got = json.loads(out.read_text())
    shares = []
    for times in got["streams"].values():
        first = times[0] if times else 0.0
        shares.append(sum(1 for t in times if first <= t < first + 5.0) / 150.0 if times else 0.0)
    return {"streams": streams, "setting": setting, "hog": hog, "shares": shares, **got["work"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load", type=float, default=4.0, help="seconds added to the models' load")
    ap.add_argument("--hog", default="python", choices=("python", "torch", "none"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="default (5 ms), short (vcam's), or ms; alternated")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    settings = tuple(args.settings.split(","))
    runs = []
    for r in range(args.rounds):
        for n in (int(x) for x in args.streams.split(",")):
            for setting in settings if r % 2 == 0 else settings[::-1]:
                row = one(n, setting, args.hog, args.load, args.seconds)
                runs.append(row)
                extra = f", laps {row['laps']}" if "laps" in row else ""
                extra += f", import {row['import_s']:.2f} s" if "import_s" in row else ""
                print(f"  round {r + 1}, {n} stream(s), {setting:7}: " + " ".join(f"{x:.0%}" for x in row["shares"]) + extra)
    print(f"\nearly frames beside a load running Python ({args.hog}), load +{args.load:g} s, medians of {args.rounds} runs")
    print(f"{'streams':>7} {'interval':>9} {'published 5 s (each stream)':>30} {'thread work':>12}")
    table = []
    for n in (int(x) for x in args.streams.split(",")):
        for setting in settings:
            mine = [x for x in runs if x["streams"] == n and x["setting"] == setting]
            shares = [statistics.median(col) for col in zip(*(x["shares"] for x in mine))]
            work = [x.get("laps", x.get("import_s")) for x in mine if x.get("laps", x.get("import_s")) is not None]
            w = statistics.median(work) if work else None
            table.append({"streams": n, "setting": setting, "shares": shares, "work": w})
            label = {"default": "5 ms", "short": f"{LOADING_SWITCH_S * 1e3:g} ms"}.get(setting, f"{setting} ms")
            print(f"{n:7d} {label:>9} {' '.join(f'{x:.0%}' for x in shares):>30} {'' if w is None else f'{w:.4g}':>12}")
    payload = {"args": vars(args) | {"json": str(args.json)}, "runs": runs, "table": table}
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
