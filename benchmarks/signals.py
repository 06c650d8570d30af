"""Stop signals at random moments: N real `vcam run --input demo --realtime` runs to a file, each sent
SIGINT, SIGTERM or SIGHUP at a random moment in its first seconds; how each ended (exit code, an
abort, a traceback, whether the named output is there and plays). Prints a table, writes JSON.

    python -m benchmarks.signals [--runs 50] [--within 4] [--tree PATH] [--json signals.json]

``--tree``: another checkout to run (e.g. an older commit, for a before/after in one session).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _terminal_signals() -> None:
    """The stop signals at their defaults in the child, as in a terminal session (a harness may run
    with SIGHUP ignored, which vcam keeps, as under nohup)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def plays(path: Path) -> bool:
    import av

    try:
        with av.open(str(path)) as c:
            return any(True for _ in c.decode(video=0))
    except Exception:
        return False


def one(tree: Path, sig: int, at: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        target = Path(d) / "out.mp4"
        cmd = [sys.executable, "-m", "vcam", "run", "--input", "demo", "--realtime", "--output", f"file:{target}"]
        # Its own control socket: another vcam on this machine (a test suite, say) must not refuse it.
        conf = Path(d) / "run" / "c.toml"
        conf.parent.mkdir(mode=0o700)
        conf.write_text(f'[control]\nsocket = "{conf.parent / "vcam.sock"}"\n')
        cmd += ["--config", str(conf)]
        p = subprocess.Popen(
            cmd + ["--device", "cpu", "--quiet"],
            cwd=tree,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_terminal_signals,
        )
        time.sleep(at)
        p.send_signal(sig)
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        return {
            "signal": signal.Signals(sig).name,
            "at_s": round(at, 2),
            "rc": p.returncode,
            "abort": "terminate called" in out,
            "traceback": "Traceback" in out,
            "named_output": target.exists(),
            "plays": target.exists() and plays(target),
            "left": sorted(p for p in os.listdir(d) if p != "run"),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--within", type=float, default=4.0, help="the signal comes at a random moment in the first N seconds")
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--json", default="signals.json")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = [one(Path(args.tree), rng.choice(SIGNALS), rng.uniform(0.0, args.within)) for _ in range(args.runs)]
    clean = [r for r in rows if r["rc"] in (0, 130) and not r["abort"] and not r["traceback"]]
    print(f"{'runs':>5} {'clean (rc 0/130)':>17} {'aborts':>7} {'tracebacks':>11} {'output plays':>13}  exit codes")
    print(
        f"{len(rows):>5} {len(clean):>17} {sum(r['abort'] for r in rows):>7} {sum(r['traceback'] for r in rows):>11} "
        f"{sum(r['plays'] for r in rows):>13}  {dict(Counter(r['rc'] for r in rows))}"
    )
    for r in rows:
        if r not in clean:
            print("  not clean:", r)
    Path(args.json).write_text(json.dumps({"tree": args.tree, "within_s": args.within, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
