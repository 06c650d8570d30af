"""Do many idle control connections slow the video or the control thread? (issue 27)

    python -m benchmarks.idle_connections [--connections 1000] [--seconds 8] [--rounds 2] [--json FILE]

Runs the daemon on the 320x240 demo clip at its 30 fps (classic swap, CPU, a null output that stamps
each published frame) with its control socket, and alternates, ``--rounds`` times, a window with no
other connection and a window while a separate process holds ``--connections`` connections open
without sending a byte. In each window it measures the published fps, asks ``vcam ctl status``
every 0.5 s (the real :func:`vcam.control.client.send_command`) and reads the control thread's CPU
time from /proc. The server keeps at most ``MAX_CLIENTS`` connections and closes the one idle the
longest to take a new one, so the held connections are closed under it as new ones come: what is
measured is that this churn and the full set cost the frame loop and the control thread nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import demo_daemon, write_report

HOLDER = r"""
import socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(path)
    except OSError:
        s.close()
        continue
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()  # hold them until told to stop
"""


def _thread_cpu(name: str) -> float:
    """CPU seconds (user + system) of this process's thread called ``name``."""
    tid = next(t.native_id for t in threading.enumerate() if t.name == name)
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window(out, sock: Path, seconds: float) -> dict:
    from vcam.control.client import send_command

    n0, c0, t0 = len(out.stamps), _thread_cpu("vcam-ctl"), time.perf_counter()
    answers: list[float] = []
    while time.perf_counter() - t0 < seconds:
        a = time.perf_counter()
        try:
            ok = send_command(str(sock), {"status": True}, timeout=5)["ok"]
        except Exception:  # counted as a failed answer
            ok = False
        answers.append(time.perf_counter() - a if ok else float("inf"))
        time.sleep(0.5)
    t1 = time.perf_counter()
    stamps = np.array(out.stamps[n0:])
    return {
        "fps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
        "status_max_s": max(answers),
        "status_p50_s": float(np.median(answers)),
        "control_cpu_pct": 100.0 * (_thread_cpu("vcam-ctl") - c0) / (t1 - t0),
    }


def run(connections: int, seconds: float, rounds: int, root: Path) -> dict:
    sock = root / "vcam.sock"
    daemon, out = demo_daemon(sock, max_latency=0)
    daemon.start()
    rows = []
    try:
        if not daemon.ready.wait(60):
            raise RuntimeError(f"the daemon did not start: {daemon.summary.error}")
        time.sleep(2.0)
        for i in range(rounds):
            rows.append({"round": i + 1, "held": 0, **_window(out, sock, seconds)})
            args = [sys.executable, "-c", HOLDER, str(sock), str(connections)]
            holder = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdin is not None
            held = int(holder.stdout.readline())
            rows.append({"round": i + 1, "held": held, **_window(out, sock, seconds)})
            holder.stdin.close()
            holder.wait(30)
    finally:
        daemon.stop()
    return {"rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="bench_idle_connections.json")
    args = ap.parse_args(argv)
    result = run(args.connections, args.seconds, args.rounds, Path(tempfile.mkdtemp(prefix="vcam-bench-idle-")))
    rows = result["rows"]
    idle = [r["fps"] for r in rows if not r["held"]]
    held = [r["fps"] for r in rows if r["held"]]
    result["fps_ratio"] = float(np.mean(held) / np.mean(idle)) if idle and np.mean(idle) else 0.0

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.connections} idle control connections held vs none, 30 fps demo clip")
    for col in ("round", "connections opened", "video fps", "ctl status max s", "p50 s", "control thread CPU %"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["round"]), str(r["held"]), f"{r['fps']:.1f}", f"{r['status_max_s']:.3f}", f"{r['status_p50_s']:.3f}",
            f"{r['control_cpu_pct']:.2f}",
        )  # fmt: skip
    con = Console(width=160)
    con.print(table)
    con.print(f"fps with the connections held / without: {result['fps_ratio']:.3f}")
    payload = write_report(args.json, {"connections": args.connections, **result})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
